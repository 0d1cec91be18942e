#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <thread>

#include "agent/symbols/process_address_space.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/frame_kind.h"
#include "common/elf/debug_fixtures_for_test.h"
#include "common/unwind/unwind_test_chain.h"
#include "common/unwind/unwinder.h"
#include "gtest/gtest.h"

extern "C" __attribute__((noinline)) int StrataSymbolsTestTarget(int x) {
  asm volatile("" ::: "memory");
  return x + 11;
}

namespace strata::agent::symbols {
namespace {

__attribute__((noinline)) int NamespacedTarget(long v) {
  asm volatile("" ::: "memory");
  return static_cast<int>(v) - 3;
}

uint64_t Addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// The names of an unwound stack's frames, innermost first (a caller by its call's address).
std::vector<std::string> FrameNames(const ProcessAddressSpace& space, const unwind::Frame* frames,
                                    size_t n) {
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    names.push_back(space.Symbolize(i == 0 ? frames[i].pc : frames[i].pc - 1).function_name);
  }
  return names;
}

TEST(SymbolsTest, SymbolizesOwnFunctions) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_EQ(space.failed_modules(), 0u);
  EXPECT_GE(space.num_modules(), 3u);  // exe, libc, libstdc++, ld.so, vdso

  SymbolizedPc s = space.Symbolize(Addr(reinterpret_cast<void*>(&StrataSymbolsTestTarget)) + 2);
  EXPECT_EQ(s.function_name, "StrataSymbolsTestTarget");
  EXPECT_TRUE(s.known_function);
  EXPECT_FALSE(s.is_plt);
  EXPECT_EQ(s.module_pc - s.function_start, 2u);
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  EXPECT_EQ(s.module_path, self);
  EXPECT_EQ(s.build_id.size(), 40u);

  s = space.Symbolize(Addr(reinterpret_cast<void*>(&NamespacedTarget)));
  EXPECT_EQ(s.function_name, "strata::agent::symbols::(anonymous namespace)::NamespacedTarget(long)");

  s = space.Symbolize(Addr(reinterpret_cast<void*>(&getpid)));
  EXPECT_NE(s.module_path.find("libc.so"), std::string::npos) << s.module_path;
  EXPECT_TRUE(s.function_name == "getpid" || s.function_name == "__getpid") << s.function_name;

  s = space.Symbolize(0x10);
  EXPECT_TRUE(s.module_path.empty());
  EXPECT_FALSE(s.known_function);
}

TEST(SymbolsTest, PltStubsAreAttributedToTheirTarget) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  ASSERT_TRUE(space.Refresh().ok());
  uint64_t module_pc = 0;
  const Module* exe = space.ModuleAt(Addr(reinterpret_cast<void*>(&StrataSymbolsTestTarget)), &module_pc);
  ASSERT_NE(exe, nullptr);
  int64_t bias = static_cast<int64_t>(Addr(reinterpret_cast<void*>(&StrataSymbolsTestTarget)) - module_pc);
  int checked = 0;
  for (const auto& f : exe->symbols.functions()) {
    if (!f.is_plt() || f.name.empty()) continue;
    SymbolizedPc s = space.Symbolize(f.start + bias + 4);
    EXPECT_TRUE(s.is_plt);
    EXPECT_EQ(s.function_name, f.name);
    EXPECT_TRUE(s.function_name.ends_with("@plt"));
    EXPECT_EQ(s.function_start, f.start);
    ++checked;
  }
  EXPECT_GT(checked, 5);
}

TEST(SymbolsTest, RefreshFindsDlopenedModuleAndReusesModules) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  ASSERT_TRUE(space.Refresh().ok());
  size_t modules_before = space.num_modules();
  uint64_t opens_before = cache.opens();
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_EQ(cache.opens(), opens_before) << "unchanged mappings must not reopen files";

  void* handle = dlopen(STRATA_SYMBOLS_TEST_DSO, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto fn = reinterpret_cast<int (*)(int)>(dlsym(handle, "strata_symbols_test_dso_function"));
  ASSERT_NE(fn, nullptr);
  EXPECT_EQ(fn(1), 7);
  EXPECT_TRUE(space.Symbolize(Addr(reinterpret_cast<void*>(fn))).module_path.empty());

  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_EQ(space.num_modules(), modules_before + 1);
  EXPECT_EQ(cache.opens(), opens_before + 1);
  SymbolizedPc s = space.Symbolize(Addr(reinterpret_cast<void*>(fn)) + 1);
  EXPECT_EQ(s.function_name, "strata_symbols_test_dso_function");
  EXPECT_TRUE(s.module_path.ends_with("strata_symbols_test_dso.so")) << s.module_path;
  const unwind::RuleSource* rules = nullptr;
  uint64_t module_pc = 0;
  ASSERT_TRUE(space.Lookup(Addr(reinterpret_cast<void*>(fn)), &rules, &module_pc));
  EXPECT_NE(rules, nullptr);

  dlclose(handle);
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_EQ(space.num_modules(), modules_before);
}

