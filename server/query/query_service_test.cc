#include "server/query/query_service.h"

#include <map>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/aggregate/phase_event.h"
#include "server/commit/batch_committer.h"
#include "server/query/compare_profiles.h"
#include "server/query/pprof.h"
#include "server/registry/agent_registry.h"

namespace strata::server::query {
namespace {

constexpr int64_t kWindow = 1'000 * commit::kWindowMs;

class QueryServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    query_ = std::make_unique<QueryService>(store_.get(), &registry_);
  }

  // Interns the stack of `functions` (outermost first, all in module "app" unless given).
  uint64_t Stack(const std::vector<std::string>& functions,
                 const std::vector<std::string>& modules = {},
                 const std::string& build_id = "") {
    store::WriteBatch wb;
    store::StackFrames frames;
    for (size_t i = 0; i < functions.size(); ++i) {
      const std::string& name = functions[i];
      auto fn = store_->interner().InternFunction(
          {name, i < modules.size() ? modules[i] : "app", build_id, 0}, &wb);
      EXPECT_TRUE(fn.ok()) << fn.status();
      frames.function_ids.push_back(fn.ok() ? *fn : 0);
    }
    auto stack = store_->interner().InternStack(frames, &wb);
    EXPECT_TRUE(stack.ok()) << stack.status();
    EXPECT_TRUE(store_->Commit(&wb).ok());
    return stack.ok() ? *stack : 0;
  }

  void AddSamples(const std::string& service, const std::string& host, uint64_t stack,
                  uint64_t count, const labels::LabelSet& set = {},
                  int64_t window = kWindow) {
    store::WriteBatch wb;
    auto label_set = store_->interner().InternLabelSet(service, set, 100, &wb);
    ASSERT_TRUE(label_set.ok()) << label_set.status();
    wb.AddSamples(service, window, host, stack, count, *label_set);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }

  void PutPhaseEvent(const std::string& service, int64_t window, std::string payload) {
    store::WriteBatch wb;
    wb.PutPhaseEvent({service, window, std::move(payload)});
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }

  // main;work;hash x30, main;work x10, main;idle x5 on two hosts of "api".
  void AddKnownProfile() {
    hash_ = Stack({"main", "work", "hash"});
    work_ = Stack({"main", "work"});
    idle_ = Stack({"main", "idle"});
    AddSamples("api", "h1", hash_, 20);
    AddSamples("api", "h2", hash_, 10);
    AddSamples("api", "h1", work_, 10);
    AddSamples("api", "h2", idle_, 5);
  }

  static v1::ProfileFilter Filter(const std::string& service) {
    v1::ProfileFilter filter;
    filter.set_service(service);
    filter.mutable_range()->set_from_ms(kWindow);
    filter.mutable_range()->set_to_ms(kWindow + commit::kWindowMs);
    return filter;
  }

  template <typename Path>
  static std::vector<std::string> Names(const Path& path) {
    std::vector<std::string> names;
    for (const v1::Frame& f : path.frames()) names.push_back(f.function());
    return names;
  }

  strata::testing::TempDir dir_{"query_service_test"};
  std::unique_ptr<store::Store> store_;
  registry::AgentRegistry registry_;
  std::unique_ptr<QueryService> query_;
  uint64_t hash_ = 0, work_ = 0, idle_ = 0;
};

TEST_F(QueryServiceTest, HotPathsAreTheStacksByCount) {
  AddKnownProfile();
  v1::HotPathsRequest request;
  *request.mutable_filter() = Filter("api");
  auto response = query_->RunHotPaths(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->total_samples(), 45u);
  ASSERT_EQ(response->paths_size(), 3);
  EXPECT_EQ(Names(response->paths(0)), (std::vector<std::string>{"main", "work", "hash"}));
  EXPECT_EQ(response->paths(0).samples(), 30u);
  EXPECT_EQ(response->paths(0).frames(0).module(), "app");
  EXPECT_EQ(Names(response->paths(1)), (std::vector<std::string>{"main", "work"}));
  EXPECT_EQ(response->paths(1).samples(), 10u);
  EXPECT_EQ(Names(response->paths(2)), (std::vector<std::string>{"main", "idle"}));
  EXPECT_EQ(response->paths(2).samples(), 5u);

  request.set_limit(1);
  request.mutable_filter()->set_host("h2");
  response = query_->RunHotPaths(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->total_samples(), 15u);
  ASSERT_EQ(response->paths_size(), 1);
  EXPECT_EQ(response->paths(0).samples(), 10u);
}

