#include "server/ingest/agent_session.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ingest/fake_agent.h"
#include "server/query/profile.h"

namespace strata::server::ingest {
namespace {

using ::testing::ElementsAre;
using strata::testing::TempDir;

std::vector<std::string> Names(const query::Profile& p, const query::ResolvedStack& s) {
  std::vector<std::string> out;
  for (uint32_t f : s.frames) out.push_back(p.functions[f].name);
  return out;
}

class AgentSessionTest : public ::testing::TestWithParam<Form> {
 protected:
  void SetUp() override { Reopen(); }
  // A batch in the form under test.
  v1::SampleBatch Batch(uint64_t seq, uint64_t epoch, std::vector<v1::ContextCount> contexts,
                        uint32_t target_id = 1) {
    return ingest::Batch(seq, epoch, std::move(contexts), GetParam(), target_id);
  }
  void Reopen() {
    store_.reset();
    auto s = store::Store::Open(dir_.path(), {});
    ASSERT_TRUE(s.ok()) << s.status();
    store_ = std::move(*s);
  }
  // 2,000 contexts of one sample each under 40 callers: a graph of about 4,000 edges.
  static std::vector<v1::ContextCount> WideContexts(FakeAgent& agent) {
    std::vector<v1::ContextCount> contexts;
    for (int i = 0; i < 2000; ++i) {
      contexts.push_back(
          agent.Context({"main", absl::StrCat("f", i % 40), absl::StrCat("g", i)}, 1));
    }
    return contexts;
  }
  std::unique_ptr<AgentSession> Open(uint64_t graph_id = 7, const IngestLimits& limits = {}) {
    auto s = AgentSession::Open(store_.get(), {"agent-1", "host-a", "x86_64", "test", graph_id},
                                nullptr, limits);
    EXPECT_TRUE(s.ok()) << s.status();
    return std::move(*s);
  }
  query::Profile Load() {
    query::ProfileReader reader(store_.get());
    auto p = reader.Load({.service = "demo", .from_ms = 0, .to_ms = INT64_MAX});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : query::Profile{};
  }

  TempDir dir_;
  std::unique_ptr<store::Store> store_;
};

TEST_P(AgentSessionTest, DecodesAndStoresBatch) {
  FakeAgent agent;
  auto c1 = agent.Context({"main", "serve", "tokenize"}, 6);
  auto c2 = agent.Context({"main", "serve", "deflate"}, 3);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto applied = session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c1, c2}));
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->contexts.size(), 2u);

  query::Profile p = Load();
  EXPECT_EQ(p.total, 9u);
  ASSERT_EQ(p.stacks.size(), 2u);
  EXPECT_THAT(Names(p, p.stacks[0]), ElementsAre("main", "serve", "tokenize"));
  EXPECT_THAT(Names(p, p.stacks[1]), ElementsAre("main", "serve", "deflate"));
  EXPECT_EQ(p.stacks[0].count, 6u);
  // The stack keeps its call sites (the fake agent's: 100 + depth), for source lines.
  auto stack = store_->interner().GetStack(p.stacks[0].stack_id);
  ASSERT_TRUE(stack.ok()) << stack.status();
  EXPECT_THAT(stack->call_sites, ElementsAre(100, 101));
}

// Frames whose function is called again deeper keep no call site: recursion from two sites
// would otherwise make exponentially many stacks.
TEST_P(AgentSessionTest, RecursiveFramesKeepNoCallSite) {
  FakeAgent agent;
  auto c = agent.Context({"main", "fib", "fib", "fib", "leaf"}, 4);
  auto mutual = agent.Context({"main", "a", "b", "a", "b"}, 2);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c, mutual})).ok());
  query::Profile p = Load();
  ASSERT_EQ(p.stacks.size(), 2u);
  auto fib = store_->interner().GetStack(p.stacks[0].stack_id);
  ASSERT_TRUE(fib.ok()) << fib.status();
  // main's call of fib and the innermost fib's call of leaf keep theirs.
  EXPECT_THAT(fib->call_sites, ElementsAre(100, 0, 0, 103));
  auto ab = store_->interner().GetStack(p.stacks[1].stack_id);
  ASSERT_TRUE(ab.ok()) << ab.status();
  EXPECT_THAT(ab->call_sites, ElementsAre(100, 0, 0, 103));
}

TEST_P(AgentSessionTest, ResentBatchIsAppliedOnce) {
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto batch = Batch(1, agent.graph.num_edges(), {c});
  ASSERT_TRUE(session->ApplyBatch(batch).ok());
  auto again = session->ApplyBatch(batch);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(Load().total, 5u);
}

