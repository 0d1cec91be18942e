// The longer member functions of SortedTable (sorted_table.h), out of the class so that its
// header reads as the interface and the hot inline paths. Included by sorted_table.h only.
#ifndef STRATA_COMMON_TABLE_SORTED_TABLE_IMPL_H_
#define STRATA_COMMON_TABLE_SORTED_TABLE_IMPL_H_

#ifndef STRATA_COMMON_TABLE_SORTED_TABLE_H_
#error "include common/table/sorted_table.h"
#endif

namespace strata::table {

template <typename Key, typename Hash>
AddResult SortedTable<Key, Hash>::AddBehindHead(Key key, uint64_t count, uint32_t b) {
  uint32_t position = 1;
  uint32_t tail = kNil;
  if (HasChain(b)) {
    for (uint32_t i = b, previous = kNil;; ++position) {
      if (slots_[i].key == key) {
        deep_probes_ += position - 1;
        const bool period_done = Hit(i, position, count, tally_);
        if (previous != kNil && sorting_) PassIfBusier(i, previous);
        if (period_done) PeriodCountReached();
        return AddResult::kUpdated;
      }
      const uint32_t next = Next(i);
      if (next == kNil) {
        tail = i;
        break;
      }
      previous = i;
      i = next;
    }
    ++position;
  }
  if (size_ == options_.max_entries) {
    ++stats_.full_rejections;
    return AddResult::kFull;
  }
  ++size_;
  const uint32_t weight = PeriodWeight(count);
  const uint32_t i = ClaimSlot(b, tail);
  Slot& s = slots_[i];
  s.key = key;
  s.count = static_cast<uint16_t>(count);
  count_high_[i] = count >> 16;
  s.period = tally_.epoch_base + std::min(weight, kPeriodCountLimit);
  if (sorting_ && weight >= hot_min_) BecameHot(key, position);
  ++stats_.inserts;
  stats_.insert_probe_sum += position - 1;
  if (CountTowardsPeriod(weight, tally_)) PeriodCountReached();
  return AddResult::kInserted;
}

template <typename Key, typename Hash>
void SortedTable<Key, Hash>::PassIfBusier(uint32_t i, uint32_t previous) {
  constexpr uint32_t kPassMinimum = 4;
  const uint32_t mine = PeriodCount(slots_[i]);
  if (mine >= kPassMinimum && mine > 2 * PeriodCount(slots_[previous])) {
    SwapEntries(i, previous);
    ++stats_.entries_passed;
  }
}

template <typename Key, typename Hash>
void SortedTable<Key, Hash>::Clear() {
  for (uint32_t i = 0; i < slot_count_; ++i) Release(i);
  free_scan_ = slot_count_;
  size_ = 0;
  sort_queue_size_ = 0;
  hot_count_ = 0;
  ++stats_.drains;
}

template <typename Key, typename Hash>
template <typename Fn>
void SortedTable<Key, Hash>::TakeCounts(Fn&& fn) {
  for (uint32_t i = 0; i < slot_count_; ++i) {
    const uint64_t count = Count(i);
    if (count == 0) continue;  // free slots too
    fn(static_cast<const Key&>(slots_[i].key), count);
    slots_[i].count = 0;
    count_high_[i] = 0;
  }
  ++stats_.drains;
}

template <typename Key, typename Hash>
void SortedTable<Key, Hash>::EndPeriod() {
  if (options_.sorting) {
    // A chain is queued once per entry that turned hot behind its head: sort it once, and in
    // bucket order, so that the result depends only on the set of chains.
    uint32_t* const queue = sort_queue_.get();
    std::sort(queue, queue + sort_queue_size_);
    uint32_t* const end = std::unique(queue, queue + sort_queue_size_);
    for (uint32_t* b = queue; b != end; ++b) SortChain(*b);
    sort_queue_size_ = 0;
    RankHotSet();
  }
  RestartPeriodCount();
  ++stats_.periods;
  ++epoch_;
  tally_.epoch_base = EpochBase(epoch_);
  SweepStaleWords();
}

template <typename Key, typename Hash>
absl::Status SortedTable<Key, Hash>::Grow(const SortedTableOptions& options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  const SortedTableOptions& o = options_;
  if (options.max_entries < o.max_entries || options.max_phase_changes < o.max_phase_changes ||
      (options.bucket_count != 0 && options.bucket_count < bucket_count_) ||
      options.sorting != o.sorting || options.period != o.period ||
      options.depth_threshold != o.depth_threshold ||
      options.frequency_threshold != o.frequency_threshold ||
      options.phase_change_factor != o.phase_change_factor ||
      options.phase_rank_limit != o.phase_rank_limit) {
    return absl::InvalidArgumentError(
        "Grow may only raise max_entries, bucket_count, max_phase_changes, max_hot_entries");
  }
  SortedTable grown(options, hash_);
  if (grown.bucket_count_ < bucket_count_) {
    return absl::InvalidArgumentError("Grow cannot reduce the number of chains");
  }
  grown.tally_ = tally_;  // the period words keep their tags
  // Chains are rebuilt. Bucket indices are the hash's top bits, so each new chain takes its
  // entries from one old chain, in that chain's (sorted) order: appended at its tail.
  std::vector<uint32_t> tails(grown.bucket_count_, kNil);
  for (uint32_t b = 0; b < bucket_count_; ++b) {
    if (!HasChain(b)) continue;
    for (uint32_t i = b; i != kNil; i = Next(i)) {
      const uint32_t nb = grown.BucketIndex(slots_[i].key);
      if (tails[nb] == kNil && IsUsed(grown.slots_[nb])) {
        // The home slot holds a deeper entry, maybe the tail of its chain: it moves.
        const uint32_t moved_to = grown.MoveOut(nb);
        uint32_t& tail = tails[grown.BucketIndex(grown.slots_[moved_to].key)];
        if (tail == nb) tail = moved_to;
      }
      const uint32_t to = grown.ClaimSlot(nb, tails[nb]);
      tails[nb] = to;
      grown.CopyEntry(slots_[i], count_high_[i], to);
    }
  }
  grown.size_ = size_;
  grown.counted_ = counted_;
  grown.period_start_ = period_start_;
  grown.deep_probes_ = deep_probes_;
  grown.epoch_ = epoch_;
  grown.stats_ = stats_;
  if (sorting_) {
    // The period's hot entries stay recorded; chains where one is not at the head are
    // queued again for the period's sort.
    for (uint32_t k = 0; k < hot_count_ && grown.hot_count_ < grown.hot_capacity_; ++k) {
      const Key& key = hot_list_[k];
      grown.hot_list_[grown.hot_count_++] = key;
      if (grown.ProbeLength(key) > 1) grown.QueueForSort(grown.BucketIndex(key));
    }
    std::copy(rank_back1_.get(), rank_back1_.get() + ranked_back1_, grown.rank_back1_.get());
    std::copy(rank_back2_.get(), rank_back2_.get() + ranked_back2_, grown.rank_back2_.get());
    grown.ranked_back1_ = ranked_back1_;
    grown.ranked_back2_ = ranked_back2_;
    std::copy(reported_before_.get(), reported_before_.get() + reported_before_count_,
              grown.reported_before_.get());
    grown.reported_before_count_ = reported_before_count_;
    std::copy(phase_changes_.get(), phase_changes_.get() + phase_change_count_,
              grown.phase_changes_.get());
    grown.phase_change_count_ = phase_change_count_;
  }
  *this = std::move(grown);
  return absl::OkStatus();
}

template <typename Key, typename Hash>
template <typename Pred>
size_t SortedTable<Key, Hash>::RemoveIf(Pred&& pred) {
  size_t removed = 0;
  for (uint32_t b = 0; b < bucket_count_; ++b) {
    if (!HasChain(b)) continue;
    uint32_t last = kNil;  // the slot of the last entry kept
    for (uint32_t i = b; i != kNil;) {
      const uint32_t next = Next(i);
      if (pred(static_cast<const Key&>(slots_[i].key), Count(i), PeriodCount(slots_[i]))) {
        // The home slot stays in use until a kept entry moves in or the chain ends, so that
        // HasChain(b) holds while the chain is walked.
        if (i != b) Release(i);
        ++removed;
      } else if (last == kNil) {
        if (i != b) {  // the head went: the first entry kept moves into the home slot
          MoveEntry(i, b);
          Release(i);
        }
        last = b;
      } else {
        SetNext(last, i);
        last = i;
      }
      i = next;
    }
    if (last != kNil) {
      SetNext(last, kNil);
    } else {
      Release(b);  // the whole chain went
    }
  }
  if (removed == 0) return 0;
  size_ -= static_cast<uint32_t>(removed);
  free_scan_ = slot_count_;
  // The period's hot entries that remain stay recorded, in the order they turned hot.
  uint32_t kept = 0;
  for (uint32_t k = 0; k < hot_count_; ++k) {
    if (FindSlot(hot_list_[k]) != kNil) hot_list_[kept++] = hot_list_[k];
  }
  hot_count_ = kept;
  return removed;
}

template <typename Key, typename Hash>
std::vector<KeyCount<Key>> SortedTable<Key, Hash>::TopN(size_t n) const {
  std::vector<KeyCount<Key>> heap;
  n = std::min<size_t>(n, size_);
  if (n == 0) return heap;
  heap.reserve(n);
  // "a before b" in the result; the heap keeps the worst of the best n at its front.
  auto better = [](const KeyCount<Key>& a, const KeyCount<Key>& b) {
    return a.count != b.count ? a.count > b.count : a.key < b.key;
  };
  // Counts below `floor` cannot enter: zero (free slots too) at first, then the heap's
  // worst, so that most slots cost one well-predicted branch.
  uint64_t floor = 1;
  for (uint32_t i = 0; i < slot_count_; ++i) {
    const uint64_t count = Count(i);
    if (count < floor) continue;
    KeyCount<Key> kc{slots_[i].key, count};
    if (heap.size() < n) {
      heap.push_back(kc);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(kc, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = kc;
      std::push_heap(heap.begin(), heap.end(), better);
    }
    if (heap.size() == n) floor = heap.front().count;
  }
  std::sort_heap(heap.begin(), heap.end(), better);
  return heap;
}

template <typename Key, typename Hash>
absl::Status SortedTable<Key, Hash>::Validate(const SortedTableOptions& o) {
  constexpr uint32_t kMaxSize = 1u << 31;
  if (o.max_entries == 0 || o.max_entries > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_entries must be in [1, 2^31], got ", o.max_entries));
  }
  if (o.bucket_count > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket_count must be at most 2^31, got ", o.bucket_count));
  }
  if (o.period > kMaxSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("period must be at most 2^31, got ", o.period));
  }
  if (o.period != 0 && o.frequency_threshold >= o.period) {
    return absl::InvalidArgumentError("frequency_threshold must be below period");
  }
  if (o.phase_change_factor < 2) {
    return absl::InvalidArgumentError("phase_change_factor must be at least 2");
  }
  if (o.max_hot_entries > kMaxSize) {
    return absl::InvalidArgumentError("max_hot_entries must be at most 2^31");
  }
  return absl::OkStatus();
}

template <typename Key, typename Hash>
typename SortedTable<Key, Hash>::Layout SortedTable<Key, Hash>::LayoutFor(
    const SortedTableOptions& o) {
  Layout l;
  const uint32_t wanted = o.bucket_count != 0 ? o.bucket_count : o.max_entries;
  l.bucket_count = std::max<uint32_t>(2, std::bit_ceil(wanted));
  // A chain is queued when one of its entries crosses frequency_threshold in the current
  // period; the counts of a period sum to less than period + the last count, so at most
  // (period - 1) / (threshold + 1) + 1 entries cross per period. The same bounds the hot
  // entries of one chain. Owner-driven periods have no such bound: max_hot_entries (or
  // 4096) caps the entries remembered and sorted per period; more are sorted next time.
  constexpr uint64_t kDefaultHotEntries = 4096;
  const uint64_t per_period =
      o.period != 0 ? (uint64_t{o.period} - 1) / (uint64_t{o.frequency_threshold} + 1) + 1
                    : (o.max_hot_entries != 0 ? o.max_hot_entries : kDefaultHotEntries);
  const uint64_t hot_bound = o.max_hot_entries != 0 ? o.max_hot_entries : per_period;
  l.sort_capacity = static_cast<uint32_t>(
      std::min<uint64_t>({per_period, o.max_entries, l.bucket_count}));
  l.hot_capacity = static_cast<uint32_t>(std::min<uint64_t>(hot_bound, o.max_entries));
  l.scratch_capacity = std::max(
      static_cast<uint32_t>(std::min<uint64_t>(per_period, o.max_entries)), l.hot_capacity);
  l.rank_capacity = std::max<uint32_t>(1, o.phase_rank_limit);
  l.slot_count = std::max(l.bucket_count, o.max_entries);
  l.memory_bytes = (sizeof(Slot) + sizeof(uint32_t) + sizeof(uint64_t)) * size_t{l.slot_count};
  if (o.sorting) {
    l.memory_bytes += sizeof(uint32_t) * l.sort_capacity + sizeof(Key) * l.hot_capacity +
                      sizeof(SortItem) * l.scratch_capacity +
                      3 * sizeof(Ranked) * l.rank_capacity +
                      2 * sizeof(KeyPair) * o.max_phase_changes +
                      sizeof(PhaseChange<Key>) * o.max_phase_changes;
  }
  return l;
}

template <typename Key, typename Hash>
SortedTable<Key, Hash>::SortedTable(const SortedTableOptions& options, Hash hash)
    : hash_(std::move(hash)),
      sorting_(options.sorting),
      hot_min_(std::min(options.frequency_threshold, kPeriodCountLimit) + 1),
      options_(options) {
  const Layout layout = LayoutFor(options_);
  bucket_count_ = layout.bucket_count;
  slot_count_ = layout.slot_count;
  bucket_shift_ = 64 - std::countr_zero(bucket_count_);
  sort_capacity_ = layout.sort_capacity;
  hot_capacity_ = layout.hot_capacity;
  scratch_capacity_ = layout.scratch_capacity;
  const uint32_t rank_capacity = layout.rank_capacity;
  sweep_chunk_ = (slot_count_ + kSweepPeriods - 1) / kSweepPeriods;
  tally_.epoch_base = EpochBase(0);

  // Poison keys: the first candidate, and another one of another bucket for its bucket's
  // slot.
  poison_[0] = poison_[1] = CandidateKey(0);
  poison_bucket_ = BucketIndex(poison_[0]);
  guarded_ = true;
  for (uint32_t n = 1; n < 64 && guarded_; ++n) {
    poison_[1] = CandidateKey(n);
    guarded_ = BucketIndex(poison_[1]) == poison_bucket_;
  }

  slots_ = AllocateSlots(slot_count_);
  next_ = std::make_unique_for_overwrite<uint32_t[]>(slot_count_);
  count_high_ = std::make_unique_for_overwrite<uint64_t[]>(slot_count_);
  if (options_.sorting) {
    sort_queue_ = std::make_unique_for_overwrite<uint32_t[]>(sort_capacity_);
    hot_ = std::make_unique_for_overwrite<SortItem[]>(scratch_capacity_);
    hot_list_ = std::make_unique_for_overwrite<Key[]>(hot_capacity_);
    rank_now_ = std::make_unique_for_overwrite<Ranked[]>(rank_capacity);
    rank_back1_ = std::make_unique_for_overwrite<Ranked[]>(rank_capacity);
    rank_back2_ = std::make_unique_for_overwrite<Ranked[]>(rank_capacity);
    reported_now_ = std::make_unique_for_overwrite<KeyPair[]>(options_.max_phase_changes);
    reported_before_ = std::make_unique_for_overwrite<KeyPair[]>(options_.max_phase_changes);
    phase_changes_ =
        std::make_unique_for_overwrite<PhaseChange<Key>[]>(options_.max_phase_changes);
  }
  memory_bytes_ = layout.memory_bytes;
  Clear();
  stats_.drains = 0;
  RestartPeriodCount();
}

template <typename Key, typename Hash>
void SortedTable<Key, Hash>::SortChain(uint32_t b) {
  if (!HasChain(b)) return;
  uint32_t length = 0;
  for (uint32_t i = b; i != kNil; i = Next(i)) ++length;
  if (length <= options_.depth_threshold) return;
  const uint32_t threshold = options_.frequency_threshold;
  uint32_t hot = 0;
  uint32_t cold_head = kNil;
  uint32_t cold_tail = kNil;
  uint32_t position = 0;
  uint32_t cold_seen = 0;
  uint32_t cold_before_last_hot = 0;
  for (uint32_t i = b; i != kNil; ++position) {
    const uint32_t next = Next(i);
    const uint32_t count = PeriodCount(slots_[i]);
    const bool is_hot = count > threshold && hot < scratch_capacity_;
    if (is_hot) {
      hot_[hot++] = SortItem{i, position, count};
      cold_before_last_hot = cold_seen;
    } else {
      ++cold_seen;
      if (cold_tail == kNil) {
        cold_head = i;
      } else {
        SetNext(cold_tail, i);
      }
      cold_tail = i;
    }
    i = next;
  }
  if (cold_tail != kNil) SetNext(cold_tail, kNil);
  std::sort(hot_.get(), hot_.get() + hot, [](const SortItem& a, const SortItem& b) {
    return a.count != b.count ? a.count > b.count : a.position < b.position;
  });

  // The new head must sit in the home slot: if it is elsewhere (then it is hot, and the old
  // head is the first cold entry or a later hot one), the two swap contents and places.
  if (hot != 0 && hot_[0].index != b) {
    const uint32_t first = hot_[0].index;
    SwapEntries(b, first);
    hot_[0].index = b;
    uint32_t r = 1;
    while (r < hot && hot_[r].index != b) ++r;
    if (r < hot) {
      hot_[r].index = first;
    } else {  // the old head leads the cold chain
      SetNext(first, Next(b));
      cold_head = first;
    }
  }
  // Relink: hot group, then the cold chain. Count entries whose position changed.
  for (uint32_t r = 0; r < hot; ++r) {
    SetNext(hot_[r].index, r + 1 < hot ? hot_[r + 1].index : cold_head);
    if (hot_[r].position != r) ++stats_.entries_moved;
  }
  // A cold entry moved back iff some hot entry was behind it.
  stats_.entries_moved += cold_before_last_hot;
  ++stats_.chains_sorted;
}

template <typename Key, typename Hash>
void SortedTable<Key, Hash>::RankHotSet() {
  const uint32_t limit = options_.phase_rank_limit;
  uint32_t n = 0;
  for (uint32_t k = 0; k < hot_count_; ++k) {
    hot_[n++] = SortItem{k, k, CurrentPeriodCount(hot_list_[k])};
  }
  hot_count_ = 0;
  const uint32_t ranked = std::min(n, limit);
  std::partial_sort(hot_.get(), hot_.get() + ranked, hot_.get() + n,
                    [](const SortItem& a, const SortItem& b) {
                      return a.count != b.count ? a.count > b.count : a.position < b.position;
                    });
  Ranked* now = rank_now_.get();
  for (uint32_t r = 0; r < ranked; ++r) {
    now[r] = Ranked{hot_list_[hot_[r].index], hot_[r].count, 0, 0};
  }
  uint32_t reported = 0;
  CompareRankings(now, ranked, rank_back1_.get(), ranked_back1_, &reported);
  CompareRankings(now, ranked, rank_back2_.get(), ranked_back2_, &reported);
  // The previous ranking becomes the one two back; this one the previous.
  std::swap(rank_back2_, rank_back1_);
  ranked_back2_ = ranked_back1_;
  std::copy(now, now + ranked, rank_back1_.get());
  ranked_back1_ = ranked;
  std::swap(reported_now_, reported_before_);
  reported_before_count_ = reported;
}

template <typename Key, typename Hash>
void SortedTable<Key, Hash>::CompareRankings(const Ranked* now, uint32_t ranked, Ranked* back,
                                             uint32_t ranked_back, uint32_t* reported) {
  // Where each key of the older ranking stands now.
  for (uint32_t p = 0; p < ranked_back; ++p) {
    back[p].rank_after = kNil;
    for (uint32_t r = 0; r < ranked; ++r) {
      if (now[r].key == back[p].key) {
        back[p].rank_after = r;
        back[p].count_after = now[r].count;
        break;
      }
    }
    if (back[p].rank_after == kNil) back[p].count_after = CurrentPeriodCount(back[p].key);
  }
  // A key missing from the older ranking had at most this many counts then.
  const uint64_t unranked_bound = ranked_back < options_.phase_rank_limit || ranked_back == 0
                                      ? uint64_t{options_.frequency_threshold}
                                      : uint64_t{back[ranked_back - 1].count};
  const uint64_t factor = options_.phase_change_factor;
  for (uint32_t r = 0; r < ranked; ++r) {
    const Ranked& x = now[r];
    uint32_t x_rank_back = ranked_back;
    uint64_t x_back = unranked_bound;
    for (uint32_t p = 0; p < ranked_back; ++p) {
      if (back[p].key == x.key) {
        x_rank_back = p;
        x_back = back[p].count;
        break;
      }
    }
    // Every y ranked ahead of x then and behind it now.
    for (uint32_t p = 0; p < x_rank_back; ++p) {
      const Ranked& y = back[p];
      if (y.rank_after != kNil && y.rank_after < r) continue;
      if (uint64_t{y.count} < factor * x_back && uint64_t{x.count} < factor * y.count_after) {
        continue;
      }
      if (Reported(reported_before_.get(), reported_before_count_, x.key, y.key) ||
          Reported(reported_now_.get(), *reported, x.key, y.key)) {
        continue;
      }
      if (*reported < options_.max_phase_changes) reported_now_[(*reported)++] = {x.key, y.key};
      ++stats_.phase_changes;
      if (phase_change_count_ == options_.max_phase_changes) {
        ++stats_.phase_changes_dropped;
        continue;
      }
      phase_changes_[phase_change_count_++] = PhaseChange<Key>{
          Updates(), epoch_, x.key, x.count, static_cast<uint32_t>(x_back),
          y.key, y.count_after, y.count};
    }
  }
}

}  // namespace strata::table

#endif  // STRATA_COMMON_TABLE_SORTED_TABLE_IMPL_H_
