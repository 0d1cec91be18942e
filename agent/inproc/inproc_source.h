// Agent side of in-process sampling: finds the rings that libstrata_inproc.so creates in the
// processes it is loaded into (<dir>/strata-inproc-<pid>), maps them, and delivers their
// unwound stacks. The stacks' pcs are absolute addresses in the target; symbolization stays
// with the agent (the ring also carries the target's executable mappings, see Mappings()).
//
// Not thread-safe: owned by the agent's main loop (Profiler).
#ifndef STRATA_AGENT_INPROC_INPROC_SOURCE_H_
#define STRATA_AGENT_INPROC_INPROC_SOURCE_H_

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/inproc/ring.h"
#include "agent/symbols/process_address_space.h"

namespace strata::inproc {

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

class InprocSource {
 public:
  explicit InprocSource(InprocSourceOptions options) : options_(std::move(options)) {}

  // Opens rings that appeared and closes those whose process is gone (removing their file).
  // `added`/`removed` (optional) receive the pids.
  absl::Status Rescan(std::vector<pid_t>* added = nullptr, std::vector<pid_t>* removed = nullptr);
  bool Has(pid_t pid) const { return rings_.contains(pid); }
  std::vector<pid_t> pids() const;

  // Delivers every stack published so far, ring by ring.
  size_t Drain(const std::function<void(const RingStack&)>& callback);

  // The target's executable mappings as the sampler published them, in the form the agent's
  // ProcessAddressSpace takes. `generation` changes when the target saw dlopen/dlclose.
  absl::StatusOr<std::vector<symbols::MappingInfo>> Mappings(pid_t pid,
                                                             uint64_t* generation) const;

  InprocSourceStats stats() const;

 private:
  InprocSourceOptions options_;
  absl::flat_hash_map<pid_t, std::unique_ptr<RingReader>> rings_;
  uint64_t stacks_ = 0;
  uint64_t lost_closed_ = 0;
};

}  // namespace strata::inproc

#endif  // STRATA_AGENT_INPROC_INPROC_SOURCE_H_
