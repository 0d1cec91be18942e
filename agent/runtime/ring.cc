#include "agent/runtime/ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace strata::agent::runtime {

std::string RingPath(const std::string& dir, pid_t pid) {
  return absl::StrCat(dir, "/", kRingPrefix, pid);
}

RingWriter::~RingWriter() {
  if (header_ != nullptr) munmap(header_, bytes_);
}

absl::Status RingWriter::Create(const std::string& dir, pid_t pid, uint32_t arch,
                                uint32_t capacity, uint32_t hz) {
  if (capacity == 0) return absl::InvalidArgumentError("ring capacity 0");
  path_ = RingPath(dir, pid);
  // A file left by an earlier process with the same pid is stale: start over.
  unlink(path_.c_str());
  const int fd = open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("create ", path_));
  bytes_ = RingBytes(capacity);
  if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    const int err = errno;
    close(fd);
    unlink(path_.c_str());
    return absl::ErrnoToStatus(err, absl::StrCat("size ", path_));
  }
  void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    unlink(path_.c_str());
    return absl::ErrnoToStatus(errno, absl::StrCat("map ", path_));
  }
  // The file is zero-filled: every slot's seq is 0, which no ticket publishes (ticket + 1).
  header_ = static_cast<RingHeader*>(p);
  header_->version = kRingVersion;
  header_->arch = arch;
  header_->pid = static_cast<uint32_t>(pid);
  header_->capacity = capacity;
  header_->record_size = sizeof(RingRecord);
  header_->hz = hz;
  // The magic last: a reader that sees it sees a complete header.
  std::atomic_thread_fence(std::memory_order_release);
  header_->magic.store(kRingMagic, std::memory_order_release);
  return absl::OkStatus();
}

bool RingWriter::Append(uint32_t tid, uint64_t time_ns, const uint64_t* pcs, size_t n,
                        bool truncated, uint8_t stop) {
  RingHeader* h = header_;
  if (h == nullptr) return false;
  uint64_t ticket = h->reserve.load(std::memory_order_relaxed);
  do {
    if (ticket - h->consumed.load(std::memory_order_acquire) >= h->capacity) {
      h->lost.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!h->reserve.compare_exchange_weak(ticket, ticket + 1, std::memory_order_acq_rel,
                                             std::memory_order_relaxed));
  RingRecord& r = RingSlots(h)[ticket % h->capacity];
  if (n > kMaxRecordFrames) {
    n = kMaxRecordFrames;
    truncated = true;
  }
  r.pid = h->pid;
  r.tid = tid;
  r.time_ns = time_ns;
  r.num_frames = static_cast<uint16_t>(n);
  r.truncated = truncated ? 1 : 0;
  r.stop = stop;
  for (size_t i = 0; i < n; ++i) r.pcs[i] = pcs[i];
  r.seq.store(ticket + 1, std::memory_order_release);
  return true;
}

void RingWriter::SetModules(const RingModule* modules, size_t n) {
  if (header_ == nullptr) return;
  if (n > kMaxRingModules) n = kMaxRingModules;
  const uint64_t gen = header_->modules_gen.load(std::memory_order_relaxed);
  header_->modules_gen.store(gen + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  header_->num_modules = static_cast<uint32_t>(n);
  std::memcpy(header_->modules, modules, n * sizeof(RingModule));
  header_->modules_gen.store(gen + 2, std::memory_order_release);
}

void RingWriter::Remove() {
  if (header_ == nullptr) return;
  munmap(header_, bytes_);
  header_ = nullptr;
  unlink(path_.c_str());
}

RingReader::~RingReader() { munmap(header_, bytes_); }

absl::StatusOr<std::unique_ptr<RingReader>> RingReader::Open(const std::string& path,
                                                             uint32_t expected_arch) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(RingHeader)) {
    close(fd);
    return absl::UnavailableError(absl::StrCat(path, ": not initialized yet"));
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("map ", path));
  auto* h = static_cast<RingHeader*>(p);
  absl::Status bad;
  if (h->magic.load(std::memory_order_acquire) != kRingMagic) {
    bad = absl::UnavailableError(absl::StrCat(path, ": not initialized yet"));
  } else if (h->version != kRingVersion || h->record_size != sizeof(RingRecord) ||
             h->capacity == 0 || RingBytes(h->capacity) != bytes) {
    bad = absl::FailedPreconditionError(absl::StrCat(path, ": incompatible ring layout"));
  } else if (h->arch != expected_arch) {
    bad = absl::FailedPreconditionError(
        absl::StrCat(path, ": ring of architecture ", h->arch, ", agent is ", expected_arch));
  }
  if (!bad.ok()) {
    munmap(p, bytes);
    return bad;
  }
  return std::unique_ptr<RingReader>(new RingReader(h, bytes));
}

bool RingReader::ReadModules(std::vector<RingModule>* out, uint64_t* generation) const {
  for (int attempt = 0; attempt < 8; ++attempt) {
    const uint64_t before = header_->modules_gen.load(std::memory_order_acquire);
    if (before & 1) continue;
    const uint32_t n = std::min<uint32_t>(header_->num_modules, kMaxRingModules);
    out->assign(header_->modules, header_->modules + n);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (header_->modules_gen.load(std::memory_order_relaxed) == before) {
      for (RingModule& m : *out) m.path[kModulePathBytes - 1] = '\0';
      *generation = before;
      return true;
    }
  }
  return false;
}

}  // namespace strata::agent::runtime
