// The stored form of a phase change (store::PhaseEvent::payload): the stacks whose order
// changed, by stack ID, with their counts. The aggregator writes it when a window closes;
// the query service reads it and names the stacks' functions (v1::PhaseChange), so the
// aggregation side never resolves names nor builds API messages.
//
// Payload: a version byte (kPhaseEventVersion), then varints: detected_ms, the number of
// rising stacks and (stack ID, count before, count after) for each, then the same for the
// falling stacks. Servers before this encoding stored a serialized v1::PhaseChange, which
// cannot start with a byte below 0x08 (its first byte is a field tag of field 1 or higher):
// IsPhaseEventPayload tells the two apart.
#ifndef STRATA_SERVER_AGGREGATE_PHASE_EVENT_H_
#define STRATA_SERVER_AGGREGATE_PHASE_EVENT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::server::aggregate {

inline constexpr uint8_t kPhaseEventVersion = 1;

struct PhaseShift {
  uint64_t stack_id = 0;
  uint64_t count_before = 0;
  uint64_t count_after = 0;
  bool operator==(const PhaseShift&) const = default;
};

// The service and window are the store record's key; the payload holds the rest.
struct PhaseEventPayload {
  int64_t detected_ms = 0;  // server time the reordering was observed
  std::vector<PhaseShift> rose;
  std::vector<PhaseShift> fell;
  bool operator==(const PhaseEventPayload&) const = default;
};

std::string EncodePhaseEvent(const PhaseEventPayload& event);
// True for payloads of this encoding (any version); false for an earlier server's
// serialized v1::PhaseChange.
bool IsPhaseEventPayload(std::string_view payload);
// DataLoss for a malformed payload or an unknown version.
absl::StatusOr<PhaseEventPayload> DecodePhaseEvent(std::string_view payload);

}  // namespace strata::server::aggregate

#endif  // STRATA_SERVER_AGGREGATE_PHASE_EVENT_H_