TEST_P(AgentSessionTest, RequestsAreStoredOncePerHostAndWindow) {
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto batch = Batch(1, agent.graph.num_edges(), {c});
  (*batch.mutable_requests())["demo"] = 40;
  ASSERT_TRUE(session->ApplyBatch(batch).ok());
  ASSERT_TRUE(session->ApplyBatch(batch).ok());  // resent: acknowledged only
  auto next = Batch(2, agent.graph.num_edges(), {c});
  (*next.mutable_requests())["demo"] = 2;
  ASSERT_TRUE(session->ApplyBatch(next).ok());

  query::ProfileReader reader(store_.get());
  query::ProfileQuery q{.service = "demo", .from_ms = 0, .to_ms = INT64_MAX, .requests = true};
  EXPECT_EQ(reader.Load(q)->requests, 42u);
  q.host = "host-a";
  EXPECT_EQ(reader.Load(q)->requests, 42u);
  q.host = "host-b";
  EXPECT_EQ(reader.Load(q)->requests, 0u);
  EXPECT_EQ(Load().requests, 0u);  // not asked

  auto capture = Batch(3, agent.graph.num_edges(), {c});
  capture.set_capture_id("cap");
  (*capture.mutable_requests())["demo"] = 1;
  EXPECT_FALSE(session->ApplyBatch(capture).ok());
}

TEST_P(AgentSessionTest, GraphSurvivesServerRestart) {
  FakeAgent agent;
  auto c1 = agent.Context({"main", "a", "b"}, 2);
  {
    auto session = Open();
    ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
    ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c1})).ok());
  }
  Reopen();
  auto session = Open();
  EXPECT_EQ(session->num_nodes(), agent.graph.num_nodes());
  EXPECT_EQ(session->num_edges(), agent.graph.num_edges());
  EXPECT_EQ(session->last_applied_sequence(), 1u);
  // A later batch encoded against the same graph still decodes.
  const uint32_t nodes = session->num_nodes();
  const uint64_t edges = session->num_edges();
  auto c2 = agent.Context({"main", "a", "c"}, 4);
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(nodes, edges)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {c1, c2})).ok());
  EXPECT_EQ(Load().total, 8u);
}

// The edges are stored with their classification: a restart or a reload after Unload lays
// the graph out again without classifying (whatever that cost as the deltas came). Graphs
// stored before that was kept are classified again, to the same result.
TEST_P(AgentSessionTest, AStoredGraphLoadsWithoutClassifyingAgain) {
  FakeAgent agent;
  auto c1 = agent.Context({"main", "a", "b", "a", "b"}, 2);  // recursion: back edges
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  EXPECT_GT(session->graph_search_steps(), 0u);
  auto first = session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c1}));
  ASSERT_TRUE(first.ok()) << first.status();
  session->Unload();
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {c1})).ok());
  EXPECT_EQ(session->graph_search_steps(), 0u);
  session.reset();
  Reopen();
  session = Open();
  EXPECT_EQ(session->num_edges(), agent.graph.num_edges());
  EXPECT_EQ(session->graph_search_steps(), 0u);
  ASSERT_TRUE(session->ApplyBatch(Batch(3, agent.graph.num_edges(), {c1})).ok());

  // The same graph as an older server stored it, under another graph ID.
  auto stored = store_->meta().LoadGraph("agent-1", 7);
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (store::GraphEdge& e : stored->edges) {
    ASSERT_TRUE(e.back.has_value());
    e.back.reset();
  }
  store::WriteBatch wb;
  wb.AppendGraphNodes("agent-1", 8, stored->nodes);
  wb.AppendGraphEdges("agent-1", 8, 0, stored->edges);
  ASSERT_TRUE(store_->Commit(&wb).ok());
  auto older = Open(8);
  EXPECT_EQ(older->num_edges(), agent.graph.num_edges());
  EXPECT_GT(older->graph_search_steps(), 0u);
  auto applied = older->ApplyBatch(Batch(1, agent.graph.num_edges(), {c1}));
  ASSERT_TRUE(applied.ok()) << applied.status();
  query::Profile p = Load();
  EXPECT_EQ(p.total, 4 * 2u);
  ASSERT_EQ(p.stacks.size(), 1u);
}

TEST_P(AgentSessionTest, NewGraphIdStartsEmpty) {
  FakeAgent agent;
  agent.Context({"main", "a"}, 1);
  {
    auto session = Open(7);
    ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  }
  auto session = Open(8);
  EXPECT_EQ(session->num_edges(), 0u);
}

