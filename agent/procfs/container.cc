#include "agent/procfs/container.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/procfs/procfs.h"
#include "common/base/split.h"

namespace strata::agent::procfs {
namespace {

using base::Split;

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A pod UID as the kubelet writes it in cgroup names: 36 characters with dashes (or, with
// the systemd driver, underscores), or 32 hex digits (static pods: a hash).
std::string PodUid(std::string_view s) {
  std::string uid(s);
  std::replace(uid.begin(), uid.end(), '_', '-');
  const bool dashed = uid.size() == 36 && uid[8] == '-' && uid[13] == '-' && uid[18] == '-' &&
                      uid[23] == '-';
  std::string digits = uid;
  std::erase(digits, '-');
  if ((dashed || uid.size() == 32) && digits.size() == 32 && IsHex(digits)) return uid;
  return "";
}

struct Prefix {
  std::string_view prefix;
  std::string_view runtime;
};
// systemd scope names of the runtimes' containers.
constexpr Prefix kScopePrefixes[] = {
    {"docker-", "docker"},         {"cri-containerd-", "containerd"},
    {"crio-", "cri-o"},            {"libpod-", "podman"},
    {"containerd-", "containerd"}, {"nerdctl-", "containerd"},
};

// Container ID and pod UID in one cgroup path.
ContainerInfo ParsePath(std::string_view path) {
  ContainerInfo info;
  std::string_view parent;
  for (std::string_view part : Split(path, '/')) {
    std::string_view name = part;
    if (name.ends_with(".scope")) name.remove_suffix(6);
    if (name.ends_with(".slice")) {
      // kubepods-burstable-pod<uid>.slice, kubepods-pod<uid>.slice (systemd driver)
      name.remove_suffix(6);
      const size_t pod = name.rfind("-pod");
      if (name.starts_with("kubepods") && pod != std::string_view::npos) {
        if (std::string uid = PodUid(name.substr(pod + 4)); !uid.empty()) info.pod_uid = uid;
      }
      parent = part;
      continue;
    }
    if (name.starts_with("pod") && (parent.starts_with("kubepods") || parent == "burstable" ||
                                     parent == "besteffort" || parent == "guaranteed")) {
      // /kubepods/<qos>/pod<uid>/<id>, /kubepods/pod<uid>/<id> (cgroupfs driver)
      if (std::string uid = PodUid(name.substr(3)); !uid.empty()) info.pod_uid = uid;
    }
    std::string_view runtime;
    if (name.starts_with("crio-conmon-")) {
      parent = part;
      continue;  // CRI-O's monitor process, not the container
    }
    for (const Prefix& p : kScopePrefixes) {
      if (name.starts_with(p.prefix)) {
        name.remove_prefix(p.prefix.size());
        runtime = p.runtime;
        break;
      }
    }
    if (name.size() == 64 && IsHex(name)) {
      info.container_id = std::string(name);
      // cgroupfs driver: /docker/<id>; Kubernetes leaves the runtime unnamed there.
      info.runtime = !runtime.empty() ? std::string(runtime)
                     : parent == "docker" ? "docker"
                     : parent == "libpod_parent" ? "podman"
                                          : "";
    }
    parent = part;
  }
  return info;
}

}  // namespace

ContainerInfo ParseCgroup(std::string_view cgroup_text) {
  // The unified hierarchy ("0::") first, then the v1 hierarchies in file order; the first
  // path that names a container wins, a pod UID found anywhere is kept.
  ContainerInfo best;
  std::vector<std::string_view> paths;
  for (std::string_view line : Split(cgroup_text, '\n')) {
    // hierarchy-ID:controller-list:path; the path may contain ':'.
    const size_t first = line.find(':');
    if (first == std::string_view::npos) continue;
    const size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    std::string_view path = line.substr(second + 1);
    if (line.starts_with("0::")) {
      paths.insert(paths.begin(), path);
    } else {
      paths.push_back(path);
    }
  }
  for (std::string_view path : paths) {
    ContainerInfo info = ParsePath(path);
    if (best.pod_uid.empty()) best.pod_uid = info.pod_uid;
    if (best.container_id.empty() && !info.container_id.empty()) {
      best.container_id = info.container_id;
      best.runtime = info.runtime;
      if (!info.pod_uid.empty()) best.pod_uid = info.pod_uid;
    }
  }
  return best;
}

absl::StatusOr<std::string> ReadCgroup(pid_t pid) {
  return ReadProcFile(absl::StrCat("/proc/", pid, "/cgroup"), 64u << 10);
}

}  // namespace strata::agent::procfs
