#include "common/labels/labels.h"

#include <algorithm>

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

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Greedy with backtracking to the last '*': linear in practice, never exponential.
  size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

absl::StatusOr<Selector> Selector::Parse(std::string_view text) {
  Selector selector;
  if (Strip(text).empty()) return selector;
  for (std::string_view raw : Split(text, ',')) {
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