TEST_F(QueryServiceTest, TopSortsBySelfOrTotal) {
  AddKnownProfile();
  v1::TopRequest request;
  *request.mutable_filter() = Filter("api");
  auto self = query_->RunTop(request);
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_EQ(self->total_samples(), 45u);
  ASSERT_EQ(self->functions_size(), 4);
  EXPECT_EQ(self->functions(0).function().function(), "hash");
  EXPECT_EQ(self->functions(0).self(), 30u);
  EXPECT_EQ(self->functions(1).function().function(), "work");
  EXPECT_EQ(self->functions(1).self(), 10u);
  EXPECT_EQ(self->functions(1).total(), 40u);

  request.set_sort(v1::TopRequest::TOTAL);
  request.set_limit(2);
  auto total = query_->RunTop(request);
  ASSERT_TRUE(total.ok()) << total.status();
  ASSERT_EQ(total->functions_size(), 2);
  EXPECT_EQ(total->functions(0).function().function(), "main");
  EXPECT_EQ(total->functions(0).total(), 45u);
  EXPECT_EQ(total->functions(0).self(), 0u);
  EXPECT_EQ(total->functions(1).function().function(), "work");
}

// Off-CPU samples carry the reserved profile label (as ingest stores them): CPU queries
// leave them out, off-CPU queries read only them, wall both; selectors combine with the type.
TEST_F(QueryServiceTest, ProfileTypeSelectsLabelSets) {
  AddKnownProfile();
  const labels::LabelSet off_cpu = {{"__profile__", "off-cpu"}};
  const labels::LabelSet v2_off_cpu = {{"__profile__", "off-cpu"}, {"version", "2"}};
  AddSamples("api", "h1", idle_, 100, off_cpu);
  AddSamples("api", "h1", idle_, 8, v2_off_cpu);
  AddSamples("api", "h1", work_, 2, {{"version", "2"}});
  auto total = [&](v1::ProfileType type, const std::string& selector = "") {
    v1::TopRequest request;
    *request.mutable_filter() = Filter("api");
    request.mutable_filter()->set_type(type);
    request.mutable_filter()->set_selector(selector);
    auto r = query_->RunTop(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->total_samples() : 0;
  };
  EXPECT_EQ(total(v1::PROFILE_CPU), 47u);
  EXPECT_EQ(total(v1::PROFILE_OFF_CPU), 108u);
  EXPECT_EQ(total(v1::PROFILE_WALL), 155u);
  EXPECT_EQ(total(v1::PROFILE_CPU, "version=2"), 2u);
  EXPECT_EQ(total(v1::PROFILE_OFF_CPU, "version=2"), 8u);
  EXPECT_EQ(total(v1::PROFILE_WALL, "version=2"), 10u);

  // Reserved keys are not selector material: ListLabels leaves them out.
  v1::ListLabelsRequest labels_request;
  labels_request.set_service("api");
  auto listed = query_->RunListLabels(labels_request);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->labels_size(), 1);
  EXPECT_EQ(listed->labels(0).key(), "version");

  // Captures are CPU profiles; unknown types are refused.
  v1::TopRequest capture;
  capture.mutable_filter()->set_capture_id("cap-1");
  capture.mutable_filter()->set_type(v1::PROFILE_OFF_CPU);
  auto refused = query_->RunTop(capture);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  v1::TopRequest unknown;
  *unknown.mutable_filter() = Filter("api");
  unknown.mutable_filter()->set_type(static_cast<v1::ProfileType>(9));
  EXPECT_TRUE(absl::IsInvalidArgument(query_->RunTop(unknown).status()));

  // A diff of the off-CPU profile against the CPU one of the same range is allowed.
  v1::DiffRequest diff;
  *diff.mutable_filter() = Filter("api");
  diff.mutable_filter()->set_type(v1::PROFILE_OFF_CPU);
  *diff.mutable_base() = Filter("api");
  auto diffed = query_->RunDiff(diff);
  ASSERT_TRUE(diffed.ok()) << diffed.status();
  EXPECT_EQ(diffed->base_total_samples(), 47u);
  EXPECT_EQ(diffed->total_samples(), 108u);
}

// pprof time values use the sampling rate most of the service's agents report.
TEST_F(QueryServiceTest, SamplingRateIsTheMostCommonOfTheServicesAgents) {
  EXPECT_EQ(registry_.SamplingRate("api"), registry::kDefaultFrequencyHz);
  auto attach = [&](const std::string& id, uint32_t hz, const std::string& service) {
    ASSERT_TRUE(registry_
                    .Attach({id, "host-" + id, "x86_64", "1.0", ""}, hz,
                            [](const v1::ServerMessage&) { return true; })
                    .ok());
    v1::SampleBatch batch;
    v1::Target* target = batch.add_targets();
    target->set_service(service);
    target->set_pid(42);
    registry_.RecordBatch(id, batch);
  };
  attach("a", 49, "api");
  attach("b", 199, "api");
  attach("c", 199, "api");
  attach("d", 49, "other");
  attach("e", 0, "api");  // did not say
  EXPECT_EQ(registry_.SamplingRate("api"), 199u);
  EXPECT_EQ(registry_.SamplingRate("other"), 49u);
  EXPECT_EQ(registry_.SamplingRate("none"), registry::kDefaultFrequencyHz);
}