// Samples are unwound a second or more after they were taken: one taken in a library that was
// dlclose'd before the next read of the mappings still finds it there, until something else is
// mapped over it.
TEST(SymbolsTest, DlclosedModuleKeptForPcsNoMappingCovers) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  void* handle = dlopen(STRATA_SYMBOLS_TEST_DSO, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  auto fn = reinterpret_cast<int (*)(int)>(dlsym(handle, "strata_symbols_test_dso_function"));
  ASSERT_NE(fn, nullptr);
  const uint64_t pc = Addr(reinterpret_cast<void*>(fn)) + 1;
  ASSERT_TRUE(space.Refresh().ok());
  const size_t modules = space.num_modules();
  ASSERT_EQ(space.Symbolize(pc).function_name, "strata_symbols_test_dso_function");
  ASSERT_EQ(space.num_unmapped_regions(), 0u);

  ASSERT_EQ(dlclose(handle), 0);
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_LT(space.num_modules(), modules);
  EXPECT_GT(space.num_unmapped_regions(), 0u);
  SymbolizedPc s = space.Symbolize(pc);
  EXPECT_EQ(s.function_name, "strata_symbols_test_dso_function");
  EXPECT_TRUE(s.module_path.ends_with("strata_symbols_test_dso.so")) << s.module_path;
  const unwind::RuleSource* rules = nullptr;
  uint64_t module_pc = 0;
  EXPECT_TRUE(space.Lookup(pc, &rules, &module_pc));
  const size_t kept = space.num_unmapped_regions();
  ASSERT_TRUE(space.Refresh().ok());  // nothing changed: still kept
  EXPECT_EQ(space.num_unmapped_regions(), kept);

  // Code mapped over it (here anonymous: JIT code) is looked up where it is now.
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  void* at = reinterpret_cast<void*>(pc & ~(page - 1));
  void* jit = mmap(at, page, PROT_READ | PROT_EXEC,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(jit, at) << strerror(errno);
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_FALSE(space.Lookup(pc, &rules, &module_pc));
  EXPECT_EQ(space.Symbolize(pc).module_path, base::JitModuleName(""));
  munmap(jit, page);
}

TEST(SymbolsTest, UnwindsAndSymbolizesOwnStack) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  ASSERT_TRUE(space.Refresh().ok());
  unwind::testing::CapturedStack cap;
  unwind::testing::CaptureChainNoFp(4, &cap);
  unwind::Frame frames[128];
  unwind::UnwindResult r = unwind::Unwind(unwind::UnwindOptions(), cap.regs, cap.snapshot(), space,
                                          frames, 128);
  EXPECT_EQ(r.stop, unwind::StopReason::kOutermost) << unwind::StopReasonName(r.stop);
  std::vector<std::string> names;
  for (size_t i = 0; i < r.num_frames; ++i) names.push_back(space.Symbolize(frames[i].pc).function_name);
  ASSERT_GE(names.size(), 8u);
  EXPECT_NE(names[0].find("LeafNoFp"), std::string::npos) << names[0];
  for (int i = 1; i <= 4; ++i) EXPECT_NE(names[i].find("StepNoFp"), std::string::npos) << names[i];
  EXPECT_NE(names[5].find("CaptureChainNoFp"), std::string::npos) << names[5];
  EXPECT_NE(std::find(names.begin(), names.end(), "main"), names.end());
  EXPECT_EQ(names.back(), "_start");
}

