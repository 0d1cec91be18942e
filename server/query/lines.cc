#include "server/query/lines.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
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

// The source frames at `offset` of `f`'s module, innermost first; none for modules without a
// build ID, kernel or JIT code, or without a symbolizer.
std::vector<symbolize::SourceFrame> SourceFramesAt(symbolize::Symbolizer* symbolizer,
                                                   const store::FunctionInfo& f, uint64_t offset) {
  // A Python or Java function's offsets are lines (the agent's call sites: line + 1, as a
  // return address follows its call; leaf addresses: the line), its module "[python:FILE]" or
  // "[java:FILE]".
  if (base::OffsetsAreLines(base::FrameKindOf(f.module))) {
    if (offset == 0 || offset > UINT32_MAX) return {};
    symbolize::SourceFrame frame;
    frame.function = f.name;
    frame.file = std::string(base::SourceFileOf(f.module));
    frame.line = static_cast<uint32_t>(offset);
    return {std::move(frame)};
  }
  if (symbolizer == nullptr || f.build_id.empty() ||
      base::FrameKindOf(f.module) != base::FrameKind::kUser) {
    return {};
  }
  return symbolizer->SourceFrames(BuildIdHex(f.build_id), offset);
}

}  // namespace

void FunctionLookup::Add(uint64_t function_id, store::FunctionInfo info) {
  functions_[function_id] = std::make_unique<store::FunctionInfo>(std::move(info));
}

absl::StatusOr<const store::FunctionInfo*> FunctionLookup::Get(uint64_t function_id) {
  std::unique_ptr<store::FunctionInfo>& slot = functions_[function_id];
  if (slot == nullptr) {
    auto info = store_ != nullptr ? store_->interner().GetFunction(function_id)
                                  : absl::StatusOr<store::FunctionInfo>(
                                        absl::NotFoundError("no node sent its record"));
    if (!info.ok()) {
      functions_.erase(function_id);
      return absl::DataLossError(absl::StrCat("function ", function_id,
                                              " cannot be read: ", info.status().message()));
    }
    slot = std::make_unique<store::FunctionInfo>(*std::move(info));
  }
  return slot.get();
}

absl::Status CheckLeafAddressQuery(const ProfileQuery& query) {
  if (!query.capture_id.empty() || !query.focus.empty() || !query.ignore.empty() ||
      !query.selector.empty() || query.type != v1::PROFILE_CPU) {
    return absl::InvalidArgumentError(
        "lines and FDO profiles read the leaf addresses of continuous CPU profiles: only the time range "
        "and --host apply (no --focus, --ignore, --select, --type or capture)");
  }
  if (query.service.empty()) return absl::InvalidArgumentError("a service is required");
  return absl::OkStatus();
}

absl::StatusOr<LeafAddressCounts> LoadLeafAddresses(store::Store* store,
                                                    const ProfileQuery& query) {
  if (absl::Status s = CheckLeafAddressQuery(query); !s.ok()) return s;
  return SumLeafAddressesOf(store, query);
}

absl::StatusOr<LeafAddressCounts> SumLeafAddressesOf(store::Store* store,
                                                     const ProfileQuery& query) {
  std::optional<std::string> host;
  if (!query.host.empty()) host = query.host;
  if (!query.hosts) {
    return store->meta().SumLeafAddresses(query.service, query.from_ms, query.to_ms, host);
  }
  // A cluster node's share of a fan-out query: its hosts, one by one.
  LeafAddressCounts sum;
  for (const std::string& h : *query.hosts) {
    if (host && *host != h) continue;
    auto part = store->meta().SumLeafAddresses(query.service, query.from_ms, query.to_ms, h);
    if (!part.ok()) return part.status();
    for (const auto& [address, count] : *part) base::SaturatingAddTo(sum[address], count);
  }
  return sum;
}

