#include "server/query/otlp_export.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/otlp/otlp_convert.h"

namespace strata::server::query {
namespace {

using ::testing::ElementsAre;

// A profile with a frame of every kind: native (with a build ID), kernel, Python, JIT from a
// perf map, a JVM frame and a Ruby frame as an OTLP sender named them, and an unnamed one.
ResolvedFunction Function(uint64_t id, std::string name, std::string module,
                          std::string build_id = "") {
  ResolvedFunction f;
  f.id = id;
  f.name = std::move(name);
  f.module = std::move(module);
  f.build_id = std::move(build_id);
  return f;
}

ResolvedStack Stack(uint64_t id, uint64_t count, std::vector<uint32_t> frames,
                    bool truncated = false) {
  ResolvedStack s;
  s.stack_id = id;
  s.count = count;
  s.frames.assign(frames.begin(), frames.end());
  s.truncated = truncated;
  return s;
}

Profile EveryKind() {
  Profile p;
  p.functions = {Function(1, "main", "/usr/bin/app", "ab12"),
                 Function(2, "ksys_read", "[kernel.kallsyms]"),
                 Function(3, "handler", "[python:/srv/h.py]"),
                 Function(4, "LFoo;.bar", "[jit:/tmp/perf-7.map]"),
                 Function(5, "Main.run", "[jit:hotspot]"),
                 Function(6, "Foo#bar", "[ruby:app.rb]"),
                 Function(7, "libc.so.6+0x1230", "/usr/lib/libc.so.6"),
                 Function(8, "int app.Main.run(long)", "[java:app/Main.java]")};
  p.stacks = {Stack(10, 9, {0, 2, 1}), Stack(11, 4, {3, 4, 5, 6, 7}, /*truncated=*/true)};
  p.total = 13;
  return p;
}

std::vector<std::string> Frames(const otlp::ConvertedRequest& r, uint32_t stack) {
  std::vector<std::string> out;
  for (uint32_t f : r.stacks[stack].functions) {
    out.push_back(r.functions[f].name + " (" + r.functions[f].module + ")");
  }
  return out;
}

TEST(OtlpExportTest, ReadsBackAsTheSameStacksAndCounts) {
  for (v1::ProfileType type : {v1::PROFILE_CPU, v1::PROFILE_OFF_CPU}) {
    OtlpExportOptions options;
    options.service = "svc";
    options.from_ms = 1'700'000'000'000;
    options.to_ms = 1'700'000'060'000;
    options.type = type;
    options.rate_hz = 99;
    auto data = EncodeOtlp({{"host-1", EveryKind()}}, options);
    ASSERT_TRUE(data.ok()) << data.status();
    otlp::otlp_v1::ExportProfilesServiceRequest request;
    ASSERT_TRUE(request.ParseFromString(*data));
    auto r = otlp::ConvertRequest(request, {}, "", 0);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->cells.size(), 2u);
    EXPECT_EQ(r->cells[0].service, "svc");
    EXPECT_EQ(r->cells[0].host, "host-1");
    EXPECT_EQ(r->cells[0].window_start_ms, 1'700'000'000'000);
    EXPECT_EQ(r->cells[0].count, 9u);
    EXPECT_EQ(r->cells[1].count, 4u);
    EXPECT_EQ(r->cells[0].labels.empty(), type == v1::PROFILE_CPU);
    EXPECT_THAT(Frames(*r, r->cells[0].stack),
                ElementsAre("main (/usr/bin/app)", "handler ([python:/srv/h.py])",
                            "ksys_read ([kernel.kallsyms])"));
    EXPECT_EQ(r->functions[r->stacks[r->cells[0].stack].functions[0]].build_id, "ab12");
    EXPECT_THAT(Frames(*r, r->cells[1].stack),
                ElementsAre("LFoo;.bar ([jit:/tmp/perf-7.map])", "Main.run ([jit:hotspot])",
                            "Foo#bar ([ruby:app.rb])", "libc.so.6+0x1230 (/usr/lib/libc.so.6)",
                            "int app.Main.run(long) ([java:app/Main.java])"));
    EXPECT_TRUE(r->stacks[r->cells[1].stack].truncated);
  }
}

TEST(OtlpExportTest, WallIsRefused) {
  OtlpExportOptions options;
  options.type = v1::PROFILE_WALL;
  EXPECT_FALSE(EncodeOtlp({{"h", EveryKind()}}, options).ok());
}

}  // namespace
}  // namespace strata::server::query