// Debian's libc.so.6 is stripped: without libc6-dbg's debug file a thread's outermost frames
// are "libc.so.6+0x..."; with it, unwinding from the module and naming from the debug file.
TEST(SymbolsTest, ThreadStackEndsInLibcStartThreadAndClone3) {
  std::string libc;
  if (std::string missing = elf::testing::SystemLibcDebugFileMissing(&libc); !missing.empty()) {
    GTEST_SKIP() << missing;
  }
  unwind::testing::CapturedStack cap;
  std::thread([&cap] { unwind::testing::CaptureChainNoFp(2, &cap); }).join();
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_GE(cache.symbols_sources().debug_file, 1u);
  unwind::Frame frames[128];
  unwind::UnwindResult r = unwind::Unwind(unwind::UnwindOptions(), cap.regs, cap.snapshot(), space,
                                          frames, 128);
  EXPECT_EQ(r.stop, unwind::StopReason::kOutermost) << unwind::StopReasonName(r.stop);
  const std::vector<std::string> names = FrameNames(space, frames, r.num_frames);
  ASSERT_GE(names.size(), 3u);
  EXPECT_NE(names[0].find("LeafNoFp"), std::string::npos) << names[0];
  EXPECT_EQ(names[names.size() - 2], "start_thread") << absl::StrJoin(names, "\n");
  EXPECT_TRUE(names.back() == "__clone3" || names.back() == "clone3") << absl::StrJoin(names, "\n");
}

// ---------------------------------------------------------------------------- JIT code

// Machine code generated at run time into anonymous executable memory, the way a JIT compiler
// does: a frame-pointer frame that calls its first argument with its second,
//   push rbp; mov rbp, rsp; mov rax, rdi; mov rdi, rsi; call rax; pop rbp; ret
// with a second copy right after it (another "function" for the perf map), and a third
// function that does the same from a frame without a frame pointer, built as HotSpot's
// compiled methods build theirs (a stack bang, rbp pushed, 32 bytes allocated, rbp then used
// as a plain register):
//   mov [rsp - 0x100], eax; push rbp; sub rsp, 0x20; mov rax, rdi; mov rdi, rsi;
//   mov rbp, 1; call rax; add rsp, 0x20; pop rbp; ret
class JitCode {
 public:
  using Fn = void (*)(void (*)(void*), void*);
  static constexpr size_t kSize = 4096;
  static constexpr size_t kSecond = 64;  // offset of the second copy
  static constexpr size_t kFrameless = 128;  // offset of the third function
  // Its frame: rbp pushed from 8 on, the frame whole from 12 on, 48 bytes from sp to the CFA.
  static constexpr JitFrameLayout kFramelessLayout{8, 12, 48};

  JitCode() {
    void* p = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    static const uint8_t kCode[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0xf8, 0x48,
                                    0x89, 0xf7, 0xff, 0xd0, 0x5d, 0xc3};
    std::memset(p, 0xcc, kSize);
    std::memcpy(p, kCode, sizeof kCode);
    std::memcpy(static_cast<uint8_t*>(p) + kSecond, kCode, sizeof kCode);
    static const uint8_t kFramelessCode[] = {
        0x89, 0x84, 0x24, 0x00, 0xff, 0xff, 0xff, 0x55, 0x48, 0x83, 0xec, 0x20,
        0x48, 0x89, 0xf8, 0x48, 0x89, 0xf7, 0x48, 0xc7, 0xc5, 0x01, 0x00, 0x00,
        0x00, 0xff, 0xd0, 0x48, 0x83, 0xc4, 0x20, 0x5d, 0xc3};
    std::memcpy(static_cast<uint8_t*>(p) + kFrameless, kFramelessCode, sizeof kFramelessCode);
    if (mprotect(p, kSize, PROT_READ | PROT_EXEC) != 0) {
      munmap(p, kSize);
      return;
    }
    base_ = static_cast<uint8_t*>(p);
  }
  ~JitCode() {
    if (base_ != nullptr) munmap(base_, kSize);
  }
  bool ok() const { return base_ != nullptr; }
  uint64_t start() const { return Addr(base_); }
  Fn first() const { return reinterpret_cast<Fn>(base_); }
  Fn second() const { return reinterpret_cast<Fn>(base_ + kSecond); }
  Fn frameless() const { return reinterpret_cast<Fn>(base_ + kFrameless); }

 private:
  uint8_t* base_ = nullptr;
};

class JitSymbolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(code_.ok()) << "cannot map executable memory";
    char dir[] = "/tmp/strata_symbols_jit.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    map_ = dir_ + "/perf-42.map";
  }
  void TearDown() override {
    std::remove(map_.c_str());
    rmdir(dir_.c_str());
  }
  void AppendMap(const std::string& text) {
    std::ofstream out(map_, std::ios::app | std::ios::binary);
    out << text;
  }
  JitCode code_;
  std::string dir_, map_;
};