absl::StatusOr<absl::flat_hash_map<uint32_t, std::vector<LeafLine>>> LeafLinesOf(
    FunctionLookup* functions, symbolize::Symbolizer* symbolizer,
    const LeafAddressCounts& addresses, const Profile& profile) {
  absl::flat_hash_map<uint32_t, std::vector<LeafLine>> out;
  if (symbolizer == nullptr) return out;
  absl::flat_hash_map<uint64_t, uint32_t> index_of;
  for (uint32_t i = 0; i < profile.functions.size(); ++i) index_of.emplace(profile.functions[i].id, i);
  for (const auto& [address, count] : addresses) {
    const auto [function_id, offset] = address;
    auto index = index_of.find(function_id);
    if (index == index_of.end()) continue;
    absl::StatusOr<const store::FunctionInfo*> info = functions->Get(function_id);
    if (!info.ok()) return info.status();
    std::vector<symbolize::SourceFrame> frames = SourceFramesAt(symbolizer, **info, offset);
    if (frames.empty()) continue;
    out[index->second].push_back({offset, std::move(frames), count});
  }
  for (auto& [function, lines] : out) {
    std::sort(lines.begin(), lines.end(),
              [](const LeafLine& a, const LeafLine& b) { return a.address < b.address; });
  }
  return out;
}

absl::StatusOr<CallSiteLines> CallSiteLinesOf(store::Store* store, FunctionLookup* functions,
                                              symbolize::Symbolizer* symbolizer,
                                              const Profile& profile) {
  CallSiteLines out;
  out.sites.resize(profile.stacks.size());
  if (symbolizer == nullptr) return out;  // sites without lines serve no view: no stack reads
  absl::flat_hash_set<std::pair<uint32_t, uint64_t>> looked_up;
  for (size_t s = 0; s < profile.stacks.size(); ++s) {
    const ResolvedStack& stack = profile.stacks[s];
    if (stack.frames.size() < 2) continue;
    std::vector<uint64_t> sites;
    if (s < profile.call_sites.size()) {
      sites = profile.call_sites[s];
    } else {
      auto frames = store->interner().GetStack(stack.stack_id);
      if (!frames.ok()) {
        return absl::DataLossError(absl::StrCat("stack ", stack.stack_id,
                                                " cannot be read: ", frames.status().message()));
      }
      sites = std::move(frames->call_sites);
    }
    if (sites.size() + 1 != stack.frames.size()) continue;
    out.sites[s] = std::move(sites);
    for (size_t j = 0; j + 1 < stack.frames.size(); ++j) {
      const std::pair<uint32_t, uint64_t> key{stack.frames[j], out.sites[s][j]};
      if (key.second == 0 || !looked_up.insert(key).second) continue;
      absl::StatusOr<const store::FunctionInfo*> info =
          functions->Get(profile.functions[key.first].id);
      if (!info.ok()) return info.status();
      // The call instruction ends just before the return address.
      std::vector<symbolize::SourceFrame> source =
          SourceFramesAt(symbolizer, **info, key.second - 1);
      if (!source.empty()) out.lines.emplace(key, std::move(source));
    }
  }
  return out;
}

