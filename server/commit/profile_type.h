// Profile types in the store. Off-CPU samples are kept as their own profile beside the CPU
// one through a reserved label: ingest adds __profile__=off-cpu to the label set of every
// target of an off-CPU batch, so cells, rollups, the aggregation tables, flame graphs, diffs
// and exports need nothing new, and queries pick a type by label set (ProfileFilter.type).
// Label keys starting with "__" are the server's: agents may not send them, so nobody can
// store samples under another type.
//
// Ingest writes the label (server/ingest), queries read it (server/query); this header owns
// the names and the mapping from ProfileType to label sets.
#ifndef STRATA_SERVER_COMMIT_PROFILE_TYPE_H_
#define STRATA_SERVER_COMMIT_PROFILE_TYPE_H_

#include <string_view>

#include "common/labels/labels.h"
#include "strata/v1/common.pb.h"

namespace strata::server::commit {

inline constexpr char kReservedLabelPrefix[] = "__";
inline constexpr char kProfileLabel[] = "__profile__";
inline constexpr char kOffCpuProfile[] = "off-cpu";

inline bool IsReservedLabelKey(std::string_view key) {
  return key.starts_with(kReservedLabelPrefix);
}

// The label ingest adds to a target's set for samples of batch type `type` (none for CPU).
inline labels::LabelSet ProfileLabels(v1::ProfileType type) {
  if (type != v1::PROFILE_OFF_CPU) return {};
  return {{kProfileLabel, kOffCpuProfile}};
}

// Whether samples stored under `set` belong to a query of profile `type`: CPU is every set
// without the label (all data stored before types existed), off-CPU the sets with it, wall
// both.
inline bool InProfile(const labels::LabelSet& set, v1::ProfileType type) {
  if (type == v1::PROFILE_WALL) return true;
  const bool off_cpu = labels::ValueOf(set, kProfileLabel) == kOffCpuProfile;
  return type == v1::PROFILE_OFF_CPU ? off_cpu : !off_cpu;
}

// "cpu", "off-cpu", "wall": the names the CLI, the HTTP API and pprof use.
inline const char* ProfileTypeName(v1::ProfileType type) {
  switch (type) {
    case v1::PROFILE_OFF_CPU: return kOffCpuProfile;
    case v1::PROFILE_WALL: return "wall";
    default: return "cpu";
  }
}
// Inverse of ProfileTypeName; false for any other text.
inline bool ParseProfileType(std::string_view name, v1::ProfileType* type) {
  for (v1::ProfileType t : {v1::PROFILE_CPU, v1::PROFILE_OFF_CPU, v1::PROFILE_WALL}) {
    if (name == std::string_view(ProfileTypeName(t))) {
      *type = t;
      return true;
    }
  }
  return false;
}

}  // namespace strata::server::commit

#endif  // STRATA_SERVER_COMMIT_PROFILE_TYPE_H_
