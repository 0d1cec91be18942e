#include "server/otlp/otlp_convert.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/otlp/otlp_builder.h"

namespace strata::server::otlp {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

constexpr uint64_t kSecond = 1'000'000'000;
constexpr uint64_t kT0 = 1'700'000'000 * kSecond;  // a window start (divisible by 10 s)
constexpr int64_t kNowMs = 1'800'000'000'000;

// "name (module)" of each frame of a stack, outermost first.
std::vector<std::string> Frames(const ConvertedRequest& r, uint32_t stack) {
  std::vector<std::string> out;
  for (uint32_t f : r.stacks[stack].functions) {
    out.push_back(r.functions[f].name + " (" + r.functions[f].module + ")");
  }
  return out;
}

// What the OTel eBPF profiler sends for a Go service calling into the kernel and a Python
// service: resource attributes, frame types on locations, sample attributes, timestamps.
class OtlpConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int32_t go_binary = b_.Mapping("/usr/bin/api", "b1d0", 0x400000, 0x800000, 0);
    const int32_t vmlinux = b_.Mapping("vmlinux");
    const int32_t libpython = b_.Mapping("/usr/lib/libpython3.11.so");
    main_ = b_.Location(go_binary, 0x401000, {{"main.main", "main.go", 10}}, "go");
    // handle() with encode() inlined into it: one location, two lines, innermost first.
    handle_ = b_.Location(go_binary, 0x402000,
                          {{"main.encode", "enc.go", 5}, {"main.handle", "main.go", 20}}, "go");
    write_ = b_.Location(vmlinux, 0xffffffff81000000, {{"ksys_write", "", 0}}, "kernel");
    py_run_ = b_.Location(libpython, 0, {{"run", "/srv/app.py", 3}}, "cpython");
    py_work_ = b_.Location(libpython, 0, {{"work", "/srv/app.py", 9}}, "cpython");
  }

  absl::StatusOr<ConvertedRequest> Convert(const std::string& forced_host = "") {
    return ConvertRequest(b_.request(), {}, forced_host, kNowMs);
  }

  RequestBuilder b_;
  int32_t main_, handle_, write_, py_run_, py_work_;
};

TEST_F(OtlpConvertTest, StacksFramesKindsAndLabels) {
  auto* api = b_.AddResource({{"service.name", "api"}, {"host.name", "host-1"},
                              {"k8s.namespace.name", "prod"}, {"process.pid", "42"}});
  auto* cpu = b_.AddProfile(api, "samples", "count", kT0, "cpu", 50'000'000);
  const int32_t go_stack = b_.Stack({write_, handle_, main_});  // leaf first
  const auto attrs = b_.AttributeList({{"container.id", "c1"},
                                       {"process.executable.name", "api"},
                                       {"thread.name", "worker-3"}});
  b_.AddSample(cpu, go_stack, attrs, 1, kT0 + 1 * kSecond);
  b_.AddSample(cpu, go_stack, attrs, 1, kT0 + 2 * kSecond);
  b_.AddSample(cpu, go_stack, attrs, 1, kT0 + 12 * kSecond);  // the next window
  auto* py = b_.AddResource({{"service.name", "worker"}, {"host.name", "host-2"}});
  auto* py_cpu = b_.AddProfile(py, "samples", "count", kT0);
  b_.AddSample(py_cpu, b_.Stack({py_work_, py_run_}), {}, 7);

  auto r = Convert();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->profiles, 2u);
  EXPECT_EQ(r->samples, 10u);
  ASSERT_EQ(r->cells.size(), 3u);
  const ConvertedCell& first = r->cells[0];
  EXPECT_EQ(first.service, "api");
  EXPECT_EQ(first.host, "host-1");
  EXPECT_EQ(first.window_start_ms, static_cast<int64_t>(kT0 / 1'000'000));
  EXPECT_EQ(first.count, 2u);
  // process.pid and thread.name would make a label set per process and thread: dropped.
  EXPECT_THAT(first.labels, ElementsAre(Pair("container.id", "c1"),
                                        Pair("k8s.namespace.name", "prod"),
                                        Pair("process.executable.name", "api")));
  EXPECT_THAT(Frames(*r, first.stack),
              ElementsAre("main.main (/usr/bin/api)", "main.handle (/usr/bin/api)",
                          "main.encode (/usr/bin/api)", "ksys_write ([kernel.kallsyms])"));
  EXPECT_EQ(r->functions[r->stacks[first.stack].functions[0]].build_id, "b1d0");
  EXPECT_EQ(r->cells[1].count, 1u);
  EXPECT_EQ(r->cells[1].window_start_ms, first.window_start_ms + 10'000);
  const ConvertedCell& python = r->cells[2];
  EXPECT_EQ(python.service, "worker");
  EXPECT_EQ(python.host, "host-2");
  EXPECT_EQ(python.count, 7u);
  EXPECT_TRUE(python.labels.empty());
  EXPECT_THAT(Frames(*r, python.stack),
              ElementsAre("run ([python:/srv/app.py])", "work ([python:/srv/app.py])"));
}