TEST_F(JitSymbolsTest, AnonymousCodeIsJitNamedFromThePerfMap) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  space.SetPerfMap(map_, "/tmp/perf-42.map");
  AppendMap(absl::StrFormat("%x 40 JS:*strataFirst /app/a.js:1:1\n", code_.start()));
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_GE(space.num_jit_regions(), 1u);

  const uint64_t pc = code_.start() + 10;
  const unwind::RuleSource* rules = nullptr;
  uint64_t module_pc = 0;
  EXPECT_FALSE(space.Lookup(pc, &rules, &module_pc)) << "JIT code is in no module";
  ASSERT_TRUE(space.LookupJit(pc, &rules, &module_pc));
  EXPECT_EQ(rules, nullptr);
  EXPECT_EQ(module_pc, pc);

  SymbolizedPc s = space.Symbolize(pc);
  EXPECT_EQ(s.function_name, "JS:*strataFirst /app/a.js:1:1");
  EXPECT_EQ(s.module_path, "[jit:/tmp/perf-42.map]");
  EXPECT_EQ(base::FrameKindOf(s.module_path), base::FrameKind::kJit);
  EXPECT_TRUE(s.known_function);
  EXPECT_EQ(s.function_start, code_.start());
  EXPECT_EQ(s.module_pc, pc);
  EXPECT_TRUE(s.build_id.empty());

  // No entry covers the second copy yet: unknown JIT code.
  const uint64_t second = code_.start() + JitCode::kSecond + 4;
  s = space.Symbolize(second);
  EXPECT_EQ(s.module_path, "[jit]");
  EXPECT_EQ(s.function_name, absl::StrFormat("[jit]+0x%x", second));
  EXPECT_FALSE(s.known_function);
  EXPECT_EQ(s.function_start, second);

  // The runtime appends; the next Refresh reads the new line.
  AppendMap(absl::StrFormat("%x 20 JS:*strataSecond /app/a.js:9:1\n",
                            code_.start() + JitCode::kSecond));
  ASSERT_TRUE(space.Refresh().ok());
  s = space.Symbolize(second);
  EXPECT_EQ(s.function_name, "JS:*strataSecond /app/a.js:9:1");
  EXPECT_EQ(s.function_start, code_.start() + JitCode::kSecond);

  // And so does a pc the map does not cover yet, without a Refresh (rate-limited).
  AppendMap(absl::StrFormat("0x%x 0x10 JS:~strataThird /app/a.js:20:1\n",
                            code_.start() + 0x200));
  std::this_thread::sleep_for(ProcessAddressSpace::kPerfMapRetry + std::chrono::milliseconds(50));
  const uint64_t generation = space.perf_map_generation();
  PerfMap::Symbol entry;
  ASSERT_TRUE(space.PerfMapEntryAt(code_.start() + 0x208, &entry));
  EXPECT_EQ(entry.name, "JS:~strataThird /app/a.js:20:1");
  EXPECT_EQ(space.perf_map_generation(), generation + 1);  // names read since may differ
  s = space.Symbolize(code_.start() + 0x208);
  EXPECT_EQ(s.function_name, "JS:~strataThird /app/a.js:20:1");
  EXPECT_EQ(space.perf_map_generation(), generation + 1);  // nothing new read
  // Code memory reused: the later entry wins.
  AppendMap(absl::StrFormat("%x 40 JS:*strataReused /app/b.js:1:1\n", code_.start()));
  ASSERT_TRUE(space.Refresh().ok());
  EXPECT_EQ(space.Symbolize(pc).function_name, "JS:*strataReused /app/b.js:1:1");

  // The kernel's code pages are not JIT code.
  auto maps = ReadProcMaps(getpid());
  ASSERT_TRUE(maps.ok());
  for (const MappingInfo& m : *maps) {
    if (m.path != "[vdso]" && m.path != "[vsyscall]") continue;
    EXPECT_FALSE(space.LookupJit(m.start, &rules, &module_pc)) << m.path;
    if (m.path == "[vdso]") {
      EXPECT_EQ(space.Symbolize(m.start + 16).module_path, "[vdso]");
    }
  }
}