// A restarted agent (same agent ID, new graph) numbers its batches from 1 again: they are
// stored, not acknowledged as replays of the earlier incarnation's.
TEST_P(AgentSessionTest, RestartedAgentIsNotTakenForAReplay) {
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  {
    auto session = Open(7);
    ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
    for (uint64_t seq = 1; seq <= 3; ++seq) {
      ASSERT_TRUE(session->ApplyBatch(Batch(seq, agent.graph.num_edges(), {c})).ok());
    }
  }
  auto restarted = Open(8);
  EXPECT_EQ(restarted->last_applied_sequence(), 0u);
  ASSERT_TRUE(restarted->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto applied = restarted->ApplyBatch(Batch(1, agent.graph.num_edges(), {c}));
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_FALSE(applied->duplicate);
  EXPECT_EQ(Load().total, 20u);
  // The first incarnation's batches, resent, are still recognised.
  auto first = Open(7);
  EXPECT_EQ(first->last_applied_sequence(), 3u);
  auto again = first->ApplyBatch(Batch(3, agent.graph.num_edges(), {c}));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(Load().total, 20u);
}

TEST_P(AgentSessionTest, ImplausibleSequenceJumpIsRefused) {
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  IngestLimits limits;
  limits.max_sequence_gap = 100;
  auto session = Open(7, limits);
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto r = session->ApplyBatch(Batch(UINT64_MAX, agent.graph.num_edges(), {c}));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  ASSERT_TRUE(session->ApplyBatch(Batch(100, agent.graph.num_edges(), {c})).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      session->ApplyBatch(Batch(201, agent.graph.num_edges(), {c})).status()));
  // Nothing was poisoned: the next plausible batch is stored.
  auto next = session->ApplyBatch(Batch(101, agent.graph.num_edges(), {c}));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->duplicate);
  EXPECT_EQ(Load().total, 10u);
}

// A batch refused for a missing graph part makes the later ones wait: applying batch 3
// while 2 waits would make 2 look applied (acknowledged, never stored) when it comes again.
TEST_P(AgentSessionTest, LaterBatchesWaitForOneThatNeedsTheGraph) {
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c})).ok());
  const uint32_t nodes = session->num_nodes();
  const uint64_t edges = session->num_edges();
  auto deeper = agent.Context({"main", "work", "deeper"}, 2);
  EXPECT_TRUE(absl::IsFailedPrecondition(
      session->ApplyBatch(Batch(2, agent.graph.num_edges(), {deeper})).status()));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(session->ApplyBatch(Batch(3, edges, {c})).status()));
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(nodes, edges)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {deeper})).ok());
  auto third = session->ApplyBatch(Batch(3, agent.graph.num_edges(), {c}));
  ASSERT_TRUE(third.ok());
  EXPECT_FALSE(third->duplicate);
  EXPECT_EQ(Load().total, 12u);
}

TEST_P(AgentSessionTest, CountsAboveTheLimitAreRefused) {
  FakeAgent agent;
  auto huge = agent.Context({"main", "work"}, UINT64_MAX);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto r = session->ApplyBatch(Batch(1, agent.graph.num_edges(), {huge}));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  auto largest = agent.Context({"main", "work"}, (uint64_t{1} << 32) - 1);
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {largest})).ok());
  EXPECT_EQ(Load().total, (uint64_t{1} << 32) - 1);
}

// A batch from a host whose clock is far ahead (year 2262 here) is refused, naming the clock;
// nothing of it is stored, and the next batch, in time, is.
TEST_P(AgentSessionTest, BatchesFarPastTheServersClockAreRefused) {
  FakeAgent agent;
  auto context = agent.Context({"main", "work"}, 5);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  v1::SampleBatch future = Batch(1, agent.graph.num_edges(), {context});
  future.set_end_ms(std::numeric_limits<int64_t>::max());
  auto r = session->ApplyBatch(future);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("clock"), std::string_view::npos) << r.status();
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {context})).ok());
  EXPECT_EQ(Load().total, 5u);
}

// Contexts that decode to more frames than a batch may: the batch is refused, nothing of it
// stored, and the next batch, within the limit, is. Stacks decoded by earlier batches do not
// count again.
TEST_P(AgentSessionTest, FramesDecodedPerBatchAreBounded) {
  FakeAgent agent;
  auto deep = agent.Context({"main", "a", "b", "c", "d", "e", "f", "g"}, 1);
  auto other = agent.Context({"main", "a", "b", "c", "d", "e", "f", "h"}, 1);
  IngestLimits limits;
  limits.max_batch_decoded_frames = 12;
  auto session = Open(7, limits);
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto refused = session->ApplyBatch(Batch(1, agent.graph.num_edges(), {deep, other}));
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("more than 12 new frames"), std::string::npos)
      << refused.status();
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {deep})).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {deep, other})).ok());
  EXPECT_EQ(Load().total, 3u);
}

