#include "server/query/query_service.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/frame_kind.h"
#include "server/aggregate/phase_event.h"

namespace strata::server::query {
namespace {

// Every frame the API returns says where its code lives, from the module name agents give
// kernel and JIT code (common/base/frame_kind.h).
void SetFrame(const std::string& function, const std::string& module, v1::Frame* out) {
  out->set_function(function);
  out->set_module(module);
  out->set_kind(static_cast<v1::FrameKind>(base::FrameKindOf(module)));
}

// Names a stored stack's functions, outermost first. A stack the store cannot resolve leaves
// the path empty, a function its frame.
void ResolvePath(store::Store* store, uint64_t stack_id, v1::HotPath* path) {
  auto stack = store->interner().GetStack(stack_id);
  if (!stack.ok()) return;
  path->set_truncated(stack->truncated);
  for (uint64_t fid : stack->function_ids) {
    auto fn = store->interner().GetFunction(fid);
    v1::Frame* frame = path->add_frames();
    if (fn.ok()) SetFrame(fn->name, fn->module, frame);
  }
}

// A stored phase event as the API's message, its stacks named (`paths` caches them across the
// events of one query). Events of servers before stack IDs were stored hold the message.
absl::StatusOr<v1::PhaseChange> ToPhaseChange(store::Store* store, const store::PhaseEvent& e,
                                              absl::flat_hash_map<uint64_t, v1::HotPath>* paths) {
  v1::PhaseChange change;
  if (!aggregate::IsPhaseEventPayload(e.payload)) {
    if (!change.ParseFromString(e.payload)) {
      return absl::DataLossError(absl::StrCat("corrupt phase event of ", e.service,
                                              " at window ", e.window_start_ms));
    }
    return change;
  }
  auto event = aggregate::DecodePhaseEvent(e.payload);
  if (!event.ok()) {
    return absl::DataLossError(absl::StrCat(event.status().message(), " of ", e.service,
                                            " at window ", e.window_start_ms));
  }
  change.set_service(e.service);
  change.set_window_start_ms(e.window_start_ms);
  change.set_detected_ms(event->detected_ms);
  for (const auto& [shifts, out] : {std::pair{&event->rose, change.mutable_rose()},
                                    std::pair{&event->fell, change.mutable_fell()}}) {
    for (const aggregate::PhaseShift& shift : *shifts) {
      v1::PhaseChange::Shift* s = out->Add();
      auto [path, inserted] = paths->try_emplace(shift.stack_id);
      if (inserted) ResolvePath(store, shift.stack_id, &path->second);
      *s->mutable_path() = path->second;
      s->set_count_before(shift.count_before);
      s->set_count_after(shift.count_after);
    }
  }
  return change;
}

// Whether a phase change is one of naming, not of behaviour: every stack that fell runs
// through JIT code no perf map had named yet ("[jit]+0x..."), and no stack that rose does.
// The runtime's map arrived (a JVM's, asked for after it started) and the same samples now
// land on named, and often whole, stacks; the old ones fall to nothing at once.
bool IsNamingChange(const v1::PhaseChange& c) {
  auto unnamed_jit = [](const v1::PhaseChange::Shift& s) {
    return std::any_of(s.path().frames().begin(), s.path().frames().end(),
                       [](const v1::Frame& f) { return f.module() == base::kJitModule; });
  };
  return !c.fell().empty() && std::all_of(c.fell().begin(), c.fell().end(), unnamed_jit) &&
         std::none_of(c.rose().begin(), c.rose().end(), unnamed_jit);
}

}  // namespace

absl::StatusOr<v1::PhasesResponse> PhasesOf(store::Store* store, const ProfileQuery& query) {
  auto events = store->meta().ScanPhaseEvents(query.service, query.from_ms, query.to_ms);
  if (!events.ok()) return events.status();
  v1::PhasesResponse response;
  absl::flat_hash_map<uint64_t, v1::HotPath> paths;
  for (const store::PhaseEvent& e : *events) {
    auto change = ToPhaseChange(store, e, &paths);
    if (!change.ok()) return change.status();
    if (IsNamingChange(*change)) continue;
    *response.add_changes() = *std::move(change);
  }
  return response;
}

}  // namespace strata::server::query
