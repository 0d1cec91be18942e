#include "server/aggregate/phase_detector.h"

#include <chrono>
#include <set>

#include "spdlog/spdlog.h"

namespace strata::server {

PhaseDetector::PhaseDetector(store::Store* store, PhaseDetectorOptions options)
    : store_(store), options_(options) {}

uint64_t PhaseDetector::events() const {
  absl::MutexLock lock(&mu_);
  return events_;
}

void PhaseDetector::OnBatch(const AppliedBatch& batch) {
  if (!batch.batch->capture_id().empty()) return;  // captures are not the service's phases
  std::map<std::string, std::vector<table::PhaseChange<uint64_t>>> found;
  {
    absl::MutexLock lock(&mu_);
    for (const AppliedContext& c : batch.contexts) {
      ServiceState& state = services_[*c.service];
      // Bounded memory: a context beyond max_contexts in one period is not ranked (its
      // samples still count towards the period's length).
      if (state.current.size() < options_.max_contexts || state.current.contains(c.stack_id)) {
        state.current[c.stack_id] += c.count;
      }
      state.current_total += c.count;
    }
    for (auto& [service, state] : services_) {
      if (state.current_total >= options_.period) EndPeriod(state, &found[service]);
    }
  }
  std::erase_if(found, [](const auto& kv) { return kv.second.empty(); });
  for (const auto& [service, changes] : found) Publish(service, batch.window_start_ms, changes);
}

void PhaseDetector::EndPeriod(ServiceState& state,
                              std::vector<table::PhaseChange<uint64_t>>* out) {
  const auto& before = state.previous[1];  // two periods back
  const uint64_t factor = options_.factor;
  const double hot_now = options_.hot_share * static_cast<double>(state.current_total);
  const double hot_before = options_.hot_share * static_cast<double>(state.previous_total[1]);
  auto count_in = [](const std::map<uint64_t, uint64_t>& m, uint64_t key) -> uint64_t {
    auto it = m.find(key);
    return it == m.end() ? 0 : it->second;
  };
  for (const auto& [x, x_now] : state.current) {
    if (x_now <= hot_now) continue;
    const uint64_t x_before = count_in(before, x);
    for (const auto& [y, y_before] : before) {
      if (x == y || y_before <= hot_before || x_before >= y_before) continue;
      const uint64_t y_now = count_in(state.current, y);
      if (x_now <= y_now) continue;  // no reordering
      if (y_before < factor * std::max<uint64_t>(x_before, 1) &&
          x_now < factor * std::max<uint64_t>(y_now, 1)) {
        continue;  // reordered, but not by an order of magnitude
      }
      out->push_back({0, 0, x, static_cast<uint32_t>(x_now), static_cast<uint32_t>(x_before), y,
                      static_cast<uint32_t>(y_now), static_cast<uint32_t>(y_before)});
    }
  }
  state.previous[1] = std::move(state.previous[0]);
  state.previous[0] = std::move(state.current);
  state.previous_total[1] = state.previous_total[0];
  state.previous_total[0] = state.current_total;
  state.current.clear();
  state.current_total = 0;
}

void PhaseDetector::Resolve(uint64_t stack_id, v1::HotPath* path) {
  auto stack = store_->GetStack(stack_id);
  if (!stack.ok()) return;
  path->set_truncated(stack->truncated);
  for (uint64_t fid : stack->function_ids) {
    auto fn = store_->GetFunction(fid);
    auto* frame = path->add_frames();
    if (fn.ok()) {
      frame->set_function(fn->name);
      frame->set_module(fn->module);
    }
  }
}

void PhaseDetector::Publish(const std::string& service, int64_t window_start_ms,
                            const std::vector<table::PhaseChange<uint64_t>>& changes) {
  v1::PhaseChange event;
  event.set_service(service);
  event.set_window_start_ms(window_start_ms);
  event.set_detected_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count());
  std::set<uint64_t> rose, fell;
  for (const auto& c : changes) {
    if (rose.insert(c.rose_key).second) {
      auto* shift = event.add_rose();
      Resolve(c.rose_key, shift->mutable_path());
      shift->set_count_before(c.rose_prev_count);
      shift->set_count_after(c.rose_count);
    }
    if (fell.insert(c.fell_key).second) {
      auto* shift = event.add_fell();
      Resolve(c.fell_key, shift->mutable_path());
      shift->set_count_before(c.fell_prev_count);
      shift->set_count_after(c.fell_count);
    }
  }
  store::WriteBatch wb;
  wb.PutPhaseEvent({service, window_start_ms, event.SerializeAsString()});
  if (auto st = store_->Commit(&wb); !st.ok()) {
    spdlog::error("storing a phase change of {}: {}", service, st.ToString());
    return;
  }
  absl::MutexLock lock(&mu_);
  ++events_;
  spdlog::info("phase change in {} (window {}): {} contexts rose, {} fell", service,
               window_start_ms, event.rose_size(), event.fell_size());
}

}  // namespace strata::server
