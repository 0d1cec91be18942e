#include "agent/inproc/inproc_source.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::inproc {
namespace {

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

absl::Status InprocSource::Rescan(std::vector<pid_t>* added, std::vector<pid_t>* removed) {
  for (auto it = rings_.begin(); it != rings_.end();) {
    auto cur = it++;
    if (ProcessAlive(cur->first)) continue;
    lost_closed_ += cur->second->lost();
    if (removed != nullptr) removed->push_back(cur->first);
    // The process is gone and did not clean up (killed): its ring is ours to remove.
    unlink(RingPath(options_.dir, cur->first).c_str());
    rings_.erase(cur);
  }
  DIR* dir = opendir(options_.dir.c_str());
  if (dir == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("opendir ", options_.dir));
  }
  const size_t prefix = std::strlen(kRingPrefix);
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, kRingPrefix, prefix) != 0) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name + prefix, &pid) || pid <= 0) continue;
    if (rings_.contains(pid) || !ProcessAlive(pid)) continue;
    absl::StatusOr<std::unique_ptr<RingReader>> reader =
        RingReader::Open(RingPath(options_.dir, pid), options_.arch);
    if (!reader.ok()) continue;  // still being created, or not ours to read: retry next scan
    rings_[pid] = std::move(*reader);
    if (added != nullptr) added->push_back(pid);
  }
  closedir(dir);
  return absl::OkStatus();
}

std::vector<pid_t> InprocSource::pids() const {
  std::vector<pid_t> out;
  for (const auto& [pid, ring] : rings_) out.push_back(pid);
  return out;
}

size_t InprocSource::Drain(const std::function<void(const RingStack&)>& callback) {
  size_t n = 0;
  for (auto& [pid, ring] : rings_) n += ring->Drain(callback);
  stacks_ += n;
  return n;
}

absl::StatusOr<std::vector<symbols::MappingInfo>> InprocSource::Mappings(
    pid_t pid, uint64_t* generation) const {
  auto it = rings_.find(pid);
  if (it == rings_.end()) return absl::NotFoundError(absl::StrCat("no ring for pid ", pid));
  std::vector<RingModule> modules;
  if (!it->second->ReadModules(&modules, generation)) {
    return absl::UnavailableError("module table is being rewritten");
  }
  std::vector<symbols::MappingInfo> out;
  for (const RingModule& m : modules) {
    symbols::MappingInfo info;
    info.start = m.start;
    info.end = m.end;
    info.offset = m.offset;
    info.exec = true;
    info.path = m.path;
    out.push_back(std::move(info));
  }
  return out;
}

InprocSourceStats InprocSource::stats() const {
  InprocSourceStats s;
  s.stacks = stacks_;
  s.lost = lost_closed_;
  for (const auto& [pid, ring] : rings_) {
    s.lost += ring->lost();
    s.unwind_errors += ring->unwind_errors();
  }
  s.rings = rings_.size();
  return s;
}

}  // namespace strata::inproc