// Frames say whether their code is the kernel's, JIT code or user code, from their module.
TEST_F(QueryServiceTest, FramesCarryTheirKind) {
  const uint64_t stack = Stack({"main", "read", "vfs_read", "Lambda.run"},
                               {"app", "/lib/libc.so.6", "[kernel.kallsyms]", "[jit]"});
  AddSamples("api", "h1", stack, 3);
  v1::HotPathsRequest request;
  *request.mutable_filter() = Filter("api");
  auto paths = query_->RunHotPaths(request);
  ASSERT_TRUE(paths.ok()) << paths.status();
  ASSERT_EQ(paths->paths_size(), 1);
  std::vector<v1::FrameKind> kinds;
  for (const v1::Frame& f : paths->paths(0).frames()) kinds.push_back(f.kind());
  EXPECT_EQ(kinds, (std::vector<v1::FrameKind>{v1::FRAME_USER, v1::FRAME_USER, v1::FRAME_KERNEL,
                                                v1::FRAME_JIT}));
  v1::TopRequest top;
  *top.mutable_filter() = Filter("api");
  auto functions = query_->RunTop(top);
  ASSERT_TRUE(functions.ok()) << functions.status();
  ASSERT_GT(functions->functions_size(), 0);
  EXPECT_EQ(functions->functions(0).function().function(), "Lambda.run");
  EXPECT_EQ(functions->functions(0).function().kind(), v1::FRAME_JIT);
}

// Beyond 2^62 ms every front door's query is refused: later arithmetic on times (series
// intervals, compare's windows) would overflow.
TEST_F(QueryServiceTest, TimesBeyondTheQueryRangeAreRefused) {
  v1::ProfileFilter filter = Filter("svc");
  filter.mutable_range()->set_from_ms(0);
  filter.mutable_range()->set_to_ms(INT64_MAX);
  EXPECT_TRUE(absl::IsInvalidArgument(ToProfileQuery(filter, 1000).status()));
  filter.mutable_range()->set_from_ms(kMaxQueryMs + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(ToProfileQuery(filter, 1000).status()));
  filter.mutable_range()->set_from_ms(0);
  filter.mutable_range()->set_to_ms(kMaxQueryMs);
  EXPECT_TRUE(ToProfileQuery(filter, 1000).ok());
}

// A range takes the windows that start in it: ranges that meet at any T share no window (a
// deploy's before and after), and their totals add up to the whole range's. A window holding
// `from` but starting before it was taken whole by both.
TEST_F(QueryServiceTest, RangesThatMeetShareNoWindowWhereverTheyMeet) {
  const uint64_t stack = Stack({"main", "work"});
  for (int i = 0; i < 3; ++i) {
    AddSamples("api", "h1", stack, uint64_t{1} << i, {}, kWindow + i * commit::kWindowMs);
  }
  auto total = [&](int64_t from_ms, int64_t to_ms) -> uint64_t {
    v1::TopRequest request;
    *request.mutable_filter() = Filter("api");
    request.mutable_filter()->mutable_range()->set_from_ms(from_ms);
    request.mutable_filter()->mutable_range()->set_to_ms(to_ms);
    absl::StatusOr<v1::TopResponse> top = query_->RunTop(request);
    EXPECT_TRUE(top.ok()) << top.status();
    return top.ok() ? top->total_samples() : 0;
  };
  const int64_t end = kWindow + 3 * commit::kWindowMs;
  EXPECT_EQ(total(kWindow, end), 7u);
  for (const int64_t t : {kWindow + 1, kWindow + 5'000, kWindow + commit::kWindowMs,
                          kWindow + commit::kWindowMs + 9'999}) {
    EXPECT_EQ(total(kWindow, t) + total(t, end), 7u) << "meeting at " << t - kWindow;
  }
  EXPECT_EQ(total(kWindow + 5'000, kWindow + 15'000), 2u);  // the window starting in it
  EXPECT_EQ(total(kWindow + 9'999, kWindow + 10'000), 0u);  // none starts in it
  // A series agrees: no interval, not an "empty time range" error.
  v1::SeriesRequest series;
  *series.mutable_filter() = Filter("api");
  series.mutable_filter()->mutable_range()->set_from_ms(kWindow + 1'000);
  series.mutable_filter()->mutable_range()->set_to_ms(kWindow + 5'000);
  absl::StatusOr<v1::SeriesResponse> within = query_->RunSeries(series);
  ASSERT_TRUE(within.ok()) << within.status();
  EXPECT_EQ(within->series_size(), 0);
  EXPECT_EQ(within->total_samples(), 0u);
}

TEST_F(QueryServiceTest, UnknownServiceIsNotFound) {
  AddKnownProfile();
  v1::TopRequest request;
  *request.mutable_filter() = Filter("nope");
  EXPECT_EQ(query_->RunTop(request).status().code(), absl::StatusCode::kNotFound);
  v1::ListLabelsRequest labels;
  labels.set_service("nope");  // every service has the empty label set: not "no labels"
  EXPECT_EQ(query_->RunListLabels(labels).status().code(), absl::StatusCode::kNotFound);
  labels.set_service("api");
  EXPECT_TRUE(query_->RunListLabels(labels).ok());
}

// A capture ID no capture has is not an empty capture; a capture that got no samples is.
TEST_F(QueryServiceTest, UnknownCaptureIsNotFound) {
  AddKnownProfile();
  v1::TopRequest request;
  request.mutable_filter()->set_capture_id("cap-nope");
  absl::Status unknown = query_->RunTop(request).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_NE(unknown.message().find("unknown capture 'cap-nope'"), std::string::npos) << unknown;
  store::CaptureInfo empty_capture;
  empty_capture.capture_id = "cap-empty";
  empty_capture.service = "api";
  store::WriteBatch wb;
  wb.PutCapture(empty_capture);
  ASSERT_TRUE(store_->Commit(&wb).ok());
  request.mutable_filter()->set_capture_id("cap-empty");
  auto empty = query_->RunTop(request);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->total_samples(), 0u);
}

TEST_F(QueryServiceTest, ListsServicesWithTheirWindows) {
  AddKnownProfile();
  auto response = query_->RunListServices();
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->services_size(), 1);
  EXPECT_EQ(response->services(0).name(), "api");
  EXPECT_EQ(response->services(0).total_samples(), 45u);
  EXPECT_EQ(response->services(0).first_ms(), kWindow);
  EXPECT_EQ(response->services(0).last_ms(), kWindow + commit::kWindowMs);
}

// "The whole history" (no range) is the service's stored windows, not everything since 1970:
// a series' intervals and an export's start and duration are its data's.
TEST_F(QueryServiceTest, TheWholeHistoryIsTheServicesStoredWindows) {
  AddKnownProfile();
  AddSamples("api", "h1", hash_, 7, {}, kWindow + 5 * commit::kWindowMs);
  v1::SeriesRequest series;
  series.mutable_filter()->set_service("api");
  series.set_step_ms(commit::kWindowMs);
  auto response = query_->RunSeries(series);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->from_ms(), kWindow);
  ASSERT_EQ(response->series_size(), 1);
  ASSERT_EQ(response->series(0).counts_size(), 6);
  EXPECT_EQ(response->series(0).counts(0), 45u);
  EXPECT_EQ(response->series(0).counts(5), 7u);

  v1::ExportRequest pprof;
  pprof.mutable_filter()->set_service("api");
  pprof.set_format(v1::ExportRequest::PPROF);
  auto exported = query_->RunExport(pprof);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->total_samples(), 52u);
  auto decoded = Gunzip(exported->data(), 1 << 20);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  // The profile's top-level varint fields: time_nanos is 9, duration_nanos 10.
  std::map<uint64_t, uint64_t> varints;
  size_t at = 0;
  auto varint = [&]() {
    uint64_t v = 0;
    for (int shift = 0; at < decoded->size(); shift += 7) {
      const uint8_t byte = static_cast<uint8_t>((*decoded)[at++]);
      v |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) break;
    }
    return v;
  };
  while (at < decoded->size()) {
    const uint64_t tag = varint();
    if ((tag & 7) == 0) {
      varints[tag >> 3] = varint();
    } else {
      ASSERT_EQ(tag & 7, 2u) << "field " << (tag >> 3);
      at += varint();
    }
  }
  EXPECT_EQ(varints[9], uint64_t{kWindow} * 1'000'000);
  EXPECT_EQ(varints[10], uint64_t{6 * commit::kWindowMs} * 1'000'000);
}