// The unwinder meeting JIT code its map does not name yet counts it (a JVM is then asked for a
// new map: jvm/jvm_perf_maps.h), and the map read again names it, at most every
// kPerfMapRetry.
TEST_F(JitSymbolsTest, UnwinderCountsCodeTheMapDoesNotNameAndReadsTheMapAgain) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  space.SetPerfMap(map_, "/tmp/perf-42.map");
  AppendMap(absl::StrFormat("%x 40 JS:*strataFirst /app/a.js:1:1\n", code_.start()));
  ASSERT_TRUE(space.Refresh().ok());
  const unwind::RuleSource* rules = nullptr;
  uint64_t module_pc = 0;
  const uint64_t named = code_.start() + 10, newer = code_.start() + JitCode::kSecond + 4;
  ASSERT_TRUE(space.LookupJit(named, &rules, &module_pc));
  EXPECT_EQ(space.unnamed_jit_pcs(), 0u);
  ASSERT_TRUE(space.LookupJit(newer, &rules, &module_pc));
  ASSERT_TRUE(space.LookupJit(newer, &rules, &module_pc));
  EXPECT_EQ(space.unnamed_jit_pcs(), 2u);  // each walk that meets it
  EXPECT_FALSE(space.ReadPerfMapAgain()) << "the map gained nothing";

  AppendMap(absl::StrFormat("%x 20 JS:*strataSecond /app/a.js:9:1\n",
                            code_.start() + JitCode::kSecond));
  EXPECT_FALSE(space.ReadPerfMapAgain()) << "read again within kPerfMapRetry";
  std::this_thread::sleep_for(ProcessAddressSpace::kPerfMapRetry + std::chrono::milliseconds(50));
  EXPECT_TRUE(space.ReadPerfMapAgain());
  ASSERT_TRUE(space.LookupJit(newer, &rules, &module_pc));
  EXPECT_EQ(space.unnamed_jit_pcs(), 2u);
}

TEST_F(JitSymbolsTest, WithoutPerfMapJitCodeIsUnknownJit) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  space.SetPerfMap(map_, "/tmp/perf-42.map");  // never written
  ASSERT_TRUE(space.Refresh().ok());
  SymbolizedPc s = space.Symbolize(code_.start());
  EXPECT_EQ(s.module_path, base::JitModuleName(""));
  EXPECT_EQ(s.function_name, absl::StrFormat("[jit]+0x%x", code_.start()));
  EXPECT_FALSE(s.known_function);
}

TEST(SymbolsMappingTest, WhichMappingsAreJitRegions) {
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  space.SetPerfMap("/nonexistent/perf.map", "/tmp/perf-1.map");
  std::vector<MappingInfo> maps = {
      {0x10000, 0x11000, 0, true, 0, ""},
      {0x20000, 0x21000, 0, true, 0, "[anon:v8 code]"},
      {0x30000, 0x31000, 0, false, 0, ""},  // data
      {0x40000, 0x41000, 0, true, 0, "[vsyscall]"},
      {0x50000, 0x51000, 0, true, 0, "[uprobes]"},
      {0x60000, 0x61000, 0, true, 0, "[heap]"},
  };
  EXPECT_TRUE(space.Refresh(maps).ok());
  EXPECT_EQ(space.num_jit_regions(), 2u);
  const unwind::RuleSource* rules = nullptr;
  uint64_t module_pc = 0;
  EXPECT_TRUE(space.LookupJit(0x10000, &rules, &module_pc));
  EXPECT_TRUE(space.LookupJit(0x20fff, &rules, &module_pc));
  EXPECT_FALSE(space.LookupJit(0x21000, &rules, &module_pc));
  for (uint64_t pc : {0x30000u, 0x40000u, 0x50000u, 0x60000u, 0xfffu}) {
    EXPECT_FALSE(space.LookupJit(pc, &rules, &module_pc)) << pc;
  }
  EXPECT_EQ(space.Symbolize(0x40000).module_path, "");
}

// The stack a sampler sees inside a callback called from JIT code: CFI-described frames,
// the JIT frame (no CFI: frame pointers), and the test's frames again beyond it, up to _start.
struct JitCapture {
  unwind::testing::CapturedStack stack;
};

__attribute__((noinline)) void CaptureFromJit(void* arg) {
  const int v = unwind::testing::CaptureChainNoFp(2, &static_cast<JitCapture*>(arg)->stack);
  asm volatile("" : : "r"(v) : "memory");  // not a tail call: this frame stays on the stack
}

