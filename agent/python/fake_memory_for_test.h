// Test support: a target's memory made by hand, for readers of RemoteMemory (the Python and
// Go readers). Header-only; tests only.
#ifndef STRATA_AGENT_PYTHON_FAKE_MEMORY_FOR_TEST_H_
#define STRATA_AGENT_PYTHON_FAKE_MEMORY_FOR_TEST_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "agent/python/remote_memory.h"
#include "gtest/gtest.h"

namespace strata::agent::python::testing {

// Regions of bytes, read like process_vm_readv (all or nothing). Counts its reads.
class FakeMemory final : public RemoteMemory {
 public:
  FakeMemory() : RemoteMemory(0) {}
  bool Read(uint64_t address, void* out, size_t size) const override {
    ++reads;
    for (const auto& [start, bytes] : regions) {
      if (address >= start && size <= bytes.size() && address - start <= bytes.size() - size) {
        std::memcpy(out, bytes.data() + (address - start), size);
        return true;
      }
    }
    return false;
  }
  bool ReadMany(const uint64_t* addresses, const size_t* sizes, size_t count,
                void* out) const override {
    auto* to = static_cast<uint8_t*>(out);
    for (size_t i = 0; i < count; to += sizes[i++]) {
      if (!Read(addresses[i], to, sizes[i])) return false;
    }
    return true;
  }
  void Map(uint64_t start, size_t size) { regions[start].assign(size, 0); }
  // Writes the 8 bytes of `value` (host order) at `addr`, inside a mapped region.
  void Put(uint64_t addr, uint64_t value) {
    for (auto& [start, bytes] : regions) {
      if (addr >= start && addr + 8 <= start + bytes.size()) {
        std::memcpy(bytes.data() + (addr - start), &value, 8);
        return;
      }
    }
    ADD_FAILURE() << "unmapped " << addr;
  }
  std::map<uint64_t, std::vector<uint8_t>> regions;
  mutable uint64_t reads = 0;
};

}  // namespace strata::agent::python::testing

#endif  // STRATA_AGENT_PYTHON_FAKE_MEMORY_FOR_TEST_H_
