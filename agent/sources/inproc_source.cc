#include "agent/sources/inproc_source.h"

#include <dirent.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/unwind/unwind_types.h"

namespace strata::agent::sources {
namespace {

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

InprocSource::InprocSource(InprocSourceOptions options) : options_(std::move(options)) {
  inotify_fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  // A ring is complete when its creator closes it (IN_CLOSE_WRITE); IN_CREATE sees it early.
  if (inotify_fd_.valid() &&
      inotify_add_watch(inotify_fd_.get(), options_.dir.c_str(),
                        IN_CREATE | IN_CLOSE_WRITE | IN_MOVED_TO) < 0) {
    inotify_fd_.reset();
  }
}

absl::Status InprocSource::Rescan(StackSink& sink, std::vector<pid_t>* claimed) {
  if (inotify_fd_.valid()) {  // the directory is listed below: what it says is moot
    alignas(inotify_event) char buffer[4096];
    while (read(inotify_fd_.get(), buffer, sizeof(buffer)) > 0) {
    }
  }
  // An exited process's ring is closed below: take its last stacks first.
  Drain(sink);
  for (auto it = rings_.begin(); it != rings_.end();) {
    auto cur = it++;
    if (ProcessAlive(cur->first)) continue;
    lost_closed_ += cur->second->lost();
    // The process is gone and did not clean up (killed): its ring is ours to remove.
    unlink(runtime::RingPath(options_.dir, cur->first).c_str());
    rings_.erase(cur);
  }
  DIR* dir = opendir(options_.dir.c_str());
  if (dir == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("opendir ", options_.dir));
  }
  const size_t prefix = std::strlen(runtime::kRingPrefix);
  while (dirent* e = readdir(dir)) {
    if (std::strncmp(e->d_name, runtime::kRingPrefix, prefix) != 0) continue;
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name + prefix, &pid) || pid <= 0) continue;
    if (rings_.contains(pid) || !ProcessAlive(pid)) continue;
    absl::StatusOr<std::unique_ptr<runtime::RingReader>> reader =
        runtime::RingReader::Open(runtime::RingPath(options_.dir, pid), options_.arch);
    if (!reader.ok()) {
      // Its owner's, mode 0600, and opened for writing (the reader's position): an agent that
      // is neither root nor that user nor has CAP_DAC_OVERRIDE would get nothing, unsaid.
      if (refused_.size() > 4096) refused_.clear();  // pids of long-gone processes
      if (absl::IsPermissionDenied(reader.status()) && refused_.insert(pid).second) {
        LogWarn("pid {}: cannot open its in-process sampler's ring ({}): run the agent as root, "
                "as the process's user, or with CAP_DAC_OVERRIDE",
                pid, reader.status().ToString());
      }
      continue;  // still being created, or not ours to read: retry next scan
    }
    rings_[pid] = std::move(*reader);
    if (claimed != nullptr) claimed->push_back(pid);
  }
  closedir(dir);
  return absl::OkStatus();
}

void InprocSource::Drain(StackSink& sink) {
  auto deliver = [this, &sink](const runtime::RingStack& s) {
    UnwoundStack stack;
    stack.pid = s.pid;
    stack.tid = s.tid;
    stack.time_ns = s.time_ns;
    stack.pcs = s.pcs;
    stack.num_frames = s.num_frames;
    stack.truncated = s.truncated;
    stack.stopped_outside_modules = s.stop == static_cast<uint8_t>(unwind::StopReason::kNoModule);
    sink.OnStack(*this, stack);
  };
  for (auto& [pid, ring] : rings_) stacks_ += ring->Drain(deliver);
}

absl::StatusOr<std::vector<symbols::MappingInfo>> InprocSource::Mappings(
    pid_t pid, uint64_t* generation) const {
  auto it = rings_.find(pid);
  if (it == rings_.end()) return absl::NotFoundError(absl::StrCat("no ring for pid ", pid));
  std::vector<runtime::RingModule> modules;
  if (!it->second->ReadModules(&modules, generation)) {
    return absl::UnavailableError("module table is being rewritten");
  }
  std::vector<symbols::MappingInfo> out;
  for (const runtime::RingModule& m : modules) {
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

}  // namespace strata::agent::sources
