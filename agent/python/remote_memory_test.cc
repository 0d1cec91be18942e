// RemoteMemory on this process's own memory: ranges with a part unmapped.
#include "agent/python/remote_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace strata::agent::python {
namespace {

TEST(RemoteMemoryTest, ReadDownToStopsAtTheUnmappedStart) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* map = static_cast<uint8_t*>(
      mmap(nullptr, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  for (size_t i = 0; i < 3 * page; ++i) map[i] = static_cast<uint8_t>(i * 7);
  const auto base = reinterpret_cast<uintptr_t>(map);
  RemoteMemory memory(getpid());
  std::vector<uint8_t> out(2 * page);

  // All mapped: the whole range, in one call.
  uint64_t reads = memory.reads();
  EXPECT_EQ(memory.ReadDownTo(base + page / 2, page, base + page, out.data()), base + page / 2);
  EXPECT_EQ(std::memcmp(out.data(), map + page / 2, page), 0);
  if (!memory.reads_mem_file()) {
    EXPECT_EQ(memory.reads(), reads + 1);
  }

  // The first page gone: the part from the split only, where it belongs in `out`.
  ASSERT_EQ(munmap(map, page), 0);
  std::fill(out.begin(), out.end(), 0);
  reads = memory.reads();
  EXPECT_EQ(memory.ReadDownTo(base + page / 2, page + 64, base + page, out.data()), base + page);
  EXPECT_EQ(std::memcmp(out.data() + page / 2, map + page, page / 2 + 64), 0);
  if (!memory.reads_mem_file()) {
    EXPECT_EQ(memory.reads(), reads + 1);
  }

  // Nothing mapped from the split on: nothing.
  EXPECT_EQ(memory.ReadDownTo(base, 64, base + 32, out.data()), 0u);
  // No split inside the range: a plain read.
  EXPECT_EQ(memory.ReadDownTo(base + page, 64, base, out.data()), base + page);
  EXPECT_EQ(std::memcmp(out.data(), map + page, 64), 0);
  munmap(map + page, 2 * page);
}

TEST(RemoteMemoryTest, ReadPrefixStopsAtTheFirstPageThatCannotBeRead) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  constexpr size_t kPages = 40;  // more than one call's iovecs
  auto* map = static_cast<uint8_t*>(mmap(nullptr, kPages * page, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(map, MAP_FAILED);
  for (size_t i = 0; i < kPages * page; ++i) map[i] = static_cast<uint8_t>(i * 7);
  const auto base = reinterpret_cast<uintptr_t>(map);
  RemoteMemory memory(getpid());
  std::vector<uint8_t> out(kPages * page);

  // All mapped: all of it.
  EXPECT_EQ(memory.ReadPrefix(base + 100, out.data(), kPages * page - 200), kPages * page - 200);
  EXPECT_EQ(std::memcmp(out.data(), map + 100, kPages * page - 200), 0);

  // A page gone: up to it.
  ASSERT_EQ(munmap(map + 36 * page, page), 0);
  std::fill(out.begin(), out.end(), 0);
  EXPECT_EQ(memory.ReadPrefix(base + 100, out.data(), kPages * page - 200), 36 * page - 100);
  EXPECT_EQ(std::memcmp(out.data(), map + 100, 36 * page - 100), 0);
  // Starting there: nothing.
  EXPECT_EQ(memory.ReadPrefix(base + 36 * page + 8, out.data(), 64), 0u);
  munmap(map, 36 * page);
  munmap(map + 37 * page, (kPages - 37) * page);
}

}  // namespace
}  // namespace strata::agent::python
