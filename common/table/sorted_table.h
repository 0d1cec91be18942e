// Bounded, periodically sorted hash table (the AMD method, US8024719).
//
// The server aggregates (stack ID -> count) per (service, time window) in one of these; the
// agent aggregates its per-interval batch (hash of the sample context -> count) in another.
// Memory is fixed at construction: one array of max(bucket_count, max_entries) entry slots,
// allocated once (an owner may Grow() it explicitly, e.g. the server creates tables small and
// grows them with use). Nothing else allocates (Add, sorting, Drain, Clear
// and phase-change recording never allocate; TopN and TakePhaseChanges allocate only the
// vectors they return). When the table is full, Add() reports AddResult::kFull and the owner
// flushes with Drain() (or ForEach() + Clear() when the sink can fail), then adds again: counts
// are never dropped or merged lossily.
//
// Each entry also keeps its count of the current period. Every `period` counts (or at
// EndPeriod()), chains longer than `depth_threshold` move their entries above
// `frequency_threshold` to the front, hottest first, and the period's hot set is ranked
// against those of the two periods before to record phase changes (PhaseChange); between
// the sorts, a hit behind a head passes the entry before it when it has more than twice that
// entry's period count (the warm entries the sort leaves alone find their place). Entries are
// 16-byte slots with each chain's head in its home slot, so a hit on a head (where sorting
// keeps the hot entries) is one cache miss found from the hash alone. Why each of these is so,
// and what an update costs: docs/developing/sorted-table.md.
//
// Not thread-safe: the owner serializes calls. Keys are trivially copyable, equality
// comparable and hashed by `Hash` (whose result is mixed again, so std::hash's identity for
// integers is fine).