TEST_F(QueryServiceTest, ListsTheRegistrysAgents) {
  absl::StatusOr<uint64_t> attachment =
      registry_.Attach({"agent-1", "host-1", "x86_64", "1.0", ""}, 99,
                       [](const v1::ServerMessage&) { return true; });
  ASSERT_TRUE(attachment.ok()) << attachment.status();
  v1::SampleBatch batch;
  batch.set_end_ms(kWindow + 500);
  v1::Target* target = batch.add_targets();
  target->set_service("api");
  target->set_pid(42);
  registry_.RecordBatch("agent-1", batch);
  v1::AgentHealth health;
  health.set_spool_dropped_samples(7);
  registry_.SetHealth("agent-1", health);

  v1::ListAgentsResponse response = query_->RunListAgents();
  ASSERT_EQ(response.agents_size(), 1);
  const v1::AgentInfo& a = response.agents(0);
  EXPECT_EQ(a.agent_id(), "agent-1");
  EXPECT_EQ(a.host(), "host-1");
  EXPECT_EQ(a.arch(), "x86_64");
  EXPECT_EQ(a.version(), "1.0");
  EXPECT_TRUE(a.connected());
  EXPECT_EQ(a.last_batch_ms(), kWindow + 500);
  EXPECT_EQ(a.batches(), 1u);
  ASSERT_EQ(a.targets_size(), 1);
  EXPECT_EQ(a.targets(0), "api/42");
  EXPECT_EQ(a.health().spool_dropped_samples(), 7u);

  registry_.Detach("agent-1", *attachment);
  response = query_->RunListAgents();
  ASSERT_EQ(response.agents_size(), 1);
  EXPECT_FALSE(response.agents(0).connected());
}

