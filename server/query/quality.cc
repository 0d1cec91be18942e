#include "server/query/quality.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/frame_kind.h"
#include "common/base/saturating.h"

namespace strata::server::query {
namespace {

double Pct(uint64_t part, uint64_t total) {
  return total == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(total);
}

// The kinds FrameKindCount names, in the order a tie in frames is listed.
enum class Kind { kNative, kGo, kPython, kJava, kJit, kKernel, kCount };
constexpr const char* kKindNames[] = {"native", "go", "python", "java", "jit", "kernel"};

}  // namespace

bool IsGoStackRoot(std::string_view function) {
  return function == "runtime.goexit" || function == "runtime.mstart" ||
         function == "runtime.rt0_go" || function == "runtime.goexit.abi0" ||
         function == "runtime.mstart.abi0" || function == "runtime.rt0_go.abi0";
}

bool IsUnnamedFunction(std::string_view name) {
  if (name == "[unknown]") return true;
  const size_t plus = name.find("+0x");
  // A demangled name may hold "+0x" only inside parentheses or after a space (operator+).
  return plus != std::string_view::npos && plus > 0 &&
         name.substr(0, plus).find_first_of("( <") == std::string_view::npos;
}

// Agents send build IDs as lowercase hex text; raw bytes (from other writers) are encoded.
std::string BuildIdHex(std::string_view id) {
  const bool hex = id.size() % 2 == 0 && std::all_of(id.begin(), id.end(), [](char c) {
                     return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                   });
  return hex ? std::string(id) : absl::BytesToHexString(absl::string_view(id.data(), id.size()));
}

std::string DebugHint(std::string_view module, std::string_view build_id_hex) {
  // Agents leave the module empty for a pc in none of the mappings they read of the process.
  if (module.empty()) {
    return "pcs in no mapping the agent knew of (code mapped and unmapped between its reads of "
           "the process's mappings, or memory no file backs): no debug file names them";
  }
  switch (base::FrameKindOf(module)) {
    case base::FrameKind::kKernel:
      return "kernel symbols: let the agent read /proc/kallsyms (kernel.kptr_restrict)";
    case base::FrameKind::kJit:
      return "enable the runtime's perf map (/tmp/perf-PID.map)";
    case base::FrameKind::kPython:
      return "Python functions are named by the interpreter";
    case base::FrameKind::kJava:
      return "Java methods are named from the JVM's memory";
    default:
      break;
  }
  const bool system = module.starts_with("/usr/lib") || module.starts_with("/lib");
  if (system && build_id_hex.size() > 2) {
    return absl::StrCat("install the -dbg/-dbgsym package that ships /usr/lib/debug/.build-id/",
                        std::string(build_id_hex.substr(0, 2)), "/",
                        std::string(build_id_hex.substr(2)),
                        ".debug (agent or server host), or strata debuginfo upload it");
  }
  if (system) return absl::StrCat("install the -dbg/-dbgsym package of ", std::string(module));
  return "strata debuginfo upload FILE (its unstripped binary or debug file)";
}

// What would let stacks go on past a binary whose frames are all named but where stacks end.
std::string UnwindHint(std::string_view module) {
  switch (base::FrameKindOf(module)) {
    case base::FrameKind::kJit:
      return "stacks end in named JIT code: a runtime that keeps no frame pointer (HotSpot's "
             "compiled methods are unwound by their frame layouts; others need their "
             "frame-pointer option)";
    case base::FrameKind::kKernel:
    case base::FrameKind::kPython:
    case base::FrameKind::kJava:
      return "";
    default:
      return "stacks end in it: code without unwind rules (.eh_frame), a stack deeper than "
             "the agent's --stack-bytes, or more frames than its --max-frames (256)";
  }
}

v1::QualityResponse StackQuality(const Profile& profile,
                                 const std::vector<std::string>& build_ids) {
  struct Binary {
    uint64_t frames = 0, unnamed = 0, truncated_here = 0;
    Kind kind = Kind::kNative;
  };
  std::map<std::pair<std::string, std::string>, Binary> binaries;  // (module, build ID)
  std::vector<Binary*> binary_of(profile.functions.size());
  std::vector<uint8_t> unnamed(profile.functions.size());
  for (size_t i = 0; i < profile.functions.size(); ++i) {
    const ResolvedFunction& f = profile.functions[i];
    const std::string& id = i < build_ids.size() ? build_ids[i] : std::string();
    Binary& binary = binaries[{f.module, id}];
    binary_of[i] = &binary;
    unnamed[i] = IsUnnamedFunction(f.name);
    switch (base::FrameKindOf(f.module)) {
      case base::FrameKind::kKernel: binary.kind = Kind::kKernel; break;
      case base::FrameKind::kJit: binary.kind = Kind::kJit; break;
      case base::FrameKind::kPython: binary.kind = Kind::kPython; break;
      case base::FrameKind::kJava: binary.kind = Kind::kJava; break;
      case base::FrameKind::kUser:
        if (IsGoStackRoot(f.name)) binary.kind = Kind::kGo;
        break;
    }
  }
  v1::QualityResponse r;
  uint64_t samples = 0, truncated = 0, depth_sum = 0, truncated_depth_sum = 0;
  uint64_t frames = 0, unnamed_frames = 0;
  uint32_t max_depth = 0, max_truncated_depth = 0;
  for (const ResolvedStack& s : profile.stacks) {
    const uint32_t depth = static_cast<uint32_t>(s.frames.size());
    base::SaturatingAddTo(samples, s.count);
    base::SaturatingAddTo(depth_sum, s.count * depth);
    max_depth = std::max(max_depth, depth);
    if (s.truncated) {
      base::SaturatingAddTo(truncated, s.count);
      base::SaturatingAddTo(truncated_depth_sum, s.count * depth);
      max_truncated_depth = std::max(max_truncated_depth, depth);
      if (!s.frames.empty()) {
        base::SaturatingAddTo(binary_of[s.frames[0]]->truncated_here, s.count);
      }
    }
    for (uint32_t f : s.frames) {
      base::SaturatingAddTo(binary_of[f]->frames, s.count);
      base::SaturatingAddTo(frames, s.count);
      if (unnamed[f]) {
        base::SaturatingAddTo(binary_of[f]->unnamed, s.count);
        base::SaturatingAddTo(unnamed_frames, s.count);
      }
    }
  }
  r.set_samples(samples);
  r.set_truncated_samples(truncated);
  r.set_complete_pct(samples == 0 ? 0.0 : 100.0 - Pct(truncated, samples));
  r.set_mean_depth(samples == 0 ? 0.0 : static_cast<double>(depth_sum) / samples);
  r.set_max_depth(max_depth);
  r.set_mean_truncated_depth(truncated == 0 ? 0.0
                                            : static_cast<double>(truncated_depth_sum) / truncated);
  r.set_max_truncated_depth(max_truncated_depth);
  r.set_frames(frames);
  r.set_unnamed_frames(unnamed_frames);
  r.set_unnamed_pct(Pct(unnamed_frames, frames));
  uint64_t kind_frames[static_cast<int>(Kind::kCount)] = {};
  uint64_t kind_unnamed[static_cast<int>(Kind::kCount)] = {};
  for (const auto& [key, b] : binaries) {
    base::SaturatingAddTo(kind_frames[static_cast<int>(b.kind)], b.frames);
    base::SaturatingAddTo(kind_unnamed[static_cast<int>(b.kind)], b.unnamed);
  }
  for (int k = 0; k < static_cast<int>(Kind::kCount); ++k) {
    if (kind_frames[k] == 0) continue;
    v1::FrameKindCount* out = r.add_frames_by_kind();
    out->set_kind(kKindNames[k]);
    out->set_frames(kind_frames[k]);
    out->set_unnamed_frames(kind_unnamed[k]);
  }
  std::stable_sort(r.mutable_frames_by_kind()->begin(), r.mutable_frames_by_kind()->end(),
                   [](const v1::FrameKindCount& a, const v1::FrameKindCount& b) {
                     return a.frames() > b.frames();
                   });
  for (const auto& [key, b] : binaries) {
    if (b.frames == 0) continue;
    v1::BinaryQuality* out = r.add_binaries();
    out->set_kind(kKindNames[static_cast<int>(b.kind)]);
    out->set_module(key.first);
    out->set_build_id(BuildIdHex(key.second));
    out->set_frames(b.frames);
    out->set_unnamed_frames(b.unnamed);
    out->set_unnamed_pct(Pct(b.unnamed, b.frames));
    out->set_truncated_here(b.truncated_here);
    if (b.unnamed > 0) {
      out->set_hint(DebugHint(key.first, out->build_id()));
    } else if (b.truncated_here > 0) {
      out->set_hint(UnwindHint(key.first));
    }
  }
  std::sort(r.mutable_binaries()->begin(), r.mutable_binaries()->end(),
            [](const v1::BinaryQuality& a, const v1::BinaryQuality& b) {
              if (a.unnamed_frames() != b.unnamed_frames()) {
                return a.unnamed_frames() > b.unnamed_frames();
              }
              if (a.frames() != b.frames()) return a.frames() > b.frames();
              return a.module() < b.module();
            });
  return r;
}

}  // namespace strata::server::query
