#include "server/store/write_batch.h"

#include <algorithm>
#include <string>

#include "common/base/saturating.h"
#include "server/store/codec.h"
#include "server/store/rollup_plan.h"
#include "server/store/write_batch_rep.h"

namespace strata::server::store {

WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;

void WriteBatch::AddSamples(std::string_view service, int64_t window_start_ms,
                            std::string_view host, uint64_t stack_id, uint64_t count,
                            uint64_t label_set) {
  if (!rep_->CheckKeyPart("service", service, false) || !rep_->CheckKeyPart("host", host, true) ||
      !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  // The rollups are the store's: sealed windows get theirs at commit, the others from the
  // roller (rollups.h).
  rep_->cell_ops.push_back(rep_->ops.size());
  rep_->Add(Column::kSamples, Rep::OpType::kMerge,
            EncodeCellKey(service, window_start_ms, host, stack_id, label_set),
            EncodeCount(count));
  const int64_t minute = window_start_ms - window_start_ms % kMinuteMs;
  if (minute != rep_->last_touched_minute || service != rep_->last_touched_service) {
    rep_->touched_minutes.emplace(std::string(service), minute);
    rep_->last_touched_minute = minute;
    rep_->last_touched_service.assign(service);
  }
  auto [it, inserted] = rep_->services.try_emplace(std::string(service));
  ServiceSummary& s = it->second;
  if (inserted) {
    s.first_window_ms = s.last_window_ms = window_start_ms;
  } else {
    s.first_window_ms = std::min(s.first_window_ms, window_start_ms);
    s.last_window_ms = std::max(s.last_window_ms, window_start_ms);
  }
  base::SaturatingAddTo(s.total_samples, count);
}

void WriteBatch::AddCaptureSamples(std::string_view capture_id, int64_t window_start_ms,
                                   std::string_view host, uint64_t stack_id, uint64_t count,
                                   uint64_t label_set) {
  if (!rep_->CheckKeyPart("capture id", capture_id, false) ||
      !rep_->CheckKeyPart("host", host, true) || !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  rep_->Add(Column::kCaptures, Rep::OpType::kMerge,
            EncodeCellKey(capture_id, window_start_ms, host, stack_id, label_set),
            EncodeCount(count));
}

void WriteBatch::SetAppliedSequence(std::string_view agent_id, uint64_t incarnation,
                                    uint64_t sequence) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  for (Rep::Sequence& s : rep_->sequences) {
    if (s.agent_id == agent_id && s.incarnation == incarnation) {
      s.sequence = std::max(s.sequence, sequence);
      return;
    }
  }
  rep_->sequences.push_back({std::string(agent_id), incarnation, sequence});
}

void WriteBatch::PutAgent(const AgentRecord& agent) {
  if (!rep_->CheckKeyPart("agent id", agent.agent_id, false)) return;
  rep_->Add(Column::kMeta, Rep::OpType::kPut, AgentKey(agent.agent_id),
            EncodeAgent(agent));
}

void WriteBatch::AppendGraphNodes(std::string_view agent_id, uint64_t graph_id,
                                  const std::vector<GraphNode>& nodes) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  for (const GraphNode& node : nodes) {
    rep_->Add(Column::kMeta, Rep::OpType::kPut, GraphNodeKey(agent_id, graph_id, node.id),
              EncodeGraphNode(node));
  }
}

void WriteBatch::AppendGraphEdges(std::string_view agent_id, uint64_t graph_id,
                                  uint64_t first_edge, const std::vector<GraphEdge>& edges) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  for (size_t i = 0; i < edges.size(); ++i) {
    rep_->Add(Column::kMeta, Rep::OpType::kPut,
              GraphEdgeKey(agent_id, graph_id, first_edge + i),
              EncodeGraphEdge(edges[i]));
  }
}

void WriteBatch::DeleteGraph(std::string_view agent_id, uint64_t graph_id) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  std::string begin = GraphPrefix(agent_id, graph_id);
  std::string end = PrefixSuccessor(begin);
  rep_->Add(Column::kMeta, Rep::OpType::kDeleteRange, std::move(begin), std::move(end));
  // The mark is the only key with exactly this value: a one-key range.
  std::string mark = GraphUseKey(agent_id, graph_id);
  std::string mark_end = mark + '\0';
  rep_->Add(Column::kMeta, Rep::OpType::kDeleteRange, std::move(mark), std::move(mark_end));
}

void WriteBatch::MarkGraphUsed(std::string_view agent_id, uint64_t graph_id, int64_t now_ms) {
  if (!rep_->CheckKeyPart("agent id", agent_id, false)) return;
  rep_->Add(Column::kMeta, Rep::OpType::kPut, GraphUseKey(agent_id, graph_id),
            EncodeCount(static_cast<uint64_t>(std::max<int64_t>(0, now_ms))));
}

void WriteBatch::DeleteCapture(std::string_view capture_id) {
  if (!rep_->CheckKeyPart("capture id", capture_id, false)) return;
  // Every cell key of the capture starts with its ID and the separator.
  std::string cells = CellPrefix(capture_id, 0);
  cells.resize(cells.size() - 8);
  std::string cells_end = PrefixSuccessor(cells);
  rep_->Add(Column::kCaptures, Rep::OpType::kDeleteRange, std::move(cells), std::move(cells_end));
  // The metadata record is the only key with exactly this value: a one-key range.
  std::string meta = CaptureKey(capture_id);
  std::string meta_end = meta;
  meta_end.push_back('\0');
  rep_->Add(Column::kMeta, Rep::OpType::kDeleteRange, std::move(meta), std::move(meta_end));
}