// A Python or Java frame's line is where it is: a caller's becomes its call site (line + 1, as
// agents send one), a CPU sample's leaf's its leaf line (what agents send as leaf addresses).
TEST_F(OtlpConvertTest, PythonAndJavaLinesBecomeCallSitesAndLeafLines) {
  const int32_t libpython = b_.Mapping("/usr/lib/libpython3.11.so");
  const int32_t libjvm = b_.Mapping("/usr/lib/jvm/lib/server/libjvm.so");
  auto py = [&](const char* function, int64_t line) {
    return b_.Location(libpython, 0, {{function, "/srv/app.py", line}}, "cpython");
  };
  auto* worker = b_.AddResource({{"service.name", "worker"}, {"host.name", "host-2"}});
  auto* cpu = b_.AddProfile(worker, "samples", "count", kT0);
  b_.AddSample(cpu, b_.Stack({py_work_, py_run_}), {}, 7);                // work:9 < run:3
  b_.AddSample(cpu, b_.Stack({py("work", 11), py_run_}), {}, 2);          // work:11 < run:3
  b_.AddSample(cpu, b_.Stack({py_work_, py("run", 5)}), {}, 1);           // work:9 < run:5
  // fib:4 < fib:6 < main:10: no call site inside the recursion.
  b_.AddSample(cpu, b_.Stack({py("fib", 4), py("fib", 6), py("main", 10)}), {}, 3);
  b_.AddSample(cpu, b_.Stack({write_, handle_, main_}), {}, 1);           // native: none
  auto* java = b_.AddProfile(
      b_.AddResource({{"service.name", "orders"}, {"host.name", "host-3"}}), "samples",
      "count", kT0);
  b_.AddSample(java,
               b_.Stack({b_.Location(libjvm, 0, {{"Spin.inner", "Spin.java", 6}}, "jvm"),
                         b_.Location(libjvm, 0, {{"Spin.main", "Spin.java", 2}}, "jvm")}),
               {}, 4);
  auto* off_cpu = b_.AddProfile(worker, "off_cpu", "nanoseconds", kT0, "off_cpu", 1000);
  b_.AddSample(off_cpu, b_.Stack({py_work_, py_run_}), {}, 5000);        // no leaf lines

  auto r = Convert();
  ASSERT_TRUE(r.ok()) << r.status();
  auto stack_of = [&](const std::vector<std::string>& frames,
                      const std::vector<uint64_t>& call_sites) -> const ConvertedCell* {
    for (const ConvertedCell& cell : r->cells) {
      if (Frames(*r, cell.stack) == frames && r->stacks[cell.stack].call_sites == call_sites &&
          cell.labels.empty()) {
        return &cell;
      }
    }
    return nullptr;
  };
  const std::string run = "run ([python:/srv/app.py])", work = "work ([python:/srv/app.py])";
  const ConvertedCell* at_3 = stack_of({run, work}, {4});
  ASSERT_NE(at_3, nullptr);
  EXPECT_EQ(at_3->count, 9u);  // the leaf's line is not the stack's
  const ConvertedCell* at_5 = stack_of({run, work}, {6});
  ASSERT_NE(at_5, nullptr);
  EXPECT_EQ(at_5->count, 1u);
  const std::string fib = "fib ([python:/srv/app.py])";
  const ConvertedCell* recursive = stack_of({"main ([python:/srv/app.py])", fib, fib}, {11, 0});
  ASSERT_NE(recursive, nullptr);
  EXPECT_EQ(recursive->count, 3u);
  EXPECT_NE(stack_of({"main.main (/usr/bin/api)", "main.handle (/usr/bin/api)",
                      "main.encode (/usr/bin/api)", "ksys_write ([kernel.kallsyms])"},
                     {}),
            nullptr);
  EXPECT_NE(stack_of({"Spin.main ([java:Spin.java])", "Spin.inner ([java:Spin.java])"}, {3}),
            nullptr);

  std::vector<std::string> leaf_lines;
  for (const ConvertedLeafLine& l : r->leaf_lines) {
    EXPECT_EQ(l.window_start_ms, static_cast<int64_t>(kT0 / 1'000'000));
    leaf_lines.push_back(absl::StrCat(l.service, " ", l.host, " ", r->functions[l.function].name,
                                      ":", l.line, " ", l.count));
  }
  EXPECT_THAT(leaf_lines, ::testing::UnorderedElementsAre(
                              "worker host-2 work:9 8", "worker host-2 work:11 2",
                              "worker host-2 fib:4 3", "orders host-3 Spin.inner:6 4"));
}