TEST_F(QueryServiceTest, PhaseEventsAreNamedWhenRead) {
  AddKnownProfile();
  aggregate::PhaseEventPayload event;
  event.detected_ms = kWindow + 12'000;
  event.rose = {{hash_, 3, 300}};
  event.fell = {{work_, 200, 10}, {idle_, 50, 1}};
  PutPhaseEvent("api", kWindow, aggregate::EncodePhaseEvent(event));

  v1::PhasesRequest request;
  *request.mutable_filter() = Filter("api");
  auto response = query_->RunPhases(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->changes_size(), 1);
  const v1::PhaseChange& c = response->changes(0);
  EXPECT_EQ(c.service(), "api");
  EXPECT_EQ(c.window_start_ms(), kWindow);
  EXPECT_EQ(c.detected_ms(), kWindow + 12'000);
  ASSERT_EQ(c.rose_size(), 1);
  EXPECT_EQ(Names(c.rose(0).path()), (std::vector<std::string>{"main", "work", "hash"}));
  EXPECT_EQ(c.rose(0).count_before(), 3u);
  EXPECT_EQ(c.rose(0).count_after(), 300u);
  ASSERT_EQ(c.fell_size(), 2);
  EXPECT_EQ(Names(c.fell(0).path()), (std::vector<std::string>{"main", "work"}));
  EXPECT_EQ(c.fell(0).count_before(), 200u);
  EXPECT_EQ(Names(c.fell(1).path()), (std::vector<std::string>{"main", "idle"}));
  EXPECT_EQ(c.fell(1).count_after(), 1u);
}

// A JVM's perf map arriving renames its stacks: the unnamed ones fall to nothing as the named
// ones rise. That is no change of behaviour and no phase change; a reordering among stacks
// that stay unnamed (a runtime never asked for its map) still is one.
TEST_F(QueryServiceTest, PhaseEventsOfJitCodeGettingNamedAreNotPhaseChanges) {
  const std::vector<std::string> jit = {"app", "[jit]", "[jit:/tmp/perf-7.map]"};
  const uint64_t unnamed = Stack({"main", "[jit]+0x7f00", "digest"}, jit);
  const uint64_t named = Stack({"main", "long Svc.hash(long)", "digest"},
                               {"app", "[jit:/tmp/perf-7.map]", "[jit:/tmp/perf-7.map]"});
  const uint64_t other_unnamed = Stack({"main", "[jit]+0x7f80"}, {"app", "[jit]"});
  aggregate::PhaseEventPayload renamed, reordered;
  renamed.detected_ms = reordered.detected_ms = kWindow + 12'000;
  renamed.rose = {{named, 0, 300}};
  renamed.fell = {{unnamed, 280, 0}};
  reordered.rose = {{other_unnamed, 3, 300}};
  reordered.fell = {{unnamed, 280, 5}};
  PutPhaseEvent("jvm", kWindow, aggregate::EncodePhaseEvent(renamed));
  PutPhaseEvent("jvm", kWindow + commit::kWindowMs, aggregate::EncodePhaseEvent(reordered));

  v1::PhasesRequest request;
  *request.mutable_filter() = Filter("jvm");
  request.mutable_filter()->mutable_range()->set_to_ms(kWindow + 2 * commit::kWindowMs);
  auto response = query_->RunPhases(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->changes_size(), 1);
  EXPECT_EQ(response->changes(0).window_start_ms(), kWindow + commit::kWindowMs);
}

// Earlier servers stored a serialized v1::PhaseChange; none looks like the stack-ID encoding.
TEST(PhaseEventFormatTest, SerializedPhaseChangesAreToldApart) {
  v1::PhaseChange change;
  EXPECT_FALSE(aggregate::IsPhaseEventPayload(change.SerializeAsString()));  // empty
  change.set_window_start_ms(10'000);
  EXPECT_FALSE(aggregate::IsPhaseEventPayload(change.SerializeAsString()));
  change.set_service("api");
  EXPECT_FALSE(aggregate::IsPhaseEventPayload(change.SerializeAsString()));
  v1::PhaseChange only_shifts;
  only_shifts.add_fell()->set_count_before(5);
  EXPECT_FALSE(aggregate::IsPhaseEventPayload(only_shifts.SerializeAsString()));
  only_shifts.clear_fell();
  only_shifts.add_rose()->set_count_after(5);
  EXPECT_FALSE(aggregate::IsPhaseEventPayload(only_shifts.SerializeAsString()));
  only_shifts.set_detected_ms(1);
  EXPECT_FALSE(aggregate::IsPhaseEventPayload(only_shifts.SerializeAsString()));
}

// Servers before stack IDs were stored wrote the API message itself; it is served as it was.
TEST_F(QueryServiceTest, PhaseEventsOfEarlierServersAreServedAsStored) {
  v1::PhaseChange old;
  old.set_service("api");
  old.set_window_start_ms(kWindow);
  old.set_detected_ms(kWindow + 11'000);
  v1::PhaseChange::Shift* rose = old.add_rose();
  rose->mutable_path()->add_frames()->set_function("main");
  rose->mutable_path()->add_frames()->set_function("parse");
  rose->set_count_before(1);
  rose->set_count_after(100);
  old.add_fell()->set_count_before(90);
  PutPhaseEvent("api", kWindow, old.SerializeAsString());
  // And one of this server in the next window.
  aggregate::PhaseEventPayload event;
  event.detected_ms = kWindow + 22'000;
  event.rose = {{Stack({"main", "sort"}), 2, 80}};
  PutPhaseEvent("api", kWindow + commit::kWindowMs, aggregate::EncodePhaseEvent(event));

  v1::PhasesRequest request;
  request.mutable_filter()->set_service("api");
  auto response = query_->RunPhases(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->changes_size(), 2);
  EXPECT_EQ(response->changes(0).SerializeAsString(), old.SerializeAsString());
  EXPECT_EQ(response->changes(1).window_start_ms(), kWindow + commit::kWindowMs);
  ASSERT_EQ(response->changes(1).rose_size(), 1);
  EXPECT_EQ(Names(response->changes(1).rose(0).path()),
            (std::vector<std::string>{"main", "sort"}));
}

TEST_F(QueryServiceTest, CorruptPhaseEventsAreDataLoss) {
  PutPhaseEvent("api", kWindow, std::string("\x01\x05", 2));  // this encoding, cut short
  v1::PhasesRequest request;
  request.mutable_filter()->set_service("api");
  EXPECT_EQ(query_->RunPhases(request).status().code(), absl::StatusCode::kDataLoss);

  request.mutable_filter()->clear_service();
  EXPECT_EQ(query_->RunPhases(request).status().code(), absl::StatusCode::kInvalidArgument);
}

// Six hosts of each version: hash's share is 28..32 % in version 1 and 38..42 % in version 2,
// whose build has other function IDs (another build ID); parse and idle make up the rest.
TEST_F(QueryServiceTest, CompareFindsTheChangedFunctionAcrossBuilds) {
  for (int version : {1, 2}) {
    const std::string build = absl::StrCat("build", version);
    const uint64_t hash = Stack({"main", "work", "hash"}, {}, build);
    const uint64_t parse = Stack({"main", "work", "parse"}, {}, build);
    const uint64_t idle = Stack({"main", "idle"}, {}, build);
    for (int h = 0; h < 6; ++h) {
      const std::string host = absl::StrCat("v", version, "-h", h);
      const labels::LabelSet set = {{"version", absl::StrCat(version)}};
      const uint64_t hash_n = (version == 1 ? 280 : 380) + 20 * (h % 3);  // of 1000 samples
      const uint64_t parse_n = 480 + 10 * (h % 2);
      AddSamples("api", host, hash, hash_n, set);
      AddSamples("api", host, parse, parse_n, set);
      AddSamples("api", host, idle, 1000 - hash_n - parse_n, set);
    }
  }
  v1::CompareRequest request;
  request.set_service("api");
  *request.mutable_baseline() = Filter("");
  request.mutable_baseline()->set_selector("version=1");
  request.mutable_candidate()->set_selector("version=2");
  auto r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->not_enough_data());
  EXPECT_EQ(r->baseline_hosts(), 6u);
  EXPECT_EQ(r->candidate_units(), 6u);
  EXPECT_EQ(r->baseline_samples(), 6000u);
  EXPECT_EQ(r->window_s(), 0u);  // units are whole hosts
  // (name, module) matched across builds: one row per function.
  ASSERT_EQ(r->functions_size(), 5) << r->DebugString();
  const v1::FunctionComparison& top = r->functions(0);
  EXPECT_EQ(top.function().function(), "hash");
  EXPECT_TRUE(top.self().significant());
  EXPECT_NEAR(top.self().share_baseline(), 30, 0.01);
  EXPECT_NEAR(top.self().delta(), 10, 0.01);
  EXPECT_NEAR(top.self().relative(), 100.0 / 3, 0.01);
  EXPECT_LT(top.self().ci_low(), 10);
  EXPECT_GT(top.self().ci_high(), 10);
  EXPECT_LT(top.self().q(), 0.05);
  EXPECT_GT(top.self().min_detectable(), 0);
  for (const auto& f : r->functions()) {
    if (f.function().function() == "main") {
      EXPECT_FALSE(f.total().significant());  // 100 % of every unit
    }
  }
  ASSERT_GE(r->paths_size(), 1);
  EXPECT_EQ(Names(r->paths(0)), (std::vector<std::string>{"main", "work", "hash"}));
  EXPECT_TRUE(r->paths(0).samples().significant());

  // Against itself under another name: nothing.
  request.mutable_candidate()->set_selector("version=1,version!=2");
  r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& f : r->functions()) EXPECT_FALSE(f.self().significant()) << f.DebugString();

  // Loads capped: a sample of the hosts, said in the notes.
  ProfileReader reader(store_.get());
  CompareGroupQuery b{*ToProfileQuery(request.baseline(), 0), 0};
  b.query.service = "api";
  CompareGroupQuery c = b;
  c.query.selector = "version=2";
  auto capped = CompareProfiles([&](const ProfileQuery& q) { return reader.Load(q); }, b, c,
                                {.max_loads = 3});
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ(capped->baseline_units(), 3u);
  EXPECT_EQ(capped->baseline_hosts(), 6u);
  EXPECT_THAT(capped->notes(), ::testing::Contains(::testing::HasSubstr("3 of 6 hosts")));
}

TEST_F(QueryServiceTest, CompareNeedsTwoUnitsPerGroup) {
  AddKnownProfile();
  const uint64_t other = Stack({"main", "other"});
  AddSamples("api", "h1", other, 7, {{"version", "2"}});
  AddSamples("api", "h1", other, 9, {{"version", "2"}}, kWindow + commit::kWindowMs);
  v1::CompareRequest request;
  request.set_service("api");
  *request.mutable_baseline() = Filter("");
  request.mutable_baseline()->mutable_range()->set_to_ms(kWindow + 2 * commit::kWindowMs);
  request.mutable_baseline()->set_selector("version=");
  request.mutable_candidate()->set_selector("version=2");
  auto r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  // Version 2 is one host: no verdict.
  EXPECT_TRUE(r->not_enough_data());
  EXPECT_EQ(r->candidate_units(), 1u);
  EXPECT_EQ(r->keys_compared(), 0u);
  for (const auto& f : r->functions()) EXPECT_FALSE(f.self().significant());
  // Its two windows as independent units: a (weak) comparison.
  request.set_windows_independent(true);
  request.set_window_s(10);
  r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->candidate_units(), 2u);
  EXPECT_EQ(r->window_s(), 10u);
  EXPECT_FALSE(r->not_enough_data());
  EXPECT_GT(r->keys_compared(), 0u);

  request.mutable_candidate()->set_selector("version=");
  EXPECT_EQ(query_->RunCompare(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.mutable_candidate()->set_selector("version=2");
  request.set_fdr(1.5);
  EXPECT_EQ(query_->RunCompare(request).status().code(), absl::StatusCode::kInvalidArgument);
  request.set_fdr(0);
  request.mutable_candidate()->set_service("nope");
  auto unknown = query_->RunCompare(request);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), ::testing::StartsWith("candidate: "));
}

