#include "server/ingest/agent_session.h"

#include <cstring>
#include <map>
#include <utility>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/clock.h"
#include "common/base/escape.h"
#include "common/base/log.h"
#include "common/encoding/packed_contexts.h"
#include "server/commit/profile_type.h"

namespace strata::server::ingest {
namespace {

constexpr size_t kMaxDecodeDepth = 4096;
// Per session: distinct contexts of recent batches (an agent sends a few hundred to a few
// thousand per batch); bounds a connected agent's memory.
constexpr size_t kMaxDecodeCacheEntries = 1 << 14;

// Writes the decode cache's key of `c` into *key (reused: most lookups hit and copy nothing).
absl::string_view DecodeCacheKey(const encoding::EncodedContext& c, std::string* key) {
  key->resize(4 + 8 * c.ids.size());
  const uint32_t leaf = c.leaf;
  std::memcpy(key->data(), &leaf, 4);
  if (!c.ids.empty()) std::memcpy(key->data() + 4, c.ids.data(), 8 * c.ids.size());
  return *key;
}

// Bounds label_set_cache_ (distinct target label sets of one agent).
constexpr size_t kMaxLabelSetCacheEntries = 1 << 12;
std::atomic<uint64_t> g_label_sets_refused{0};

}  // namespace

uint64_t LabelSetsRefused() { return g_label_sets_refused.load(std::memory_order_relaxed); }

absl::StatusOr<absl::flat_hash_map<uint32_t, uint64_t>> AgentSession::TargetLabelSets(
    const v1::SampleBatch& batch, store::WriteBatch* wb) {
  absl::flat_hash_map<uint32_t, uint64_t> out;
  // The profile type is a reserved label over the target's own (agents cannot send "__"
  // keys), so every profile is a label set of its service (commit/profile_type.h).
  const labels::LabelSet profile = commit::ProfileLabels(batch.profile());
  for (const v1::Target& t : batch.targets()) {
    if (t.labels().empty() && identity_.labels.empty() && profile.empty()) {
      out[t.id()] = 0;
      continue;
    }
    labels::LabelSet own(t.labels().begin(), t.labels().end());
    labels::Normalize(&own);
    const labels::LabelSet set =
        labels::Merge(labels::Merge(identity_.labels, own), profile);
    std::string key = absl::StrCat(t.service(), std::string(1, '\0'), labels::Encode(set));
    if (auto it = label_set_cache_.find(key); it != label_set_cache_.end()) {
      out[t.id()] = it->second;
      continue;
    }
    if (auto it = pending_label_sets_.find(key); it != pending_label_sets_.end()) {
      out[t.id()] = it->second;
      continue;
    }
    absl::StatusOr<uint64_t> id =
        store_->interner().InternLabelSet(t.service(), set, limits_.max_label_sets, wb);
    if (absl::IsResourceExhausted(id.status())) {
      // Past the bound the samples are kept, under one overflow set (allowed beyond it).
      if (g_label_sets_refused.fetch_add(1, std::memory_order_relaxed) % 1000 == 0) {
        LogError("agent {}: {}; its samples are stored under strata_overflow=label_sets",
                      base::EscapeForLog(identity_.agent_id), std::string(id.status().message()));
      }
      // One overflow set per profile type, so overflowing samples keep their type.
      id = store_->interner().InternLabelSet(
          t.service(), labels::Merge({{"strata_overflow", "label_sets"}}, profile),
          limits_.max_label_sets + 2, wb);
    }
    if (!id.ok()) return id.status();
    out[t.id()] = *id;
    pending_label_sets_.emplace(std::move(key), *id);
  }
  return out;
}

AgentSession::AgentSession(store::Store* store, AgentIdentity identity,
                           const IngestLimits& limits)
    : store_(store), identity_(std::move(identity)), limits_(limits) {
  node_function_ids_.assign(encoding::kFirstFunctionNode, 0);
}

absl::StatusOr<std::unique_ptr<AgentSession>> AgentSession::Open(
    store::Store* store, AgentIdentity identity, commit::BatchCommitter* committer,
    const IngestLimits& limits) {
  std::unique_ptr<AgentSession> session(new AgentSession(store, std::move(identity), limits));
  if (committer == nullptr) {
    session->own_committer_ = std::make_unique<commit::StoreCommitter>(store);
    committer = session->own_committer_.get();
  }
  session->committer_ = committer;
  const AgentIdentity& id = session->identity_;
  auto applied = store->meta().AppliedSequence(id.agent_id, id.graph_id);
  if (!applied.ok()) return applied.status();
  session->last_applied_ = *applied;

  if (absl::Status s = session->Load(); !s.ok()) return s;
  return session;
}

absl::Status AgentSession::Load() {
  if (loaded_) return absl::OkStatus();
  graph_ = encoding::CallGraph();
  node_function_ids_.assign(encoding::kFirstFunctionNode, 0);
  auto graph = store_->meta().LoadGraph(identity_.agent_id, identity_.graph_id);
  if (!graph.ok()) return graph.status();
  // Replay the persisted graph; stop at the first gap so a partial record set only costs a
  // resend of the rest (the agent is told what we have in Welcome).
  for (const store::GraphNode& node : graph->nodes) {
    if (node.id != graph_.num_nodes()) break;
    store::WriteBatch unused;
    auto fn = store_->interner().InternFunction(
        {node.name, node.module, node.build_id, node.start_offset}, &unused);
    if (!fn.ok()) return fn.status();
    if (!unused.empty()) {
      if (auto st = store_->Commit(&unused); !st.ok()) return st;
    }
    graph_.AddNode();
    node_function_ids_.push_back(*fn);
  }
  std::vector<encoding::CallEdge> edges;
  std::vector<uint8_t> back;
  edges.reserve(graph->edges.size());
  back.reserve(graph->edges.size());
  bool classified = true;
  for (const store::GraphEdge& e : graph->edges) {
    edges.push_back({e.caller, e.call_site, e.callee});
    back.push_back(e.back.value_or(false));
    classified &= e.back.has_value();
  }
  if (!edges.empty()) {
    // The classification kept with the edges makes a reload linear in the graph's size;
    // classifying again costs what it cost as the deltas came (bounded by the search budget
    // then, not now), and is left for records written before it was kept.
    absl::Status st = classified ? encoding::RestoreEdges(graph_, edges, back)
                                 : encoding::AppendEdges(graph_, 0, edges);
    if (!st.ok()) {
      // A persisted graph that does not replay is treated as absent: the agent resends it.
      LogWarn("the stored call graph of agent {} (graph {:x}) does not load: {}; it is "
              "asked for again",
              base::EscapeForLog(identity_.agent_id), identity_.graph_id, st.ToString());
      graph_ = encoding::CallGraph();
      node_function_ids_.assign(encoding::kFirstFunctionNode, 0);
    }
  }
  loaded_ = true;
  return absl::OkStatus();
}

void AgentSession::Unload() {
  if (!loaded_) return;
  graph_ = encoding::CallGraph();
  std::vector<uint64_t>().swap(node_function_ids_);
  numberings_.Clear();
  absl::flat_hash_map<std::string, uint64_t>().swap(decode_cache_);
  absl::flat_hash_map<std::string, uint64_t>().swap(pending_cache_);
  decode_cache_epoch_ = UINT64_MAX;
  loaded_ = false;
}

size_t AgentSession::MemoryBytes() const {
  if (!loaded_) return sizeof(*this);
  // Estimates from the structures' layouts: per node its function ID and adjacency lists, per
  // edge the edge and its index entries, per cached context its key and ID; the numberings
  // of the epochs kept (each a few dozen bytes per edge) as they are.
  return sizeof(*this) + 64 * graph_.num_nodes() + 88 * graph_.num_edges() +
         96 * decode_cache_.size() + numberings_.MemoryBytes();
}

absl::Status AgentSession::ApplyGraphDelta(const v1::GraphDelta& delta) {
  if (absl::Status s = Load(); !s.ok()) return s;
  if (delta.first_node() != graph_.num_nodes() && delta.nodes_size() > 0) {
    return absl::FailedPreconditionError(absl::StrCat("graph delta starts at node ",
                                                      delta.first_node(), ", server has ",
                                                      graph_.num_nodes()));
  }
  if (delta.first_edge() != graph_.num_edges() && delta.edges_size() > 0) {
    return absl::FailedPreconditionError(absl::StrCat("graph delta starts at edge ",
                                                      delta.first_edge(), ", server has ",
                                                      graph_.num_edges()));
  }
  // Validate everything before changing anything.
  if (absl::Status s = CheckGraphDelta(delta, limits_); !s.ok()) return s;
  if (graph_.num_nodes() + delta.nodes_size() > limits_.max_graph_nodes ||
      graph_.num_edges() + delta.edges_size() > limits_.max_graph_edges) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the agent's call graph would exceed ", limits_.max_graph_nodes, " nodes or ",
        limits_.max_graph_edges, " edges (strata-server --max-graph-nodes, --max-graph-edges)"));
  }
  for (int i = 0; i < delta.nodes_size(); ++i) {
    const v1::FunctionNode& n = delta.nodes(i);
    if (n.id() != delta.first_node() + static_cast<uint32_t>(i)) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph delta node ", i, " has id ", n.id(), ", expected ",
                       delta.first_node() + i));
    }
    if (n.name().empty()) return absl::InvalidArgumentError("graph delta node without a name");
  }
  const size_t nodes_after = graph_.num_nodes() + delta.nodes_size();
  std::vector<encoding::CallEdge> edges;
  edges.reserve(delta.edges_size());
  for (const v1::CallEdge& e : delta.edges()) {
    if (e.caller() >= nodes_after || e.callee() >= nodes_after) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph delta edge references unknown node (", e.caller(), " -> ",
                       e.callee(), ", graph has ", nodes_after, " nodes)"));
    }
    edges.push_back({e.caller(), e.call_site(), e.callee()});
  }

  store::WriteBatch wb;
  std::vector<uint64_t> new_function_ids;
  std::vector<store::GraphNode> records;
  for (const v1::FunctionNode& n : delta.nodes()) {
    store::FunctionInfo info{n.name(), n.module(), n.build_id(), n.start_offset()};
    auto fn = store_->interner().InternFunction(info, &wb);
    if (!fn.ok()) return fn.status();
    new_function_ids.push_back(*fn);
    records.push_back({n.id(), n.name(), n.module(), n.build_id(), n.start_offset()});
  }

  // Apply edges to a trial copy first would cost a graph copy; AppendEdges is all-or-nothing
  // on its own, but nodes must exist before it runs, so nodes are rolled back on failure.
  const size_t nodes_before = graph_.num_nodes();
  if (auto st = encoding::AppendNodes(graph_, delta.first_node(), delta.nodes_size());
      !st.ok() && delta.nodes_size() > 0) {
    return st;
  }
  const uint64_t max_search_steps =
      (graph_.num_edges() + edges.size() + kGraphSearchFloorEdges) *
      uint64_t{limits_.max_graph_search_steps_per_edge};
  if (auto st = encoding::AppendEdges(graph_, delta.first_edge(), edges, max_search_steps);
      !st.ok() && !edges.empty()) {
    if (graph_.num_nodes() != nodes_before) {
      // CallGraph cannot shrink; rebuild it from the persisted state. Rare: only a delta
      // whose nodes were fine but whose edges were not.
      loaded_ = false;
      if (absl::Status reloaded = Load(); !reloaded.ok()) return reloaded;
    }
    if (absl::IsResourceExhausted(st)) {
      return absl::ResourceExhaustedError(
          absl::StrCat(st.message(), " (strata-server --max-graph-search-steps-per-edge)"));
    }
    return st;
  }

  wb.AppendGraphNodes(identity_.agent_id, identity_.graph_id, records);
  std::vector<store::GraphEdge> edge_records;
  edge_records.reserve(edges.size());
  for (size_t i = 0; i < edges.size(); ++i) {
    const encoding::CallEdge& e = edges[i];
    edge_records.push_back(
        {e.caller, e.call_site, e.callee, graph_.is_back_edge(delta.first_edge() + i)});
  }
  if (!edge_records.empty()) {
    wb.AppendGraphEdges(identity_.agent_id, identity_.graph_id, delta.first_edge(),
                        edge_records);
  }
  if (auto st = store_->Commit(&wb); !st.ok()) return st;
  node_function_ids_.insert(node_function_ids_.end(), new_function_ids.begin(),
                            new_function_ids.end());
  // An agent's graph only grows: past half of either limit the agent starts a new one,
  // and an older agent delivers nothing more at a limit. Said once, as it passes half.
  const uint64_t edges_before = graph_.num_edges() - edges.size();
  if ((nodes_before <= limits_.max_graph_nodes / 2 &&
       graph_.num_nodes() > limits_.max_graph_nodes / 2) ||
      (edges_before <= limits_.max_graph_edges / 2 &&
       graph_.num_edges() > limits_.max_graph_edges / 2)) {
    LogWarn("agent {}: its call graph passed half of the server's limits ({} of {} nodes, {} of "
            "{} edges); the agent starts a new graph once it is caught up (one that does not, "
            "older than the limits in Welcome, delivers nothing past a limit until it "
            "restarts; strata-server --max-graph-nodes, --max-graph-edges)",
            base::EscapeForLog(identity_.agent_id), graph_.num_nodes(), limits_.max_graph_nodes,
            graph_.num_edges(), limits_.max_graph_edges);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> AgentSession::StackIdFor(const encoding::Numbering& numbering,
                                                  const encoding::EncodedContext& context,
                                                  store::WriteBatch* wb) {
  thread_local std::string key_buffer;
  const absl::string_view key = DecodeCacheKey(context, &key_buffer);
  if (auto it = decode_cache_.find(key); it != decode_cache_.end()) return it->second;
  if (auto it = pending_cache_.find(key); it != pending_cache_.end()) return it->second;

  bool truncated = false;
  auto path = encoding::Decode(numbering, context, &truncated, kMaxDecodeDepth);
  if (!path.ok()) return path.status();
  batch_decoded_frames_ += path->size();
  if (batch_decoded_frames_ > limits_.max_batch_decoded_frames) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "its contexts decode to more than ", limits_.max_batch_decoded_frames, " new frames"));
  }
  store::StackFrames frames;
  frames.truncated = truncated;
  frames.function_ids.reserve(path->size());
  if (path->size() > 1) frames.call_sites.reserve(path->size() - 1);
  for (const encoding::PathFrame& f : *path) {
    if (f.function >= node_function_ids_.size() || node_function_ids_[f.function] == 0) {
      return absl::InvalidArgumentError(absl::StrCat("context references node ", f.function,
                                                     " which has no function record"));
    }
    frames.function_ids.push_back(node_function_ids_[f.function]);
    // The leaf's call site is not a call (0).
    if (frames.function_ids.size() < path->size()) frames.call_sites.push_back(f.call_site);
  }
  store::ZeroCallSitesInRecursion(frames.function_ids, frames.call_sites, recursive_);
  auto stack_id = store_->interner().InternStack(frames, wb);
  if (!stack_id.ok()) return stack_id.status();
  if (decode_cache_.size() >= kMaxDecodeCacheEntries) decode_cache_.clear();
  // Entries become visible to later batches only once this batch commits (its write batch
  // carries the stack record); see ApplyBatch.
  pending_cache_.emplace(key, *stack_id);
  return *stack_id;
}

