// Stack quality of a profile: how many samples reached the outermost frame, how deep stacks
// are, which frames have no function name, per binary (module and build ID) with the debug
// package that would name them. Computed at query time from the stored stacks; the agents'
// own unwinding counters (persisted per batch, store::MetaRecords::SumUnwindCounts) are
// added by the caller. Pure functions over values, used by QueryService::RunQuality.
#ifndef STRATA_SERVER_QUERY_QUALITY_H_
#define STRATA_SERVER_QUERY_QUALITY_H_

#include <string>
#include <string_view>
#include <vector>

#include "server/query/profile.h"
#include "strata/v1/query.pb.h"

namespace strata::server::query {

// A function name in the agent's unknown forms: "module+0xOFFSET" (no symbol for it),
// "[unknown]" or "[unknown]+0x..", "[jit]+0x.." (agent/core/stack_recorder.cc FrameFor,
// agent/symbols).
bool IsUnnamedFunction(std::string_view name);

// Build IDs as lowercase hex: agents send hex text; raw bytes (other writers) are encoded.
std::string BuildIdHex(std::string_view id);

// What would name a module's frames: the -dbg/-dbgsym package shipping its build ID's debug
// file for system libraries, debug info for everything else.
std::string DebugHint(std::string_view module, std::string_view build_id_hex);

// A function name that is one of Go's stack roots: a module with one is a Go binary.
bool IsGoStackRoot(std::string_view function);

// The stack-derived fields of a QualityResponse. `build_ids[i]` is the raw build ID of
// profile.functions[i] (empty: none).
v1::QualityResponse StackQuality(const Profile& profile,
                                 const std::vector<std::string>& build_ids);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_QUALITY_H_