// Version 1 over the first three 10 s windows from kWindow against version 2 after them, the
// windows as units once one_host_windows is set.
v1::CompareRequest OneHostReleaseRequest(const std::string& service) {
  v1::CompareRequest request;
  request.set_service(service);
  request.mutable_baseline()->set_selector("version=1");
  request.mutable_baseline()->mutable_range()->set_from_ms(kWindow);
  request.mutable_baseline()->mutable_range()->set_to_ms(kWindow + 6 * commit::kWindowMs);
  request.mutable_candidate()->set_selector("version=2");
  request.set_window_s(10);
  return request;
}

// A service on one host, deployed there: version 1 in three windows, then version 2 in three,
// hash's share 30 % before and 45 % after. With one_host_windows the host's windows are the
// units; only while both versions are that one host.
TEST_F(QueryServiceTest, CompareOfOneHostTakesItsWindowsWhenAsked) {
  const uint64_t hash = Stack({"main", "work", "hash"});
  const uint64_t parse = Stack({"main", "work", "parse"});
  for (int w = 0; w < 6; ++w) {
    const bool candidate = w >= 3;
    const labels::LabelSet set = {{"version", candidate ? "2" : "1"}};
    const int64_t window = kWindow + w * commit::kWindowMs;
    const uint64_t hash_n = (candidate ? 450 : 300) + 10 * (w % 2);
    AddSamples("solo", "h1", hash, hash_n, set, window);
    AddSamples("solo", "h1", parse, 1000 - hash_n, set, window);
  }
  v1::CompareRequest request = OneHostReleaseRequest("solo");
  // Hosts as units: one each, no verdict.
  auto r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->not_enough_data());
  EXPECT_EQ(r->window_s(), 0u);

  request.set_one_host_windows(true);
  r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->not_enough_data());
  EXPECT_EQ(r->baseline_units(), 3u);
  EXPECT_EQ(r->candidate_units(), 3u);
  EXPECT_EQ(r->baseline_hosts(), 1u);
  EXPECT_EQ(r->window_s(), 10u);
  EXPECT_THAT(r->notes(), ::testing::Contains(::testing::HasSubstr("one host (h1)")));
  bool hash_rose = false;
  for (const v1::FunctionComparison& f : r->functions()) {
    if (f.function().function() != "hash") continue;
    EXPECT_TRUE(f.self().significant()) << f.DebugString();
    EXPECT_NEAR(f.self().delta(), 45.0 + 2.0 / 3 - (30.0 + 1.0 / 3), 0.01);
    hash_rose = true;
  }
  EXPECT_TRUE(hash_rose) << r->DebugString();

  // A second host in the baseline: hosts are the units again (the candidate has one).
  AddSamples("solo", "h2", hash, 300, {{"version", "1"}}, kWindow);
  r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->not_enough_data());
  EXPECT_EQ(r->baseline_units(), 2u);
  EXPECT_EQ(r->window_s(), 0u);
  EXPECT_THAT(r->notes(), ::testing::IsEmpty());
  // One host each, but not the same one: a host's bias would pass for the release's.
  request.mutable_baseline()->set_host("h2");
  r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->not_enough_data());
  EXPECT_EQ(r->window_s(), 0u);
}

