#include "server/store/merge.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/base/saturating.h"
#include "server/store/codec.h"

namespace strata::server::store {
namespace {

struct CountTraits {
  using Value = uint64_t;
  static constexpr const char* kName = "strata.CountAdd";
  static std::optional<Value> Parse(const rocksdb::Slice& s) {
    if (s.size() != 8) return std::nullopt;
    return GetFixed64LE(s.data());
  }
  static Value Combine(Value a, Value b) { return base::SaturatingAdd(a, b); }
  static std::string Encode(Value v) { return EncodeCount(v); }
};

struct ServiceSummaryTraits {
  using Value = ServiceSummary;
  static constexpr const char* kName = "strata.ServiceSummary";
  static std::optional<Value> Parse(const rocksdb::Slice& s) {
    auto decoded = DecodeServiceSummary(std::string_view(s.data(), s.size()));
    if (!decoded.ok()) return std::nullopt;
    return *decoded;
  }
  static Value Combine(const Value& a, const Value& b) {
    Value out;
    out.first_window_ms = std::min(a.first_window_ms, b.first_window_ms);
    out.last_window_ms = std::max(a.last_window_ms, b.last_window_ms);
    out.total_samples = base::SaturatingAdd(a.total_samples, b.total_samples);
    return out;
  }
  static std::string Encode(const Value& v) {
    return EncodeServiceSummary(v.first_window_ms, v.last_window_ms, v.total_samples);
  }
};

// Hourly leaf-address records: lists of (function, offset, count) sorted by (function,
// offset), summed key by key.
struct LeafAddressSumTraits {
  using Value = std::vector<LeafAddressCount>;
  static constexpr const char* kName = "strata.LeafAddressSum";
  static std::optional<Value> Parse(const rocksdb::Slice& s) {
    auto decoded = DecodeLeafAddresses(std::string_view(s.data(), s.size()));
    if (!decoded.ok()) return std::nullopt;
    std::sort(decoded->begin(), decoded->end(), Less);
    return *std::move(decoded);
  }
  static Value Combine(const Value& a, const Value& b) {
    Value out;
    out.reserve(a.size() + b.size());
    size_t i = 0, j = 0;
    while (i < a.size() || j < b.size()) {
      if (j == b.size() || (i < a.size() && Less(a[i], b[j]))) {
        Append(a[i++], &out);
      } else {
        Append(b[j++], &out);
      }
    }
    return out;
  }
  static std::string Encode(const Value& v) { return EncodeLeafAddresses(v); }

 private:
  static bool Less(const LeafAddressCount& x, const LeafAddressCount& y) {
    return x.function_id != y.function_id ? x.function_id < y.function_id : x.offset < y.offset;
  }
  // Appends `c`, summing it into the last entry when that has the same address.
  static void Append(const LeafAddressCount& c, Value* out) {
    if (!out->empty() && out->back().function_id == c.function_id &&
        out->back().offset == c.offset) {
      out->back().count = base::SaturatingAdd(out->back().count, c.count);
    } else {
      out->push_back(c);
    }
  }
};

template <typename Traits>
class FixedRecordMergeOperator : public rocksdb::MergeOperator {
 public:
  explicit FixedRecordMergeOperator(std::shared_ptr<std::atomic<uint64_t>> malformed)
      : malformed_(std::move(malformed)) {}

  const char* Name() const override { return Traits::kName; }

  bool FullMergeV2(const MergeOperationInput& in, MergeOperationOutput* out) const override {
    std::optional<typename Traits::Value> acc;
    if (in.existing_value != nullptr) Add(*in.existing_value, &acc);
    for (const rocksdb::Slice& operand : in.operand_list) Add(operand, &acc);
    // All inputs malformed: keep a well-formed neutral record rather than failing the read
    // (a failed merge would surface as a corruption error on every read of the key).
    out->new_value = acc ? Traits::Encode(*acc) : Traits::Encode(typename Traits::Value{});
    return true;
  }

  bool PartialMerge(const rocksdb::Slice& key, const rocksdb::Slice& left,
                    const rocksdb::Slice& right, std::string* new_value,
                    rocksdb::Logger* logger) const override {
    std::optional<typename Traits::Value> acc;
    Add(left, &acc);
    Add(right, &acc);
    if (!acc) return false;  // keep the operands; the full merge will skip them
    *new_value = Traits::Encode(*acc);
    return true;
  }

  bool PartialMergeMulti(const rocksdb::Slice& key, const std::deque<rocksdb::Slice>& operands,
                         std::string* new_value, rocksdb::Logger* logger) const override {
    std::optional<typename Traits::Value> acc;
    for (const rocksdb::Slice& operand : operands) Add(operand, &acc);
    if (!acc) return false;
    *new_value = Traits::Encode(*acc);
    return true;
  }