namespace {
std::string JournalKey(uint64_t sequence) {
  std::string key;
  PutFixed64BE(&key, sequence);
  return key;
}
}  // namespace

void WriteBatch::PutJournal(uint64_t sequence, std::string_view record) {
  rep_->Add(Column::kJournal, Rep::OpType::kPut, JournalKey(sequence), std::string(record));
}

void WriteBatch::DeleteJournalBefore(uint64_t sequence) {
  if (sequence == 0) return;
  rep_->Add(Column::kJournal, Rep::OpType::kDeleteRange, JournalKey(0), JournalKey(sequence));
}

void WriteBatch::PutJournalWritten(std::string_view service, uint64_t sequence) {
  std::string value;
  PutFixed64BE(&value, sequence);
  rep_->Add(Column::kMeta, Rep::OpType::kPut, JournalWrittenKey(service), std::move(value));
}

void WriteBatch::DeleteJournalWritten() {
  rep_->Add(Column::kMeta, Rep::OpType::kDeleteRange, std::string(1, kJournalWrittenTag),
            std::string(1, kJournalWrittenTag + 1));
}

void WriteBatch::PutPhaseEvent(const PhaseEvent& event) {
  if (!rep_->CheckKeyPart("service", event.service, false) ||
      !rep_->CheckWindow(event.window_start_ms)) {
    return;
  }
  rep_->Add(Column::kMeta, Rep::OpType::kPut, PhaseKey(event), event.payload);
}

void WriteBatch::PutCapture(const CaptureInfo& capture) {
  if (!rep_->CheckKeyPart("capture id", capture.capture_id, false)) return;
  rep_->Add(Column::kMeta, Rep::OpType::kPut, CaptureKey(capture.capture_id),
            EncodeCapture(capture));
}

void WriteBatch::PutRelease(const ReleaseRecord& release) {
  // The ID joins its parts with NUL, so only the whole key is checked for emptiness.
  if (release.release_id.empty()) {
    rep_->CheckKeyPart("release id", release.release_id, false);
    return;
  }
  rep_->Add(Column::kMeta, Rep::OpType::kPut, ReleaseKey(release.release_id),
            EncodeRelease(release));
}

void WriteBatch::PutUnwindCounts(std::string_view service, int64_t window_start_ms,
                                 std::string_view agent_id, uint64_t incarnation,
                                 uint64_t sequence, const UnwindCounts& counts) {
  if (!rep_->CheckKeyPart("service", service, false) ||
      !rep_->CheckKeyPart("agent id", agent_id, false) || !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  rep_->Add(Column::kMeta, Rep::OpType::kPut,
            UnwindKey(service, static_cast<uint64_t>(window_start_ms), agent_id, incarnation,
                      sequence),
            EncodeUnwindCounts(counts));
}

void WriteBatch::PutLeafAddresses(std::string_view service, int64_t window_start_ms,
                                  std::string_view host, std::string_view agent_id,
                                  uint64_t incarnation, uint64_t sequence,
                                  const std::vector<LeafAddressCount>& counts) {
  if (!rep_->CheckKeyPart("service", service, false) ||
      !rep_->CheckKeyPart("host", host, false) ||
      !rep_->CheckKeyPart("agent id", agent_id, false) || !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  const std::string value = EncodeLeafAddresses(counts);
  rep_->Add(Column::kMeta, Rep::OpType::kPut,
            LeafAddressKey(service, static_cast<uint64_t>(window_start_ms), host, agent_id,
                           incarnation, sequence),
            value);
  // And summed into the service's hour for this host, which long ranges read instead.
  const uint64_t hour = static_cast<uint64_t>(window_start_ms) / kHourMs * kHourMs;
  rep_->Add(Column::kMeta, Rep::OpType::kMerge, LeafAddressHourKey(service, hour, host), value);
}

void WriteBatch::PutRequests(std::string_view service, int64_t window_start_ms,
                             std::string_view host, std::string_view agent_id,
                             uint64_t incarnation, uint64_t sequence, uint64_t requests) {
  if (!rep_->CheckKeyPart("service", service, false) ||
      !rep_->CheckKeyPart("host", host, false) ||
      !rep_->CheckKeyPart("agent id", agent_id, false) || !rep_->CheckWindow(window_start_ms)) {
    return;
  }
  const std::string value = EncodeLeafAddresses({{0, 0, requests}});
  rep_->Add(Column::kMeta, Rep::OpType::kPut,
            RequestsKey(service, static_cast<uint64_t>(window_start_ms), host, agent_id,
                        incarnation, sequence),
            value);
  const uint64_t hour = static_cast<uint64_t>(window_start_ms) / kHourMs * kHourMs;
  rep_->Add(Column::kMeta, Rep::OpType::kMerge, RequestsHourKey(service, hour, host), value);
}

bool WriteBatch::empty() const {
  return rep_->ops.empty() && rep_->sequences.empty() && rep_->status.ok();
}

void WriteBatch::Clear() { *rep_ = Rep(); }

}  // namespace strata::server::store