// A Python service's release whose parse allocates more: the interpreter's _PyObject_Free
// under it rises from about 10 % to 25 % of the samples. Compared by leaf the cause is
// _PyObject_Free; with language_self parse's own self share rises by those 15 points, and a
// native thread without Python frames is still counted by its leaf.
TEST_F(QueryServiceTest, CompareWithLanguageSelfGivesTheRuntimesCostToItsPythonCaller) {
  const std::vector<std::string> modules = {"/usr/bin/python3.11", "[python:app.py]",
                                            "/usr/bin/python3.11"};
  const uint64_t parse_free = Stack({"Py_RunMain", "parse", "_PyObject_Free"}, modules);
  const uint64_t parse = Stack({"Py_RunMain", "parse"}, modules);
  const uint64_t gc = Stack({"start_thread", "gc_collect_main"}, {"libc.so.6", modules[0]});
  for (int w = 0; w < 6; ++w) {
    const bool candidate = w >= 3;
    const labels::LabelSet set = {{"version", candidate ? "2" : "1"}};
    const int64_t window = kWindow + w * commit::kWindowMs;
    const uint64_t free_n = (candidate ? 250 : 100) + 10 * (w % 2);
    AddSamples("py", "h1", parse_free, free_n, set, window);
    AddSamples("py", "h1", parse, 300, set, window);
    AddSamples("py", "h1", gc, 1000 - 300 - free_n, set, window);
  }
  v1::CompareRequest request = OneHostReleaseRequest("py");
  request.set_one_host_windows(true);
  auto self_delta = [](const v1::CompareResponse& r, const std::string& name) {
    for (const v1::FunctionComparison& f : r.functions()) {
      if (f.function().function() == name && f.self().tested()) return f.self().delta();
    }
    return 0.0;
  };
  const double rise = (770.0 - 310.0) / 30;  // points: 310 of 3,000 samples, then 770
  auto r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(self_delta(*r, "_PyObject_Free"), rise, 0.01);
  EXPECT_NEAR(self_delta(*r, "parse"), 0.0, 0.01);
  EXPECT_THAT(r->notes(), ::testing::Not(::testing::Contains(::testing::HasSubstr("Python"))));

  request.set_language_self(true);
  r = query_->RunCompare(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(self_delta(*r, "parse"), rise, 0.01);
  EXPECT_EQ(self_delta(*r, "_PyObject_Free"), 0.0);
  EXPECT_NEAR(self_delta(*r, "gc_collect_main"), -rise, 0.01);
  EXPECT_THAT(r->notes(), ::testing::Contains(::testing::HasSubstr("Python and JIT functions")));
  for (const v1::FunctionComparison& f : r->functions()) {
    if (f.function().function() == "_PyObject_Free") EXPECT_TRUE(f.total().significant());
  }
}

}  // namespace
}  // namespace strata::server::query

