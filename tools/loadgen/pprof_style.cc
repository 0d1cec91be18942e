#include "tools/loadgen/pprof_style.h"

#include "absl/container/flat_hash_map.h"

namespace strata::loadgen {

void PutVarint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

void PutUint(std::string* s, int field, uint64_t v) {
  if (v == 0) return;
  PutVarint(s, static_cast<uint64_t>(field) << 3);
  PutVarint(s, v);
}

void PutBytes(std::string* s, int field, std::string_view b) {
  PutVarint(s, (static_cast<uint64_t>(field) << 3) | 2);
  PutVarint(s, b.size());
  s->append(b);
}

void PutPacked(std::string* s, int field, const std::vector<uint64_t>& v) {
  if (v.empty()) return;
  std::string inner;
  for (uint64_t x : v) PutVarint(&inner, x);
  PutBytes(s, field, inner);
}

std::vector<uint64_t> FrameAddresses(const StreamStack& s) {
  std::vector<uint64_t> a;
  for (size_t i = s.frames.size(); i-- > 0;) {
    const StreamFrame& f = s.frames[i];
    const uint64_t off = i + 1 == s.frames.size() ? 0x8 : f.call_site;
    a.push_back(kLoadBase + FunctionStart(f.function) + off);
  }
  return a;
}

std::string PprofStyleBatch(const SampleStream& stream,
                            const std::vector<std::pair<const StreamStack*, uint64_t>>& stacks,
                            size_t interval) {
  std::string pp;
  absl::flat_hash_map<uint64_t, uint64_t> location_id;  // address -> id
  std::vector<uint64_t> location_addr, location_fn;
  absl::flat_hash_map<uint32_t, uint64_t> function_id;
  std::vector<uint32_t> function_list;
  for (const auto& [stack, count] : stacks) {
    const StreamStack& s = *stack;
    const std::vector<uint64_t> addrs = FrameAddresses(s);
    std::vector<uint64_t> locs;
    for (size_t i = 0; i < addrs.size(); ++i) {
      auto [it, inserted] = location_id.try_emplace(addrs[i], location_addr.size() + 1);
      if (inserted) {
        location_addr.push_back(addrs[i]);
        const uint32_t f = s.frames[s.frames.size() - 1 - i].function;
        location_fn.push_back(f);
        if (function_id.try_emplace(f, function_list.size() + 1).second) {
          function_list.push_back(f);
        }
      }
      locs.push_back(it->second);
    }
    std::string m;
    PutPacked(&m, 1, locs);
    PutPacked(&m, 2, {count, count * 10000000});
    PutBytes(&pp, 2, m);
  }
  {  // pprof tables, re-sent each interval.
    std::vector<std::string> strings = {"", "samples", "count", "cpu", "nanoseconds",
                                        "/opt/demo/bin/demo_service", std::string(40, 'b')};
    std::string vt;
    PutUint(&vt, 1, 1);
    PutUint(&vt, 2, 2);
    PutBytes(&pp, 1, vt);
    vt.clear();
    PutUint(&vt, 1, 3);
    PutUint(&vt, 2, 4);
    PutBytes(&pp, 1, vt);
    std::string mapping;
    PutUint(&mapping, 1, 1);
    PutUint(&mapping, 2, kLoadBase);
    PutUint(&mapping, 3, kLoadBase + 0x4000000);
    PutUint(&mapping, 5, 5);
    PutUint(&mapping, 6, 6);
    PutBytes(&pp, 3, mapping);
    for (size_t i = 0; i < location_addr.size(); ++i) {
      std::string loc, line;
      PutUint(&line, 1, function_id[location_fn[i]]);
      PutUint(&line, 2, 100 + location_addr[i] % 500);
      PutUint(&loc, 1, i + 1);
      PutUint(&loc, 2, 1);
      PutUint(&loc, 3, location_addr[i]);
      PutBytes(&loc, 4, line);
      PutBytes(&pp, 4, loc);
    }
    absl::flat_hash_map<std::string, uint64_t> files;
    for (size_t i = 0; i < function_list.size(); ++i) {
      const uint32_t f = function_list[i];
      strings.push_back(stream.function_names[f]);
      const uint64_t name_idx = strings.size() - 1;
      std::string file = "src/module" + std::to_string(f / 100) + ".cc";
      auto [it, inserted] = files.try_emplace(file, strings.size());
      if (inserted) strings.push_back(file);
      std::string fn;
      PutUint(&fn, 1, i + 1);
      PutUint(&fn, 2, name_idx);
      PutUint(&fn, 3, name_idx);
      PutUint(&fn, 4, it->second);
      PutUint(&fn, 5, 100);
      PutBytes(&pp, 5, fn);
    }
    for (const auto& str : strings) PutBytes(&pp, 6, str);
    PutUint(&pp, 9, 1700000000000000000ull + interval * 10000000000ull);
    PutUint(&pp, 10, 10000000000ull);
    PutUint(&pp, 12, 10101010);
  }
  return pp;
}

}  // namespace strata::loadgen
