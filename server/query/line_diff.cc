#include "server/query/line_diff.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/saturating.h"

namespace strata::server::query {
namespace {

std::string KeyOf(const v1::LineStat& line) {
  std::string key;
  for (const v1::Frame& f : line.frames()) {
    absl::StrAppend(&key, f.function(), absl::string_view("\0", 1), f.file(),
                    absl::string_view("\0", 1), f.line(), f.inlined() ? "i" : "o",
                    absl::string_view("\0", 1));
  }
  return key;
}

double Share(uint64_t samples, uint64_t total) {
  return total == 0 ? 0 : 100.0 * static_cast<double>(samples) / static_cast<double>(total);
}

}  // namespace

v1::DiffResponse DiffLines(const v1::TopResponse& base, const v1::TopResponse& current,
                           uint32_t limit) {
  struct Row {
    std::string key;
    v1::LineDelta delta;
  };
  std::vector<Row> rows;
  absl::flat_hash_map<std::string, size_t> row_of;
  auto add = [&](const v1::TopResponse& profile, bool is_base) {
    for (const v1::LineStat& line : profile.lines()) {
      std::string key = KeyOf(line);
      auto [it, added] = row_of.try_emplace(key, rows.size());
      if (added) {
        Row& row = rows.emplace_back();
        row.key = std::move(key);
        *row.delta.mutable_frames() = line.frames();
      }
      v1::LineDelta& d = rows[it->second].delta;
      // Two modules' copies of one line (two releases' binaries in one range) add up.
      if (is_base) {
        d.set_base_self(base::SaturatingAdd(d.base_self(), line.self()));
      } else {
        d.set_self(base::SaturatingAdd(d.self(), line.self()));
      }
    }
  };
  add(base, true);
  add(current, false);
  for (Row& row : rows) {
    row.delta.set_self_delta_pct(Share(row.delta.self(), current.total_samples()) -
                                 Share(row.delta.base_self(), base.total_samples()));
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    const double da = std::fabs(a.delta.self_delta_pct());
    const double db = std::fabs(b.delta.self_delta_pct());
    if (da != db) return da > db;
    return a.key < b.key;
  });
  v1::DiffResponse response;
  response.set_base_total_samples(base.total_samples());
  response.set_total_samples(current.total_samples());
  response.set_base_unresolved_samples(base.unresolved_samples());
  response.set_unresolved_samples(current.unresolved_samples());
  for (size_t i = 0; i < rows.size() && i < limit; ++i) {
    *response.add_lines() = std::move(rows[i].delta);
  }
  std::set<std::string> unreachable(base.unreachable_nodes().begin(),
                                    base.unreachable_nodes().end());
  unreachable.insert(current.unreachable_nodes().begin(), current.unreachable_nodes().end());
  for (const std::string& n : unreachable) response.add_unreachable_nodes(n);
  return response;
}

}  // namespace strata::server::query
