#include "cli/format.h"

#include <time.h>

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::cli {

absl::StatusOr<int64_t> ParseRfc3339(std::string_view text) {
  int year, month, day, hour, minute, second;
  int consumed = 0;
  std::string s(text);
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &month, &day, &hour, &minute,
                  &second, &consumed) != 6 ||
      consumed != 19 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 ||
      minute > 59 || second > 60) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid time '", std::string(text), "': expected RFC 3339, e.g. 2026-11-21T05:53:00Z"));
  }
  size_t i = 19;
  int64_t millis = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (digits < 3) millis = millis * 10 + (s[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) return absl::InvalidArgumentError(absl::StrCat("invalid time '", std::string(text), "'"));
    for (; digits < 3; ++digits) millis *= 10;
  }
  int64_t offset_minutes = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    int oh, om;
    if (i + 6 != s.size() || std::sscanf(s.c_str() + i + 1, "%2d:%2d", &oh, &om) != 2 ||
        s[i + 3] != ':' || oh > 23 || om > 59) {
      return absl::InvalidArgumentError(absl::StrCat("invalid time zone offset in '", std::string(text), "'"));
    }
    offset_minutes = (s[i] == '+' ? 1 : -1) * (oh * 60 + om);
    i += 6;
  } else if (i == s.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("time '", std::string(text), "' needs a zone: Z or +hh:mm"));
  } else {
    // Something else after the seconds ("05:15:50:00Z"): not a missing zone.
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid time '", std::string(text), "': '", s.substr(i),
        "' after the seconds (times are like 2026-12-06T05:15:50Z)"));
  }
  if (i != s.size()) return absl::InvalidArgumentError(absl::StrCat("invalid time '", std::string(text), "'"));
  tm t{};
  t.tm_year = year - 1900;
  t.tm_mon = month - 1;
  t.tm_mday = day;
  t.tm_hour = hour;
  t.tm_min = minute;
  t.tm_sec = second;
  const int64_t seconds = timegm(&t);
  return (seconds - offset_minutes * 60) * 1000 + millis;
}

std::string FormatRfc3339(int64_t unix_ms) {
  time_t seconds = unix_ms / 1000;
  tm t{};
  gmtime_r(&seconds, &t);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &t);
  return buf;
}

std::string FormatRfc3339Millis(int64_t unix_ms) {
  std::string text = FormatRfc3339(unix_ms);
  if (const int64_t millis = unix_ms % 1000; millis != 0) {
    text.insert(text.size() - 1, absl::StrFormat(".%03d", millis));
  }
  return text;
}

std::string WithThousands(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string Percent(uint64_t part, uint64_t total) {
  if (total == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * static_cast<double>(part) / total);
  return buf;
}

size_t DisplayWidth(std::string_view text) {
  size_t width = 0;
  for (unsigned char c : text) width += (c & 0xC0) != 0x80;
  return width;
}

Table::Table(std::vector<std::string> header, std::vector<size_t> right_aligned)
    : header_(std::move(header)), right_aligned_(std::move(right_aligned)) {}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(header_.size());
  // Escaped here, not only on the way to stdout, so that the columns are padded to the width
  // the terminal shows.
  for (std::string& cell : cells) {
    std::string safe;
    bool held_c2 = false;
    AppendTerminalSafe(cell, &held_c2, &safe);
    if (held_c2) safe.push_back(static_cast<char>(0xc2));
    cell = std::move(safe);
  }
  rows_.push_back(std::move(cells));
}

std::string Table::ToString() const {
  std::vector<size_t> widths(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    widths[c] = DisplayWidth(header_[c]);
    for (const auto& row : rows_) widths[c] = std::max(widths[c], DisplayWidth(row[c]));
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      const bool right = std::find(right_aligned_.begin(), right_aligned_.end(), c) !=
                         right_aligned_.end();
      const std::string pad(widths[c] - DisplayWidth(cells[c]), ' ');
      const bool last = c + 1 == cells.size();
      if (right) {
        absl::StrAppend(&out, pad, cells[c]);
      } else {
        absl::StrAppend(&out, cells[c], last ? "" : pad);
      }
      if (!last) out += "  ";
    }
    out += "\n";
    return out;
  };
  std::string out = line(header_);
  for (const auto& row : rows_) out += line(row);
  return out;
}

void AppendTerminalSafe(std::string_view text, bool* held_c2, std::string* out) {
  auto escape = [out](unsigned char c) { absl::StrAppendFormat(out, "\\x%02x", c); };
  for (const char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (*held_c2) {
      *held_c2 = false;
      if (c >= 0x80 && c <= 0x9f) {  // U+0080..U+009F: C1 controls (0x9b is CSI)
        escape(0xc2);
        escape(c);
        continue;
      }
      out->push_back(static_cast<char>(0xc2));
    }
    if (c == 0xc2) {
      *held_c2 = true;
    } else if ((c < 0x20 && c != '\n' && c != '\t' && c != '\r') || c == 0x7f) {
      escape(c);
    } else {
      out->push_back(ch);
    }
  }
}

}  // namespace strata::cli
