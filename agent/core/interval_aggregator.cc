#include "agent/core/interval_aggregator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "common/encoding/packed_contexts.h"

namespace strata::agent {
namespace {

// Entries of a new table: 8 KB, the contexts of a small process's interval.
constexpr size_t kInitialTableEntries = 256;

table::SortedTableOptions TableOptions(size_t entries) {
  table::SortedTableOptions options;
  options.max_entries = static_cast<uint32_t>(std::clamp<size_t>(entries, 1, 1u << 31));
  return options;
}

table::SortedTable<uint64_t> MakeTable(size_t max_contexts) {
  // Options are valid by construction.
  return *table::SortedTable<uint64_t>::Create(
      TableOptions(std::min(max_contexts, kInitialTableEntries)));
}

IntervalAggregatorOptions Normalize(IntervalAggregatorOptions o) {
  o.max_contexts = std::clamp<size_t>(o.max_contexts, 1, 1u << 31);
  if (o.max_path_edges == 0) o.max_path_edges = o.max_contexts * 64;
  if (!o.hash) {
    o.hash = [](uint32_t target_id, std::span<const encoding::EdgeId> edges) {
      return static_cast<uint64_t>(
          absl::HashOf(target_id, absl::MakeConstSpan(edges.data(), edges.size())));
    };
  }
  return o;
}

std::string SpillKey(uint32_t target_id, std::span<const encoding::EdgeId> edges) {
  std::string key(4 + sizeof(encoding::EdgeId) * edges.size(), '\0');
  std::memcpy(key.data(), &target_id, 4);
  std::memcpy(key.data() + 4, edges.data(), sizeof(encoding::EdgeId) * edges.size());
  return key;
}

}  // namespace

IntervalAggregator::IntervalAggregator(size_t max_contexts)
    : IntervalAggregator(IntervalAggregatorOptions{.max_contexts = max_contexts}) {}

IntervalAggregator::IntervalAggregator(IntervalAggregatorOptions options)
    : options_(Normalize(std::move(options))), table_(MakeTable(options_.max_contexts)) {
  key_index_.reserve(std::min<size_t>(options_.max_contexts, 1 << 12));
}

bool IntervalAggregator::Add(uint32_t target_id, std::span<const encoding::EdgeId> edges,
                             uint64_t count) {
  if (count == 0) return !full_;
  samples_ += count;
  const uint64_t hash = options_.hash(target_id, edges);
  uint64_t key = hash;
  for (auto it = key_index_.find(key); it != key_index_.end(); it = key_index_.find(++key)) {
    const Record& r = records_[it->second];
    if (r.target_id == target_id && std::ranges::equal(PathOf(r), edges)) {
      table_.Add(key, count);  // present in the table: never kFull
      return !full_;
    }
  }
  // A new context: store it under the first free key from its hash on.
  if (!full_ && records_.size() < options_.max_contexts &&
      edges_.size() + edges.size() <= options_.max_path_edges) {
    table::AddResult added = table_.Add(key, count);
    if (added == table::AddResult::kFull && GrowTable()) added = table_.Add(key, count);
    if (added != table::AddResult::kInserted) {
      // Cannot happen (the table holds exactly the records); keep the count anyway.
      full_ = true;
      spill_[SpillKey(target_id, edges)] += count;
      return false;
    }
    collisions_ += key != hash;
    key_index_.emplace(key, static_cast<uint32_t>(records_.size()));
    records_.push_back({target_id, static_cast<uint32_t>(edges.size()), edges_.size()});
    edges_.insert(edges_.end(), edges.begin(), edges.end());
    if (records_.size() >= options_.max_contexts || edges_.size() >= options_.max_path_edges) {
      full_ = true;
    }
    return !full_;
  }
  full_ = true;
  spill_[SpillKey(target_id, edges)] += count;
  return false;
}

absl::Status IntervalAggregator::EncodeInto(const encoding::Numbering& numbering,
                                            v1::SampleBatch* batch) {
  return EncodeScaledInto(numbering, batch, [](uint64_t count) { return count; }).status();
}

absl::StatusOr<size_t> IntervalAggregator::EncodeScaledInto(
    const encoding::Numbering& numbering, v1::SampleBatch* batch,
    absl::FunctionRef<uint64_t(uint64_t)> scale) {
  encoding::Encoder encoder(numbering);
  std::vector<encoding::ContextRecord> contexts;
  contexts.reserve(distinct_contexts());
  absl::Status status;
  table_.ForEach([&](uint64_t key, uint64_t count) {
    if (!status.ok()) return;
    const uint64_t scaled = scale(count);
    if (scaled == 0) return;
    const Record& r = records_[key_index_.at(key)];
    encoding::ContextRecord& c = contexts.emplace_back();
    c.target_id = r.target_id;
    c.count = scaled;
    status = encoder.EncodeInto(PathOf(r), &c.context);
  });
  if (!status.ok()) return status;
  std::vector<encoding::EdgeId> edges;
  for (const auto& [key, count] : spill_) {
    const uint64_t scaled = scale(count);
    if (scaled == 0) continue;
    encoding::ContextRecord& c = contexts.emplace_back();
    std::memcpy(&c.target_id, key.data(), 4);
    edges.resize((key.size() - 4) / sizeof(encoding::EdgeId));
    std::memcpy(edges.data(), key.data() + 4, sizeof(encoding::EdgeId) * edges.size());
    c.count = scaled;
    if (auto st = encoder.EncodeInto(edges, &c.context); !st.ok()) return st;
  }
  const size_t encoded = contexts.size();
  auto packed = encoding::EncodePackedContexts(std::move(contexts));
  if (!packed.ok()) return packed.status();
  batch->set_packed_contexts(*std::move(packed));
  Clear();
  return encoded;
}

bool IntervalAggregator::GrowTable() {
  const size_t entries = table_.options().max_entries;
  if (entries >= options_.max_contexts) return false;
  return table_.Grow(TableOptions(std::min(options_.max_contexts, 2 * entries))).ok();
}

bool IntervalAggregator::References(uint32_t target_id) const {
  for (const Record& r : records_) {
    if (r.target_id == target_id) return true;
  }
  for (const auto& [key, count] : spill_) {
    if (std::memcmp(key.data(), &target_id, 4) == 0) return true;
  }
  return false;
}

void IntervalAggregator::Clear() {
  table_.Clear();
  key_index_.clear();
  records_.clear();
  edges_.clear();
  spill_.clear();
  samples_ = 0;
  full_ = false;
}

}  // namespace strata::agent