TEST_P(AgentSessionTest, GraphAndBatchLimits) {
  FakeAgent agent;
  auto c = agent.Context({"main", "a", "b", "c"}, 1);
  IngestLimits limits;
  limits.max_graph_nodes = 4;
  limits.max_batch_services = 1;
  auto session = Open(7, limits);
  // 2 + 4 function nodes: beyond the graph limit, nothing is applied.
  EXPECT_TRUE(absl::IsResourceExhausted(session->ApplyGraphDelta(agent.Delta(2, 0))));
  EXPECT_EQ(session->num_nodes(), 2u);
  limits.max_graph_nodes = 1u << 20;
  limits.max_delta_nodes = 2;
  session = Open(7, limits);
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyGraphDelta(agent.Delta(2, 0))));
  limits.max_delta_nodes = 1u << 16;
  limits.max_name_bytes = 8;
  session = Open(7, limits);
  FakeAgent long_names;
  long_names.Context({"main", "a_function_name_longer_than_eight_bytes"}, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyGraphDelta(long_names.Delta(2, 0))));
  limits.max_name_bytes = 16384;
  session = Open(7, limits);
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto two_services = Batch(1, agent.graph.num_edges(), {c});
  auto* t = two_services.add_targets();
  t->set_id(2);
  t->set_service("other");
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyBatch(two_services).status()));
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {c})).ok());
  EXPECT_EQ(Load().total, 1u);
}

// A chain of functions whose edges come against its topological order costs the search the
// chain's length per edge: past the budget the delta is refused whole.
TEST_P(AgentSessionTest, GraphsTooCostlyToClassifyAreRefused) {
  FakeAgent agent;
  const v1::ContextCount main_a = agent.Context({"main", "a"}, 2);
  IngestLimits limits;
  limits.max_graph_search_steps_per_edge = 64;  // (2,000 + 4,096 edges) x 64: 390,000 steps
  auto session = Open(7, limits);
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  const uint32_t nodes = agent.graph.num_nodes();
  const uint64_t edges = agent.graph.num_edges();
  constexpr int kChain = 2000;  // over 2,000,000 steps
  std::vector<encoding::NodeId> chain;
  for (int i = 0; i < kChain; ++i) chain.push_back(agent.Function(absl::StrCat("f", i)));
  for (int i = 0; i + 1 < kChain; ++i) {
    ASSERT_TRUE(agent.graph.AddEdge({chain[i + 1], 0x10, chain[i]}).ok());
  }
  const v1::GraphDelta chain_delta = agent.Delta(nodes, edges);
  const absl::Status refused = session->ApplyGraphDelta(chain_delta);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("--max-graph-search-steps-per-edge"));
  EXPECT_EQ(session->num_nodes(), nodes);
  EXPECT_EQ(session->num_edges(), edges);
  // What was accepted before still decodes.
  ASSERT_TRUE(session->ApplyBatch(Batch(1, edges, {main_a})).ok());
  EXPECT_EQ(Load().total, 2u);

  limits.max_graph_search_steps_per_edge = 2048;
  session = Open(7, limits);
  EXPECT_TRUE(session->ApplyGraphDelta(chain_delta).ok());
  EXPECT_EQ(session->num_edges(), agent.graph.num_edges());
}

// An agent's graph only grows and stops being accepted at a limit: the server warns once, as
// it passes half of one.
TEST_P(AgentSessionTest, AGraphPassingHalfOfALimitIsWarnedOfOnce) {
  FakeAgent agent;
  agent.Context({"main", "a", "b"}, 1);  // with the root and the marker: 5 nodes
  IngestLimits limits;
  limits.max_graph_nodes = 8;
  auto session = Open(7, limits);
  ::testing::internal::CaptureStdout();
  const absl::Status first = session->ApplyGraphDelta(agent.Delta(2, 0));
  const uint32_t nodes = agent.graph.num_nodes();
  const uint64_t edges = agent.graph.num_edges();
  agent.Context({"main", "c"}, 1);
  const absl::Status second = session->ApplyGraphDelta(agent.Delta(nodes, edges));
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_TRUE(first.ok()) << first;
  ASSERT_TRUE(second.ok()) << second;
  const std::string warning = "agent agent-1: its call graph passed half of the server's limits";
  const size_t at = printed.find(warning);
  EXPECT_NE(at, std::string::npos) << printed;
  EXPECT_THAT(printed, ::testing::HasSubstr("(5 of 8 nodes"));
  EXPECT_EQ(printed.find(warning, at + 1), std::string::npos) << printed;
}

