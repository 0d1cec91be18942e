// Fuzz target: the /proc text parsers of agent/procfs/procfs.h (maps, stat, cmdline and
// environ), which read files other processes' kernels state writes but whose contents
// (paths, comm, arguments, environment, cgroup paths) those processes choose.
//
// Input: the text of one /proc file; every parser runs on it. Oracles besides the
// sanitizers: the skipped-line count and parsed mappings account for every non-empty line;
// FindMapping agrees with a linear search over sorted, disjoint mappings; splitting at NULs
// and joining again gives back the text (a trailing NUL aside); FindEnvironValue finds the
// first entry of a name that SplitNulSeparated shows.
#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/procfs/container.h"
#include "agent/procfs/procfs.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace p = strata::agent::procfs;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  // maps
  size_t skipped = 0;
  std::vector<p::Mapping> maps = p::ParseMaps(text, &skipped);
  size_t lines = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    if (nl > pos) ++lines;
    pos = nl + 1;
  }
  STRATA_FUZZ_CHECK(maps.size() + skipped == lines, "%zu mappings + %zu skipped != %zu lines",
                    maps.size(), skipped, lines);
  for (const p::Mapping& m : maps) {
    STRATA_FUZZ_CHECK(m.start <= m.end, "mapping ends before it starts");
    (void)m.IsFile();
  }
  std::vector<uint64_t> probes;
  for (const p::Mapping& m : maps) {
    probes.insert(probes.end(), {m.start, m.end, m.end - 1, m.start + (m.end - m.start) / 2});
  }
  std::stable_sort(maps.begin(), maps.end(),
                   [](const p::Mapping& a, const p::Mapping& b) { return a.start < b.start; });
  bool disjoint = true;
  for (size_t i = 1; i < maps.size(); ++i) disjoint &= maps[i - 1].end <= maps[i].start;
  if (disjoint) {
    for (uint64_t a : probes) {
      const p::Mapping* found = p::FindMapping(maps, a);
      const p::Mapping* linear = nullptr;
      for (const p::Mapping& m : maps) {
        if (m.Contains(a)) {
          linear = &m;
          break;
        }
      }
      STRATA_FUZZ_CHECK(found == linear, "FindMapping(%#llx) differs from a linear search",
                        static_cast<unsigned long long>(a));
    }
  }

  // stat
  (void)p::ParseStatStartTime(text);

  // cmdline / environ
  std::vector<std::string> parts = p::SplitNulSeparated(text);
  std::string joined;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) joined.push_back('\0');
    joined += parts[i];
  }
  std::string_view expected = text;
  if (!expected.empty() && expected.back() == '\0') expected.remove_suffix(1);
  STRATA_FUZZ_CHECK(joined == expected, "SplitNulSeparated lost or added bytes");
  for (size_t k = 0; k < parts.size() && k < 64; ++k) {
    const std::string& entry = parts[k];
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string name = entry.substr(0, eq);
    std::optional<std::string> value = p::FindEnvironValue(text, name);
    STRATA_FUZZ_CHECK(value.has_value(), "FindEnvironValue misses %s", name.c_str());
    // The first entry of that name wins.
    for (const std::string& e : parts) {
      if (e.size() > name.size() && e.compare(0, name.size(), name) == 0 && e[name.size()] == '=') {
        STRATA_FUZZ_CHECK(*value == e.substr(name.size() + 1), "FindEnvironValue(%s) differs",
                          name.c_str());
        break;
      }
    }
  }
  (void)p::FindEnvironValue(text, "STRATA_SERVICE");

  // cgroup: a container ID found is 64 hex digits, a pod UID 32 hex digits with or without
  // dashes, and both occur in the text.
  const p::ContainerInfo container = p::ParseCgroup(text);
  STRATA_FUZZ_CHECK(container.container_id.empty() || container.container_id.size() == 64,
                    "container ID of %zu bytes", container.container_id.size());
  STRATA_FUZZ_CHECK(container.container_id.empty() ||
                        text.find(container.container_id) != std::string_view::npos,
                    "container ID not in the text");
  STRATA_FUZZ_CHECK(container.pod_uid.empty() || container.pod_uid.size() == 32 ||
                        container.pod_uid.size() == 36,
                    "pod UID of %zu bytes", container.pod_uid.size());
  return 0;
}
