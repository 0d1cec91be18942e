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

  // Leaf-address locations come after the functions' (IDs n+1...), with functions of their
  // own for the source frames (name, file), after the profile's.
  const uint64_t n = profile.functions.size();
  absl::flat_hash_map<uint32_t, uint64_t> first_leaf_location;  // function -> location ID
  absl::flat_hash_map<std::pair<std::string, std::string>, uint64_t> source_functions;
  std::vector<std::string> leaf_locations;  // encoded, IDs n+1...
  if (options.leaf_lines != nullptr) {
    for (const auto& [function, lines] : *options.leaf_lines) {
      if (function >= n || lines.empty()) continue;
      first_leaf_location[function] = n + leaf_locations.size() + 1;
      for (const LeafLine& l : lines) {
        Writer loc;
        loc.UInt(1, n + leaf_locations.size() + 1);
        loc.UInt(2, mapping_ids[profile.functions[function].module]);
        loc.UInt(3, l.address);
        for (const symbolize::SourceFrame& f : l.frames) {
          auto [it, inserted] = source_functions.try_emplace(
              std::pair{f.function, f.file}, n + source_functions.size() + 1);
          Writer line;
          line.UInt(1, it->second);
          line.UInt(2, f.line);
          loc.Bytes(4, line.str());
        }
        leaf_locations.push_back(std::move(loc.str()));
      }
    }
  }

  // Samples: location IDs leaf first (pprof's order); location i+1 is function i.
  std::vector<uint64_t> locations;
  auto add_sample = [&](uint64_t count) {
    Writer sample;
    sample.Packed(1, locations.begin(), locations.end());
    const uint64_t values[2] = {count, Nanos(count, period_ns)};
    sample.Packed(2, std::begin(values), std::end(values));
    out.Bytes(kSample, sample.str());
  };
  for (const ResolvedStack& stack : profile.stacks) {
    locations.clear();
    for (auto it = stack.frames.rbegin(); it != stack.frames.rend(); ++it) {
      locations.push_back(*it + 1);
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
    // The stack's samples over its leaf's addresses, in proportion; rounding remainders go
    // to the heaviest addresses so the parts sum to the stack's count.
    uint64_t weight = 0;
    for (const LeafLine& l : *lines) weight = base::SaturatingAdd(weight, l.weight);
    std::vector<uint64_t> parts(lines->size());
    uint64_t given = 0;
    for (size_t i = 0; i < lines->size(); ++i) {
      parts[i] = static_cast<uint64_t>(static_cast<double>(stack.count) *
                                       static_cast<double>((*lines)[i].weight) /
                                       static_cast<double>(std::max<uint64_t>(weight, 1)));
      given += parts[i];
    }
    std::vector<size_t> order(lines->size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return (*lines)[a].weight > (*lines)[b].weight; });
    for (size_t k = 0; given < stack.count; k = (k + 1) % order.size(), ++given) ++parts[order[k]];
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
  for (const std::string& loc : leaf_locations) out.Bytes(kLocation, loc);
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

absl::StatusOr<std::string> EncodePprof(const Profile& profile, const PprofOptions& options) {
  return Gzip(EncodePprofProto(profile, options));
}

}  // namespace strata::server::query
