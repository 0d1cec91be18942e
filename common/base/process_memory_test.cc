#include "common/base/process_memory.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

#include "common/testing/sanitizers.h"
#include "gtest/gtest.h"

namespace strata::base {
namespace {

// Free bytes the heap keeps after `bytes` were allocated, written and freed.
size_t HeapFreeAfterUsing(size_t bytes) {
  char* p = static_cast<char*>(std::malloc(bytes));
  // The block escapes into an empty asm that may read it: at -O2 GCC removes a malloc, memset
  // and free whose memory nothing else reads, and the heap would see no request at all.
  asm volatile("" : : "r"(p) : "memory");
  std::memset(p, 1, bytes);
  asm volatile("" : : "r"(p) : "memory");
  std::free(p);
  return mallinfo2().fordblks;
}

TEST(RetainFreedMemoryTest, FreedMegabytesStayInTheHeapForTheNextRequest) {
  if (testing::kSanitized) GTEST_SKIP() << "the sanitizer's allocator ignores mallopt";
  // Above the largest mmap threshold glibc picks by itself (32 MiB): by default such a block
  // is a mapping of its own, unmapped when freed, and its pages are fresh at every use.
  constexpr size_t kBytes = size_t{40} << 20;
  EXPECT_LT(HeapFreeAfterUsing(kBytes), kBytes);
  ASSERT_TRUE(RetainFreedMemory(size_t{64} << 20, size_t{256} << 20).ok());
  EXPECT_GE(HeapFreeAfterUsing(kBytes), kBytes);
}

TEST(RetainFreedMemoryTest, ThresholdsAboveWhatMalloptTakesAreRefused) {
  EXPECT_EQ(RetainFreedMemory(size_t{4} << 30, 1 << 20).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::base
