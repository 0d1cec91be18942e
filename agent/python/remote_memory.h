// Reads of another process's memory (the agent's view of a target's interpreter state):
// process_vm_readv, or pread on /proc/PID/mem where that system call is missing. Both need
// the same permission as ptrace-reading the target (the agent's CAP_SYS_PTRACE, or the same
// user under ptrace_scope 0/1 for a child). A read of memory the target unmapped fails; it
// never faults the agent. No allocation per read.
#ifndef STRATA_AGENT_PYTHON_REMOTE_MEMORY_H_
#define STRATA_AGENT_PYTHON_REMOTE_MEMORY_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/base/unique_fd.h"

namespace strata::agent::python {

class RemoteMemory {
 public:
  explicit RemoteMemory(pid_t pid) : pid_(pid) {}
  virtual ~RemoteMemory() = default;

  // Copies `size` bytes at `address` of the process to `out`; false unless all were read.
  virtual bool Read(uint64_t address, void* out, size_t size) const;

  // Copies the bytes at [address, address + size) to `out` up to the first page that cannot
  // be read (unmapped); returns how many were copied.
  virtual size_t ReadPrefix(uint64_t address, void* out, size_t size) const;

  // Several reads in one system call where possible: `sizes[i]` bytes at `addresses[i]` to
  // consecutive places in `out`. False unless all were read.
  virtual bool ReadMany(const uint64_t* addresses, const size_t* sizes, size_t count,
                        void* out) const;

  // [address, address + size) into `out`, the part from `split` on first: where the part
  // below `split` is unmapped, only the rest. Returns where the bytes read start (address or
  // split; their place in `out` is as in the whole range), or 0 when none were read.
  virtual uint64_t ReadDownTo(uint64_t address, size_t size, uint64_t split, void* out) const;

  template <typename T>
  bool ReadValue(uint64_t address, T* out) const {
    return Read(address, out, sizeof(T));
  }

  pid_t pid() const { return pid_; }
  uint64_t reads() const { return reads_; }
  // Whether reads go through /proc/PID/mem (process_vm_readv failed: qemu user mode has none),
  // one system call per range instead of one per batch of ranges.
  bool reads_mem_file() const { return use_mem_file_; }

 private:
  bool OpenMemFile() const;  // /proc/PID/mem, once

  pid_t pid_;
  mutable base::UniqueFd mem_fd_;  // /proc/PID/mem, opened on the first fallback
  mutable bool use_mem_file_ = false;
  mutable uint64_t reads_ = 0;
};

// Field `T` at `offset` of a copied struct.
template <typename T>
T FieldAt(const uint8_t* bytes, uint32_t offset) {
  T v;
  std::memcpy(&v, bytes + offset, sizeof(T));
  return v;
}

}  // namespace strata::agent::python

#endif  // STRATA_AGENT_PYTHON_REMOTE_MEMORY_H_