TEST_F(OtlpConvertTest, NanosecondsBecomeSamplingPeriods) {
  auto* api = b_.AddResource({{"service.name", "api"}, {"host.name", "h"}});
  // CPU time with a 10 ms period: 35 ms is 3.5 periods, rounded to 4.
  auto* cpu = b_.AddProfile(api, "cpu", "nanoseconds", kT0, "cpu", 10'000'000);
  b_.AddSample(cpu, b_.Stack({main_}), {}, 35'000'000);
  // Off-CPU time as the eBPF profiler sends it (no period): at the agents' 99 Hz.
  auto* off = b_.AddProfile(api, "events", "nanoseconds", kT0);
  b_.AddSample(off, b_.Stack({handle_, main_}), {}, 2 * 1'000'000'000);
  auto r = Convert();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->cells.size(), 2u);
  EXPECT_EQ(r->cells[0].count, 4u);
  EXPECT_TRUE(r->cells[0].labels.empty());
  EXPECT_EQ(r->cells[1].count, 198u);
  EXPECT_THAT(r->cells[1].labels, ElementsAre(Pair("__profile__", "off-cpu")));
}

TEST_F(OtlpConvertTest, UnsymbolizedNativeFramesAndMissingNames) {
  const int32_t libc = b_.Mapping("/usr/lib/libc.so.6", "abcd", 0x7f0000000000, 0x7f0000100000,
                                  0x1000);
  const int32_t raw = b_.Location(libc, 0x7f0000000230, {}, "native");
  auto* r0 = b_.AddResource({{"process.executable.name", "batch"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", 0);
  b_.AddSample(cpu, b_.Stack({raw}), {}, 3);
  b_.AddSample(cpu, 0, {}, 2);  // the empty stack: its samples still count
  auto r = Convert();
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->cells.size(), 2u);
  EXPECT_EQ(r->cells[0].service, "unknown_service:batch");
  EXPECT_EQ(r->cells[0].host, "unknown");
  EXPECT_EQ(r->cells[0].window_start_ms, kNowMs);  // no time: now's window
  EXPECT_THAT(Frames(*r, r->cells[0].stack), ElementsAre("libc.so.6+0x1230 (/usr/lib/libc.so.6)"));
  EXPECT_THAT(Frames(*r, r->cells[1].stack), ElementsAre("[unknown] ([unknown])"));
  EXPECT_EQ(r->cells[1].count, 2u);
}

TEST_F(OtlpConvertTest, OtherFrameKindsKeptByName) {
  const int32_t rb = b_.Location(b_.Mapping(""), 0, {{"Foo#bar", "app.rb", 1}}, "ruby");
  const int32_t jvm = b_.Location(b_.Mapping(""), 0, {{"Main.run", "Main.java", 1}}, "hotspot");
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  b_.AddSample(b_.AddProfile(r0, "samples", "count", kT0), b_.Stack({rb, jvm}), {}, 1);
  auto r = Convert();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Frames(*r, r->cells[0].stack),
              ElementsAre("Main.run ([java:Main.java])", "Foo#bar ([ruby:app.rb])"));
}

TEST_F(OtlpConvertTest, CertificateHostIsEnforced) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "other"}});
  b_.AddSample(b_.AddProfile(r0, "samples", "count", kT0), b_.Stack({main_}), {}, 1);
  auto r = Convert("host-1");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  RequestBuilder without_host;
  auto* r1 = without_host.AddResource({{"service.name", "s"}});
  without_host.AddSample(without_host.AddProfile(r1, "samples", "count", kT0), 0, {}, 1);
  auto ok = ConvertRequest(without_host.request(), {}, "host-1", kNowMs);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->cells[0].host, "host-1");
}

