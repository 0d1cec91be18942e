#include "server/query/profile.h"

#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "server/aggregate/window_aggregator.h"

namespace strata::server::query {
namespace {

class ProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
    // main -> a -> leaf (5), main -> b -> leaf (3), main -> a -> a (2): recursion
    store::WriteBatch wb;
    auto fn = [&](const char* name) { return Function(name, "/bin/x", &wb); };
    const uint64_t main = fn("main"), a = fn("a"), b = fn("b"), leaf = fn("leaf");
    auto stack = [&](std::vector<uint64_t> f) { return Stack(std::move(f), &wb); };
    wb.AddSamples("svc", 10'000, "h1", stack({main, a, leaf}), 5);
    wb.AddSamples("svc", 20'000, "h2", stack({main, b, leaf}), 3);
    wb.AddSamples("svc", 20'000, "h1", stack({main, a, a}), 2);
    wb.AddSamples("other", 20'000, "h1", stack({main}), 100);
    ASSERT_TRUE(store_->Commit(&wb).ok());
  }
  uint64_t Function(const char* name, const char* module, store::WriteBatch* wb) {
    return *store_->interner().InternFunction({name, module, "", 0}, wb);
  }
  uint64_t Stack(std::vector<uint64_t> functions, store::WriteBatch* wb) {
    return *store_->interner().InternStack({std::move(functions), false}, wb);
  }
  absl::StatusOr<Profile> Load(ProfileQuery q) {
    if (q.service.empty()) q.service = "svc";
    if (q.to_ms == 0) q.to_ms = 1'000'000;
    return ProfileReader(store_.get()).Load(q);
  }
  strata::testing::TempDir dir_;
  std::unique_ptr<store::Store> store_;
};

TEST_F(ProfileTest, TopCountsSelfAndTotalOncePerStack) {
  auto p = Load({});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->total, 10u);
  auto top = TopFunctions(*p, /*sort_by_total=*/false);
  ASSERT_GE(top.size(), 3u);
  EXPECT_EQ(p->functions[top[0].function].name, "leaf");
  EXPECT_EQ(top[0].self, 8u);
  EXPECT_EQ(top[0].total, 8u);
  for (const auto& t : top) {
    if (p->functions[t.function].name == "a") {
      EXPECT_EQ(t.self, 2u);
      EXPECT_EQ(t.total, 7u);  // the recursive stack counts once
    }
    if (p->functions[t.function].name == "main") {
      EXPECT_EQ(t.total, 10u);
    }
  }
  auto by_total = TopFunctions(*p, /*sort_by_total=*/true);
  EXPECT_EQ(p->functions[by_total[0].function].name, "main");
}

// A deploy within the range: the new build's functions (another build ID, another release
// directory) are the old build's for top and paths, and a JIT function of two processes is one.
TEST_F(ProfileTest, FunctionsOfTwoBuildsAreMergedForViews) {
  store::WriteBatch wb;
  auto fn = [&](const char* name, const char* module, const char* build) {
    return *store_->interner().InternFunction({name, module, build, 0}, &wb);
  };
  const uint64_t main1 = fn("main", "/srv/1/bin/app", "aa");
  const uint64_t work1 = fn("work", "/srv/1/bin/app", "aa");
  const uint64_t main2 = fn("main", "/srv/2/bin/app", "bb");
  const uint64_t work2 = fn("work", "/srv/2/bin/app", "bb");
  const uint64_t jit1 = fn("LCart;::total", "[jit:/tmp/perf-7.map]", "");
  const uint64_t jit2 = fn("LCart;::total", "[jit:/tmp/perf-9.map]", "");
  const uint64_t other = fn("work", "/srv/2/bin/tool", "cc");  // another program: kept apart
  wb.AddSamples("app", 10'000, "h1", Stack({main1, work1}, &wb), 4);
  wb.AddSamples("app", 20'000, "h1", Stack({main2, work2}, &wb), 3);
  wb.AddSamples("app", 20'000, "h1", Stack({main1, jit1}, &wb), 1);
  wb.AddSamples("app", 20'000, "h2", Stack({main2, jit2}, &wb), 5);
  wb.AddSamples("app", 20'000, "h2", Stack({main2, other}, &wb), 6);
  ASSERT_TRUE(store_->Commit(&wb).ok());
  auto p = Load({.service = "app"});
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->stacks.size(), 5u);
  ASSERT_EQ(p->functions.size(), 7u);

  MergeFunctionsAcrossBuilds(&*p);
  EXPECT_EQ(p->total, 19u);
  ASSERT_EQ(p->functions.size(), 4u);  // main, work, LCart;::total, tool's work
  ASSERT_EQ(p->stacks.size(), 3u);
  EXPECT_EQ(p->stacks[0].count, 7u);  // main > work, both builds; by count, descending
  EXPECT_EQ(p->functions[p->stacks[0].frames[1]].name, "work");
  EXPECT_EQ(p->stacks[1].count, 6u);  // main > work of the other program
  EXPECT_EQ(p->functions[p->stacks[1].frames[1]].module, "/srv/2/bin/tool");
  EXPECT_EQ(p->stacks[2].count, 6u);  // main > the JIT function of both processes
  EXPECT_EQ(p->functions[p->stacks[2].frames[1]].name, "LCart;::total");
  const std::vector<FunctionTotals> top = TopFunctions(*p, true);
  ASSERT_FALSE(top.empty());
  EXPECT_EQ(p->functions[top[0].function].name, "main");
  EXPECT_EQ(top[0].total, 19u);

  // Nothing to merge: left as it was.
  auto plain = Load({});
  ASSERT_TRUE(plain.ok());
  const size_t functions = plain->functions.size(), stacks = plain->stacks.size();
  MergeFunctionsAcrossBuilds(&*plain);
  EXPECT_EQ(plain->functions.size(), functions);
  EXPECT_EQ(plain->stacks.size(), stacks);
}

TEST_F(ProfileTest, FiltersByRangeHostFocusAndIgnore) {
  EXPECT_EQ(Load({.from_ms = 20'000})->total, 5u);
  EXPECT_EQ(Load({.host = "h2"})->total, 3u);
  EXPECT_EQ(Load({.focus = "^b$"})->total, 3u);
  EXPECT_EQ(Load({.ignore = "^b$"})->total, 7u);
  EXPECT_EQ(Load({})->hosts, (std::vector<std::string>{"h1", "h2"}));
}

TEST_F(ProfileTest, RepeatedLoadsOfOneReaderMatchFreshReaders) {
  ProfileReader reader(store_.get());
  auto first = reader.Load({.service = "svc", .to_ms = 1'000'000});
  ASSERT_TRUE(first.ok()) << first.status();
  // New stacks and functions after the reader cached the first ones.
  store::WriteBatch wb;
  const uint64_t main = *store_->interner().InternFunction({"main", "/bin/x", "", 0}, &wb);
  const uint64_t fresh = *store_->interner().InternFunction({"fresh", "/bin/x", "", 0}, &wb);
  wb.AddSamples("svc", 30'000, "h3", *store_->interner().InternStack({{main, fresh}, true}, &wb), 4);
  ASSERT_TRUE(store_->Commit(&wb).ok());
  for (const ProfileQuery& q : {ProfileQuery{.service = "svc", .to_ms = 1'000'000},
                                ProfileQuery{.service = "svc", .to_ms = 1'000'000,
                                             .focus = "fresh"},
                                ProfileQuery{.service = "svc", .to_ms = 1'000'000,
                                             .ignore = "^a$"}}) {
    for (int i = 0; i < 2; ++i) {
      auto cached = reader.Load(q);
      auto fresh_reader = ProfileReader(store_.get()).Load(q);
      ASSERT_TRUE(cached.ok() && fresh_reader.ok());
      EXPECT_EQ(cached->total, fresh_reader->total);
      ASSERT_EQ(cached->stacks.size(), fresh_reader->stacks.size());
      for (size_t s = 0; s < cached->stacks.size(); ++s) {
        const ResolvedStack& a = cached->stacks[s];
        const ResolvedStack& b = fresh_reader->stacks[s];
        EXPECT_EQ(a.stack_id, b.stack_id);
        EXPECT_EQ(a.count, b.count);
        EXPECT_EQ(a.truncated, b.truncated);
        ASSERT_EQ(a.frames.size(), b.frames.size());
        for (size_t f = 0; f < a.frames.size(); ++f) {
          EXPECT_EQ(cached->functions[a.frames[f]].id, fresh_reader->functions[b.frames[f]].id);
          EXPECT_EQ(cached->functions[a.frames[f]].name,
                    fresh_reader->functions[b.frames[f]].name);
        }
      }
    }
  }
  EXPECT_EQ(reader.Load({.service = "svc", .to_ms = 1'000'000})->total, 14u);
  EXPECT_EQ(reader.Load({.service = "svc", .to_ms = 1'000'000, .focus = "fresh"})->total, 4u);
}

// The open window's counts go into a long range's span of whole hours once, in order: a
// stack they raise moves up, one they add takes its place, and the hosts add up.
TEST_F(ProfileTest, OpenWindowCountsJoinASpanOfWholeHours) {
  constexpr int64_t kHour = 3'600'000;
  store::WriteBatch wb;
  auto fn = [&](const char* name) { return Function(name, "/bin/y", &wb); };
  const uint64_t main = fn("main"), work = fn("work"), idle = fn("idle"), fresh = fn("fresh");
  auto stack = [&](std::vector<uint64_t> f) { return Stack(std::move(f), &wb); };
  const uint64_t busy = stack({main, work}), quiet = stack({main, idle});
  const uint64_t added = stack({main, fresh});
  for (int64_t w = 0; w < 12 * kHour; w += 60'000) {
    wb.AddSamples("long", w, "h1", busy, 3);
    wb.AddSamples("long", w, "h2", quiet, 1);
  }
  ASSERT_TRUE(store_->Commit(&wb).ok());
  ASSERT_TRUE(store_->RollUp(12 * kHour).ok());
  auto aggregator = aggregate::WindowAggregator::Create(store_.get(), {});
  ASSERT_TRUE(aggregator.ok()) << aggregator.status();
  const std::string service = "long";
  store::WriteBatch open_window;
  ASSERT_TRUE((*aggregator)
                  ->CommitBatch(&open_window, "h3", 12 * kHour + 10'000,
                                {{&service, quiet, 1000}, {&service, added, 2000}})
                  .ok());
  ProfileReader reader(store_.get(), aggregator->get());
  ProfileQuery q;
  q.service = "long";
  q.to_ms = 13 * kHour;
  for (int read = 0; read < 2; ++read) {  // the span built, then copied
    absl::StatusOr<Profile> p = reader.Load(q);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->stacks.size(), 3u);
    EXPECT_EQ(p->stacks[0].stack_id, busy);
    EXPECT_EQ(p->stacks[0].count, 720u * 3);
    EXPECT_EQ(p->stacks[1].stack_id, added);
    EXPECT_EQ(p->stacks[1].count, 2000u);
    EXPECT_EQ(p->stacks[2].stack_id, quiet);
    EXPECT_EQ(p->stacks[2].count, 720u + 1000);
    EXPECT_EQ(p->hosts, (std::vector<std::string>{"h1", "h2", "h3"}));
    EXPECT_EQ(p->host_samples, (std::vector<uint64_t>{2160, 720, 3000}));
  }
  EXPECT_EQ(store_->Stats().span_misses, 1u);
  EXPECT_EQ(store_->Stats().span_hits, 1u);
}

TEST_F(ProfileTest, UnreadableStackIsDataLoss) {
  store::WriteBatch wb;
  wb.AddSamples("svc", 30'000, "h1", 0x1234, 1);  // no such stack record
  ASSERT_TRUE(store_->Commit(&wb).ok());
  ProfileReader reader(store_.get());
  EXPECT_TRUE(absl::IsDataLoss(reader.Load({.service = "svc", .to_ms = 1'000'000}).status()));
  EXPECT_TRUE(absl::IsDataLoss(reader.Load({.service = "svc", .to_ms = 1'000'000}).status()));
  EXPECT_EQ(reader.Load({.service = "svc", .to_ms = 25'000})->total, 10u);
}

TEST_F(ProfileTest, ClearErrors) {
  EXPECT_TRUE(absl::IsNotFound(Load({.service = "nope"}).status()));
  EXPECT_NE(Load({.service = "nope"}).status().message().find("known: other, svc"),
            std::string::npos)
      << Load({.service = "nope"}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(Load({.focus = "("}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Load({.from_ms = 6, .to_ms = 5}).status()));
  // No window starts in it (a range inside one window, once ToProfileQuery moved its start to
  // the next window's): empty, not wrong.
  absl::StatusOr<Profile> none = Load({.from_ms = 5, .to_ms = 5});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->total, 0u);
}

}  // namespace
}  // namespace strata::server::query
