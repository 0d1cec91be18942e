// Stacks from the in-process runtime (agent/runtime: libstrata_inproc.so or a program linked
// with it): finds the rings it creates in the processes it is loaded into
// (<dir>/strata-inproc-<pid>), maps them, and delivers their unwound stacks. The stacks' pcs
// are absolute addresses in the target; symbolization stays with the agent (the ring also
// carries the target's executable mappings, see Mappings()).
//
// A process with a ring is served by its ring whatever the other sources do (Claims()), so
// attaching targets is a no-op here. Rings have no wake-up: while any is open they are drained
// at least every 100 ms. New rings are noticed by inotify on the directory (rescan_fd()), or,
// where that fails, by the owner's periodic Rescan().
#ifndef STRATA_AGENT_SOURCES_INPROC_SOURCE_H_
#define STRATA_AGENT_SOURCES_INPROC_SOURCE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/runtime/ring.h"
#include "agent/sources/stack_source.h"
#include "common/base/unique_fd.h"

namespace strata::agent::sources {

struct InprocSourceOptions {
  std::string dir = "/dev/shm";
  uint32_t arch = 0;  // unwind::Arch the rings must have been written for (the agent's)
};

struct InprocSourceStats {
  uint64_t stacks = 0;
  uint64_t lost = 0;           // dropped by producers on full rings (summed over open rings)
  uint64_t unwind_errors = 0;  // samples the producers could not unwind at all
  size_t rings = 0;
};

class InprocSource final : public StackSource {
 public:
  explicit InprocSource(InprocSourceOptions options);

  // Delivers what the open rings hold, then opens rings that appeared and closes those whose
  // process is gone (removing their file); `claimed` receives the pids of the new rings.
  absl::Status Rescan(StackSink& sink, std::vector<pid_t>* claimed) override;
  bool Claims(pid_t pid) const override { return rings_.contains(pid); }
  int rescan_fd() const override { return inotify_fd_.get(); }
  bool rescan_periodically() const override { return !inotify_fd_.valid(); }

  absl::Status Attach(pid_t, const std::vector<pid_t>&) override { return absl::OkStatus(); }
  void Detach(pid_t) override {}
  void Remove(pid_t, StackSink&) override {}
  absl::Duration max_wait() const override {
    return rings_.empty() ? absl::InfiniteDuration() : absl::Milliseconds(100);
  }
  // Delivers every stack published so far, ring by ring.
  void Drain(StackSink& sink) override;

  // The target's executable mappings as the sampler published them. `generation` changes
  // when the target saw dlopen/dlclose.
  bool ProvidesMappings() const override { return true; }
  absl::StatusOr<std::vector<symbols::MappingInfo>> Mappings(
      pid_t pid, uint64_t* generation) const override;

  uint64_t lost() const override { return stats().lost; }
  InprocSourceStats stats() const;

 private:
  InprocSourceOptions options_;
  base::UniqueFd inotify_fd_;  // files created in options_.dir
  absl::flat_hash_map<pid_t, std::unique_ptr<runtime::RingReader>> rings_;
  absl::flat_hash_set<pid_t> refused_;  // rings this agent may not open, said once each
  uint64_t stacks_ = 0;
  uint64_t lost_closed_ = 0;
};

}  // namespace strata::agent::sources

#endif  // STRATA_AGENT_SOURCES_INPROC_SOURCE_H_