TEST_F(JitSymbolsTest, UnwindsThroughJitCodeByFramePointers) {
  AppendMap(absl::StrFormat("%x 40 JS:*strataTrampoline /app/a.js:3:1\n", code_.start()));
  JitCapture cap;
  code_.first()(&CaptureFromJit, &cap);
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  space.SetPerfMap(map_, "/tmp/perf-42.map");
  ASSERT_TRUE(space.Refresh().ok());
  for (bool fallback : {true, false}) {
    unwind::UnwindOptions options;
    options.frame_pointer_fallback = fallback;  // JIT frames are left by frame pointers anyway
    unwind::Frame frames[128];
    unwind::UnwindResult r =
        unwind::Unwind(options, cap.stack.regs, cap.stack.snapshot(), space, frames, 128);
    EXPECT_EQ(r.stop, unwind::StopReason::kOutermost) << unwind::StopReasonName(r.stop);
    EXPECT_EQ(r.jit_frames_fp, 1u);
    EXPECT_EQ(r.jit_frames_cfi, 0u);
    const std::vector<std::string> names = FrameNames(space, frames, r.num_frames);
    auto at = [&](std::string_view what) {
      return std::find_if(names.begin(), names.end(),
                          [&](const std::string& n) { return n.find(what) != std::string::npos; }) -
             names.begin();
    };
    const auto jit = at("strataTrampoline");
    ASSERT_LT(static_cast<size_t>(jit), names.size()) << absl::StrJoin(names, "\n");
    EXPECT_EQ(at("CaptureFromJit"), jit - 1);
    EXPECT_LT(at("JitSymbolsTest_UnwindsThroughJitCodeByFramePointers"), names.size());
    EXPECT_GT(at("JitSymbolsTest_UnwindsThroughJitCodeByFramePointers"), jit);
    EXPECT_NE(std::find(names.begin(), names.end(), "main"), names.end());
    EXPECT_EQ(names.back(), "_start");
  }
  // Without knowing the JIT region (an address space of modules only), the walk ends there.
  struct ModulesOnly final : unwind::AddressSpace {
    const ProcessAddressSpace* space;
    bool Lookup(uint64_t pc, const unwind::RuleSource** rules, uint64_t* module_pc) const override {
      return space->Lookup(pc, rules, module_pc);
    }
  } modules_only;
  modules_only.space = &space;
  unwind::Frame frames[128];
  unwind::UnwindResult r = unwind::Unwind({}, cap.stack.regs, cap.stack.snapshot(), modules_only,
                                          frames, 128);
  EXPECT_EQ(r.stop, unwind::StopReason::kNoModule);
}

// Layouts as a runtime's conventions would give them: JitCode's frameless function's only.
class FramelessLayouts final : public JitFrameLayouts {
 public:
  std::optional<JitFrameLayout> Layout(uint64_t start, uint64_t size,
                                       std::string_view name) const override {
    ++asked;
    if (name.find("strataFrameless") == std::string_view::npos) return std::nullopt;
    return JitCode::kFramelessLayout;
  }
  mutable int asked = 0;
};

