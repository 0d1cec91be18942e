#include "server/query/quality.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::server::query {
namespace {

TEST(QualityTest, FramesCountedByKindAndBinariesNamedByKind) {
  Profile profile;
  auto add = [&](std::string name, std::string module) {
    ResolvedFunction f;
    f.id = profile.functions.size() + 1;
    f.name = std::move(name);
    f.module = std::move(module);
    profile.functions.push_back(f);
    return static_cast<uint32_t>(profile.functions.size() - 1);
  };
  const uint32_t goexit = add("runtime.goexit.abi0", "/srv/api");
  const uint32_t handler = add("main.handle", "/srv/api");
  const uint32_t unnamed_go = add("/srv/api+0x1234", "/srv/api");
  const uint32_t libc = add("write", "/usr/lib/x86_64-linux-gnu/libc.so.6");
  const uint32_t kernel = add("ksys_write", "[kernel.kallsyms]");
  const uint32_t eval = add("main", "[python:/srv/app.py]");
  const uint32_t jit = add("[jit]+0x7f00", "[jit]");
  const uint32_t c_main = add("main", "/usr/bin/tool");
  const uint32_t named_jit = add("long Spin.hotLoop(long)", "[jit:/tmp/perf-7.map]");
  const uint32_t lib = add("step", "/opt/lib/libstep.so");
  profile.stacks = {
      {1, 10, false, {goexit, handler, libc, kernel}},
      {2, 5, false, {goexit, unnamed_go}},
      {3, 3, true, {eval, jit}},
      {4, 2, false, {c_main, libc}},
      {5, 4, true, {named_jit}},
      {6, 1, true, {lib}},
  };
  const v1::QualityResponse r = StackQuality(profile, {});
  ASSERT_EQ(r.frames_by_kind_size(), 5);
  // go: 10*2 + 5*2 frames (5 unnamed); native: libc 10 + 2, tool 2, libstep 1; kernel 10;
  // python 3; jit 3 + 4.
  EXPECT_EQ(r.frames_by_kind(0).kind(), "go");
  EXPECT_EQ(r.frames_by_kind(0).frames(), 30u);
  EXPECT_EQ(r.frames_by_kind(0).unnamed_frames(), 5u);
  EXPECT_EQ(r.frames_by_kind(1).kind(), "native");
  EXPECT_EQ(r.frames_by_kind(1).frames(), 15u);
  EXPECT_EQ(r.frames_by_kind(2).kind(), "kernel");
  EXPECT_EQ(r.frames_by_kind(2).frames(), 10u);
  EXPECT_EQ(r.frames_by_kind(3).kind(), "jit");  // by frames: 7 against python's 3
  EXPECT_EQ(r.frames_by_kind(3).frames(), 7u);
  EXPECT_EQ(r.frames_by_kind(3).unnamed_frames(), 3u);
  EXPECT_EQ(r.frames_by_kind(4).kind(), "python");
  uint64_t sum = 0;
  for (const auto& k : r.frames_by_kind()) sum += k.frames();
  EXPECT_EQ(sum, r.frames());
  for (const v1::BinaryQuality& b : r.binaries()) {
    if (b.module() == "/srv/api") {
      EXPECT_EQ(b.kind(), "go");
      EXPECT_EQ(b.unnamed_frames(), 5u);
      EXPECT_FALSE(b.hint().empty());
    }
    if (b.module() == "/usr/bin/tool") {
      EXPECT_EQ(b.kind(), "native");
    }
    if (b.module() == "[jit]") {
      EXPECT_EQ(b.kind(), "jit");
      EXPECT_NE(b.hint().find("perf map"), std::string::npos) << b.hint();
    }
    // Named, but stacks end there: a hint about unwinding, not about names.
    if (b.module() == "[jit:/tmp/perf-7.map]") {
      EXPECT_EQ(b.truncated_here(), 4u);
      EXPECT_NE(b.hint().find("frame pointer"), std::string::npos) << b.hint();
    }
    if (b.module() == "/opt/lib/libstep.so") {
      EXPECT_NE(b.hint().find("unwind rules"), std::string::npos) << b.hint();
      EXPECT_NE(b.hint().find("--stack-bytes"), std::string::npos) << b.hint();
      EXPECT_NE(b.hint().find("--max-frames"), std::string::npos) << b.hint();
    }
  }
}

// A pc the agent found in no mapping has no module: no debug file can name it.
TEST(QualityTest, FramesInNoKnownMappingAreNotSentToDebugFiles) {
  Profile profile;
  profile.functions = {{1, "main", "/srv/tool"}, {2, "[unknown]", ""}};
  profile.stacks = {{1, 3, true, {1}}, {2, 5, false, {0}}};
  const v1::QualityResponse r = StackQuality(profile, {});
  ASSERT_EQ(r.binaries_size(), 2);
  const v1::BinaryQuality& unknown = r.binaries(0);  // the unnamed frames first
  EXPECT_EQ(unknown.module(), "");
  EXPECT_EQ(unknown.unnamed_frames(), 3u);
  EXPECT_EQ(unknown.hint().find("debuginfo upload"), std::string::npos) << unknown.hint();
  EXPECT_NE(unknown.hint().find("no mapping"), std::string::npos) << unknown.hint();
}

TEST(QualityTest, GoStackRoots) {
  EXPECT_TRUE(IsGoStackRoot("runtime.goexit"));
  EXPECT_TRUE(IsGoStackRoot("runtime.mstart"));
  EXPECT_TRUE(IsGoStackRoot("runtime.rt0_go.abi0"));
  EXPECT_FALSE(IsGoStackRoot("runtime.main"));
  EXPECT_FALSE(IsGoStackRoot("main"));
}

}  // namespace
}  // namespace strata::server::query
