// MetaRecords: reads of the store's metadata: agents and their applied batch sequences,
// agents' call graphs, phase events, captures, agents' unwinding counters, and the
// aggregation journal. They are written
// through a WriteBatch (PutAgent, AppendGraphNodes, ...). Owned by Store (Store::meta());
// thread-safe.
#ifndef STRATA_SERVER_STORE_META_RECORDS_H_
#define STRATA_SERVER_STORE_META_RECORDS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/records.h"

namespace strata::server::store {

struct Database;

class MetaRecords {
 public:
  explicit MetaRecords(const Database* db) : database_(db) {}
  MetaRecords(const MetaRecords&) = delete;
  MetaRecords& operator=(const MetaRecords&) = delete;

  // Last applied batch sequence of the agent's incarnation; 0 when none was ever committed.
  // A store written before sequences were kept per incarnation has one per agent: it counts
  // for the incarnation whose graph the store holds.
  absl::StatusOr<uint64_t> AppliedSequence(std::string_view agent_id, uint64_t incarnation);

  absl::StatusOr<std::vector<AgentRecord>> ListAgents();
  // One agent's record; NotFound if there is none.
  absl::StatusOr<AgentRecord> GetAgent(const std::string& agent_id);
  absl::StatusOr<AgentGraph> LoadGraph(std::string_view agent_id, uint64_t graph_id);
  // Every stored graph with its use mark, by (agent, graph_id): one seek per graph, not a
  // read of its records.
  absl::StatusOr<std::vector<StoredGraph>> ListGraphs();
  // Events of `service` with window in [from_ms, to_ms), by window.
  absl::StatusOr<std::vector<PhaseEvent>> ScanPhaseEvents(std::string_view service,
                                                          int64_t from_ms, int64_t to_ms);
  // The agents' unwinding counters of `service` in windows [from_ms, to_ms), summed, and
  // (when `by_agent` is given) summed per agent ID there too.
  absl::StatusOr<UnwindCounts> SumUnwindCounts(
      std::string_view service, int64_t from_ms, int64_t to_ms,
      std::map<std::string, UnwindCounts>* by_agent = nullptr);
  // Where `service`'s samples in windows [from_ms, to_ms) stopped in their leaf functions
  // (of `host` only, when given): (function ID, offset) -> samples, summed over batches. Whole
  // hours are read from one record per host and hour, the rest from the batches' records;
  // `records_read` (optional) says how many records that took.
  absl::StatusOr<absl::flat_hash_map<std::pair<uint64_t, uint64_t>, uint64_t>> SumLeafAddresses(
      std::string_view service, int64_t from_ms, int64_t to_ms,
      const std::optional<std::string>& host, size_t* records_read = nullptr);
  // Requests `service` served in windows [from_ms, to_ms) (on `host` only, when given), as
  // the agents scraped them, summed; 0: none known. Whole hours come from the hourly records.
  absl::StatusOr<uint64_t> SumRequests(std::string_view service, int64_t from_ms, int64_t to_ms,
                                       const std::optional<std::string>& host);
  absl::StatusOr<CaptureInfo> GetCapture(std::string_view capture_id);
  absl::StatusOr<std::vector<CaptureInfo>> ListCaptures();
  absl::StatusOr<std::vector<ReleaseRecord>> ListReleases();
  // Every journal record in sequence order; stops at the first error `fn` returns.
  absl::Status ScanJournal(
      const std::function<absl::Status(uint64_t sequence, std::string_view record)>& fn);
  // WriteBatch::PutJournalWritten's sequences, by service.
  absl::StatusOr<std::map<std::string, uint64_t>> JournalWritten();

 private:
  const Database* database_;
};

}  // namespace strata::server::store

#endif  // STRATA_SERVER_STORE_META_RECORDS_H_
