#include "agent/python/remote_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <string>

namespace strata::agent::python {

bool RemoteMemory::Read(uint64_t address, void* out, size_t size) const {
  ++reads_;
  if (size == 0) return true;
  if (!use_mem_file_) {
    iovec local{out, size};
    iovec remote{reinterpret_cast<void*>(static_cast<uintptr_t>(address)), size};
    const ssize_t n = process_vm_readv(pid_, &local, 1, &remote, 1, 0);
    if (n == static_cast<ssize_t>(size)) return true;
    if (n >= 0 || errno != ENOSYS) return false;
    use_mem_file_ = true;  // kernels or emulators without the call
  }
  if (!OpenMemFile()) return false;
  return pread(mem_fd_.get(), out, size, static_cast<off_t>(address)) ==
         static_cast<ssize_t>(size);
}

size_t RemoteMemory::ReadPrefix(uint64_t address, void* out, size_t size) const {
  constexpr uint64_t kPage = 4096;  // the smallest page of both architectures
  constexpr size_t kPages = 32;     // iovecs per call
  auto* to = static_cast<uint8_t*>(out);
  size_t done = 0;
  while (done < size && !use_mem_file_) {
    // A partial transfer ends at a whole remote iovec: one per page, so that it ends at the
    // first page that cannot be read.
    iovec remote[kPages];
    size_t pages = 0, want = 0;
    for (uint64_t at = address + done, end = address + size; at < end && pages < kPages;) {
      const uint64_t next = std::min(end, (at | (kPage - 1)) + 1);
      remote[pages++] = {reinterpret_cast<void*>(static_cast<uintptr_t>(at)), next - at};
      want += next - at;
      at = next;
    }
    iovec local{to + done, want};
    ++reads_;
    const ssize_t got = process_vm_readv(pid_, &local, 1, remote, pages, 0);
    if (got < 0 && errno == ENOSYS) {
      use_mem_file_ = true;  // as in Read()
      break;
    }
    if (got > 0) done += static_cast<size_t>(got);
    if (got != static_cast<ssize_t>(want)) return done;
  }
  if (done == size || !OpenMemFile()) return done;
  ++reads_;
  const ssize_t got =
      pread(mem_fd_.get(), to + done, size - done, static_cast<off_t>(address + done));
  return done + static_cast<size_t>(std::max<ssize_t>(got, 0));
}

bool RemoteMemory::OpenMemFile() const {
  if (!mem_fd_.valid()) {
    const std::string path = "/proc/" + std::to_string(pid_) + "/mem";
    mem_fd_.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  }
  return mem_fd_.valid();
}

bool RemoteMemory::ReadMany(const uint64_t* addresses, const size_t* sizes, size_t count,
                            void* out) const {
  constexpr size_t kBatch = 64;  // iovecs per call (well under IOV_MAX)
  auto* to = static_cast<uint8_t*>(out);
  for (size_t first = 0; first < count; first += kBatch) {
    const size_t n = std::min(kBatch, count - first);
    iovec local[kBatch], remote[kBatch];
    size_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      local[i] = {to + total, sizes[first + i]};
      remote[i] = {reinterpret_cast<void*>(static_cast<uintptr_t>(addresses[first + i])),
                   sizes[first + i]};
      total += sizes[first + i];
    }
    ++reads_;
    const ssize_t got = use_mem_file_ ? -1 : process_vm_readv(pid_, local, n, remote, n, 0);
    if (got != static_cast<ssize_t>(total)) {
      // One by one: the /proc/PID/mem fallback, or a partial read (memory that went away).
      if (got >= 0 || (errno != ENOSYS && !use_mem_file_)) return false;
      for (size_t i = 0; i < n; ++i) {
        if (!Read(addresses[first + i], local[i].iov_base, sizes[first + i])) return false;
      }
    }
    to += total;
  }
  return true;
}

uint64_t RemoteMemory::ReadDownTo(uint64_t address, size_t size, uint64_t split,
                                  void* out) const {
  if (split <= address || split - address >= size) {
    return Read(address, out, size) ? address : 0;
  }
  auto* to = static_cast<uint8_t*>(out);
  const size_t below = split - address, above = size - below;
  ++reads_;
  if (!use_mem_file_) {
    // Partial transfers stop at a whole iovec: the upper part, or nothing.
    iovec local[2] = {{to + below, above}, {to, below}};
    iovec remote[2] = {{reinterpret_cast<void*>(static_cast<uintptr_t>(split)), above},
                       {reinterpret_cast<void*>(static_cast<uintptr_t>(address)), below}};
    const ssize_t n = process_vm_readv(pid_, local, 2, remote, 2, 0);
    if (n == static_cast<ssize_t>(size)) return address;
    if (n == static_cast<ssize_t>(above)) return split;
    if (n >= 0 || errno != ENOSYS) return 0;
    use_mem_file_ = true;
  }
  if (!Read(split, to + below, above)) return 0;
  return Read(address, to, below) ? address : split;
}

}  // namespace strata::agent::python
