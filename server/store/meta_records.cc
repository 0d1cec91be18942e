#include "server/store/meta_records.h"

#include <algorithm>
#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/base/saturating.h"
#include "server/store/codec.h"
#include "server/store/rollup_plan.h"
#include "server/store/db.h"

namespace strata::server::store {

absl::StatusOr<uint64_t> MetaRecords::AppliedSequence(std::string_view agent_id,
                                                      uint64_t incarnation) {
  if (!ValidKeyPart(agent_id)) return absl::InvalidArgumentError("agent id contains NUL");
  std::string value;
  rocksdb::Status s = database_->db->Get(rocksdb::ReadOptions(), database_->cf(Column::kMeta),
                                         SequenceKey(agent_id, incarnation), &value);
  if (s.IsNotFound()) {
    // A store from before incarnations: its one sequence per agent belongs to the graph it
    // holds (the agent's latest), so a batch of that graph resent after the upgrade is
    // still recognised as applied.
    s = database_->db->Get(rocksdb::ReadOptions(), database_->cf(Column::kMeta),
                           LegacySequenceKey(agent_id), &value);
    if (s.IsNotFound()) return 0;
    if (s.ok()) {
      absl::StatusOr<bool> has_graph =
          database_->HasRecords(Column::kMeta, GraphPrefix(agent_id, incarnation));
      if (!has_graph.ok()) return has_graph.status();
      if (!*has_graph) return 0;
    }
  }
  if (!s.ok()) return FromRocks(s);
  if (value.size() != 8) return absl::DataLossError("corrupt applied sequence record");
  return GetFixed64LE(value.data());
}

namespace {

// Every meta record under a one-byte tag, decoded; the key after the tag is the record's ID.
template <typename Record>
absl::StatusOr<std::vector<Record>> ScanTaggedRecords(
    const Database& db, char tag, absl::StatusOr<Record> (*decode)(std::string_view),
    std::string Record::*id) {
  std::vector<Record> out;
  const std::string begin(1, tag);
  absl::Status s = db.Scan(Column::kMeta, begin, PrefixSuccessor(begin),
                           [&](std::string_view key, std::string_view value) {
                             absl::StatusOr<Record> record = decode(value);
                             if (!record.ok()) return record.status();
                             ((*record).*id).assign(key.substr(1));
                             out.push_back(std::move(*record));
                             return absl::OkStatus();
                           });
  if (!s.ok()) return s;
  return out;
}

}  // namespace

absl::StatusOr<std::vector<AgentRecord>> MetaRecords::ListAgents() {
  return ScanTaggedRecords<AgentRecord>(*database_, kAgentTag, &DecodeAgent,
                                        &AgentRecord::agent_id);
}

absl::StatusOr<AgentGraph> MetaRecords::LoadGraph(std::string_view agent_id, uint64_t graph_id) {
  if (!ValidKeyPart(agent_id)) return absl::InvalidArgumentError("agent id contains NUL");
  AgentGraph graph;
  std::string prefix = GraphPrefix(agent_id, graph_id);
  absl::Status s = database_->Scan(
      Column::kMeta, prefix, PrefixSuccessor(prefix),
      [&](std::string_view key, std::string_view value) -> absl::Status {
        if (key.size() != prefix.size() + 9) return absl::DataLossError("corrupt graph key");
        char kind = key[prefix.size()];
        uint64_t index = GetFixed64BE(key.data() + prefix.size() + 1);
        if (kind == 'n') {
          absl::StatusOr<GraphNode> node = DecodeGraphNode(value);
          if (!node.ok()) return node.status();
          if (index > UINT32_MAX ||
              (!graph.nodes.empty() && index != uint64_t{graph.nodes.back().id} + 1)) {
            return absl::DataLossError(absl::StrCat("graph node ", index, " out of sequence"));
          }
          node->id = static_cast<uint32_t>(index);
          graph.nodes.push_back(std::move(*node));
        } else if (kind == 'e') {
          absl::StatusOr<GraphEdge> edge = DecodeGraphEdge(value);
          if (!edge.ok()) return edge.status();
          if (index != graph.edges.size()) {
            return absl::DataLossError(absl::StrCat("graph edge ", index, " out of sequence"));
          }
          graph.edges.push_back(*edge);
        } else {
          return absl::DataLossError("corrupt graph key");
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return graph;
}

absl::StatusOr<std::vector<StoredGraph>> MetaRecords::ListGraphs() {
  std::vector<StoredGraph> out;
  const std::string begin(1, kGraphTag);
  const std::string end = PrefixSuccessor(begin);
  std::unique_ptr<rocksdb::Iterator> it(
      database_->db->NewIterator(rocksdb::ReadOptions(), database_->cf(Column::kMeta)));
  for (it->Seek(begin); it->Valid() && it->key().compare(end) < 0;) {
    // 'g' agent '\0' BE(graph_id) kind BE(index); an agent ID holds no NUL.
    const std::string_view key = View(it->key());
    const size_t nul = key.find('\0', 1);
    if (nul == std::string_view::npos || key.size() < nul + 1 + 8) {
      return absl::DataLossError("corrupt graph key");
    }
    StoredGraph graph;
    graph.agent_id.assign(key.substr(1, nul - 1));
    graph.graph_id = GetFixed64BE(key.data() + nul + 1);
    std::string value;
    rocksdb::Status s =
        database_->db->Get(rocksdb::ReadOptions(), database_->cf(Column::kMeta),
                           GraphUseKey(graph.agent_id, graph.graph_id), &value);
    // A mark of another size reads as none: the next sweep writes a good one.
    if (s.ok() && value.size() == 8) {
      graph.last_used_ms = static_cast<int64_t>(GetFixed64LE(value.data()));
    } else if (!s.ok() && !s.IsNotFound()) {
      return FromRocks(s);
    }
    it->Seek(PrefixSuccessor(GraphPrefix(graph.agent_id, graph.graph_id)));
    out.push_back(std::move(graph));
  }
  if (!it->status().ok()) return FromRocks(it->status());
  return out;
}

absl::StatusOr<std::vector<PhaseEvent>> MetaRecords::ScanPhaseEvents(std::string_view service,
                                                                     int64_t from_ms,
                                                                     int64_t to_ms) {
  if (!ValidKeyPart(service)) return absl::InvalidArgumentError("service contains NUL");
  std::vector<PhaseEvent> out;
  uint64_t from = static_cast<uint64_t>(std::max<int64_t>(from_ms, 0));
  if (to_ms <= 0 || static_cast<uint64_t>(to_ms) <= from) return out;
  std::string begin = PhasePrefix(service, from);
  size_t window_at = begin.size() - 8;
  absl::Status s = database_->Scan(
      Column::kMeta, begin, PhasePrefix(service, static_cast<uint64_t>(to_ms)),
      [&](std::string_view key, std::string_view value) -> absl::Status {
        if (key.size() != window_at + 16) return absl::DataLossError("corrupt phase event key");
        PhaseEvent event;
        event.service.assign(service);
        event.window_start_ms = static_cast<int64_t>(GetFixed64BE(key.data() + window_at));
        event.payload.assign(value);
        out.push_back(std::move(event));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<UnwindCounts> MetaRecords::SumUnwindCounts(
    std::string_view service, int64_t from_ms, int64_t to_ms,
    std::map<std::string, UnwindCounts>* by_agent) {
  if (!ValidKeyPart(service)) return absl::InvalidArgumentError("service contains NUL");
  UnwindCounts sum;
  const uint64_t from = static_cast<uint64_t>(std::max<int64_t>(from_ms, 0));
  if (to_ms <= 0 || static_cast<uint64_t>(to_ms) <= from) return sum;
  // UnwindKey: the (service, window) prefix, then the agent ID up to a NUL.
  const size_t prefix = UnwindPrefix(service, 0).size();
  absl::Status s = database_->Scan(
      Column::kMeta, UnwindPrefix(service, from),
      UnwindPrefix(service, static_cast<uint64_t>(to_ms)),
      [&](std::string_view key, std::string_view value) -> absl::Status {
        absl::StatusOr<UnwindCounts> counts = DecodeUnwindCounts(value);
        if (!counts.ok()) return counts.status();
        sum.Add(*counts);
        if (by_agent != nullptr) {
          const size_t end = key.find('\0', prefix);
          if (key.size() < prefix || end == std::string_view::npos) {
            return absl::DataLossError("malformed unwinding counters key");
          }
          (*by_agent)[std::string(key.substr(prefix, end - prefix))].Add(*counts);
        }
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return sum;
}

namespace {

using AddressCounts = absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t>;

// The leaf-address lists of `service` in windows [from, to) (of `host` only, when given)
// summed: per-batch records under prefix(window), and from `hours_since` on, the whole hours'
// records under hour_prefix(hour) (one per host and hour) instead.
absl::StatusOr<AddressCounts> SumAddressLists(
    const Database& database, std::string (*prefix)(std::string_view, uint64_t),
    std::string (*hour_prefix)(std::string_view, uint64_t), uint64_t hours_since,
    std::string_view service, int64_t from_ms, int64_t to_ms,
    const std::optional<std::string>& host, size_t* records_read) {
  if (!ValidKeyPart(service)) return absl::InvalidArgumentError("service contains NUL");
  AddressCounts sum;
  size_t read = 0;
  if (records_read != nullptr) *records_read = 0;
  const uint64_t from = static_cast<uint64_t>(std::max<int64_t>(from_ms, 0));
  if (to_ms <= 0 || static_cast<uint64_t>(to_ms) <= from) return sum;
  const uint64_t to = static_cast<uint64_t>(to_ms);
  // Records in [begin, end) of `host` (all hosts without one), summed.
  auto add = [&](const std::string& begin, const std::string& end) {
    return database.Scan(
        Column::kMeta, begin, end,
        [&](std::string_view key, std::string_view value) -> absl::Status {
          if (host) {
            absl::StatusOr<std::string_view> key_host = LeafAddressKeyHost(key);
            if (!key_host.ok()) return key_host.status();
            if (*key_host != *host) return absl::OkStatus();
          }
          ++read;
          absl::StatusOr<std::vector<LeafAddressCount>> counts = DecodeLeafAddresses(value);
          if (!counts.ok()) return counts.status();
          for (const LeafAddressCount& c : *counts) {
            uint64_t& total = sum[{c.function_id, c.offset}];
            total = base::SaturatingAdd(total, c.count);
          }
          return absl::OkStatus();
        });
  };
  const uint64_t first_hour = std::max((from + kHourMs - 1) / kHourMs * kHourMs, hours_since);
  const uint64_t end_hour = to / kHourMs * kHourMs;
  absl::Status s;
  if (first_hour < end_hour) {
    s = add(prefix(service, from), prefix(service, first_hour));
    if (s.ok()) s = add(hour_prefix(service, first_hour), hour_prefix(service, end_hour));
    if (s.ok()) s = add(prefix(service, end_hour), prefix(service, to));
  } else {
    s = add(prefix(service, from), prefix(service, to));
  }
  if (!s.ok()) return s;
  if (records_read != nullptr) *records_read = read;
  return sum;
}

}  // namespace

absl::StatusOr<absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t>>
MetaRecords::SumLeafAddresses(std::string_view service, int64_t from_ms, int64_t to_ms,
                              const std::optional<std::string>& host, size_t* records_read) {
  // Whole hours from the first one the store has hourly records for come from those; the
  // rest of the range from the batches' own records.
  uint64_t hours_since = UINT64_MAX;
  std::string since;
  rocksdb::Status got = database_->db->Get(rocksdb::ReadOptions(), database_->cf(Column::kMeta),
                                           LeafAddressHoursSinceKey(), &since);
  if (got.ok() && since.size() == 8) hours_since = GetFixed64LE(since.data());
  return SumAddressLists(*database_, &LeafAddressPrefix, &LeafAddressHourPrefix, hours_since,
                         service, from_ms, to_ms, host, records_read);
}

absl::StatusOr<uint64_t> MetaRecords::SumRequests(std::string_view service, int64_t from_ms,
                                                  int64_t to_ms,
                                                  const std::optional<std::string>& host) {
  // Every requests record was written with its hourly one.
  absl::StatusOr<AddressCounts> sum = SumAddressLists(
      *database_, &RequestsPrefix, &RequestsHourPrefix, 0, service, from_ms, to_ms, host, nullptr);
  if (!sum.ok()) return sum.status();
  auto it = sum->find(std::pair<uint64_t, uint64_t>{0, 0});
  return it == sum->end() ? 0 : it->second;
}

absl::StatusOr<AgentRecord> MetaRecords::GetAgent(const std::string& agent_id) {
  if (!ValidKeyPart(agent_id)) return absl::InvalidArgumentError("agent id contains NUL");
  std::string value;
  rocksdb::Status s = database_->db->Get(rocksdb::ReadOptions(), database_->cf(Column::kMeta),
                                         AgentKey(agent_id), &value);
  if (!s.ok()) return FromRocks(s);
  absl::StatusOr<AgentRecord> agent = DecodeAgent(value);
  if (agent.ok()) agent->agent_id = agent_id;
  return agent;
}

absl::StatusOr<CaptureInfo> MetaRecords::GetCapture(std::string_view capture_id) {
  std::string value;
  rocksdb::Status s = database_->db->Get(rocksdb::ReadOptions(), database_->cf(Column::kMeta),
                                         CaptureKey(capture_id), &value);
  if (!s.ok()) return FromRocks(s);
  absl::StatusOr<CaptureInfo> capture = DecodeCapture(value);
  if (capture.ok()) capture->capture_id.assign(capture_id);
  return capture;
}

absl::Status MetaRecords::ScanJournal(
    const std::function<absl::Status(uint64_t sequence, std::string_view record)>& fn) {
  return database_->Scan(Column::kJournal, std::string(), std::string(),
                         [&](std::string_view key, std::string_view value) -> absl::Status {
                           if (key.size() != 8) return absl::DataLossError("corrupt journal key");
                           return fn(GetFixed64BE(key.data()), value);
                         });
}

absl::StatusOr<std::map<std::string, uint64_t>> MetaRecords::JournalWritten() {
  std::map<std::string, uint64_t> written;
  absl::Status s = database_->Scan(
      Column::kMeta, std::string(1, kJournalWrittenTag), std::string(1, kJournalWrittenTag + 1),
      [&](std::string_view key, std::string_view value) -> absl::Status {
        if (value.size() != 8) return absl::DataLossError("corrupt journal mark");
        written.emplace(key.substr(1), GetFixed64BE(value.data()));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  return written;
}

absl::StatusOr<std::vector<ReleaseRecord>> MetaRecords::ListReleases() {
  return ScanTaggedRecords<ReleaseRecord>(*database_, kReleaseTag, &DecodeRelease,
                                          &ReleaseRecord::release_id);
}

absl::StatusOr<std::vector<CaptureInfo>> MetaRecords::ListCaptures() {
  return ScanTaggedRecords<CaptureInfo>(*database_, kCaptureTag, &DecodeCapture,
                                        &CaptureInfo::capture_id);
}

}  // namespace strata::server::store