TEST_F(JitSymbolsTest, UnwindsThroughJitCodeWithoutFramePointerByItsLayout) {
  const uint64_t frameless = code_.start() + JitCode::kFrameless;
  AppendMap(absl::StrFormat("%x 40 JS:*strataTrampoline /app/a.js:3:1\n", code_.start()));
  AppendMap(absl::StrFormat("%x 40 long Strata.strataFrameless(long)\n", frameless));
  JitCapture cap;
  code_.frameless()(&CaptureFromJit, &cap);
  ModuleCache cache;
  ProcessAddressSpace space(getpid(), &cache);
  space.SetPerfMap(map_, "/tmp/perf-42.map");
  ASSERT_TRUE(space.Refresh().ok());
  unwind::Frame frames[128];
  // By frame pointers the walk reads the frame's "rbp" (1) and ends there.
  unwind::UnwindResult r =
      unwind::Unwind({}, cap.stack.regs, cap.stack.snapshot(), space, frames, 128);
  EXPECT_NE(r.stop, unwind::StopReason::kOutermost);

  auto owned = std::make_unique<FramelessLayouts>();
  const FramelessLayouts* layouts = owned.get();
  space.SetJitFrameLayouts(std::move(owned));
  r = unwind::Unwind({}, cap.stack.regs, cap.stack.snapshot(), space, frames, 128);
  EXPECT_EQ(r.stop, unwind::StopReason::kOutermost) << unwind::StopReasonName(r.stop);
  EXPECT_EQ(r.jit_frames_cfi, 1u);
  EXPECT_EQ(r.jit_frames_fp, 0u);
  const std::vector<std::string> names = FrameNames(space, frames, r.num_frames);
  const auto jit = std::find(names.begin(), names.end(), "long Strata.strataFrameless(long)");
  ASSERT_NE(jit, names.end()) << absl::StrJoin(names, "\n");
  EXPECT_NE(jit[-1].find("CaptureFromJit"), std::string::npos) << absl::StrJoin(names, "\n");
  EXPECT_NE(jit[1].find("UnwindsThroughJitCodeWithoutFramePointerByItsLayout"),
            std::string::npos) << absl::StrJoin(names, "\n");
  EXPECT_EQ(names.back(), "_start");
  EXPECT_EQ(layouts->asked, 1);
  EXPECT_EQ(space.jit_layouts_known(), 1u);

  // Asked once per code object until the map changes: the code may have been replaced.
  r = unwind::Unwind({}, cap.stack.regs, cap.stack.snapshot(), space, frames, 128);
  EXPECT_EQ(layouts->asked, 1);
  AppendMap(absl::StrFormat("%x 40 JS:*strataSecond /app/a.js:9:1\n",
                            code_.start() + JitCode::kSecond));
  ASSERT_TRUE(space.Refresh().ok());
  r = unwind::Unwind({}, cap.stack.regs, cap.stack.snapshot(), space, frames, 128);
  EXPECT_EQ(r.stop, unwind::StopReason::kOutermost);
  EXPECT_EQ(layouts->asked, 2);

  // Rows across the entry code: nothing pushed yet, rbp pushed, the whole frame.
  const unwind::RuleSource* rules = nullptr;
  uint64_t offset = 0;
  unwind::UnwindRow row;
  for (auto [at, cfa, fp] : {std::tuple{0, 8, false}, {7, 8, false}, {8, 16, true},
                             {11, 16, true}, {12, 48, true}, {30, 48, true}}) {
    ASSERT_TRUE(space.LookupJit(frameless + at, &rules, &offset));
    ASSERT_NE(rules, nullptr);
    EXPECT_EQ(offset, static_cast<uint64_t>(at));
    ASSERT_TRUE(rules->FindRow(offset, /*innermost=*/true, &row));
    EXPECT_EQ(row.cfa_base, unwind::UnwindRow::CfaBase::kSp) << at;
    EXPECT_EQ(row.cfa_offset, cfa) << at;
    EXPECT_EQ(row.ra_offset, -8) << at;
    EXPECT_EQ(row.fp_rule == unwind::UnwindRow::FpRule::kAtCfaOffset, fp) << at;
  }
  // Code the layouts know nothing of keeps the frame-pointer walk.
  ASSERT_TRUE(space.LookupJit(code_.start() + 4, &rules, &offset));
  EXPECT_EQ(rules, nullptr);
}

TEST(SymbolsTest, ReadProcMapsParsesSelf) {
  auto maps = ReadProcMaps(getpid());
  ASSERT_TRUE(maps.ok());
  bool exec_file = false, stack = false;
  for (const MappingInfo& m : *maps) {
    exec_file |= m.exec && !m.path.empty() && m.path[0] == '/' && m.inode != 0;
    stack |= m.path == "[stack]";
    EXPECT_LT(m.start, m.end);
  }
  EXPECT_TRUE(exec_file);
  EXPECT_TRUE(stack);
  EXPECT_FALSE(ReadProcMaps(-5).ok());

  // The executable ones alone: the same entries as the full read keeps with exec set.
  auto code = ReadExecutableMappings(getpid());
  ASSERT_TRUE(code.ok());
  std::vector<std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, std::string>> expected, got;
  for (const MappingInfo& m : *maps) {
    if (m.exec) expected.emplace_back(m.start, m.end, m.offset, m.inode, m.path);
  }
  for (const MappingInfo& m : *code) {
    EXPECT_TRUE(m.exec);
    got.emplace_back(m.start, m.end, m.offset, m.inode, m.path);
  }
  EXPECT_FALSE(got.empty());
  EXPECT_EQ(got, expected);
  EXPECT_FALSE(ReadExecutableMappings(-5).ok());
}

}  // namespace
}  // namespace strata::agent::symbols