absl::Status AgentSession::PutLeafAddresses(
    const v1::SampleBatch& batch, const absl::flat_hash_map<uint32_t, const v1::Target*>& targets,
    int64_t window_start_ms, store::WriteBatch* wb) {
  if (batch.leaf_addresses_size() == 0) return absl::OkStatus();
  std::map<std::string, std::vector<store::LeafAddressCount>> by_service;
  for (const v1::LeafAddresses& l : batch.leaf_addresses()) {
    auto target = targets.find(l.target_id());
    if (target == targets.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch ", batch.sequence(), " has leaf addresses of unknown target ", l.target_id()));
    }
    if (l.node() >= node_function_ids_.size() || node_function_ids_[l.node()] == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch ", batch.sequence(), " has leaf addresses of unknown node ", l.node()));
    }
    std::vector<store::LeafAddressCount>& out = by_service[target->second->service()];
    uint64_t offset = 0;
    for (int i = 0; i < l.offset_deltas_size(); ++i) {
      if (offset + l.offset_deltas(i) < offset) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch ", batch.sequence(), ": leaf address offsets of node ", l.node(),
            " overflow"));
      }
      offset += l.offset_deltas(i);
      if (l.counts(i) > 0) out.push_back({node_function_ids_[l.node()], offset, l.counts(i)});
    }
  }
  for (const auto& [service, counts] : by_service) {
    wb->PutLeafAddresses(service, window_start_ms, identity_.host, identity_.agent_id,
                         identity_.graph_id, batch.sequence(), counts);
  }
  return absl::OkStatus();
}

