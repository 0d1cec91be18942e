// Fleet labels: key=value pairs that describe a profiled process (version, region, container,
// pod, ...), and label selectors that pick profiles by them.
//
// Agents attach a label set to each target (from --label, the process's STRATA_LABELS, its
// build ID and container); the server stores each distinct set once and keeps its ID with the
// samples; queries take a selector such as "version=1.4.2,region=eu-*,canary!=true".
//
// Syntax, shared by the agent, the server and the CLI:
//   key    [A-Za-z_][A-Za-z0-9_.-/]*, at most 128 bytes
//   value  printable bytes (no control characters, no ','), at most 256 bytes; may be empty
//   list   key=value[,key=value]...            (--label, STRATA_LABELS)
//   selector term[,term]...  term := key=glob | key!=glob
//          glob: '*' matches any run of bytes, everything else itself. A label the set does
//          not have reads as the empty value, so "canary!=true" also matches sets without it
//          and "region=" matches sets without a region.
// Pure functions and value types; nothing here allocates beyond its results.
#ifndef STRATA_COMMON_LABELS_LABELS_H_
#define STRATA_COMMON_LABELS_LABELS_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::labels {

inline constexpr size_t kMaxKeyBytes = 128;
inline constexpr size_t kMaxValueBytes = 256;

using Label = std::pair<std::string, std::string>;
// Sorted by key, keys unique (Normalize makes it so).
using LabelSet = std::vector<Label>;

absl::Status ValidateKey(std::string_view key);
absl::Status ValidateValue(std::string_view value);
inline absl::Status ValidateLabel(std::string_view key, std::string_view value) {
  absl::Status s = ValidateKey(key);
  return s.ok() ? ValidateValue(value) : s;
}

// "key=value" (the first '=' separates), validated.
absl::StatusOr<Label> ParseLabel(std::string_view text);
// "k=v,k2=v2" (empty text: no labels; spaces around entries are trimmed), validated and
// normalized. A key given twice keeps its last value.
absl::StatusOr<LabelSet> ParseLabelList(std::string_view text);

// Sorts by key; of duplicate keys the last one wins.
void Normalize(LabelSet* set);
// `base` with every label of `overlay` added or replacing base's value. Both normalized.
LabelSet Merge(const LabelSet& base, const LabelSet& overlay);
// Value of `key`, or "" when the set has none.
std::string_view ValueOf(const LabelSet& set, std::string_view key);

// "k=v,k2=v2" (the list syntax).
std::string ToString(const LabelSet& set);
// Canonical bytes of a normalized set (its identity in the store): "k=v\nk2=v2".
std::string Encode(const LabelSet& set);
// Inverse of Encode; InvalidArgument for anything Encode does not produce.
absl::StatusOr<LabelSet> Decode(std::string_view bytes);

// '*' matches any run of bytes (also none); everything else matches itself. Linear in the
// pattern's and the text's length.
bool GlobMatch(std::string_view pattern, std::string_view text);

class Selector {
 public:
  struct Term {
    std::string key;
    bool negate = false;  // key!=pattern
    std::string pattern;
    bool operator==(const Term&) const = default;
  };

  // A set has at most 64 labels; a query's selector, matched against every label set of a
  // service, at most as many terms.
  static constexpr size_t kMaxTerms = 64;

  // Empty text (or only spaces): the empty selector, which matches every set.
  // InvalidArgument naming the bad term otherwise, or when there are more than kMaxTerms.
  static absl::StatusOr<Selector> Parse(std::string_view text);

  bool empty() const { return terms_.empty(); }
  const std::vector<Term>& terms() const { return terms_; }
  // Every term holds.
  bool Matches(const LabelSet& set) const;
  std::string ToString() const;

 private:
  std::vector<Term> terms_;
};

}  // namespace strata::labels

#endif  // STRATA_COMMON_LABELS_LABELS_H_