// Each epoch a batch names costs a numbering of the graph up to it, a few dozen bytes per
// edge: the session's memory, which --session-memory bounds, counts them.
TEST_P(AgentSessionTest, NumberingsAreCountedInTheSessionsMemory) {
  FakeAgent agent;
  const std::vector<v1::ContextCount> contexts = WideContexts(agent);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  const size_t graph_only = session->MemoryBytes();
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {contexts[0]})).ok());
  const size_t one_numbering = session->MemoryBytes();
  EXPECT_GT(one_numbering, graph_only + 40 * agent.graph.num_edges());
}

// An agent's graph only grows and its batches are built in sequence order, so their epochs
// never go back. A client that alternated them would cost the server a numbering of the
// whole graph per batch: such a batch is refused before one is computed.
TEST_P(AgentSessionTest, AnEpochOlderThanTheLastAppliedIsRefused) {
  FakeAgent agent;
  const std::vector<v1::ContextCount> contexts = WideContexts(agent);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, 1000, {contexts[0]})).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {contexts[1]})).ok());
  const size_t memory = session->MemoryBytes();
  auto refused = session->ApplyBatch(Batch(3, 1000, {contexts[2]}));
  ASSERT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("older than epoch"));
  EXPECT_LE(session->MemoryBytes(), memory);
  // A resent batch already applied is acknowledged whatever its epoch; the refused sequence
  // is still free.
  auto resent = session->ApplyBatch(Batch(1, 1000, {contexts[0]}));
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_TRUE(resent->duplicate);
  ASSERT_TRUE(session->ApplyBatch(Batch(3, agent.graph.num_edges(), {contexts[2]})).ok());
  EXPECT_EQ(Load().total, 3u);
}

// Under a memory budget a session drops its graph between messages and loads it from the
// store for the next one: batches decode the same.
TEST_P(AgentSessionTest, UnloadedGraphIsLoadedAgainForTheNextBatch) {
  FakeAgent agent;
  auto c1 = agent.Context({"main", "serve", "tokenize"}, 6);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c1})).ok());
  const size_t loaded = session->MemoryBytes();
  session->Unload();
  EXPECT_LT(session->MemoryBytes(), loaded);
  ASSERT_TRUE(session->ApplyBatch(Batch(2, agent.graph.num_edges(), {c1})).ok());
  EXPECT_EQ(session->num_nodes(), agent.graph.num_nodes());
  // A delta after an unload appends where the persisted graph ends.
  session->Unload();
  const uint32_t nodes = agent.graph.num_nodes();
  const uint64_t edges = agent.graph.num_edges();
  auto c2 = agent.Context({"main", "serve", "deflate"}, 3);
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(nodes, edges)).ok());
  session->Unload();
  ASSERT_TRUE(session->ApplyBatch(Batch(3, agent.graph.num_edges(), {c1, c2})).ok());
  query::Profile p = Load();
  EXPECT_EQ(p.total, 21u);
  ASSERT_EQ(p.stacks.size(), 2u);
}

TEST_P(AgentSessionTest, RejectsDeltaNotStartingAtTheEnd) {
  FakeAgent agent;
  agent.Context({"main", "a"}, 1);
  auto session = Open();
  auto st = session->ApplyGraphDelta(agent.Delta(3, 1));
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_EQ(session->num_edges(), 0u);
}

TEST_P(AgentSessionTest, RejectsEdgeToUnknownNodeWithoutChangingState) {
  FakeAgent agent;
  agent.Context({"main", "a"}, 1);
  auto session = Open();
  auto delta = agent.Delta(2, 0);
  delta.mutable_edges(1)->set_callee(999);
  auto st = session->ApplyGraphDelta(delta);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_EQ(session->num_nodes(), 2u);
  // The good delta still applies afterwards.
  EXPECT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
}