#ifndef STRATA_COMMON_TABLE_SORTED_TABLE_H_
#define STRATA_COMMON_TABLE_SORTED_TABLE_H_

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace strata::table {

struct SortedTableOptions {
  // Distinct keys the table holds before Add() returns kFull. At most 2^31.
  uint32_t max_entries = 1u << 16;
  // Number of chains, rounded up to a power of two (at least 2, at most 2^31). 0 picks the
  // smallest power of two >= max_entries, i.e. mean chain length <= 1 when full. Buckets
  // beyond max_entries cost one entry slot each; fewer make chains deeper, which is where
  // sorting pays.
  uint32_t bucket_count = 0;
  // false: a plain bounded chained table (no period counts, sorting or phase changes).
  bool sorting = true;
  // A period ends after this many counts have been added (updates, with count 1 per Add).
  // 65536 samples is a few seconds of a busy server, a full interval of a busy agent.
  // 0: periods end only when the owner calls EndPeriod().
  uint32_t period = 1u << 16;
  // Only chains with more than this many entries are sorted (the patent's "small buckets are
  // ignored"). 1: a hit behind the head costs a mispredicted branch and mostly a second cache
  // miss, more than its share of a sort (O(hot entries) per period); with the hot set
  // switching, sorting chains of two takes the benchmark's mean probe from 1.20 to 1.12.
  uint32_t depth_threshold = 1;
  // Only entries with more than this many counts in the period move to the front. 64 is
  // 1/1024 of the default period: it bounds the number of hot entries (and so the sort
  // work) per period to period / (frequency_threshold + 1) and keeps Poisson noise at
  // small counts from reordering chains.
  uint32_t frequency_threshold = 64;
  // Order-of-magnitude test for phase changes (docs/developing/sorted-table.md). At least 2.
  uint32_t phase_change_factor = 10;
  // Phase changes buffered until TakePhaseChanges(); later ones are only counted.
  uint32_t max_phase_changes = 256;
  // Hot entries ranked per period for phase detection (the hottest ones). Pairs compared per
  // period: at most phase_rank_limit^2.
  uint32_t phase_rank_limit = 64;
  // Entries remembered per period as having crossed frequency_threshold (with period = 0,
  // where the number of hot entries has no bound from the period length). 0 picks
  // min(max_entries, the bound implied by period and frequency_threshold, or 4096 with
  // period = 0).
  uint32_t max_hot_entries = 0;
};

enum class AddResult {
  kUpdated,   // key was present; its count grew
  kInserted,  // key was new and is now stored
  kFull,      // key was new and the table is full: nothing stored; Drain() and add again
};

template <typename Key>
struct KeyCount {
  Key key;
  uint64_t count;
  friend bool operator==(const KeyCount&, const KeyCount&) = default;
};

// The ranking of the period that ended has `rose_key` ahead of `fell_key`, which was ahead in
// an earlier ranking (one or two periods back); their counts were an order of magnitude apart
// then or now. The owner adds service and window when it publishes these.
template <typename Key>
struct PhaseChange {
  uint64_t update_index;  // Add() calls stored so far in this table's lifetime
  uint64_t period_index;  // the period that just ended (0-based)
  Key rose_key;
  uint32_t rose_count;       // period count of rose_key in the period that ended
  // ... and in the earlier ranking's period; if rose_key was not ranked then, an upper bound
  // (the lowest ranked count, or frequency_threshold).
  uint32_t rose_prev_count;
  Key fell_key;
  uint32_t fell_count;       // period count of fell_key in the period that ended
  uint32_t fell_prev_count;  // ... and in the earlier ranking's period
};

// Cumulative counters; subtract two snapshots to measure an interval.
struct TableStats {
  uint64_t updates = 0;           // Add() calls that stored: hits + inserts
  uint64_t hits = 0;              // kUpdated
  uint64_t hit_probe_sum = 0;     // chain position of each hit, head = 1
  uint64_t inserts = 0;           // kInserted
  uint64_t insert_probe_sum = 0;  // entries walked before each insert
  uint64_t full_rejections = 0;   // kFull
  uint64_t periods = 0;           // periods ended (sort passes)
  uint64_t chains_sorted = 0;
  uint64_t entries_moved = 0;     // entries whose chain position a sort changed
  uint64_t entries_passed = 0;    // hits behind a head that passed the entry before them
  uint64_t phase_changes = 0;     // recorded (buffered or dropped)
  uint64_t phase_changes_dropped = 0;
  uint64_t drains = 0;            // Drain() and Clear() calls

  double MeanHitProbeLength() const {
    return hits == 0 ? 0.0 : static_cast<double>(hit_probe_sum) / static_cast<double>(hits);
  }
  // Mean chain position of the hits between snapshot `since` and this one.
  double MeanHitProbeLengthSince(const TableStats& since) const {
    const uint64_t h = hits - since.hits;
    return h == 0 ? 0.0 : static_cast<double>(hit_probe_sum - since.hit_probe_sum) / h;
  }
};

template <typename Key = uint64_t, typename Hash = std::hash<Key>>
class SortedTable {
  static_assert(std::is_trivially_copyable_v<Key>, "keys are copied into fixed slots");

 public:
  // Period counts saturate here (24 bits of the period word; docs/developing/sorted-table.md).
  static constexpr uint32_t kPeriodCountLimit = (1u << 24) - 1;

  // Validates `options` and allocates all memory the table will ever use.
  static absl::StatusOr<SortedTable> Create(const SortedTableOptions& options,
                                            Hash hash = Hash()) {
    if (absl::Status s = Validate(options); !s.ok()) return s;
    return SortedTable(options, std::move(hash));
  }

  SortedTable(SortedTable&&) noexcept = default;
  SortedTable& operator=(SortedTable&&) noexcept = default;
  SortedTable(const SortedTable&) = delete;
  SortedTable& operator=(const SortedTable&) = delete;

  // Adds `count` to `key`'s entry, creating it if there is room. May end a period (and sort).
  // A hit on a chain's head (where sorting keeps the hot entries) is small enough to inline;
  // deeper hits and inserts are out of line.
  AddResult Add(const Key& key, uint64_t count = 1) {
    const uint32_t b = BucketIndex(key);
    if (slots_[b].key == key && !guarded_) [[likely]] {
      if (Hit(b, 1, count, tally_)) [[unlikely]] PeriodCountReached();
      return AddResult::kUpdated;
    }
    return AddBehindHead(key, count, b);
  }

  // Adds items in order, as Add() would. Returns how many items were stored: fewer than
  // items.size() means items[returned] found the table full; the owner drains and calls again
  // with the rest. Home slots are prefetched a few items ahead, which hides the cache misses
  // of a table larger than the cache (one the cache holds gains nothing from it), sorting_ is
  // tested once, and the counters stay in registers between slow paths.
  size_t AddBatch(std::span<const KeyCount<Key>> items) {
    return sorting_ ? AddBatchAs<Upkeep::kSorted>(items) : AddBatchAs<Upkeep::kPlain>(items);
  }

  // Raises the table's bounds to `options` (max_entries, bucket_count, max_phase_changes and
  // max_hot_entries may grow; everything else must be as before), keeping every entry with
  // its count, period count and chain order, the period in progress, the previous rankings
  // and the buffered phase changes. Owners that create tables small and grow them with use
  // call this when Add() reports kFull. Allocates the new arrays and frees the old ones: the
  // only allocation after Create(). InvalidArgument for options it cannot grow to.
  absl::Status Grow(const SortedTableOptions& options);

  // Count stored for `key`, if present. Does not count as an access.
  std::optional<uint64_t> Find(const Key& key) const {
    const uint32_t i = FindSlot(key);
    if (i == kNil) return std::nullopt;
    return Count(i);
  }

  // Calls fn(key, count) for every entry, in slot order (no particular order).
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (uint32_t i = 0; i < slot_count_; ++i) {
      if (IsUsed(slots_[i])) fn(static_cast<const Key&>(slots_[i].key), Count(i));
    }
  }

  // Hands every entry to fn(key, count), then clears the table. The sum of counts handed over
  // plus those added afterwards equals the sum of all counts added. If the sink can fail, use
  // ForEach() and call Clear() once it succeeded.
  template <typename Fn>
  void Drain(Fn&& fn) {
    ForEach(fn);
    Clear();
  }

  // Removes all entries. Period counters, statistics, buffered phase changes and the previous
  // period's ranking are kept.
  void Clear();

  // Hands every non-zero count to fn(key, count) and sets it to zero, keeping the entries,
  // their chain order and their period counts: the owner flushes a window's counts and the
  // table keeps what it learned about which keys are hot. Counts conserved as with Drain().
  template <typename Fn>
  void TakeCounts(Fn&& fn);

  // Removes the entries for which pred(key, count, period_count) is true, keeping the order of
  // every chain (a chain whose head goes moves its first remaining entry into the home
  // slot). O(slots + hot entries * mean chain length); never allocates. The current period's
  // hot entries that remain stay recorded for its ranking. Returns the number removed.
  template <typename Pred>
  size_t RemoveIf(Pred&& pred);

  // The n entries with the largest non-zero counts, largest first; ties by ascending key (Key
  // needs operator<). One pass over the slots with a heap of n: O(slots + size log n).
  std::vector<KeyCount<Key>> TopN(size_t n) const;

  // Ends the current period now: sorts the queued chains, ranks the hot set and records phase
  // changes. Called by the table itself every `period` counts, or by the owner (period = 0).
  [[gnu::noinline]] void EndPeriod();

  // Moves the buffered phase changes (oldest first) to the caller.
  std::vector<PhaseChange<Key>> TakePhaseChanges() {
    std::vector<PhaseChange<Key>> out(phase_changes_.get(),
                                      phase_changes_.get() + phase_change_count_);
    phase_change_count_ = 0;
    return out;
  }

  // Diagnostics and tests: the bucket `key` maps to; the chain of a bucket head first as
  // fn(key, count, period_count) (period_count is only maintained when sorting is on); and
  // the position of `key` in its chain (head = 1; 0 if absent).
  uint32_t BucketIndex(const Key& key) const {
    uint64_t h = static_cast<uint64_t>(hash_(key));
    h ^= h >> 32;
    h *= 0x9e3779b97f4a7c15ull;
    return static_cast<uint32_t>(h >> bucket_shift_);
  }
  template <typename Fn>
  void ForEachInChain(uint32_t bucket, Fn&& fn) const {
    if (bucket >= bucket_count_ || !HasChain(bucket)) return;
    for (uint32_t i = bucket; i != kNil; i = Next(i)) {
      fn(static_cast<const Key&>(slots_[i].key), Count(i), PeriodCount(slots_[i]));
    }
  }
  uint32_t ProbeLength(const Key& key) const {
    uint32_t position = 0;
    return FindSlot(key, &position) == kNil ? 0 : position;
  }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t capacity() const { return options_.max_entries; }
  size_t bucket_count() const { return bucket_count_; }
  // Bytes a table with `options` allocates (what memory_bytes() will say), without creating
  // one: owners check a memory budget before they create or grow a table.
  static size_t MemoryBytesFor(const SortedTableOptions& options) {
    return LayoutFor(options).memory_bytes;
  }
  // Bytes allocated at construction (or by the last Grow()).
  size_t memory_bytes() const { return memory_bytes_; }
  const SortedTableOptions& options() const { return options_; }
  TableStats stats() const {
    TableStats s = stats_;
    s.updates = Updates();
    s.hits = s.updates - s.inserts;
    s.hit_probe_sum = s.hits + deep_probes_;
    return s;
  }

 private:
  static constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
  static constexpr uint32_t kFreeWord = 0;  // Slot::period of a free slot

  struct SlotFields {
    // A free slot holds a poison key whose bucket is another one (see PoisonFor): never the
    // key of a lookup that starts here.
    Key key;
    uint16_t count;  // low 16 bits of the count; the higher bits are in count_high_
    // The next entry of the chain: slot + link, or kTailLink, or kFarLink: then next_[slot]
    // (see Next). Meaningless in a free slot.
    int16_t link;
    // Tag << 24 | counts added in the tag's period (saturating at kPeriodCountLimit), where
    // tag = 1 + period number % 255; kFreeWord if the slot is free. One word, so that "reset
    // if stale, then add" is a mask and an add.
    uint32_t period;
  };
  // Aligned to its power-of-two size (16 bytes for 64-bit keys) so no slot straddles two
  // cache lines.
  struct alignas(std::min<size_t>(64, std::bit_ceil(sizeof(SlotFields)))) Slot : SlotFields {};
  // One entry of a chain being sorted, or of the hot set being ranked.
  struct SortItem {
    uint32_t index;     // slot (of a chain entry) or index into hot_list_ (of a hot entry)
    uint32_t position;  // position before the sort (head = 0), or order of turning hot
    uint32_t count;     // period count
  };
  // One key of a period's hot-set ranking.
  struct Ranked {
    Key key;
    uint32_t count;        // period count
    uint32_t rank_after;   // for an older ranking: rank in the current one, kNil if unranked
    uint32_t count_after;  // ... and count in the current period
  };
  struct KeyPair {
    Key rose;
    Key fell;
  };
  static constexpr int64_t kNoPeriodEnd = std::numeric_limits<int64_t>::max();
  // Each period end rewrites the stale period words of 1/kSweepPeriods of the slots, so every
  // word is rewritten within kSweepPeriods periods, well before its tag (one of 255) comes
  // round again.
  static constexpr uint32_t kSweepPeriods = 128;

  static absl::Status Validate(const SortedTableOptions& o);

  // Array sizes implied by a set of options.
  struct Layout {
    uint32_t bucket_count;
    uint32_t slot_count;
    uint32_t sort_capacity;
    uint32_t hot_capacity;
    uint32_t scratch_capacity;
    uint32_t rank_capacity;
    size_t memory_bytes;
  };
  static Layout LayoutFor(const SortedTableOptions& o);

  SortedTable(const SortedTableOptions& options, Hash hash);

  // What every stored Add() updates besides its entry. AddBatch() works on a copy.
  struct Tally {
    uint32_t epoch_base = 0;  // EpochBase(epoch_): the smallest period word of this period
    int64_t period_left = 0;  // counts until the current period ends
    // Sum over stored Adds of (weight - 1) (see PeriodWeight): with the weights summed in
    // period_left, it gives the number of Adds (see Updates()) without a counter of its own
    // (Add(key) with the default count adds 0 here).
    uint64_t excess = 0;
  };

  static uint32_t EpochBase(uint32_t epoch) { return (1 + epoch % 255) << 24; }

  static bool IsUsed(const Slot& s) { return s.period != kFreeWord; }
  uint64_t Count(uint32_t i) const { return count_high_[i] << 16 | slots_[i].count; }

  static constexpr int16_t kTailLink = std::numeric_limits<int16_t>::min();
  static constexpr int16_t kFarLink = kTailLink + 1;
  // The slot of the next entry of the chain after the entry in slot i, or kNil. A link to a
  // slot within 32k (the same cache line for two thirds of the weight of the hits behind a
  // head at Zipf s = 0.8) needs no other memory than the slot itself.
  uint32_t Next(uint32_t i) const {
    const int16_t link = slots_[i].link;
    if (link == kTailLink) return kNil;
    if (link == kFarLink) [[unlikely]] return next_[i];
    return i + static_cast<uint32_t>(int32_t{link});
  }
  void SetNext(uint32_t i, uint32_t next) {
    if (next == kNil) {
      slots_[i].link = kTailLink;
      return;
    }
    const int64_t delta = int64_t{next} - int64_t{i};
    if (delta > kFarLink && delta <= std::numeric_limits<int16_t>::max()) {
      slots_[i].link = static_cast<int16_t>(delta);
    } else {
      slots_[i].link = kFarLink;
      next_[i] = next;
    }
  }
  // Whether chain b has entries: then its head is in slot b.
  bool HasChain(uint32_t b) const {
    return IsUsed(slots_[b]) && BucketIndex(slots_[b].key) == b;
  }

  // The slot holding `key` (and its chain position, head = 1), or kNil.
  uint32_t FindSlot(const Key& key, uint32_t* position = nullptr) const {
    const uint32_t b = BucketIndex(key);
    if (!HasChain(b)) return kNil;
    uint32_t p = 1;
    for (uint32_t i = b; i != kNil; i = Next(i), ++p) {
      if (slots_[i].key == key) {
        if (position != nullptr) *position = p;
        return i;
      }
    }
    return kNil;
  }

  // Add() when the key is not at the head of its chain: a deeper hit, or an insert at the
  // tail (new keys start cold, behind the sorted ones).
  // `key` by value: Add() need not store it to memory for the call.
  [[gnu::noinline]] AddResult AddBehindHead(Key key, uint64_t count, uint32_t b);

  // A hit behind a head: the entry in slot `i` passes the one before it (slot `previous`)
  // once it has more than twice its count this period, and at least kPassMinimum. The
  // period-end sort orders only the entries above frequency_threshold; this orders the warm
  // ones behind them, where most hits behind a head land (after a phase change, keys that
  // were cold when they were inserted stay behind heads that have gone cold). Only this slow
  // path pays for it, and one pass brings the entry a step nearer the head.
  void PassIfBusier(uint32_t i, uint32_t previous);

  // The slot for a new last entry of chain `b`, whose tail is slot `tail` (kNil: the chain is
  // empty), linked in: the home slot for a first entry (moving a deeper entry of another
  // chain out of it), else a free slot near the tail (see TakeFreeSlotNear: in the tail's
  // cache line, a hit on the next entry costs no second miss). There is a free slot whenever
  // fewer than max_entries entries are stored.
  uint32_t ClaimSlot(uint32_t b, uint32_t tail) {
    uint32_t s = b;
    if (tail == kNil) {
      if (IsUsed(slots_[b])) MoveOut(b);
    } else {
      s = TakeFreeSlotNear(tail);
      SetNext(tail, s);
    }
    SetNext(s, kNil);
    return s;
  }

  // Moves the entry in slot `s`, a deeper entry of another chain, to a free slot; returns it.
  uint32_t MoveOut(uint32_t s) {
    uint32_t previous = BucketIndex(slots_[s].key);
    while (Next(previous) != s) previous = Next(previous);
    const uint32_t f = TakeFreeSlotNear(previous);
    MoveEntry(s, f);
    SetNext(f, Next(s));
    SetNext(previous, f);
    Release(s);
    return f;
  }

  // A free slot in the cache line of slot `near`, else in the lines next to it (up to
  // kNearLines either side: a link within reach of the slot's 16 bits, and a line close to
  // its predecessor's), else TakeFreeSlot().
  uint32_t TakeFreeSlotNear(uint32_t near) {
    constexpr uint32_t kSlotsPerLine = std::max<uint32_t>(1, 64 / sizeof(Slot));
    const uint32_t line = near / kSlotsPerLine;
    const uint32_t lines = (slot_count_ + kSlotsPerLine - 1) / kSlotsPerLine;
    for (uint32_t d = 0; d <= 2 * kNearLines; ++d) {
      // line, line + 1, line - 1, line + 2, ...
      const uint32_t l = d % 2 == 1 ? line + (d + 1) / 2 : line - d / 2;
      if (l >= lines) continue;  // also catches line - d / 2 wrapping below 0
      for (uint32_t s = l * kSlotsPerLine; s < (l + 1) * kSlotsPerLine && s < slot_count_; ++s) {
        if (!IsUsed(slots_[s])) return s;
      }
    }
    return TakeFreeSlot();
  }
  static constexpr uint32_t kNearLines = 2;

  // A free slot, searched downwards from where the last search stopped: slots above it are
  // all in use (slots are freed only by Clear() and RemoveIf(), which restart the search).
  uint32_t TakeFreeSlot() {
    while (IsUsed(slots_[--free_scan_])) {
    }
    return free_scan_;
  }

  // The poison key a free slot `i` holds: one whose bucket is not `i`. With a hash that maps
  // every candidate to one bucket there is none for that slot, and guarded_ makes every Add
  // take the path that tests the slot first.
  const Key& PoisonFor(uint32_t i) const { return poison_[i == poison_bucket_ ? 1 : 0]; }
  // Marks slot `i` free. Its count is zeroed, so that TopN() passes it over like any zero
  // count.
  void Release(uint32_t i) {
    slots_[i].key = PoisonFor(i);
    slots_[i].count = 0;
    slots_[i].period = kFreeWord;
    count_high_[i] = 0;
  }
  // Rewrites a stale period word as "0 counts in this period" (same meaning, current tag).
  void Refresh(Slot& s) const {
    if (IsUsed(s) && (s.period ^ tally_.epoch_base) > kPeriodCountLimit) {
      s.period = tally_.epoch_base;
    }
  }
  // The entry's contents (not its link) from slot `from` to slot `to`.
  void MoveEntry(uint32_t from, uint32_t to) {
    CopyEntry(slots_[from], count_high_[from], to);
  }
  void CopyEntry(const Slot& from, uint64_t high, uint32_t to) {
    slots_[to].key = from.key;
    slots_[to].count = from.count;
    slots_[to].period = from.period;
    count_high_[to] = high;
    Refresh(slots_[to]);
  }
  void SwapEntries(uint32_t a, uint32_t b) {
    std::swap(slots_[a].key, slots_[b].key);
    std::swap(slots_[a].count, slots_[b].count);
    std::swap(slots_[a].period, slots_[b].period);
    std::swap(count_high_[a], count_high_[b]);
    Refresh(slots_[a]);
    Refresh(slots_[b]);
  }
  void SweepStaleWords() {
    for (uint32_t n = 0; n < sweep_chunk_; ++n) {
      Refresh(slots_[sweep_next_]);
      if (++sweep_next_ == slot_count_) sweep_next_ = 0;
    }
  }

  // Whether a hit keeps period counts: as sorting_ says (Add: its hit path specialised both
  // ways ran slower), or as AddBatch, having tested it once, says.
  enum class Upkeep : uint8_t { kAsConfigured, kSorted, kPlain };
  // Adds `count` to the entry in slot `i`, at `position` of its chain (head = 1). Returns true
  // when the period is complete: the caller then calls PeriodCountReached() (with `t` stored
  // in tally_).
  template <Upkeep kUpkeep = Upkeep::kAsConfigured>
  bool Hit(uint32_t i, uint32_t position, uint64_t count, Tally& t) {
    Slot& s = slots_[i];
    if (count == 1) {
      // Add(key): one add to memory and a test of its result (0 after a carry).
      if (++s.count == 0) [[unlikely]] ++count_high_[i];
    } else {
      uint16_t low;
      const bool carry = __builtin_add_overflow(s.count, static_cast<uint16_t>(count), &low);
      s.count = low;
      const uint64_t high = (count >> 16) + carry;
      if (high != 0) [[unlikely]] count_high_[i] += high;
    }
    const uint32_t weight = PeriodWeight(count);
    if (kUpkeep == Upkeep::kSorted || (kUpkeep == Upkeep::kAsConfigured && sorting_)) {
      AddToPeriodCount(s, weight, t.epoch_base, position);
    }
    return CountTowardsPeriod(weight, t);
  }

  template <Upkeep kUpkeep>  // kSorted or kPlain, as sorting_ is
  size_t AddBatchAs(std::span<const KeyCount<Key>> items) {
    // Bucket indices are computed kAhead items ahead and the home slot prefetched: far
    // enough ahead for a miss to DRAM at a few ns per item.
    constexpr size_t kAhead = 32;
    uint32_t buckets[kAhead];  // of items i .. i + kAhead - 1, at index % kAhead
    const KeyCount<Key>* const item = items.data();
    const size_t n = items.size();
    for (size_t i = 0; i < std::min(n, kAhead); ++i) {
      buckets[i] = BucketIndex(item[i].key);
      __builtin_prefetch(&slots_[buckets[i]], 1);
    }
    const bool guarded = guarded_;
    Tally t = tally_;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t b = buckets[i % kAhead];
      if (i + kAhead < n) {
        const uint32_t ahead = BucketIndex(item[i + kAhead].key);
        buckets[i % kAhead] = ahead;
        __builtin_prefetch(&slots_[ahead], 1);
      }
      if (slots_[b].key == item[i].key && !guarded) [[likely]] {
        if (!Hit<kUpkeep>(b, 1, item[i].count, t)) [[likely]] continue;
        tally_ = t;
        PeriodCountReached();
        t = tally_;
        continue;
      }
      tally_ = t;
      const AddResult result = AddBehindHead(item[i].key, item[i].count, b);
      t = tally_;
      if (result == AddResult::kFull) return i;
    }
    tally_ = t;
    return n;
  }

  // Adds `weight` to the entry's count of the current period, restarting from 0 if the word
  // is from an earlier period. A mask, not a branch: entries hit less than once a period
  // start over on most of their hits (most hits on cold keys), and the branch would be
  // mispredicted on each. Crossing frequency_threshold and saturating are tested together
  // (one unlikely branch) and handled out of line.
  void AddToPeriodCount(Slot& s, uint32_t weight, uint32_t base, uint32_t position) {
    // Of a current word the low 24 bits; of a stale one more (its tag differs).
    const uint32_t delta = s.period ^ base;
    const uint32_t current = uint32_t{delta <= kPeriodCountLimit} - 1u;  // 0 if current
    const uint32_t before = delta & ~current;
    const uint32_t w = std::min(weight, kPeriodCountLimit);
    const uint32_t n = before + w;  // the new period count, if not saturated
    s.period = base + n;
    // Crossed: n - w < hot_min_ <= n (below hot_min_ the left side wraps).
    if (n - hot_min_ < w || n > kPeriodCountLimit) [[unlikely]] {
      PeriodCountEvent(s, base, before, n, position);
    }
  }
  // The period count of the entry in `s` went from `before` to `n` (which may exceed the
  // limit): saturate it, and record the entry if it crossed frequency_threshold.
  [[gnu::noinline]] void PeriodCountEvent(Slot& s, uint32_t base, uint32_t before, uint32_t n,
                                          uint32_t position) {
    n = std::min(n, kPeriodCountLimit);
    s.period = base + n;
    if (before < hot_min_ && hot_min_ <= n) BecameHot(s.key, position);
  }

  // What an Add of `count` adds to the period counters: the count, capped at 2^31. A count
  // of 2^31 or more ends the period at once like any count >= period (period <= 2^31).
  static uint32_t PeriodWeight(uint64_t count) {
    return static_cast<uint32_t>(std::min<uint64_t>(count, uint64_t{1} << 31));
  }

  uint32_t PeriodCount(const Slot& s) const {
    const uint32_t delta = s.period ^ tally_.epoch_base;
    return delta <= kPeriodCountLimit ? delta : 0;
  }

  void QueueForSort(uint32_t b) {
    if (!options_.sorting || sort_queue_size_ == sort_capacity_) return;
    sort_queue_[sort_queue_size_++] = b;
  }

  // Returns true when the period is complete.
  static bool CountTowardsPeriod(uint32_t weight, Tally& t) {
    t.excess += uint64_t{weight} - 1;
    // period_left is positive on entry (a period that ran out restarts it): for the weight
    // 1 of Add(key), "reached zero" is "ran out", and one decrement of memory tests it.
    if (weight == 1) return --t.period_left == 0;
    return (t.period_left -= weight) <= 0;
  }
  [[gnu::noinline]] void PeriodCountReached() {
    if (options_.period != 0) {
      EndPeriod();
    } else {
      RestartPeriodCount();  // owner-driven periods: only the counter restarts
    }
  }
  void RestartPeriodCount() {
    counted_ += static_cast<uint64_t>(period_start_) - static_cast<uint64_t>(tally_.period_left);
    period_start_ = options_.period != 0 ? int64_t{options_.period} : kNoPeriodEnd;
    tally_.period_left = period_start_;
  }
  // Stored Add() calls so far: the weights they added minus their excess over 1 each (exact
  // modulo 2^64).
  uint64_t Updates() const {
    return counted_ + (static_cast<uint64_t>(period_start_) -
                       static_cast<uint64_t>(tally_.period_left)) - tally_.excess;
  }

  // `key`'s entry (at `position` of its chain) crossed frequency_threshold in this period:
  // remember it for the ranking, and queue its chain if it is not the head.
  [[gnu::noinline]] void BecameHot(const Key& key, uint32_t position) {
    if (hot_count_ < hot_capacity_) hot_list_[hot_count_++] = key;
    if (position > 1) QueueForSort(BucketIndex(key));
  }

  // Hot entries to the front in descending period count (ties keep their order), the rest
  // behind in their original order; counts the entries moved.
  void SortChain(uint32_t b);

  // Sorts this period's hot entries by period count (the hottest phase_rank_limit of them),
  // compares that ranking with the previous two and records phase changes.
  void RankHotSet();

  // Records the pairs (x now ahead of y, y ahead of x in `back`) an order of magnitude apart
  // then or now, skipping pairs recorded in this period or the previous one.
  void CompareRankings(const Ranked* now, uint32_t ranked, Ranked* back, uint32_t ranked_back,
                       uint32_t* reported);

  static bool Reported(const KeyPair* pairs, uint32_t n, const Key& rose, const Key& fell) {
    for (uint32_t i = 0; i < n; ++i) {
      if (pairs[i].rose == rose && pairs[i].fell == fell) return true;
    }
    return false;
  }

  // Period count of `key` in the current period; 0 if absent.
  uint32_t CurrentPeriodCount(const Key& key) const {
    const uint32_t i = FindSlot(key);
    return i == kNil ? 0 : PeriodCount(slots_[i]);
  }

  // Candidate poison keys: byte patterns, the first all zero.
  static Key CandidateKey(uint32_t n) {
    struct Bytes {
      unsigned char b[sizeof(Key)];
    } bytes{};
    uint64_t x = 0;
    for (size_t j = 0; j < sizeof(Key); ++j) {
      if (j % 8 == 0 && n != 0) x = (x + n + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
      bytes.b[j] = static_cast<unsigned char>(x >> (8 * (j % 8)));
    }
    return std::bit_cast<Key>(bytes);
  }

  // Slots are allocated on cache-line boundaries, so that the slots of one line are the
  // aligned groups TakeFreeSlotNear() looks in.
  static constexpr std::align_val_t kSlotAlignment{std::max<size_t>(64, alignof(Slot))};
  struct FreeSlots {
    void operator()(Slot* p) const { ::operator delete(p, kSlotAlignment); }
  };
  static std::unique_ptr<Slot[], FreeSlots> AllocateSlots(uint32_t n) {
    Slot* p = static_cast<Slot*>(::operator new(sizeof(Slot) * n, kSlotAlignment));
    // Value-initialized (then Clear() writes the poison keys): no key is ever indeterminate.
    // Trivially destructible: nothing to undo.
    std::uninitialized_value_construct_n(p, n);
    return std::unique_ptr<Slot[], FreeSlots>(p);
  }

  // What a hit on a chain head reads and writes, together. Slot b holds the head of chain b
  // (docs/developing/sorted-table.md).
  std::unique_ptr<Slot[], FreeSlots> slots_;
  [[no_unique_address]] Hash hash_;
  int bucket_shift_ = 0;
  bool sorting_ = false;      // options_.sorting, beside the other fields a hit reads
  bool guarded_ = false;      // no poison key for slot poison_bucket_ (see PoisonFor)
  uint32_t hot_min_ = 0;      // options_.frequency_threshold + 1 (at most 2^24)
  Tally tally_;
  uint64_t counted_ = 0;       // weights added before period_left last restarted
  int64_t period_start_ = 0;   // ... where it restarted
  uint64_t deep_probes_ = 0;   // TableStats::hit_probe_sum - hits
  // Out of the slots: the next entry's slot where the slot's link cannot say it (kFarLink),
  // and the count's bits above the low 16 (read on a carry, by drains and moves).
  std::unique_ptr<uint32_t[]> next_;
  std::unique_ptr<uint64_t[]> count_high_;

  SortedTableOptions options_;
  uint32_t bucket_count_ = 0;
  uint32_t slot_count_ = 0;  // max(bucket_count_, max_entries)
  uint32_t free_scan_ = 0;   // slots at and above it are in use
  uint32_t size_ = 0;
  uint32_t epoch_ = 0;
  uint32_t sweep_chunk_ = 0;  // slots per SweepStaleWords()
  uint32_t sweep_next_ = 0;
  Key poison_[2];             // poison_[0] everywhere but in slot poison_bucket_, its bucket
  uint32_t poison_bucket_ = 0;
  uint32_t sort_capacity_ = 0;
  uint32_t sort_queue_size_ = 0;
  std::unique_ptr<uint32_t[]> sort_queue_;
  uint32_t scratch_capacity_ = 0;
  std::unique_ptr<SortItem[]> hot_;
  // Keys of the entries that crossed frequency_threshold in the current period, in that
  // order (keys, not slots: entries move between slots).
  uint32_t hot_capacity_ = 0;
  uint32_t hot_count_ = 0;
  std::unique_ptr<Key[]> hot_list_;
  // Hot-set rankings (phase_rank_limit entries each): the period ending now and two before.
  std::unique_ptr<Ranked[]> rank_now_;
  std::unique_ptr<Ranked[]> rank_back1_;  // the previous period's ranking
  std::unique_ptr<Ranked[]> rank_back2_;  // the ranking before that
  uint32_t ranked_back1_ = 0;
  uint32_t ranked_back2_ = 0;
  // (rose, fell) pairs recorded in the current and the previous period.
  std::unique_ptr<KeyPair[]> reported_now_;
  std::unique_ptr<KeyPair[]> reported_before_;
  uint32_t reported_before_count_ = 0;
  uint32_t phase_change_count_ = 0;
  std::unique_ptr<PhaseChange<Key>[]> phase_changes_;
  size_t memory_bytes_ = 0;
  TableStats stats_;
};

// The primary use: 64-bit stack ID / context hash -> count.
using CountTable = SortedTable<uint64_t>;

}  // namespace strata::table

#include "common/table/sorted_table_impl.h"  // IWYU pragma: export

#endif  // STRATA_COMMON_TABLE_SORTED_TABLE_H_