absl::StatusOr<Profile> ExpandLines(store::Store* store, symbolize::Symbolizer* symbolizer,
                                    const ProfileQuery& query, const Profile& profile) {
  FunctionLookup functions(store);
  auto call_sites = CallSiteLinesOf(store, &functions, symbolizer, profile);
  if (!call_sites.ok()) return call_sites.status();
  // Leaf addresses are on-CPU samples' (of continuous profiles): off-CPU and wall leaves, and
  // captures', stay functions.
  absl::flat_hash_map<uint32_t, std::vector<LeafLine>> leaf_lines;
  if (query.type == v1::PROFILE_CPU && query.capture_id.empty() && symbolizer != nullptr) {
    auto addresses = SumLeafAddressesOf(store, query);
    if (!addresses.ok()) return addresses.status();
    auto lines = LeafLinesOf(&functions, symbolizer, *addresses, profile);
    if (!lines.ok()) return lines.status();
    leaf_lines = *std::move(lines);
  }

  Profile out;
  out.total = profile.total;
  out.hosts = profile.hosts;
  // One output function per distinct (name, module, file, line, inlined).
  absl::flat_hash_map<std::tuple<std::string, std::string, std::string, uint32_t, bool>, uint32_t>
      index_of;
  auto intern = [&](const ResolvedFunction& f) {
    auto [it, inserted] = index_of.try_emplace(
        std::tuple{f.name, f.module, f.file, f.line, f.inlined},
        static_cast<uint32_t>(out.functions.size()));
    if (inserted) out.functions.push_back(f);
    return it->second;
  };
  // A frame's source chain (innermost first) appended outermost first; the outermost source
  // frame is the function itself, named as the profile names it.
  auto append_chain = [&](uint32_t function, const std::vector<symbolize::SourceFrame>& chain,
                          FrameIndices* frames) {
    const ResolvedFunction& f = profile.functions[function];
    for (size_t k = chain.size(); k-- > 0;) {
      const symbolize::SourceFrame& sf = chain[k];
      ResolvedFunction line{f.id, k + 1 == chain.size() ? f.name : sf.function, f.module,
                            sf.file, sf.line, sf.inlined, /*build_id=*/std::string()};
      frames->push_back(intern(line));
    }
  };
  std::vector<uint32_t> plain(profile.functions.size(), UINT32_MAX);
  auto plain_frame = [&](uint32_t function) {
    if (plain[function] == UINT32_MAX) plain[function] = intern(profile.functions[function]);
    return plain[function];
  };
  for (size_t s = 0; s < profile.stacks.size(); ++s) {
    const ResolvedStack& stack = profile.stacks[s];
    ResolvedStack callers{stack.stack_id, stack.count, stack.truncated, {}};
    const std::vector<uint64_t>& sites = call_sites->sites[s];
    for (size_t j = 0; j + 1 < stack.frames.size(); ++j) {
      auto lines = sites.empty() ? call_sites->lines.end()
                                 : call_sites->lines.find(std::pair{stack.frames[j], sites[j]});
      if (lines == call_sites->lines.end()) {
        callers.frames.push_back(plain_frame(stack.frames[j]));
      } else {
        append_chain(stack.frames[j], lines->second, &callers.frames);
      }
    }
    if (stack.frames.empty()) {
      out.stacks.push_back(std::move(callers));
      continue;
    }
    const uint32_t leaf = stack.frames.back();
    auto leaf_it = leaf_lines.find(leaf);
    if (leaf_it == leaf_lines.end() || leaf_it->second.empty()) {
      callers.frames.push_back(plain_frame(leaf));
      out.stacks.push_back(std::move(callers));
      continue;
    }
    const std::vector<uint64_t> parts = SplitByLeafLines(stack.count, leaf_it->second);
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i] == 0) continue;
      ResolvedStack part{stack.stack_id, parts[i], stack.truncated, callers.frames};
      append_chain(leaf, leaf_it->second[i].frames, &part.frames);
      out.stacks.push_back(std::move(part));
    }
  }
  std::stable_sort(out.stacks.begin(), out.stacks.end(),
                   [](const ResolvedStack& a, const ResolvedStack& b) { return a.count > b.count; });
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
    std::vector<symbolize::SourceFrame> frames = SourceFramesAt(symbolizer, f, offset);
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

v1::TopResponse TopLinesOfStacks(const Profile& expanded, uint32_t limit) {
  v1::TopResponse response;
  response.set_total_samples(expanded.total);
  for (const std::string& n : expanded.unreachable_nodes) response.add_unreachable_nodes(n);
  std::map<std::vector<uint32_t>, uint64_t> self;  // chain (innermost first) -> samples
  for (const ResolvedStack& stack : expanded.stacks) {
    if (stack.frames.empty()) continue;
    size_t at = stack.frames.size() - 1;
    for (size_t j = stack.frames.size(); j-- > 0;) {
      if (IsLanguageFrame(expanded.functions[stack.frames[j]])) {
        at = j;
        break;
      }
    }
    std::vector<uint32_t> chain{stack.frames[at]};
    for (size_t j = at; j > 0 && expanded.functions[stack.frames[j]].inlined; --j) {
      chain.push_back(stack.frames[j - 1]);
    }
    if (expanded.functions[chain.front()].line == 0) {
      response.set_unresolved_samples(
          base::SaturatingAdd(response.unresolved_samples(), stack.count));
    }
    base::SaturatingAddTo(self[std::move(chain)], stack.count);
  }
  std::vector<const std::pair<const std::vector<uint32_t>, uint64_t>*> sorted;
  sorted.reserve(self.size());
  for (const auto& entry : self) sorted.push_back(&entry);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [](const auto* a, const auto* b) { return a->second > b->second; });
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) {
    v1::LineStat* stat = response.add_lines();
    stat->set_self(sorted[i]->second);
    for (uint32_t f : sorted[i]->first) SetFrame(expanded.functions[f], stat->add_frames());
  }
  return response;
}

}  // namespace strata::server::query
