#include "server/query/pprof.h"

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/saturating.h"
#include "server/commit/profile_type.h"

namespace strata::server::query {
namespace {

// Minimal protobuf wire-format writer (varint and length-delimited fields only).
class Writer {
 public:
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void Tag(uint32_t field, uint32_t wire_type) { Varint((uint64_t{field} << 3) | wire_type); }
  void UInt(uint32_t field, uint64_t v) {
    if (v == 0) return;  // proto3 default
    Tag(field, 0);
    Varint(v);
  }
  void Bytes(uint32_t field, std::string_view bytes) {
    Tag(field, 2);
    Varint(bytes.size());
    out_.append(bytes);
  }
  // Packed repeated varints.
  template <typename It>
  void Packed(uint32_t field, It begin, It end) {
    Writer inner;
    for (It it = begin; it != end; ++it) inner.Varint(static_cast<uint64_t>(*it));
    Bytes(field, inner.out_);
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// profile.proto field numbers.
enum ProfileField : uint32_t {
  kSampleType = 1,
  kSample = 2,
  kMapping = 3,
  kLocation = 4,
  kFunction = 5,
  kStringTable = 6,
  kTimeNanos = 9,
  kDurationNanos = 10,
  kPeriodType = 11,
  kPeriod = 12,
  kDefaultSampleType = 14,
};

class StringTable {
 public:
  StringTable() { Index(""); }
  uint64_t Index(const std::string& s) {
    auto [it, inserted] = index_.try_emplace(s, strings_.size());
    if (inserted) strings_.push_back(s);
    return it->second;
  }
  const std::vector<std::string>& strings() const { return strings_; }

 private:
  absl::flat_hash_map<std::string, uint64_t> index_;
  std::vector<std::string> strings_;
};

std::string ValueType(StringTable* strings, const std::string& type, const std::string& unit) {
  Writer w;
  w.UInt(1, strings->Index(type));
  w.UInt(2, strings->Index(unit));
  return w.str();
}

// `periods` sampling periods in nanoseconds, rounded (saturating: counts may be up to 2^64).
uint64_t Nanos(uint64_t periods, double period_ns) {
  const double ns = static_cast<double>(periods) * period_ns;
  return ns >= 18446744073709551615.0 ? UINT64_MAX : static_cast<uint64_t>(ns + 0.5);
}

}  // namespace

std::vector<uint64_t> SplitByLeafLines(uint64_t count, const std::vector<LeafLine>& lines) {
  uint64_t weight = 0;
  for (const LeafLine& l : lines) weight = base::SaturatingAdd(weight, l.weight);
  std::vector<uint64_t> parts(lines.size());
  if (lines.empty()) return parts;
  uint64_t given = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    parts[i] = static_cast<uint64_t>(static_cast<double>(count) *
                                     static_cast<double>(lines[i].weight) /
                                     static_cast<double>(std::max<uint64_t>(weight, 1)));
    given += parts[i];
  }
  std::vector<size_t> order(lines.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return lines[a].weight > lines[b].weight; });
  for (size_t k = 0; given < count; k = (k + 1) % order.size(), ++given) ++parts[order[k]];
  return parts;
}

std::string EncodePprofProto(const Profile& profile, const PprofOptions& options) {
  StringTable strings;
  Writer out;
  const std::string type(commit::ProfileTypeName(options.type));
  const double period_ns = 1e9 / (options.rate_hz == 0 ? 99 : options.rate_hz);
  out.Bytes(kSampleType, ValueType(&strings, "samples", "count"));
  out.Bytes(kSampleType, ValueType(&strings, type, "nanoseconds"));

  // One mapping per module, IDs from 1 in order of first use.
  absl::flat_hash_map<std::string, uint64_t> mapping_ids;
  std::vector<const std::string*> mappings;
  for (const ResolvedFunction& f : profile.functions) {
    if (mapping_ids.try_emplace(f.module, mappings.size() + 1).second) {
      mappings.push_back(&f.module);
    }
  }

  // Locations with source lines (leaf addresses, then call sites) come after the functions'
  // (IDs n+1...), with functions of their own for the source frames (name, file), after the
  // profile's.
  const uint64_t n = profile.functions.size();
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> source_functions;
  std::vector<std::string> line_locations;  // encoded, IDs n+1...
  auto add_line_location = [&](uint32_t function, uint64_t address,
                               const std::vector<symbolize::SourceFrame>& frames) {
    const uint64_t id = n + line_locations.size() + 1;
    Writer loc;
    loc.UInt(1, id);
    loc.UInt(2, mapping_ids[profile.functions[function].module]);
    loc.UInt(3, address);
    for (const symbolize::SourceFrame& f : frames) {
      auto [it, inserted] = source_functions.try_emplace(std::pair{f.function, f.file},
                                                         n + source_functions.size() + 1);
      Writer line;
      line.UInt(1, it->second);
      line.UInt(2, f.line);
      loc.Bytes(4, line.str());
    }
    line_locations.push_back(std::move(loc.str()));
    return id;
  };
  absl::flat_hash_map<uint32_t, uint64_t> first_leaf_location;  // function -> location ID
  if (options.leaf_lines != nullptr) {
    for (const auto& [function, lines] : *options.leaf_lines) {
      if (function >= n || lines.empty()) continue;
      first_leaf_location[function] = n + line_locations.size() + 1;
      for (const LeafLine& l : lines) add_line_location(function, l.address, l.frames);
    }
  }
  // (function, call site) -> location ID, made at first use. The location's address is the
  // call instruction's (the return address minus one), as symbolizers look calls up.
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, uint64_t> call_site_location;
  const CallSiteLines* call_sites = options.call_site_lines;

  // Samples: location IDs leaf first (pprof's order); location i+1 is function i.
  std::vector<uint64_t> locations;
  auto add_sample = [&](uint64_t count) {
    Writer sample;
    sample.Packed(1, locations.begin(), locations.end());
    const uint64_t values[2] = {count, Nanos(count, period_ns)};
    sample.Packed(2, std::begin(values), std::end(values));
    out.Bytes(kSample, sample.str());
  };
  for (size_t s = 0; s < profile.stacks.size(); ++s) {
    const ResolvedStack& stack = profile.stacks[s];
    locations.clear();
    for (auto it = stack.frames.rbegin(); it != stack.frames.rend(); ++it) {
      locations.push_back(*it + 1);
    }
    if (call_sites != nullptr && s < call_sites->sites.size() &&
        call_sites->sites[s].size() + 1 == stack.frames.size()) {
      const std::vector<uint64_t>& sites = call_sites->sites[s];
      for (size_t j = 0; j < sites.size(); ++j) {
        const std::pair<uint32_t, uint64_t> key{stack.frames[j], sites[j]};
        auto lines = call_sites->lines.find(key);
        if (lines == call_sites->lines.end() || key.first >= n || key.second == 0) continue;
        auto [it, inserted] = call_site_location.try_emplace(key, 0);
        if (inserted) it->second = add_line_location(key.first, key.second - 1, lines->second);
        locations[stack.frames.size() - 1 - j] = it->second;
      }
    }
    const std::vector<LeafLine>* lines = nullptr;
    if (!stack.frames.empty() && options.leaf_lines != nullptr) {
      if (auto it = options.leaf_lines->find(stack.frames.back());
          it != options.leaf_lines->end() && first_leaf_location.contains(it->first)) {
        lines = &it->second;
      }
    }
    if (lines == nullptr) {
      add_sample(stack.count);
      continue;
    }
    const std::vector<uint64_t> parts = SplitByLeafLines(stack.count, *lines);
    const uint64_t first = first_leaf_location.at(stack.frames.back());
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i] == 0) continue;
      locations[0] = first + i;
      add_sample(parts[i]);
    }
  }

  for (size_t i = 0; i < mappings.size(); ++i) {
    Writer m;
    m.UInt(1, i + 1);
    m.UInt(5, strings.Index(*mappings[i]));  // filename
    m.UInt(7, 1);                            // has_functions
    m.UInt(8, 1);                            // has_filenames
    out.Bytes(kMapping, m.str());
  }
  for (size_t i = 0; i < profile.functions.size(); ++i) {
    const ResolvedFunction& f = profile.functions[i];
    Writer line;
    line.UInt(1, i + 1);  // function_id
    Writer loc;
    loc.UInt(1, i + 1);
    loc.UInt(2, mapping_ids[f.module]);
    loc.Bytes(4, line.str());
    out.Bytes(kLocation, loc.str());

    Writer fn;
    fn.UInt(1, i + 1);
    fn.UInt(2, strings.Index(f.name));  // name
    fn.UInt(3, strings.Index(f.name));  // system_name
    fn.UInt(4, strings.Index(f.module));  // filename
    out.Bytes(kFunction, fn.str());
  }
  for (const std::string& loc : line_locations) out.Bytes(kLocation, loc);
  for (const auto& [key, id] : source_functions) {
    Writer fn;
    fn.UInt(1, id);
    fn.UInt(2, strings.Index(key.first));
    fn.UInt(3, strings.Index(key.first));
    fn.UInt(4, strings.Index(key.second));
    out.Bytes(kFunction, fn.str());
  }
  const std::string period_type = ValueType(&strings, type, "nanoseconds");
  // The string table must hold every index used above, so it goes last.
  for (const std::string& s : strings.strings()) out.Bytes(kStringTable, s);
  out.UInt(kTimeNanos, static_cast<uint64_t>(options.from_ms) * 1'000'000);
  if (options.to_ms > options.from_ms) {
    out.UInt(kDurationNanos, static_cast<uint64_t>(options.to_ms - options.from_ms) * 1'000'000);
  }
  out.Bytes(kPeriodType, period_type);
  out.UInt(kPeriod, Nanos(1, period_ns));
  // pprof shows the last sample type unless told: the counts stay what it shows first.
  out.UInt(kDefaultSampleType, strings.Index("samples"));
  return std::move(out.str());
}

