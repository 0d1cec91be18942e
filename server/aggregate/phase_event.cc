#include "server/aggregate/phase_event.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/encoding/packed_contexts.h"  // AppendVarint, ReadVarint

namespace strata::server::aggregate {
namespace {

using encoding::AppendVarint;
using encoding::ReadVarint;

// A serialized protobuf message starts with a tag, (field << 3) | wire type, field >= 1.
constexpr uint8_t kFirstProtobufTag = 1 << 3;

void AppendShifts(std::string* out, const std::vector<PhaseShift>& shifts) {
  AppendVarint(out, shifts.size());
  for (const PhaseShift& s : shifts) {
    AppendVarint(out, s.stack_id);
    AppendVarint(out, s.count_before);
    AppendVarint(out, s.count_after);
  }
}

bool ReadShifts(std::string_view in, size_t* pos, std::vector<PhaseShift>* shifts) {
  uint64_t n = 0;
  // Each shift takes three bytes at least.
  if (!ReadVarint(in, pos, &n) || n > (in.size() - *pos) / 3) return false;
  shifts->resize(n);
  for (PhaseShift& s : *shifts) {
    if (!ReadVarint(in, pos, &s.stack_id) || !ReadVarint(in, pos, &s.count_before) ||
        !ReadVarint(in, pos, &s.count_after)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string EncodePhaseEvent(const PhaseEventPayload& event) {
  std::string out;
  out.push_back(static_cast<char>(kPhaseEventVersion));
  AppendVarint(&out, static_cast<uint64_t>(event.detected_ms));
  AppendShifts(&out, event.rose);
  AppendShifts(&out, event.fell);
  return out;
}

bool IsPhaseEventPayload(std::string_view payload) {
  return !payload.empty() && static_cast<uint8_t>(payload[0]) < kFirstProtobufTag;
}

absl::StatusOr<PhaseEventPayload> DecodePhaseEvent(std::string_view payload) {
  if (!IsPhaseEventPayload(payload) || static_cast<uint8_t>(payload[0]) != kPhaseEventVersion) {
    return absl::DataLossError(absl::StrCat(
        "phase event of unknown version ",
        payload.empty() ? 0 : static_cast<int>(static_cast<uint8_t>(payload[0]))));
  }
  PhaseEventPayload event;
  size_t pos = 1;
  uint64_t detected = 0;
  if (!ReadVarint(payload, &pos, &detected) || !ReadShifts(payload, &pos, &event.rose) ||
      !ReadShifts(payload, &pos, &event.fell) || pos != payload.size()) {
    return absl::DataLossError("corrupt phase event");
  }
  event.detected_ms = static_cast<int64_t>(detected);
  return event;
}

}  // namespace strata::server::aggregate
