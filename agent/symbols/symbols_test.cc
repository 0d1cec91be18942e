#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "agent/symbols/process_address_space.h"
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
}

}  // namespace
}  // namespace strata::agent::symbols