struct BadCase {
  const char* name;
  void (*spoil)(RequestBuilder::Request*);
  const char* error;
};

TEST_F(OtlpConvertTest, BadInputIsRefusedWithTheFieldNamed) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", kT0);
  b_.AddSample(cpu, b_.Stack({write_, main_}), {}, 1, kT0);
  ASSERT_TRUE(Convert().ok());
  const BadCase cases[] = {
      {"stack index", [](auto* q) {
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->set_stack_index(99);
       }, "stack index 99 outside the stack table"},
      {"link index", [](auto* q) {
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->set_link_index(-5);
       }, "link index -5 outside the link table"},
      {"link index past the table", [](auto* q) {
         q->mutable_dictionary()->clear_link_table();
         q->mutable_dictionary()->add_link_table();
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->set_link_index(1);
       }, "link index 1 outside the link table (1 entries)"},
      {"location index", [](auto* q) {
         q->mutable_dictionary()->mutable_stack_table(1)->set_location_indices(0, -1);
       }, "location index -1 outside the location table"},
      {"function index", [](auto* q) {
         q->mutable_dictionary()->mutable_location_table(1)->mutable_lines(0)->set_function_index(
             1000);
       }, "function index 1000 outside the function table"},
      {"string index", [](auto* q) {
         q->mutable_dictionary()->mutable_function_table(1)->set_name_strindex(5000);
       }, "string index 5000 outside the string table"},
      {"sample type", [](auto* q) {
         q->mutable_dictionary()->add_string_table("alloc_space");
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_sample_type()->set_type_strindex(q->dictionary().string_table_size() - 1);
       }, "sample type (alloc_space, count) is not stored"},
      {"timestamps", [](auto* q) {
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->add_timestamps_unix_nano(1);
       }, "has 1 values and 2 timestamps"},
      {"future", [](auto* q) {
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->set_timestamps_unix_nano(0, uint64_t{1} << 63);
       }, "past the server's clock (at most 24 h)"},
      {"1970", [](auto* q) {  // seconds given as nanoseconds
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->set_timestamps_unix_nano(0, 1'764'000'000);
       }, "is before 2000"},
      {"negative", [](auto* q) {
         q->mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0)
             ->mutable_samples(0)->set_values(0, -5);
       }, "negative value"},
      {"reserved label", [](auto* q) {
         auto* kv = q->mutable_resource_profiles(0)->mutable_resource()->add_attributes();
         kv->set_key("__profile__");
         kv->mutable_value()->set_string_value("off-cpu");
       }, "reserved"},
      {"label syntax", [](auto* q) {
         auto* kv = q->mutable_resource_profiles(0)->mutable_resource()->add_attributes();
         kv->set_key("k8s.pod.name");
         kv->mutable_value()->set_string_value("a,b");
       }, "attribute k8s.pod.name"},
  };
  for (const BadCase& c : cases) {
    RequestBuilder::Request request = b_.request();
    c.spoil(&request);
    auto r = ConvertRequest(request, {}, "", kNowMs);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(r.status().message(), HasSubstr(c.error)) << c.name;
  }
}

TEST_F(OtlpConvertTest, LimitsApply) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", kT0);
  b_.AddSample(cpu, b_.Stack({write_, main_}), {}, 5);
  b_.AddSample(cpu, b_.Stack({main_}), {}, 5);
  ingest::IngestLimits limits;
  limits.max_context_count = 4;
  EXPECT_THAT(ConvertRequest(b_.request(), limits, "", kNowMs).status().message(),
              HasSubstr("exceeds the limit of 4"));
  limits = {};
  limits.max_batch_contexts = 1;
  EXPECT_THAT(ConvertRequest(b_.request(), limits, "", kNowMs).status().message(),
              HasSubstr("more than 1 distinct samples"));
  limits = {};
  limits.max_name_bytes = 5;
  EXPECT_THAT(ConvertRequest(b_.request(), limits, "", kNowMs).status().message(),
              HasSubstr("longer than the limits"));
}

// One location standing for 4,000 inlined frames, in 2,100 distinct stacks: 8.4 M frames
// from a request of a few tens of KB, refused before they are all held (and stored).
TEST_F(OtlpConvertTest, FramesOfAllStacksAreBounded) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", kT0);
  const int32_t binary = b_.Mapping("/usr/bin/deep");
  const std::vector<RequestBuilder::Line> lines(4000, {"inlined", "deep.c", 1});
  const int32_t deep = b_.Location(binary, 0x1000, lines, "native");
  for (uint64_t i = 0; i < 2100; ++i) {
    const int32_t leaf = b_.Location(binary, 0x2000 + i, {}, "native");  // named by address
    b_.AddSample(cpu, b_.Stack({leaf, deep}), {}, 1);
  }
  auto r = Convert();
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("frames in all"));
}