TEST_P(AgentSessionTest, RejectsUndecodableContextsAndKeepsEarlierData) {
  FakeAgent agent;
  auto good = agent.Context({"main", "a"}, 3);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {good})).ok());

  auto bad = good;
  bad.set_leaf(12345);  // unknown node
  auto r = session->ApplyBatch(Batch(2, agent.graph.num_edges(), {good, bad}));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  auto out_of_range = good;
  out_of_range.set_ids(0, 1ull << 40);
  r = session->ApplyBatch(Batch(3, agent.graph.num_edges(), {out_of_range}));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  auto unknown_target = Batch(4, agent.graph.num_edges(), {good}, /*target_id=*/9);
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyBatch(unknown_target).status()));
  // Epoch beyond the graph: the agent must resend the graph.
  r = session->ApplyBatch(Batch(5, agent.graph.num_edges() + 5, {good}));
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();

  EXPECT_EQ(Load().total, 3u);
  EXPECT_EQ(session->last_applied_sequence(), 1u);
}

TEST_P(AgentSessionTest, TruncatedStacksAreMarked) {
  FakeAgent agent;
  auto c = agent.Context({"inner", "leaf"}, 2, /*truncated=*/true);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c})).ok());
  query::Profile p = Load();
  ASSERT_EQ(p.stacks.size(), 1u);
  EXPECT_TRUE(p.stacks[0].truncated);
  EXPECT_THAT(Names(p, p.stacks[0]), ElementsAre("inner", "leaf"));
}

TEST_P(AgentSessionTest, BatchWithBothFormsCountsBoth) {
  FakeAgent agent;
  auto c1 = agent.Context({"main", "serve", "tokenize"}, 6);
  auto c2 = agent.Context({"main", "serve", "deflate"}, 3);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  auto batch = ingest::Batch(1, agent.graph.num_edges(), {c1, c2}, Form::kPacked);
  c1.set_target_id(1);
  *batch.add_contexts() = c1;
  ASSERT_TRUE(session->ApplyBatch(batch).ok());
  query::Profile p = Load();
  EXPECT_EQ(p.total, 15u);
  ASSERT_EQ(p.stacks.size(), 2u);
  EXPECT_THAT(Names(p, p.stacks[0]), ElementsAre("main", "serve", "tokenize"));
  EXPECT_EQ(p.stacks[0].count, 12u);
}

// Agents of earlier releases write versions 1 and 2 of packed_contexts; the server reads
// them as it reads the current version 3.
TEST_P(AgentSessionTest, EarlierPackedContextsVersionsAreStillRead) {
  FakeAgent agent;
  // A single-id context and a recursive one (an ID stack).
  auto c1 = agent.Context({"main", "fib", "fib", "fib", "leaf"}, 6);
  auto c2 = agent.Context({"main", "leaf"}, 3);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  uint64_t seq = 0;
  for (uint8_t version : {encoding::kPackedContextsVersion1, encoding::kPackedContextsVersion2,
                          encoding::kPackedContextsVersion3}) {
    auto batch = ingest::Batch(++seq, agent.graph.num_edges(), {c1, c2}, Form::kPacked);
    auto records = encoding::DecodePackedContexts(batch.packed_contexts());
    ASSERT_TRUE(records.ok()) << records.status();
    ASSERT_EQ(records->size(), 2u);
    EXPECT_NE((*records)[0].context.ids.size(), (*records)[1].context.ids.size());
    auto packed = encoding::EncodePackedContexts(*records, version);
    ASSERT_TRUE(packed.ok()) << packed.status();
    ASSERT_EQ(static_cast<uint8_t>((*packed)[0]), version);
    batch.set_packed_contexts(*packed);
    auto applied = session->ApplyBatch(batch);
    ASSERT_TRUE(applied.ok()) << "version " << int{version} << ": " << applied.status();
    EXPECT_EQ(applied->contexts.size(), 2u);
  }
  query::Profile p = Load();
  EXPECT_EQ(p.total, 27u);
  ASSERT_EQ(p.stacks.size(), 2u);
  EXPECT_THAT(Names(p, p.stacks[0]), ElementsAre("main", "fib", "fib", "fib", "leaf"));
  EXPECT_EQ(p.stacks[0].count, 18u);
}