 private:
  void Add(const rocksdb::Slice& s, std::optional<typename Traits::Value>* acc) const {
    std::optional<typename Traits::Value> v = Traits::Parse(s);
    if (!v) {
      malformed_->fetch_add(1, std::memory_order_relaxed);
      return;
    }
    *acc = *acc ? Traits::Combine(**acc, *v) : *v;
  }

  std::shared_ptr<std::atomic<uint64_t>> malformed_;
};

class ScopePrefixExtractor : public rocksdb::SliceTransform {
 public:
  const char* Name() const override { return "strata.ScopePrefix"; }
  rocksdb::Slice Transform(const rocksdb::Slice& key) const override {
    const void* nul = memchr(key.data(), '\0', key.size());
    return rocksdb::Slice(key.data(), static_cast<const char*>(nul) - key.data() + 1);
  }
  bool InDomain(const rocksdb::Slice& key) const override {
    return memchr(key.data(), '\0', key.size()) != nullptr;
  }
};

// Drops values and merge operands by the window their key names: the first rule whose
// `window_of` parses the key decides, dropping windows that started before now_ms() minus
// its retention (0: kept). Keys no rule parses are kept.
class RetentionFilter : public rocksdb::CompactionFilter {
 public:
  struct Rule {
    std::optional<uint64_t> (*window_of)(std::string_view key);
    int64_t retention_ms;
  };

  RetentionFilter(const char* name, std::vector<Rule> rules, std::function<int64_t()> now_ms)
      : name_(name), rules_(std::move(rules)), now_ms_(std::move(now_ms)) {}

  const char* Name() const override { return name_; }

  Decision FilterV2(int level, const rocksdb::Slice& key, ValueType value_type,
                    const rocksdb::Slice& existing_value, std::string* new_value,
                    std::string* skip_until) const override {
    if (value_type != kValue && value_type != kMergeOperand) return Decision::kKeep;
    const std::string_view k(key.data(), key.size());
    for (const Rule& rule : rules_) {
      const std::optional<uint64_t> window = rule.window_of(k);
      if (!window) continue;
      if (rule.retention_ms <= 0) return Decision::kKeep;
      const int64_t cutoff = now_ms_() - rule.retention_ms;
      return cutoff > 0 && *window < static_cast<uint64_t>(cutoff) ? Decision::kRemove
                                                                   : Decision::kKeep;
    }
    return Decision::kKeep;
  }

 private:
  const char* const name_;
  const std::vector<Rule> rules_;
  const std::function<int64_t()> now_ms_;
};

std::optional<uint64_t> CellWindowStart(std::string_view key) {
  auto cell = DecodeCellKey(key);
  if (!cell.ok()) return std::nullopt;
  return cell->window_start_ms;
}

}  // namespace

std::unique_ptr<rocksdb::CompactionFilter> NewRetentionFilter(int64_t retention_ms,
                                                              std::function<int64_t()> now_ms) {
  return std::make_unique<RetentionFilter>(
      "strata.Retention", std::vector<RetentionFilter::Rule>{{&CellWindowStart, retention_ms}},
      std::move(now_ms));
}

std::unique_ptr<rocksdb::CompactionFilter> NewMetaRetentionFilter(
    int64_t raw_retention_ms, int64_t hour_retention_ms, std::function<int64_t()> now_ms) {
  return std::make_unique<RetentionFilter>(
      "strata.MetaRetention",
      std::vector<RetentionFilter::Rule>{{&BatchMetaWindowStart, raw_retention_ms},
                                         {&HourlyMetaWindowStart, hour_retention_ms}},
      std::move(now_ms));
}

std::shared_ptr<rocksdb::MergeOperator> NewLeafAddressSumOperator(
    std::shared_ptr<std::atomic<uint64_t>> malformed) {
  return std::make_shared<FixedRecordMergeOperator<LeafAddressSumTraits>>(std::move(malformed));
}

std::shared_ptr<rocksdb::MergeOperator> NewCountAddOperator(
    std::shared_ptr<std::atomic<uint64_t>> malformed) {
  return std::make_shared<FixedRecordMergeOperator<CountTraits>>(std::move(malformed));
}

std::shared_ptr<rocksdb::MergeOperator> NewServiceSummaryOperator(
    std::shared_ptr<std::atomic<uint64_t>> malformed) {
  return std::make_shared<FixedRecordMergeOperator<ServiceSummaryTraits>>(std::move(malformed));
}

std::shared_ptr<const rocksdb::SliceTransform> NewScopePrefixExtractor() {
  return std::make_shared<ScopePrefixExtractor>();
}

}  // namespace strata::server::store
