#include "server/query/fdo.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/frame_kind.h"
#include "common/base/saturating.h"
#include "server/query/quality.h"

namespace strata::server::query {
namespace {

// One function's samples, top level or inlined at a call site.
struct FunctionSamples {
  uint64_t total = 0;
  uint64_t head = 0;
  std::map<uint32_t, uint64_t> body;  // line offset -> samples
  // call site line offset -> inlined callee -> its samples
  std::map<uint32_t, std::map<std::string, FunctionSamples>> inlined;
};

// LLVM counts lines from the function's declaration; a line before it (a macro, a #line)
// has no offset of its own and counts at the declaration.
uint32_t LineOffset(uint32_t line, uint32_t decl_line) {
  return line >= decl_line ? line - decl_line : 0;
}

void Write(const FunctionSamples& f, int depth, std::string* out) {
  const std::string indent(static_cast<size_t>(depth), ' ');
  for (const auto& [offset, count] : f.body) absl::StrAppend(out, indent, offset, ": ", count, "\n");
  for (const auto& [offset, callees] : f.inlined) {
    for (const auto& [name, callee] : callees) {
      absl::StrAppend(out, indent, offset, ": ", name, ":", callee.total, "\n");
      Write(callee, depth + 1, out);
    }
  }
}

}  // namespace

absl::StatusOr<LlvmSampleProfile> EncodeLlvmSampleProfile(FunctionLookup* infos,
                                                         symbolize::Symbolizer* symbolizer,
                                                         const LeafAddressCounts& addresses) {
  LlvmSampleProfile result;
  std::map<std::string, FunctionSamples> functions;
  for (const auto& [address, count] : addresses) {
    const auto [function_id, offset] = address;
    absl::StatusOr<const store::FunctionInfo*> found = infos->Get(function_id);
    if (!found.ok()) return found.status();
    const store::FunctionInfo& info = **found;
    if (base::FrameKindOf(info.module) != base::FrameKind::kUser) continue;  // kernel, JIT
    if (info.name.ends_with("@plt")) {
      // The stub only jumps: the sample belongs to the call into its target.
      FunctionSamples& target = functions[info.name.substr(0, info.name.size() - 4)];
      base::SaturatingAddTo(target.head, count);
      base::SaturatingAddTo(target.total, count);
      base::SaturatingAddTo(result.samples, count);
      continue;
    }
    std::vector<symbolize::SourceFrame> frames;
    if (symbolizer != nullptr && !info.build_id.empty()) {
      frames = symbolizer->SourceFrames(BuildIdHex(info.build_id), offset);
    }
    if (frames.empty() || frames.back().linkage_name.empty()) {
      base::SaturatingAddTo(result.unresolved, count);
      continue;
    }
    base::SaturatingAddTo(result.samples, count);
    // From the out-of-line function inwards, through each inlined call site.
    FunctionSamples* node = &functions[frames.back().linkage_name];
    base::SaturatingAddTo(node->total, count);
    for (size_t i = frames.size() - 1; i > 0; --i) {
      const symbolize::SourceFrame& caller = frames[i];
      const symbolize::SourceFrame& callee = frames[i - 1];
      const std::string callee_name =
          callee.linkage_name.empty() ? callee.function : callee.linkage_name;
      node = &node->inlined[LineOffset(caller.line, caller.decl_line)][callee_name];
      base::SaturatingAddTo(node->total, count);
    }
    base::SaturatingAddTo(node->body[LineOffset(frames[0].line, frames[0].decl_line)], count);
  }
  // Hottest functions first, as llvm-profdata writes them.
  std::vector<const std::pair<const std::string, FunctionSamples>*> sorted;
  for (const auto& entry : functions) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return a->second.total != b->second.total ? a->second.total > b->second.total
                                              : a->first < b->first;
  });
  for (const auto* entry : sorted) {
    absl::StrAppend(&result.text, entry->first, ":", entry->second.total, ":",
                    entry->second.head, "\n");
    Write(entry->second, 1, &result.text);
  }
  result.functions = sorted.size();
  return result;
}

}  // namespace strata::server::query
