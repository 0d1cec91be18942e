#include "common/labels/labels.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/escape.h"
#include "common/base/split.h"

namespace strata::labels {
namespace {

using base::Split;

bool KeyStart(char c) { return absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool KeyChar(char c) {
  return KeyStart(c) || absl::ascii_isdigit(static_cast<unsigned char>(c)) || c == '.' ||
         c == '-' || c == '/';
}

std::string_view Strip(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

absl::Status ValidateKey(std::string_view key) {
  if (key.empty()) return absl::InvalidArgumentError("empty label key");
  if (key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("label key '", base::EscapeForLog(key, 64),
                                                   "' is longer than ", kMaxKeyBytes, " bytes"));
  }
  if (!KeyStart(key[0]) || !std::all_of(key.begin(), key.end(), KeyChar)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label key '", base::EscapeForLog(key, 64),
                     "': letters, digits, '_', '.', '-' and '/' only, starting with a letter "
                     "or '_'"));
  }
  return absl::OkStatus();
}

absl::Status ValidateValue(std::string_view value) {
  if (value.size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("label value '", base::EscapeForLog(value, 64),
                                                   "' is longer than ", kMaxValueBytes,
                                                   " bytes"));
  }
  for (char c : value) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f || c == ',') {
      return absl::InvalidArgumentError(absl::StrCat(
          "label value '", base::EscapeForLog(value, 64), "': no control characters or ','"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Label> ParseLabel(std::string_view text) {
  text = Strip(text);
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("label '", base::EscapeForLog(text, 64), "': expected KEY=VALUE"));
  }
  Label label{std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
  if (absl::Status s = ValidateLabel(label.first, label.second); !s.ok()) return s;
  return label;
}

absl::StatusOr<LabelSet> ParseLabelList(std::string_view text) {
  LabelSet set;
  if (Strip(text).empty()) return set;
  for (std::string_view entry : Split(text, ',')) {
    absl::StatusOr<Label> label = ParseLabel(entry);
    if (!label.ok()) return label.status();
    set.push_back(*std::move(label));
  }
  Normalize(&set);
  return set;
}

void Normalize(LabelSet* set) {
  // Stable, so that of equal keys the last one given stays last; keep that one.
  std::stable_sort(set->begin(), set->end(),
                   [](const Label& a, const Label& b) { return a.first < b.first; });
  LabelSet out;
  out.reserve(set->size());
  for (Label& l : *set) {
    if (!out.empty() && out.back().first == l.first) {
      out.back().second = std::move(l.second);
    } else {
      out.push_back(std::move(l));
    }
  }
  *set = std::move(out);
}

LabelSet Merge(const LabelSet& base, const LabelSet& overlay) {
  LabelSet out = base;
  out.insert(out.end(), overlay.begin(), overlay.end());
  Normalize(&out);
  // An empty value in the overlay removes the key.
  std::erase_if(out, [](const Label& l) { return l.second.empty(); });
  return out;
}

std::string_view ValueOf(const LabelSet& set, std::string_view key) {
  auto it = std::lower_bound(set.begin(), set.end(), key,
                             [](const Label& l, std::string_view k) { return l.first < k; });
  return it != set.end() && it->first == key ? std::string_view(it->second) : std::string_view();
}

std::string ToString(const LabelSet& set) {
  std::string out;
  for (const Label& l : set) {
    if (l.second.empty()) continue;
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, l.first, "=", l.second);
  }
  return out;
}

std::string Encode(const LabelSet& set) {
  std::string out;
  for (const Label& l : set) {
    if (l.second.empty()) continue;
    if (!out.empty()) out.push_back('\n');
    absl::StrAppend(&out, l.first, "=", l.second);
  }
  return out;
}

absl::StatusOr<LabelSet> Decode(std::string_view bytes) {
  LabelSet set;
  if (bytes.empty()) return set;
  for (std::string_view line : Split(bytes, '\n')) {
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq + 1 == line.size()) {
      return absl::InvalidArgumentError("corrupt label set");
    }
    std::string_view key = line.substr(0, eq), value = line.substr(eq + 1);
    if (!ValidateLabel(key, value).ok() || (!set.empty() && set.back().first >= key)) {
      return absl::InvalidArgumentError("corrupt label set");
    }
    set.emplace_back(std::string(key), std::string(value));
  }
  return set;
}

