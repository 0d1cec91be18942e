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
    auto r = otlp::ConvertRequest(request, {}, "", options.to_ms);
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

// A profile with lines, as ExpandLines gives one: Spin inlined into checksum_block at the
// leaf, a Python caller at its call's line.
TEST(OtlpExportTest, LinesAreWrittenWithTheirInlineChains) {
  Profile p;
  p.functions = {Function(1, "main", "/usr/bin/app", "ab12"),
                 Function(2, "handler", "[python:/srv/h.py]"),
                 Function(3, "checksum_block", "/usr/bin/app", "ab12"),
                 Function(3, "Spin", "/usr/bin/app", "ab12")};
  p.functions[0].file = "app.cc";
  p.functions[0].line = 10;
  p.functions[1].file = "/srv/h.py";
  p.functions[1].line = 7;
  p.functions[2].file = "app.cc";
  p.functions[2].line = 40;
  p.functions[3].file = "spin.h";
  p.functions[3].line = 80;
  p.functions[3].inlined = true;
  p.stacks = {Stack(10, 6, {0, 1, 2, 3})};
  p.total = 6;
  OtlpExportOptions options;
  options.service = "svc";
  options.from_ms = 1'700'000'000'000;
  auto data = EncodeOtlp({{"host-1", p}}, options);
  ASSERT_TRUE(data.ok()) << data.status();
  otlp::otlp_v1::ExportProfilesServiceRequest request;
  ASSERT_TRUE(request.ParseFromString(*data));
  const auto& d = request.dictionary();
  // Leaf first: the leaf's location holds Spin then checksum_block, innermost first.
  const auto& stack = d.stack_table(
      request.resource_profiles(0).scope_profiles(0).profiles(0).samples(0).stack_index());
  std::vector<std::string> locations;
  for (int32_t l : stack.location_indices()) {
    std::string text;
    for (const auto& line : d.location_table(l).lines()) {
      const auto& f = d.function_table(line.function_index());
      text += d.string_table(f.name_strindex()) + " " + d.string_table(f.filename_strindex()) +
              ":" + std::to_string(line.line()) + "; ";
    }
    locations.push_back(text);
  }
  EXPECT_THAT(locations, ElementsAre("Spin spin.h:80; checksum_block app.cc:40; ",
                                     "handler /srv/h.py:7; ", "main app.cc:10; "));
  // Read back, the inlined function is a frame of its own (as any OTLP sender's inline chain),
  // the Python caller's line its call site.
  auto r = otlp::ConvertRequest(request, {}, "", options.from_ms);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->cells.size(), 1u);
  EXPECT_EQ(r->cells[0].count, 6u);
  EXPECT_THAT(Frames(*r, r->cells[0].stack),
              ElementsAre("main (/usr/bin/app)", "handler ([python:/srv/h.py])",
                          "checksum_block (/usr/bin/app)", "Spin (/usr/bin/app)"));
  EXPECT_THAT(r->stacks[r->cells[0].stack].call_sites, ElementsAre(0, 8, 0));
}

TEST(OtlpExportTest, WallIsRefused) {
  OtlpExportOptions options;
  options.type = v1::PROFILE_WALL;
  EXPECT_FALSE(EncodeOtlp({{"h", EveryKind()}}, options).ok());
}

}  // namespace
}  // namespace strata::server::query
