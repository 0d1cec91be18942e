#include "agent/python/remote_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

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
  if (!mem_fd_.valid()) {
    const std::string path = "/proc/" + std::to_string(pid_) + "/mem";
    mem_fd_.reset(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!mem_fd_.valid()) return false;
  }
  return pread(mem_fd_.get(), out, size, static_cast<off_t>(address)) ==
         static_cast<ssize_t>(size);
}

}  // namespace strata::agent::python
