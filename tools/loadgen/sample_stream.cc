#include "tools/loadgen/sample_stream.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata::loadgen {

absl::StatusOr<SampleStream> ParseSampleStream(const std::string& text) {
  SampleStream stream;
  stream.intervals.emplace_back();
  absl::flat_hash_map<std::string, uint32_t> names;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (absl::StartsWith(line, "---")) {
      if (!stream.intervals.back().empty()) stream.intervals.emplace_back();
      continue;
    }
    const size_t space = line.rfind(' ');
    StreamStack stack;
    if (space == absl::string_view::npos ||
        !absl::SimpleAtoi(line.substr(space + 1), &stack.count)) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": missing count"));
    }
    for (absl::string_view tok : absl::StrSplit(line.substr(0, space), ';')) {
      if (tok.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": empty frame"));
      }
      if (tok == "[truncated]") {
        if (!stack.frames.empty() || stack.truncated) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line_no, ": [truncated] must be the first frame"));
        }
        stack.truncated = true;
        continue;
      }
      StreamFrame f;
      const size_t plus = tok.rfind("+0x");
      absl::string_view name = tok;
      if (plus != absl::string_view::npos && plus > 0) {
        if (!absl::SimpleHexAtoi(tok.substr(plus + 3), &f.call_site)) {
          return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": bad call site"));
        }
        name = tok.substr(0, plus);
      }
      auto [it, inserted] =
          names.try_emplace(std::string(name), static_cast<uint32_t>(stream.function_names.size()));
      if (inserted) stream.function_names.emplace_back(name);
      f.function = it->second;
      stack.frames.push_back(f);
    }
    if (stack.frames.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": no frames"));
    }
    stream.intervals.back().push_back(std::move(stack));
  }
  if (stream.intervals.back().empty()) stream.intervals.pop_back();
  return stream;
}

std::string FormatSampleStream(const SampleStream& stream) {
  std::string out = "# strata sample stream: folded stacks per interval\n";
  for (size_t i = 0; i < stream.intervals.size(); ++i) {
    if (i > 0) out += "---\n";
    for (const StreamStack& s : stream.intervals[i]) {
      if (s.truncated) out += "[truncated];";
      for (size_t k = 0; k < s.frames.size(); ++k) {
        out += stream.function_names[s.frames[k].function];
        if (k + 1 < s.frames.size()) absl::StrAppend(&out, "+0x", absl::Hex(s.frames[k].call_site), ";");
      }
      absl::StrAppend(&out, " ", s.count, "\n");
    }
  }
  return out;
}

SampleStream SynthesizeSampleStream(const SyntheticOptions& o) {
  std::mt19937_64 rng(o.seed);
  const uint32_t n = std::max<uint32_t>(o.functions, 200);
  const uint32_t hubs = n / 60;  // utility functions (alloc, logging, locks) at the end
  const uint32_t regular = n - hubs;
  SampleStream stream;
  for (uint32_t i = 0; i < n; ++i) {
    stream.function_names.push_back(
        i < regular ? absl::StrCat("demo::module", i / 100, "::Function", i, "(Request const&)")
                    : absl::StrCat("util::Helper", i, "(void*, unsigned long)"));
  }
  // Callees per function: a few "nearby" deeper functions, sometimes a utility function,
  // sometimes self recursion or a call back up into a recent ancestor (mutual recursion).
  struct Call {
    uint32_t callee;
    uint64_t site;
  };
  std::vector<std::vector<Call>> calls(n);
  for (uint32_t f = 0; f < regular; ++f) {
    uint64_t site = 0x10;
    const int fanout = f == 0 ? 8 : static_cast<int>(rng() % 5);
    for (int k = 0; k < fanout; ++k) {
      const uint32_t span = f < 50 ? 60 : 300;
      const uint32_t callee = std::min<uint32_t>(regular - 1, f + 1 + rng() % span);
      if (callee != f) calls[f].push_back({callee, site += 0x14});
    }
    if (rng() % 3 == 0) calls[f].push_back({regular + static_cast<uint32_t>(rng() % hubs), site += 0x14});
    if (rng() % 40 == 0) calls[f].push_back({f, site += 0x14});
    if (f > 20 && rng() % 60 == 0) calls[f].push_back({f - 1 - static_cast<uint32_t>(rng() % 20), site += 0x14});
  }
  for (uint32_t h = regular; h < n; ++h) {  // utilities call a few other utilities
    if (rng() % 2) calls[h].push_back({regular + static_cast<uint32_t>(rng() % hubs), 0x30});
  }
  // Path pool: random walks from function 0.
  std::set<std::vector<StreamFrame>, bool (*)(const std::vector<StreamFrame>&,
                                              const std::vector<StreamFrame>&)>
      seen([](const std::vector<StreamFrame>& a, const std::vector<StreamFrame>& b) {
        return std::lexicographical_compare(
            a.begin(), a.end(), b.begin(), b.end(), [](const StreamFrame& x, const StreamFrame& y) {
              return std::tie(x.function, x.call_site) < std::tie(y.function, y.call_site);
            });
      });
  std::vector<StreamStack> pool;
  for (int attempts = 0; pool.size() < o.distinct_paths && attempts < 50 * static_cast<int>(o.distinct_paths); ++attempts) {
    StreamStack s;
    s.truncated = rng() % 100 == 0;
    uint32_t at = s.truncated ? static_cast<uint32_t>(rng() % regular) : 0;
    while (true) {
      s.frames.push_back({at, 0});
      if (calls[at].empty() || s.frames.size() >= 96 || (s.frames.size() > 3 && rng() % 9 == 0)) break;
      const Call& c = calls[at][rng() % calls[at].size()];
      s.frames.back().call_site = c.site;
      at = c.callee;
    }
    s.frames.back().call_site = 0;
    if (seen.insert(s.frames).second) pool.push_back(std::move(s));
  }
  std::shuffle(pool.begin(), pool.end(), rng);
  // Zipf over pool ranks.
  std::vector<double> cdf(pool.size());
  double total = 0;
  for (size_t i = 0; i < pool.size(); ++i) cdf[i] = total += 1.0 / std::pow(i + 1.0, o.zipf_s);
  std::uniform_real_distribution<double> u(0, total);
  for (uint32_t iv = 0; iv < o.intervals; ++iv) {
    std::map<size_t, uint64_t> counts;
    for (uint32_t k = 0; k < o.samples_per_interval; ++k) {
      ++counts[std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()];
    }
    std::vector<StreamStack>& out = stream.intervals.emplace_back();
    for (auto [idx, c] : counts) {
      out.push_back(pool[std::min(idx, pool.size() - 1)]);
      out.back().count = c;
    }
  }
  return stream;
}

}  // namespace strata::loadgen
