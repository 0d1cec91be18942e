// Which container a process runs in, from its /proc/PID/cgroup: the container ID and runtime
// (Docker, containerd, CRI-O, Podman) and, under Kubernetes, the pod's UID. cgroup v1 (one
// line per hierarchy) and v2 ("0::/path"), with the cgroupfs and systemd cgroup drivers.
// Pod names and namespaces are not in the cgroup path; the agent reads them from the
// process's environment or its service account (agent/core/target_labels.h).
//
// The parser is pure and never fails: text it does not recognise yields an empty result.
#ifndef STRATA_AGENT_PROCFS_CONTAINER_H_
#define STRATA_AGENT_PROCFS_CONTAINER_H_

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace strata::agent::procfs {

struct ContainerInfo {
  std::string container_id;  // 64 lowercase hex digits; empty: not in a container we know
  std::string runtime;       // "docker", "containerd", "cri-o", "podman" or empty
  std::string pod_uid;       // Kubernetes pod UID (with dashes); empty outside Kubernetes

  bool operator==(const ContainerInfo&) const = default;
};

ContainerInfo ParseCgroup(std::string_view cgroup_text);

// /proc/PID/cgroup, at most 64 KiB of it.
absl::StatusOr<std::string> ReadCgroup(pid_t pid);

}  // namespace strata::agent::procfs

#endif  // STRATA_AGENT_PROCFS_CONTAINER_H_