absl::StatusOr<AppliedBatch> AgentSession::ApplyBatch(const v1::SampleBatch& batch) {
  AppliedBatch applied{&identity_, &batch, commit::WindowStart(batch.start_ms()), false, {}};
  if (absl::Status s = Load(); !s.ok()) return s;
  if (batch.sequence() == 0) {
    return absl::InvalidArgumentError("sample batch without a sequence number");
  }
  if (batch.sequence() <= last_applied_) {  // resent after a lost Ack: acknowledge only
    applied.duplicate = true;
    return applied;
  }
  if (batch.sequence() - last_applied_ > limits_.max_sequence_gap) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", batch.sequence(), " jumps more than ", limits_.max_sequence_gap,
        " past the last applied batch ", last_applied_, " of this agent's graph ",
        absl::Hex(identity_.graph_id)));
  }
  if (waiting_for_ != 0 && batch.sequence() > waiting_for_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "batch ", batch.sequence(), " waits for batch ", waiting_for_, " (resend in order)"));
  }
  if (batch.epoch() > graph_.num_edges()) {
    waiting_for_ = batch.sequence();
    return absl::FailedPreconditionError(
        absl::StrCat("batch ", batch.sequence(), " is encoded against epoch ", batch.epoch(),
                     " but the server has ", graph_.num_edges(), " edges"));
  }
  if (batch.epoch() < last_applied_epoch_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", batch.sequence(), " is encoded against epoch ", batch.epoch(),
        ", older than epoch ", last_applied_epoch_, " of batch ", last_applied_,
        " applied before it (an agent's epochs never go back)"));
  }
  if (absl::Status s = CheckBatchShape(batch, limits_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch.sequence(), ": ", s.message()));
  }
  if (batch.start_ms() <= 0 || batch.end_ms() < batch.start_ms()) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch.sequence(),
                                                   " has an invalid time window"));
  }
  if (const int64_t ahead_ms = batch.end_ms() - base::NowMs(); ahead_ms > kMaxAheadOfServerMs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch ", batch.sequence(), " ends ", ahead_ms / 1000,
        " s past the server's clock (at most 24 h): is the agent host's clock right?"));
  }
  absl::flat_hash_map<uint32_t, const v1::Target*> targets;
  for (const v1::Target& t : batch.targets()) targets[t.id()] = &t;
  // Both context forms as records: packed first, then the repeated field. Malformed packed
  // bytes reject the whole batch before anything is decoded.
  // One per ingest thread, reused batch after batch: decoding allocates nothing once warm.
  thread_local std::vector<encoding::ContextRecord> contexts;
  if (batch.packed_contexts().empty()) {
    contexts.clear();
  } else {
    if (absl::Status s = encoding::DecodePackedContexts(batch.packed_contexts(), &contexts);
        !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch ", batch.sequence(), ": malformed packed contexts: ", s.message()));
    }
  }
  if (contexts.size() + batch.contexts_size() > limits_.max_batch_contexts) {
    return absl::InvalidArgumentError(absl::StrCat("batch ", batch.sequence(), " has more than ",
                                                   limits_.max_batch_contexts, " contexts"));
  }
  contexts.reserve(contexts.size() + batch.contexts_size());
  for (const v1::ContextCount& c : batch.contexts()) {
    encoding::ContextRecord& r = contexts.emplace_back();
    r.target_id = c.target_id();
    r.context.leaf = c.leaf();
    r.context.ids.assign(c.ids().begin(), c.ids().end());
    r.count = c.count();
  }
  for (const encoding::ContextRecord& c : contexts) {
    if (c.count > limits_.max_context_count) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", batch.sequence(),
                                                     ": a context count of ", c.count,
                                                     " exceeds the limit of ",
                                                     limits_.max_context_count));
    }
  }
  auto numbering = numberings_.Get(graph_, batch.epoch());
  if (!numbering.ok()) return numbering.status();
  if (decode_cache_epoch_ != batch.epoch()) {
    decode_cache_.clear();
    decode_cache_epoch_ = batch.epoch();
  }

  store::WriteBatch wb;
  pending_cache_.clear();
  batch_decoded_frames_ = 0;
  pending_label_sets_.clear();
  applied.contexts.reserve(contexts.size());
  absl::flat_hash_map<uint32_t, uint64_t> label_sets;
  if (batch.capture_id().empty()) {
    auto sets = TargetLabelSets(batch, &wb);
    if (!sets.ok()) return sets.status();
    label_sets = *std::move(sets);
  }
  // Continuous-profile counts are the committer's cells; captured samples are records.
  std::vector<commit::BatchCommitter::Cell> cells;
  for (const encoding::ContextRecord& c : contexts) {
    auto target = targets.find(c.target_id);
    if (target == targets.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch ", batch.sequence(), " references unknown target ", c.target_id));
    }
    auto stack_id = StackIdFor(**numbering, c.context, &wb);
    if (!stack_id.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("batch ", batch.sequence(),
                                                     ": undecodable context: ",
                                                     stack_id.status().message()));
    }
    if (c.count == 0) continue;
    const std::string& service = target->second->service();
    if (batch.capture_id().empty()) {
      cells.push_back({&service, *stack_id, c.count, label_sets[c.target_id]});
    } else {
      wb.AddCaptureSamples(batch.capture_id(), applied.window_start_ms, identity_.host,
                           *stack_id, c.count);
    }
    applied.contexts.push_back({&service, *stack_id, c.count});
  }
  if (batch.capture_id().empty() && batch.unwind_size() > 0) {
    // The agents' unwinding counters, per service, in this batch's commit: exactly once.
    std::map<std::string, store::UnwindCounts> unwind;
    for (const v1::UnwindCounters& u : batch.unwind()) {
      auto target = targets.find(u.target_id());
      if (target == targets.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch ", batch.sequence(), " has unwind counters of unknown target ", u.target_id()));
      }
      unwind[target->second->service()].Add({u.stacks(), u.truncated(), u.verify_failures(),
                                             u.jit_frames_cfi(), u.jit_frames_fp(), u.lost(),
                                             u.python_frames(), u.python_stale()});
    }
    for (const auto& [service, counts] : unwind) {
      wb.PutUnwindCounts(service, applied.window_start_ms, identity_.agent_id,
                         identity_.graph_id, batch.sequence(), counts);
    }
  }
  // The host's throughput in this window, in this batch's commit: exactly once.
  for (const auto& [service, requests] : batch.requests()) {
    if (requests == 0) continue;
    wb.PutRequests(service, applied.window_start_ms, identity_.host, identity_.agent_id,
                   identity_.graph_id, batch.sequence(), requests);
  }
  if (auto st = PutLeafAddresses(batch, targets, applied.window_start_ms, &wb); !st.ok()) {
    return st;
  }
  wb.SetAppliedSequence(identity_.agent_id, identity_.graph_id, batch.sequence());
  // Once an hour is enough for IngestService::SweepGraphs, which waits days.
  const int64_t now_ms = base::NowMs();
  const bool mark_graph = now_ms - graph_marked_ms_ >= kGraphMarkIntervalMs;
  if (mark_graph) wb.MarkGraphUsed(identity_.agent_id, identity_.graph_id, now_ms);
  ++batches_;
  wb.PutAgent({identity_.agent_id, identity_.host, identity_.arch, identity_.version,
               batch.end_ms(), batches_, identity_.owner});
  if (auto st = committer_->CommitBatch(&wb, identity_.host, applied.window_start_ms, cells);
      !st.ok()) {
    --batches_;
    // The store refuses a sequence at or below the applied one atomically: another stream
    // of the same agent (a reconnect racing the old stream) applied it first.
    if (absl::IsAlreadyExists(st)) {
      pending_cache_.clear();
      pending_label_sets_.clear();
      applied.duplicate = true;
      applied.contexts.clear();
      return applied;
    }
    return st;
  }
  last_applied_ = batch.sequence();
  last_applied_epoch_ = batch.epoch();
  if (mark_graph) graph_marked_ms_ = now_ms;
  waiting_for_ = 0;
  decode_cache_.merge(pending_cache_);
  pending_cache_.clear();
  if (label_set_cache_.size() + pending_label_sets_.size() > kMaxLabelSetCacheEntries) {
    label_set_cache_.clear();
  }
  label_set_cache_.merge(pending_label_sets_);
  pending_label_sets_.clear();
  return applied;
}

}  // namespace strata::server::ingest
