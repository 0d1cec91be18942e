#include "server/query/otlp_export.h"

#include <string_view>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

#include "common/base/frame_kind.h"
#include "server/otlp/otlp_builder.h"

namespace strata::server::query {
namespace {

// "[kind:file]" module names: their kind and file (false for any other module).
bool SplitKindModule(std::string_view module, std::string_view* kind, std::string_view* file) {
  if (module.size() < 3 || module.front() != '[' || module.back() != ']') return false;
  const size_t colon = module.find(':');
  if (colon == std::string_view::npos) return false;
  *kind = module.substr(1, colon - 1);
  *file = module.substr(colon + 1, module.size() - colon - 2);
  return true;
}

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// The frames `chain` of a stack as one location of `b`: a function (the first, outermost)
// and the functions inlined into it (ExpandLines' frames marked inlined), with their lines
// innermost first; its kind and mapping such that server/otlp reads it back as the same name
// and module.
int32_t LocationOf(const Profile& profile, absl::Span<const uint32_t> chain,
                   otlp::RequestBuilder* b) {
  const ResolvedFunction& f = profile.functions[chain.front()];
  std::string_view kind, file;
  const bool kind_and_file = SplitKindModule(f.module, &kind, &file);
  // Interpreted code without a source file of its own has the module's.
  auto lines = [&](std::string_view module_file) {
    std::vector<otlp::RequestBuilder::Line> out;
    for (size_t k = chain.size(); k-- > 0;) {
      const ResolvedFunction& g = profile.functions[chain[k]];
      out.push_back({g.name, g.file.empty() ? std::string(module_file) : g.file, g.line});
    }
    return out;
  };
  switch (base::FrameKindOf(f.module)) {
    case base::FrameKind::kKernel:
      return b->Location(b->Mapping(f.module), 0, lines(""), "kernel");
    case base::FrameKind::kPython:
      return b->Location(0, 0, lines(file), "cpython");
    case base::FrameKind::kJava:
      return b->Location(0, 0, lines(base::SourceFileOf(f.module)), "jvm");
    case base::FrameKind::kJit:
      if (kind_and_file && (file == "jvm" || file == "hotspot" || file == "v8js" ||
                            file == "dotnet" || file == "beam")) {
        return b->Location(0, 0, lines(""), Absl(file));  // named by an OTLP sender's kind
      }
      break;
    case base::FrameKind::kUser:
      if (kind_and_file && f.module != "[unknown]") {
        return b->Location(0, 0, lines(file), Absl(kind));  // php, ruby, ...
      }
      break;
  }
  return b->Location(b->Mapping(f.module, f.build_id), 0, lines(""), "native");
}

}  // namespace

absl::StatusOr<std::string> EncodeOtlp(const std::vector<std::pair<std::string, Profile>>& by_host,
                                       const OtlpExportOptions& options) {
  if (options.type != v1::PROFILE_CPU && options.type != v1::PROFILE_OFF_CPU) {
    return absl::InvalidArgumentError(
        "the OTLP export writes CPU or off-CPU profiles, one at a time (--type cpu|off-cpu)");
  }
  const int64_t period_ns = 1'000'000'000 / (options.rate_hz == 0 ? 99 : options.rate_hz);
  const bool cpu = options.type == v1::PROFILE_CPU;
  otlp::RequestBuilder b;
  for (const auto& [host, profile] : by_host) {
    if (profile.stacks.empty()) continue;
    auto* resource = b.AddResource({{"service.name", options.service}, {"host.name", host}});
    auto* p = b.AddProfile(resource, cpu ? "samples" : "off_cpu", cpu ? "count" : "nanoseconds",
                           static_cast<uint64_t>(options.from_ms) * 1'000'000, "cpu", period_ns);
    if (options.to_ms > options.from_ms) {
      p->set_duration_nano(static_cast<uint64_t>(options.to_ms - options.from_ms) * 1'000'000);
    }
    // A frame with nothing inlined into it (most) has one location whatever the stack.
    std::vector<int32_t> location_of(profile.functions.size(), -1);
    std::vector<int32_t> leaf_first;
    for (const ResolvedStack& stack : profile.stacks) {
      leaf_first.clear();
      const absl::Span<const uint32_t> frames(stack.frames.data(), stack.frames.size());
      for (size_t end = frames.size(); end > 0;) {
        size_t start = end - 1;
        while (start > 0 && profile.functions[frames[start]].inlined) --start;
        if (end - start == 1) {
          int32_t& location = location_of[frames[start]];
          if (location < 0) location = LocationOf(profile, frames.subspan(start, 1), &b);
          leaf_first.push_back(location);
        } else {
          leaf_first.push_back(LocationOf(profile, frames.subspan(start, end - start), &b));
        }
        end = start;
      }
      if (stack.truncated) leaf_first.push_back(b.Location(0, 0, {}, "abort-marker"));
      const int64_t value = cpu ? static_cast<int64_t>(stack.count)
                                : static_cast<int64_t>(stack.count) * period_ns;
      b.AddSample(p, b.Stack(leaf_first), {}, value);
    }
  }
  return b.request().SerializeAsString();
}

}  // namespace strata::server::query