absl::StatusOr<std::string> Gzip(std::string_view data) {
  z_stream z{};
  // 15 window bits + 16: gzip header and trailer.
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
      Z_OK) {
    return absl::InternalError("zlib: deflateInit2 failed");
  }
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  deflateEnd(&z);
  if (rc != Z_STREAM_END) return absl::InternalError(absl::StrCat("zlib: deflate failed (", rc, ")"));
  out.resize(z.total_out);
  return out;
}

absl::StatusOr<std::string> Gunzip(std::string_view gzipped, size_t max_bytes) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return absl::InternalError("zlib: inflateInit2 failed");
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gzipped.data()));
  z.avail_in = static_cast<uInt>(gzipped.size());
  std::string out;
  int rc = Z_OK;
  while (rc == Z_OK) {
    if (out.size() >= max_bytes) break;
    const size_t have = out.size();
    out.resize(std::min(max_bytes, std::max<size_t>(have * 2, 64 << 10)));
    z.next_out = reinterpret_cast<Bytef*>(out.data() + have);
    z.avail_out = static_cast<uInt>(out.size() - have);
    rc = inflate(&z, Z_NO_FLUSH);
    out.resize(out.size() - z.avail_out);
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    return absl::InvalidArgumentError(
        rc == Z_OK ? absl::StrCat("gzip data inflates past ", max_bytes, " bytes")
                   : absl::StrCat("not whole gzip data (zlib ", rc, ")"));
  }
  return out;
}

absl::StatusOr<std::string> EncodePprof(const Profile& profile, const PprofOptions& options) {
  return Gzip(EncodePprofProto(profile, options));
}

}  // namespace strata::server::query
