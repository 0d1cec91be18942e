#include "server/query/lines.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/frame_kind.h"
#include "common/base/saturating.h"
#include "server/query/quality.h"

namespace strata::server::query {
namespace {

// A line's identity: its frames, innermost first (function, file, line, inlined).
using LineKey = std::vector<std::tuple<std::string, std::string, uint32_t, bool>>;

struct Line {
  std::string module;
  uint64_t self = 0;
};

}  // namespace

absl::StatusOr<const store::FunctionInfo*> FunctionLookup::Get(uint64_t function_id) {
  std::unique_ptr<store::FunctionInfo>& slot = functions_[function_id];
  if (slot == nullptr) {
    auto info = store_->interner().GetFunction(function_id);
    if (!info.ok()) {
      functions_.erase(function_id);
      return absl::DataLossError(absl::StrCat("function ", function_id,
                                              " cannot be read: ", info.status().message()));
    }
    slot = std::make_unique<store::FunctionInfo>(*std::move(info));
  }
  return slot.get();
}

absl::StatusOr<LeafAddressCounts> LoadLeafAddresses(store::Store* store,
                                                    const ProfileQuery& query) {
  if (!query.capture_id.empty() || !query.focus.empty() || !query.ignore.empty() ||
      !query.selector.empty() || query.type != v1::PROFILE_CPU) {
    return absl::InvalidArgumentError(
        "lines and FDO profiles read the leaf addresses of continuous CPU profiles: only the time range "
        "and --host apply (no --focus, --ignore, --select, --type or capture)");
  }
  if (query.service.empty()) return absl::InvalidArgumentError("a service is required");
  std::optional<std::string> host;
  if (!query.host.empty()) host = query.host;
  return store->meta().SumLeafAddresses(query.service, query.from_ms, query.to_ms, host);
}

absl::StatusOr<absl::flat_hash_map<uint32_t, std::vector<LeafLine>>> LeafLinesOf(
    store::Store* store, symbolize::Symbolizer* symbolizer, const ProfileQuery& query,
    const Profile& profile) {
  absl::flat_hash_map<uint32_t, std::vector<LeafLine>> out;
  if (symbolizer == nullptr || !query.capture_id.empty()) return out;
  std::optional<std::string> host;
  if (!query.host.empty()) host = query.host;
  auto addresses = store->meta().SumLeafAddresses(query.service, query.from_ms, query.to_ms, host);
  if (!addresses.ok()) return addresses.status();
  absl::flat_hash_map<uint64_t, uint32_t> index_of;
  for (uint32_t i = 0; i < profile.functions.size(); ++i) index_of.emplace(profile.functions[i].id, i);
  FunctionLookup functions(store);
  for (const auto& [address, count] : *addresses) {
    const auto [function_id, offset] = address;
    auto index = index_of.find(function_id);
    if (index == index_of.end()) continue;
    absl::StatusOr<const store::FunctionInfo*> info = functions.Get(function_id);
    if (!info.ok()) return info.status();
    if ((*info)->build_id.empty() ||
        base::FrameKindOf((*info)->module) != base::FrameKind::kUser) {
      continue;
    }
    std::vector<symbolize::SourceFrame> frames =
        symbolizer->SourceFrames(BuildIdHex((*info)->build_id), offset);
    if (frames.empty()) continue;
    out[index->second].push_back({offset, std::move(frames), count});
  }
  for (auto& [function, lines] : out) {
    std::sort(lines.begin(), lines.end(),
              [](const LeafLine& a, const LeafLine& b) { return a.address < b.address; });
  }
  return out;
}

absl::StatusOr<v1::TopResponse> TopLines(store::Store* store, symbolize::Symbolizer* symbolizer,
                                         const ProfileQuery& query, uint32_t limit) {
  auto addresses = LoadLeafAddresses(store, query);
  if (!addresses.ok()) return addresses.status();

  FunctionLookup functions(store);
  std::map<LineKey, Line> lines;
  v1::TopResponse response;
  for (const auto& [address, count] : *addresses) {
    const auto [function_id, offset] = address;
    absl::StatusOr<const store::FunctionInfo*> info = functions.Get(function_id);
    if (!info.ok()) return info.status();
    const store::FunctionInfo& f = **info;
    response.set_total_samples(base::SaturatingAdd(response.total_samples(), count));
    std::vector<symbolize::SourceFrame> frames;
    if (symbolizer != nullptr && !f.build_id.empty() &&
        base::FrameKindOf(f.module) == base::FrameKind::kUser) {
      frames = symbolizer->SourceFrames(BuildIdHex(f.build_id), offset);
    }
    LineKey key;
    if (frames.empty()) {
      response.set_unresolved_samples(base::SaturatingAdd(response.unresolved_samples(), count));
      // The function as the profile names it (the server's symbols too), without a line.
      std::string name = f.name;
      if (symbolizer != nullptr && IsUnnamedFunction(name) && !f.build_id.empty()) {
        if (auto named = symbolizer->FunctionName(BuildIdHex(f.build_id), f.start_offset)) {
          name = *named;
        }
      }
      key.emplace_back(std::move(name), "", 0, false);
    } else {
      for (symbolize::SourceFrame& s : frames) {
        key.emplace_back(std::move(s.function), std::move(s.file), s.line, s.inlined);
      }
    }
    Line& line = lines[key];
    line.module = f.module;
    base::SaturatingAddTo(line.self, count);
  }
  std::vector<const std::pair<const LineKey, Line>*> sorted;
  sorted.reserve(lines.size());
  for (const auto& entry : lines) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return a->second.self != b->second.self ? a->second.self > b->second.self
                                            : a->first < b->first;
  });
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) {
    v1::LineStat* stat = response.add_lines();
    stat->set_self(sorted[i]->second.self);
    for (const auto& [function, file, line, inlined] : sorted[i]->first) {
      v1::Frame* frame = stat->add_frames();
      frame->set_function(function);
      frame->set_module(sorted[i]->second.module);
      frame->set_kind(static_cast<v1::FrameKind>(base::FrameKindOf(sorted[i]->second.module)));
      frame->set_file(file);
      frame->set_line(line);
      frame->set_inlined(inlined);
    }
  }
  return response;
}

}  // namespace strata::server::query