namespace {

// The first occurrence of `needle` (not empty) in `hay`, or npos: Knuth-Morris-Pratt, linear in
// both, where a plain search (and backtracking to the last '*') costs their product.
size_t FindLinear(std::string_view hay, std::string_view needle) {
  absl::InlinedVector<uint32_t, 64> border(needle.size(), 0);
  for (size_t i = 1, k = 0; i < needle.size(); ++i) {
    while (k > 0 && needle[i] != needle[k]) k = border[k - 1];
    if (needle[i] == needle[k]) ++k;
    border[i] = static_cast<uint32_t>(k);
  }
  for (size_t i = 0, k = 0; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = border[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == needle.size()) return i + 1 - k;
  }
  return std::string_view::npos;
}

}  // namespace

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // The pieces between the stars: the first must begin the text, the last end it, and the
  // others occur in order in between, each at its leftmost place (a later one can only
  // leave less room for the rest).
  const size_t first_star = pattern.find('*');
  if (first_star == std::string_view::npos) return pattern == text;
  const size_t last_star = pattern.rfind('*');
  const std::string_view head = pattern.substr(0, first_star);
  const std::string_view tail = pattern.substr(last_star + 1);
  if (head.size() + tail.size() > text.size() || !text.starts_with(head) ||
      !text.ends_with(tail)) {
    return false;
  }
  std::string_view rest = text.substr(head.size(), text.size() - head.size() - tail.size());
  std::string_view middle = pattern.substr(first_star + 1, last_star - first_star);
  while (!middle.empty()) {
    const size_t star = middle.find('*');
    const std::string_view piece = middle.substr(0, star);
    middle.remove_prefix(star + 1);  // the middle ends with a star
    if (piece.empty()) continue;
    const size_t at = FindLinear(rest, piece);
    if (at == std::string_view::npos) return false;
    rest.remove_prefix(at + piece.size());
  }
  return true;
}

absl::StatusOr<Selector> Selector::Parse(std::string_view text) {
  Selector selector;
  if (Strip(text).empty()) return selector;
  const std::vector<std::string_view> terms = Split(text, ',');
  if (terms.size() > kMaxTerms) {
    return absl::InvalidArgumentError(absl::StrCat("label selector has ", terms.size(),
                                                   " terms; at most ", kMaxTerms));
  }
  for (std::string_view raw : terms) {
    std::string_view term = Strip(raw);
    const size_t eq = term.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label selector term '", base::EscapeForLog(term, 64),
          "': expected KEY=VALUE or KEY!=VALUE ('*' matches anything)"));
    }
    Term t;
    t.negate = term[eq - 1] == '!';
    t.key = std::string(Strip(term.substr(0, t.negate ? eq - 1 : eq)));
    t.pattern = std::string(Strip(term.substr(eq + 1)));
    if (absl::Status s = ValidateKey(t.key); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("label selector: ", s.message()));
    }
    if (absl::Status s = ValidateValue(t.pattern); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("label selector: ", s.message()));
    }
    selector.terms_.push_back(std::move(t));
  }
  return selector;
}

bool Selector::Matches(const LabelSet& set) const {
  for (const Term& t : terms_) {
    if (GlobMatch(t.pattern, ValueOf(set, t.key)) == t.negate) return false;
  }
  return true;
}

std::string Selector::ToString() const {
  std::string out;
  for (const Term& t : terms_) {
    if (!out.empty()) out.push_back(',');
    absl::StrAppend(&out, t.key, t.negate ? "!=" : "=", t.pattern);
  }
  return out;
}

}  // namespace strata::labels