TEST_P(AgentSessionTest, MalformedPackedContextsAreRejectedAndNothingIsStored) {
  FakeAgent agent;
  auto good = agent.Context({"main", "a"}, 3);
  auto other = agent.Context({"main", "b"}, 2);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {good})).ok());

  const auto valid = ingest::Batch(2, agent.graph.num_edges(), {good, other}, Form::kPacked);
  const std::string bytes = valid.packed_contexts();
  std::vector<std::string> malformed = {
      std::string(1, '\x07') + bytes.substr(1),  // unknown version
      bytes.substr(0, bytes.size() - 1),        // truncated
      bytes + std::string(1, '\0'),             // trailing byte
      std::string(1, '\x01') + std::string(12, '\xff'),
  };
  for (const std::string& m : malformed) {
    auto batch = valid;
    batch.set_packed_contexts(m);
    // Repeated contexts in the same batch must not be stored either.
    good.set_target_id(1);
    *batch.add_contexts() = good;
    auto r = session->ApplyBatch(batch);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("packed"));
  }
  // Well-formed bytes whose context does not decode (an unknown leaf).
  auto unknown = good;
  unknown.set_leaf(4000);
  auto r = session->ApplyBatch(
      ingest::Batch(2, agent.graph.num_edges(), {good, unknown}, Form::kPacked));
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_EQ(Load().total, 3u);
  EXPECT_EQ(session->last_applied_sequence(), 1u);
  // The valid batch still applies.
  ASSERT_TRUE(session->ApplyBatch(valid).ok());
  EXPECT_EQ(Load().total, 8u);
}

// Each target's labels (over the agent's Hello labels) become a label set stored with its
// samples; selectors pick them, and a service's distinct sets are bounded.
TEST_P(AgentSessionTest, TargetLabelsAreStoredAndSelected) {
  FakeAgent agent;
  auto c = agent.Context({"main", "work"}, 5);
  AgentIdentity identity{"agent-1", "host-a", "x86_64", "test", 7};
  identity.labels = {{"region", "eu-west"}, {"version", "0"}};
  IngestLimits limits;
  limits.max_label_sets = 2;
  auto opened = AgentSession::Open(store_.get(), identity, nullptr, limits);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto& session = *opened;
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  v1::SampleBatch b = ingest::Batch(1, agent.graph.num_edges(), {c}, Form::kRepeated, 1);
  (*b.mutable_targets(0)->mutable_labels())["version"] = "1";
  auto* t2 = b.add_targets();
  t2->set_id(2);
  t2->set_service("demo");
  t2->set_pid(43);
  (*t2->mutable_labels())["version"] = "2";
  (*t2->mutable_labels())["region"] = "";  // removes the agent's region
  v1::ContextCount c2 = c;
  c2.set_target_id(2);
  c2.set_count(3);
  *b.add_contexts() = c2;
  if (GetParam() == Form::kPacked) Pack(&b);
  ASSERT_TRUE(session->ApplyBatch(b).ok());

  query::ProfileReader reader(store_.get());
  auto load = [&](const std::string& selector) {
    auto p = reader.Load({.service = "demo", .from_ms = 0, .to_ms = INT64_MAX,
                          .selector = selector});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->total : 0;
  };
  EXPECT_EQ(load(""), 8u);
  EXPECT_EQ(load("version=1"), 5u);
  EXPECT_EQ(load("version=2"), 3u);
  EXPECT_EQ(load("region=eu-*"), 5u);
  EXPECT_EQ(load("region!=eu-*"), 3u);
  EXPECT_EQ(load("version=3"), 0u);
  EXPECT_TRUE(absl::IsInvalidArgument(
      reader.Load({.service = "demo", .from_ms = 0, .to_ms = INT64_MAX, .selector = "version"})
          .status()));
  auto sets = store_->interner().ListLabelSets("demo");
  ASSERT_TRUE(sets.ok());
  ASSERT_EQ(sets->size(), 3u);  // the empty set and the two targets'

  // A third distinct set is past the bound: its samples are kept under the overflow set.
  v1::SampleBatch b3 = ingest::Batch(2, agent.graph.num_edges(), {c}, GetParam(), 1);
  (*b3.mutable_targets(0)->mutable_labels())["version"] = "3";
  const uint64_t refused = LabelSetsRefused();
  ASSERT_TRUE(session->ApplyBatch(b3).ok());
  EXPECT_EQ(LabelSetsRefused(), refused + 1);
  EXPECT_EQ(load("strata_overflow=label_sets"), 5u);
  EXPECT_EQ(load(""), 13u);

  // Labels that are not label syntax make the batch invalid; nothing is stored.
  v1::SampleBatch bad = ingest::Batch(3, agent.graph.num_edges(), {c}, GetParam(), 1);
  (*bad.mutable_targets(0)->mutable_labels())["bad key"] = "x";
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyBatch(bad).status()));
  EXPECT_EQ(load(""), 13u);
}

