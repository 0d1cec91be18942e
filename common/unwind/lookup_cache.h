// A direct-mapped cache of a rule table's lookups, by the looked-up address's offset in the
// table's span: each slot one 64-bit word, (offset + 1) << 32 | a 32-bit value the table
// defines, read and written with relaxed atomics. A lookup's word is whole or not there, so
// one cache serves every thread unwinding with the table, and a signal handler; a slot another
// address took is a miss, never a wrong answer.
//
// Owned by its rule table (the tables are immutable apart from it). Per sample most frames'
// addresses (return addresses of the same call sites, a loop's leaf) were looked up before,
// and a probe reads one word instead of a search's cache misses over the table.
#ifndef STRATA_COMMON_UNWIND_LOOKUP_CACHE_H_
#define STRATA_COMMON_UNWIND_LOOKUP_CACHE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace strata::unwind {

class LookupCache {
 public:
  static constexpr size_t kSlots = 1024;
  static constexpr size_t kMemoryBytes = kSlots * sizeof(uint64_t);

  LookupCache() : slots_(std::make_unique<std::atomic<uint64_t>[]>(kSlots)) {}

  // Offsets from 2^32 - 1 on are never cached.
  static bool Cacheable(uint64_t offset) { return offset < 0xffffffffu; }

  // The value stored for `offset` (Cacheable), if its slot still holds it.
  bool Find(uint64_t offset, uint32_t* value) const {
    const uint64_t word = slots_[SlotOf(offset)].load(std::memory_order_relaxed);
    if ((word >> 32) != offset + 1) return false;
    *value = static_cast<uint32_t>(word);
    return true;
  }
  void Store(uint64_t offset, uint32_t value) const {
    slots_[SlotOf(offset)].store((offset + 1) << 32 | value, std::memory_order_relaxed);
  }

 private:
  static size_t SlotOf(uint64_t offset) {
    return static_cast<size_t>((offset * 0x9e3779b97f4a7c15ull) >> 54) & (kSlots - 1);
  }

  // Mutable through const lookups: the table's users see an immutable table.
  std::unique_ptr<std::atomic<uint64_t>[]> slots_;
};

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_LOOKUP_CACHE_H_