namespace strata::server::query {
namespace {

// Three services: two active in the last day, one only a week before. The warm-up reads the
// two, and their whole hours are then served from memory.
TEST_F(QueryServiceTest, WarmUpReadsRecentServicesIntoMemory) {
  constexpr int64_t kHour = 3'600'000;
  const int64_t now = 100 * kHour + 30 * 60'000;
  const uint64_t stack = Stack({"main", "work"});
  for (int64_t h = 90; h < 100; ++h) {
    AddSamples("recent", "h1", stack, 3, {}, h * kHour + 20'000);
    AddSamples("busy", "h2", stack, 5, {}, h * kHour + 20'000);
  }
  AddSamples("old", "h1", stack, 7, {}, 2 * kHour);
  ASSERT_TRUE(store_->RollUp(now).ok());

  std::atomic<bool> stop{true};
  EXPECT_EQ(query_->WarmUp(now, 24 * kHour, stop), 0u);  // told to stop before starting
  stop = false;
  EXPECT_EQ(query_->WarmUp(now, 24 * kHour, stop), 2u);
  const store::StoreStats warmed = store_->Stats();
  // Ten hours of each recent service, and the empty hour each read starts at (an empty hour
  // is sought past, never kept).
  EXPECT_EQ(warmed.hour_block_misses, 2u * (10 + 1));
  // Each range's whole hours as one span, and its 30 whole minutes on either side as two.
  EXPECT_EQ(warmed.span_misses, 2u * 3);

  // A query over the warmed range reads no whole hour from RocksDB again: its whole hours
  // and minutes are the spans the warm-up left.
  v1::TopRequest top;
  top.mutable_filter()->set_service("recent");
  top.mutable_filter()->mutable_range()->set_from_ms(now - 24 * kHour);
  top.mutable_filter()->mutable_range()->set_to_ms(now);
  auto answer = query_->RunTop(top);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->total_samples(), 30u);
  EXPECT_EQ(store_->Stats().span_hits, warmed.span_hits + 3);
  EXPECT_EQ(store_->Stats().hour_block_misses, warmed.hour_block_misses);
  EXPECT_EQ(store_->Stats().hour_block_hits, warmed.hour_block_hits);
}

}  // namespace
}  // namespace strata::server::query
