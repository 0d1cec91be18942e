// The fleet labels the agent attaches to one target, computed once when the process becomes a
// target (never per sample) and sent with it in every batch:
//   - what the process says: STRATA_LABELS=k=v,... in its environment (label list syntax of
//     common/labels; a bad list is left out as a whole, with a warning)
//   - its executable: build_id (GNU build ID, hex) and version (the "version" of the ELF
//     package metadata note .note.package, where the binary has one)
//   - its container (/proc/PID/cgroup, procfs/container.h): container_id, container_runtime,
//     and under Kubernetes pod_uid, pod (POD_NAME, else HOSTNAME) and namespace
//     (POD_NAMESPACE, else the pod's service account namespace file)
// STRATA_LABELS wins over the derived labels; the agent's --label (Hello.labels) are merged
// under all of them by the server.
#ifndef STRATA_AGENT_CORE_TARGET_LABELS_H_
#define STRATA_AGENT_CORE_TARGET_LABELS_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "agent/procfs/container.h"
#include "agent/procfs/process_tracker.h"
#include "common/labels/labels.h"

namespace strata::agent {

// Label keys the agent derives.
inline constexpr char kBuildIdLabel[] = "build_id";
inline constexpr char kVersionLabel[] = "version";
inline constexpr char kContainerIdLabel[] = "container_id";
inline constexpr char kContainerRuntimeLabel[] = "container_runtime";
inline constexpr char kPodUidLabel[] = "pod_uid";
inline constexpr char kPodLabel[] = "pod";
inline constexpr char kNamespaceLabel[] = "namespace";

// The "version" string of an ELF package metadata note's JSON payload
// ({"type":"deb","name":"x","version":"1.4.2",...}), or "" when it has none.
std::string PackageNoteVersion(std::string_view json);

// What the labels are computed from (the live readers fill it; tests build it).
struct TargetFacts {
  std::vector<std::pair<std::string, std::string>> environment;  // TrackedProcess::environment
  std::string build_id_hex;
  std::string package_version;
  procfs::ContainerInfo container;
  std::string service_account_namespace;
};

// The labels of a target from its facts; `warnings` (optional) receives what was left out.
labels::LabelSet LabelsFromFacts(const TargetFacts& facts, std::vector<std::string>* warnings);

// Reads the facts of a live target (its executable through /proc/PID/exe, its cgroup, its
// service account) and returns its labels. Unreadable facts are skipped.
labels::LabelSet TargetLabels(const procfs::TrackedProcess& process,
                              std::vector<std::string>* warnings);

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_TARGET_LABELS_H_