// Off-CPU batches are a profile of their own: the same targets and stacks under the reserved
// label __profile__=off-cpu, which agents may not send themselves.
TEST_P(AgentSessionTest, OffCpuBatchesAreTheirOwnProfile) {
  FakeAgent agent;
  auto c = agent.Context({"main", "wait"}, 5);
  auto c7 = agent.Context({"main", "wait"}, 7);
  auto session = Open();
  ASSERT_TRUE(session->ApplyGraphDelta(agent.Delta(2, 0)).ok());
  ASSERT_TRUE(session->ApplyBatch(Batch(1, agent.graph.num_edges(), {c})).ok());
  v1::SampleBatch off = Batch(2, agent.graph.num_edges(), {c7});
  off.set_profile(v1::PROFILE_OFF_CPU);
  ASSERT_TRUE(session->ApplyBatch(off).ok());

  query::ProfileReader reader(store_.get());
  auto total = [&](v1::ProfileType type, const std::string& selector = "") {
    auto p = reader.Load({.service = "demo", .from_ms = 0, .to_ms = INT64_MAX,
                          .selector = selector, .type = type});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? p->total : 0;
  };
  EXPECT_EQ(total(v1::PROFILE_CPU), 5u);
  EXPECT_EQ(total(v1::PROFILE_OFF_CPU), 7u);
  EXPECT_EQ(total(v1::PROFILE_WALL), 12u);
  EXPECT_EQ(total(v1::PROFILE_WALL, "__profile__=off-cpu"), 7u);
  auto sets = store_->interner().ListLabelSets("demo");
  ASSERT_TRUE(sets.ok());
  ASSERT_EQ(sets->size(), 2u);
  EXPECT_EQ(sets->back().labels, (labels::LabelSet{{"__profile__", "off-cpu"}}));

  // A reserved key from the agent, a wall batch, an off-CPU capture: refused, nothing stored.
  v1::SampleBatch forged = Batch(3, agent.graph.num_edges(), {c});
  (*forged.mutable_targets(0)->mutable_labels())["__profile__"] = "off-cpu";
  auto r = session->ApplyBatch(forged);
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("reserved"));
  v1::SampleBatch wall = Batch(3, agent.graph.num_edges(), {c});
  wall.set_profile(v1::PROFILE_WALL);
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyBatch(wall).status()));
  v1::SampleBatch capture = Batch(3, agent.graph.num_edges(), {c});
  capture.set_profile(v1::PROFILE_OFF_CPU);
  capture.set_capture_id("cap-1");
  EXPECT_TRUE(absl::IsInvalidArgument(session->ApplyBatch(capture).status()));
  EXPECT_EQ(total(v1::PROFILE_WALL), 12u);
  EXPECT_EQ(session->last_applied_sequence(), 2u);
  EXPECT_TRUE(absl::IsInvalidArgument(
      reader.Load({.service = "demo", .from_ms = 0, .to_ms = INT64_MAX,
                   .capture_id = "cap-1", .type = v1::PROFILE_OFF_CPU})
          .status()));
}

TEST(IngestLimitsTest, ReservedHelloLabelsAreRefused) {
  v1::Hello hello;
  hello.set_agent_id("a");
  hello.set_host("h");
  (*hello.mutable_labels())["region"] = "eu";
  EXPECT_TRUE(CheckHello(hello, {}).ok());
  (*hello.mutable_labels())["__profile__"] = "off-cpu";
  EXPECT_TRUE(absl::IsInvalidArgument(CheckHello(hello, {})));
}

// Contexts name their target by ID; two targets of one ID (the last one won) made it unclear
// whose samples they were.
TEST(IngestLimitsTest, TargetsListedTwiceAreRefused) {
  v1::SampleBatch batch;
  for (const char* service : {"a", "b"}) {
    v1::Target* t = batch.add_targets();
    t->set_id(1);
    t->set_service(service);
  }
  batch.set_profile(v1::PROFILE_CPU);
  const absl::Status refused = CheckBatchShape(batch, {});
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("list target 1 twice"));
  batch.mutable_targets(1)->set_id(2);
  EXPECT_TRUE(CheckBatchShape(batch, {}).ok());

  v1::Heartbeat heartbeat;
  *heartbeat.mutable_targets() = batch.targets();
  EXPECT_TRUE(CheckHeartbeat(heartbeat, {}).ok());
  heartbeat.mutable_targets(0)->set_id(2);
  EXPECT_TRUE(absl::IsInvalidArgument(CheckHeartbeat(heartbeat, {})));
}

INSTANTIATE_TEST_SUITE_P(Forms, AgentSessionTest,
                         ::testing::Values(Form::kRepeated, Form::kPacked),
                         [](const ::testing::TestParamInfo<Form>& info) {
                           return info.param == Form::kPacked ? "Packed" : "Repeated";
                         });

}  // namespace
}  // namespace strata::server::ingest