// The same stack under 2,100 stack table entries, one a sample: each entry is decoded, so
// they count as 2,100 stacks, though they store as one.
TEST_F(OtlpConvertTest, FramesOfStacksThatRepeatOneAnotherAreBoundedToo) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", kT0);
  const std::vector<RequestBuilder::Line> lines(4000, {"inlined", "deep.c", 1});
  const int32_t deep = b_.Location(b_.Mapping("/usr/bin/deep"), 0x1000, lines, "native");
  const int32_t stack = b_.Stack({deep});
  for (int i = 0; i < 2100; ++i) b_.AddSample(cpu, stack, {}, 1);
  RequestBuilder::Request request = b_.Take();
  auto* profile =
      request.mutable_resource_profiles(0)->mutable_scope_profiles(0)->mutable_profiles(0);
  for (int i = 1; i < 2100; ++i) {
    *request.mutable_dictionary()->add_stack_table() = request.dictionary().stack_table(stack);
    profile->mutable_samples(i)->set_stack_index(request.dictionary().stack_table_size() - 1);
  }
  auto r = ConvertRequest(request, {}, "", kNowMs);
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("frames in all"));
}

// A location naming its frame type 20,000 times, 20,000 times in one stack: its attributes
// are read once, not per reference (4e8 map updates before).
TEST_F(OtlpConvertTest, ALocationIsConvertedOncePerRequest) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", kT0);
  const int32_t stop = b_.Location(b_.Mapping("/usr/bin/x"), 0x1000, {}, "abort");
  b_.AddSample(cpu, b_.Stack(std::vector<int32_t>(20000, stop)), {}, 1);
  RequestBuilder::Request request = b_.Take();
  auto* location = request.mutable_dictionary()->mutable_location_table(stop);
  const int32_t abort_attribute = location->attribute_indices(0);
  for (int i = 1; i < 20000; ++i) location->add_attribute_indices(abort_attribute);
  const absl::Time start = absl::Now();
  auto r = ConvertRequest(request, {}, "", kNowMs);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->stacks.size(), 1u);
  EXPECT_TRUE(r->stacks[0].truncated);
}

// Locations share their functions' conversion when their function, mapping and frame type
// agree, and only then: the same function of one mapping as Go code and as kernel code is two
// functions, and a location with two attributes is converted on its own.
TEST_F(OtlpConvertTest, LocationsOfOneFunctionKeepTheirKinds) {
  auto* r0 = b_.AddResource({{"service.name", "s"}, {"host.name", "h"}});
  auto* cpu = b_.AddProfile(r0, "samples", "count", kT0);
  const int32_t lib = b_.Mapping("/usr/lib/libx.so", "b2");
  const int32_t as_go = b_.Location(lib, 0x10, {{"f", "f.c", 1}}, "go");
  const int32_t as_kernel = b_.Location(lib, 0x20, {{"f", "f.c", 1}}, "kernel");
  const int32_t as_go_again = b_.Location(lib, 0x30, {{"f", "f.c", 2}}, "go");
  const int32_t two_attributes = b_.Location(lib, 0x40, {{"f", "f.c", 3}}, "cpython");
  b_.AddSample(cpu, b_.Stack({as_go, as_kernel, as_go_again, two_attributes}), {}, 1);
  RequestBuilder::Request request = b_.Take();
  auto* location = request.mutable_dictionary()->mutable_location_table(two_attributes);
  location->add_attribute_indices(location->attribute_indices(0));
  auto r = ConvertRequest(request, {}, "", kNowMs);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->cells.size(), 1u);
  EXPECT_THAT(Frames(*r, r->cells[0].stack),
              ElementsAre("f ([python:f.c])", "f (/usr/lib/libx.so)",
                          "f ([kernel:/usr/lib/libx.so])", "f (/usr/lib/libx.so)"));
  const auto& functions = r->stacks[r->cells[0].stack].functions;
  EXPECT_EQ(functions[1], functions[3]);
  EXPECT_EQ(r->functions[functions[3]].build_id, "b2");
  EXPECT_EQ(r->functions[functions[2]].build_id, "");
}

}  // namespace
}  // namespace strata::server::otlp
