#include "server/query/flamegraph.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/frame_kind.h"
#include "common/base/parallel_sort.h"

namespace strata::server::query {
namespace {

constexpr uint32_t kRootFunction = 0;
constexpr uint32_t kTruncatedFunction = 1;

// Layout of the SVG (pixels); flamegraph.pl's proportions.
constexpr int kSvgWidth = 1200;
constexpr int kFrameHeight = 16;
constexpr int kPadTop = 36;     // title and reset-zoom button
constexpr int kPadBottom = 28;  // details line
constexpr int kPadSide = 10;
constexpr double kMinFramePx = 0.1;
constexpr double kCharPx = 7.0;  // 12 px monospace-ish estimate for label fitting

struct BuildNode {
  uint32_t function;
  uint32_t parent;
  uint32_t depth;
  uint64_t total = 0;
  uint64_t self = 0;
};

// Label that fits `width_px`, flamegraph.pl style: full, shortened with "..", or nothing.
std::string FitLabel(std::string_view name, double width_px) {
  const int chars = static_cast<int>((width_px - 6) / kCharPx);
  if (chars < 3) return "";
  if (static_cast<int>(name.size()) <= chars) return std::string(name);
  return std::string(name.substr(0, chars - 2)) + "..";
}

// Colours from a stable hash of the name, so a function keeps its colour across graphs, in
// flamegraph.pl's palettes: warm for user code, orange for the kernel, aqua for JIT code.
std::string FrameColor(std::string_view name, base::FrameKind kind) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  const double v1 = static_cast<double>(h & 0xff) / 255.0;
  const double v2 = static_cast<double>((h >> 8) & 0xff) / 255.0;
  const double v3 = static_cast<double>((h >> 16) & 0xff) / 255.0;
  switch (kind) {
    case base::FrameKind::kKernel:
      return absl::StrFormat("rgb(%d,%d,0)", 190 + static_cast<int>(65 * v1),
                             90 + static_cast<int>(65 * v1));
    case base::FrameKind::kJit:
      return absl::StrFormat("rgb(%d,%d,%d)", 50 + static_cast<int>(60 * v1),
                             165 + static_cast<int>(55 * v1), 165 + static_cast<int>(55 * v1));
    case base::FrameKind::kPython:  // flamegraph.pl's "java" green for interpreted code
    case base::FrameKind::kJava:
      return absl::StrFormat("rgb(%d,%d,%d)", 50 + static_cast<int>(60 * v1),
                             180 + static_cast<int>(60 * v1), 50 + static_cast<int>(60 * v1));
    default:
      return absl::StrFormat("rgb(%d,%d,%d)", 205 + static_cast<int>(50 * v3),
                             static_cast<int>(230 * v1), static_cast<int>(55 * v2));
  }
}

// perf's stackcollapse suffixes for kernel and JIT frames in folded stacks.
const char* FoldedSuffix(base::FrameKind kind) {
  switch (kind) {
    case base::FrameKind::kKernel: return "_[k]";
    case base::FrameKind::kJit: return "_[j]";
    case base::FrameKind::kPython: return "_[p]";
    case base::FrameKind::kJava: return "_[j]";
    default: return "";
  }
}

const char* KindName(base::FrameKind kind) {
  if (kind == base::FrameKind::kKernel) return "kernel";
  if (kind == base::FrameKind::kPython) return "python";
  if (kind == base::FrameKind::kJava) return "java";
  return kind == base::FrameKind::kJit ? "jit" : "user";
}

std::string PercentText(uint64_t part, uint64_t total) {
  return total == 0 ? "0%" : absl::StrFormat("%.2f%%", 100.0 * part / total);
}

// Zoom and hover for the SVG; data-x/data-w/data-d carry each frame's layout in samples.
constexpr char kSvgScript[] = R"JS(
(function () {
  var svg = document.getElementById('strata-flame');
  var W = +svg.getAttribute('data-width'), PAD = +svg.getAttribute('data-pad');
  var CH = 7, MIN = 0.1;
  var frames = svg.querySelectorAll('g.f');
  var details = svg.querySelector('#details'), reset = svg.querySelector('#reset');
  var total = +frames[0].getAttribute('data-w');
  function fit(g, w) {
    var t = g.querySelector('text'), name = g.getAttribute('data-n');
    var n = Math.floor((w - 6) / CH);
    t.textContent = n < 3 ? '' : (name.length <= n ? name : name.substr(0, n - 2) + '..');
  }
  function zoom(z) {
    var zx = +z.getAttribute('data-x'), zw = +z.getAttribute('data-w');
    var zd = +z.getAttribute('data-d'), scale = (W - 2 * PAD) / zw;
    for (var i = 0; i < frames.length; i++) {
      var g = frames[i], x = +g.getAttribute('data-x'), w = +g.getAttribute('data-w');
      var d = +g.getAttribute('data-d'), r = g.querySelector('rect'), t = g.querySelector('text');
      var inside = d >= zd && x >= zx && x + w <= zx + zw;
      var above = d < zd && x <= zx && x + w >= zx + zw;
      var px = inside ? w * scale : (above ? W - 2 * PAD : 0);
      if (px < MIN) { g.style.display = 'none'; continue; }
      g.style.display = '';
      var left = inside ? PAD + (x - zx) * scale : PAD;
      r.setAttribute('x', left); r.setAttribute('width', px);
      t.setAttribute('x', left + 3);
      g.style.opacity = above ? 0.6 : 1;
      fit(g, px);
    }
    reset.style.display = zw < total ? '' : 'none';
  }
  for (var i = 0; i < frames.length; i++) {
    frames[i].addEventListener('click', function () { zoom(this); });
    frames[i].addEventListener('mouseover', function () {
      details.textContent = this.querySelector('title').textContent;
    });
    frames[i].addEventListener('mouseout', function () { details.textContent = ' '; });
  }
  reset.addEventListener('click', function () { zoom(frames[0]); });
})();
)JS";


// A stack's path: a leading "[truncated]" marker if the stack is truncated, then its frames'
// function indices + 2 (the tree's numbering; 0 never occurs).
size_t PathLength(const ResolvedStack& s) { return s.frames.size() + (s.truncated ? 1 : 0); }
uint32_t PathValue(const ResolvedStack& s, size_t d) {
  if (s.truncated) return d == 0 ? kTruncatedFunction : s.frames[d - 1] + 2;
  return s.frames[d] + 2;
}

// The paths of a profile's stacks in lexicographic order, read from the stacks where they lie
// (copying them into an arena of their own cost more than the reads it saved).
class SortedPaths {
 public:
  explicit SortedPaths(const Profile& profile);

  size_t count() const { return order_.size(); }
  // The stack of the k-th path (its values: PathLength, PathValue).
  const ResolvedStack& stack(size_t k) const { return stacks_[order_[k]]; }
  void Prefetch(size_t k) const { __builtin_prefetch(&stacks_[order_[k]]); }
  // Length of the common prefix of paths a and b.
  size_t CommonPrefix(size_t a, size_t b) const {
    const ResolvedStack& sa = stack(a);
    const ResolvedStack& sb = stack(b);
    if (sa.truncated != sb.truncated) return 0;  // the marker against a frame
    const size_t len = std::min(sa.frames.size(), sb.frames.size());
    const uint32_t* fa = sa.frames.data();
    const uint32_t* fb = sb.frames.data();
    size_t i = 0;
    while (i < len && fa[i] == fb[i]) ++i;
    return i + (sa.truncated ? 1 : 0);
  }

 private:
  const std::vector<ResolvedStack>& stacks_;
  std::vector<uint32_t> order_;  // profile stack of the k-th path
};

SortedPaths::SortedPaths(const Profile& profile) : stacks_(profile.stacks) {
  const size_t n = stacks_.size();
  // Sort keys: the first 2K path values packed K to a word, B bits each, most significant
  // first; a position past the end packs as 0, below every value, so shorter sorts first as
  // in lexicographic order. Ties (equal first 2K values) compare the rest of the paths.
  const uint64_t max_value = profile.functions.size() + 1;
  const int bits = std::max(1, static_cast<int>(std::bit_width(max_value)));
  const size_t per_word = bits > 32 ? 1 : static_cast<size_t>(64 / bits);
  struct Item {
    uint64_t k0, k1;
    uint32_t stack;
  };
  std::vector<Item> items(n);
  for (size_t i = 0; i < n; ++i) {
    const ResolvedStack& s = stacks_[i];
    const size_t len = PathLength(s);
    auto pack = [&](size_t from) {
      uint64_t key = 0;
      for (size_t j = from; j < from + per_word; ++j) {
        key = per_word == 1 ? 0 : key << bits;
        key |= j < len ? PathValue(s, j) : 0;
      }
      return key;
    };
    items[i] = {pack(0), pack(per_word), static_cast<uint32_t>(i)};
  }
  const size_t packed = 2 * per_word;
  base::SortOnTwoThreads(items.begin(), items.end(), [&](const Item& a, const Item& b) {
    if (a.k0 != b.k0) return a.k0 < b.k0;
    if (a.k1 != b.k1) return a.k1 < b.k1;
    const ResolvedStack& sa = stacks_[a.stack];
    const ResolvedStack& sb = stacks_[b.stack];
    const size_t na = PathLength(sa), nb = PathLength(sb);
    if (na <= packed || nb <= packed) return na < nb;
    // The first values are equal, so both or neither start with the marker: compare the
    // frames after the packed ones (values + 2 keep their order).
    const size_t skip = packed - (sa.truncated ? 1 : 0);
    return std::lexicographical_compare(sa.frames.begin() + skip, sa.frames.end(),
                                        sb.frames.begin() + skip, sb.frames.end());
  });
  order_.reserve(n);
  for (const Item& item : items) order_.push_back(item.stack);
}

// The merged call tree of `profile`, already pruned to its `max_nodes` heaviest nodes
// (heavier first, then shallower, then created earlier — creation order being a walk of the
// stacks in lexicographic order), root first, every parent before its children.
//
// Visiting paths in lexicographic order, a path shares its nodes with the previous one up to
// their common prefix. The nodes a path creates below the common prefix with the *next* path
// belong to it alone: such a chain has the path's count as every node's total, so it is
// kept as one record and only its kept nodes are materialized. On profiles whose stacks
// share little beyond the first frames, that leaves a small fraction of the nodes to build.
std::vector<BuildNode> MergeAndPrune(const Profile& profile, uint32_t max_nodes,
                                     uint32_t* pruned) {
  const SortedPaths paths(profile);
  const size_t n = paths.count();
  struct Shared {
    BuildNode node;
    uint64_t index;  // creation order (the root is 0)
  };
  struct Chain {
    uint32_t path;
    uint32_t parent;      // in `shared`
    uint32_t first_depth;  // depth of its first node; it ends at the path's length
    uint32_t length;
    uint64_t count;
    uint64_t first_index;  // creation order of its first node
  };
  std::vector<Shared> shared;
  std::vector<Chain> chains;
  shared.push_back({{kRootFunction, 0, 0, profile.total, 0}, 0});
  std::vector<uint32_t> path_nodes{0};  // shared node at each depth of the current path
  uint64_t created = 1;
  size_t common = 0;  // with the previous path
  for (size_t k = 0; k < n; ++k) {
    // Paths lie in the profile's order, not this one: fetch a few ahead.
    if (k + 4 < n) paths.Prefetch(k + 4);
    const ResolvedStack& stack = paths.stack(k);
    const size_t len = PathLength(stack);
    const size_t next = k + 1 < n ? paths.CommonPrefix(k, k + 1) : 0;
    const size_t shared_end = std::max(common, std::min(len, next));  // deepest shared depth
    path_nodes.resize(common + 1);
    for (size_t d = common + 1; d <= shared_end; ++d) {
      const BuildNode node{PathValue(stack, d - 1), path_nodes.back(), static_cast<uint32_t>(d)};
      shared.push_back({node, created++});
      path_nodes.push_back(static_cast<uint32_t>(shared.size() - 1));
    }
    for (size_t d = 1; d <= shared_end; ++d) shared[path_nodes[d]].node.total += stack.count;
    if (shared_end < len) {
      chains.push_back({static_cast<uint32_t>(k), path_nodes[shared_end],
                        static_cast<uint32_t>(shared_end + 1),
                        static_cast<uint32_t>(len - shared_end), stack.count, created});
      created += len - shared_end;
    } else {
      shared[path_nodes[len]].node.self += stack.count;
    }
    common = next;
  }

  // How many nodes of each chain are kept, and which shared nodes: all when within budget.
  const uint64_t all_nodes = created - 1;
  std::vector<uint32_t> chain_kept(chains.size());
  std::vector<uint8_t> shared_kept(shared.size(), 1);
  for (size_t c = 0; c < chains.size(); ++c) chain_kept[c] = chains[c].length;
  *pruned = 0;
  if (all_nodes > max_nodes) {
    *pruned = static_cast<uint32_t>(all_nodes - max_nodes);
    // The threshold total T: fewer than max_nodes nodes are heavier, at least max_nodes are
    // at least as heavy (weighted quickselect over shared nodes and chains).
    struct Group {
      uint64_t total;
      uint64_t weight;
    };
    std::vector<Group> groups;
    groups.reserve(shared.size() + chains.size());
    for (size_t i = 1; i < shared.size(); ++i) groups.push_back({shared[i].node.total, 1});
    for (const Chain& c : chains) groups.push_back({c.count, c.length});
    uint64_t wanted = max_nodes;
    uint64_t threshold = 0;
    auto lo = groups.begin(), hi = groups.end();
    while (lo != hi) {
      const uint64_t pivot = lo[(hi - lo) / 2].total;
      auto gt_end = std::partition(lo, hi, [&](const Group& g) { return g.total > pivot; });
      auto eq_end = std::partition(gt_end, hi, [&](const Group& g) { return g.total == pivot; });
      uint64_t w_gt = 0, w_eq = 0;
      for (auto it = lo; it != gt_end; ++it) w_gt += it->weight;
      for (auto it = gt_end; it != eq_end; ++it) w_eq += it->weight;
      if (wanted <= w_gt) {
        hi = gt_end;
      } else if (wanted <= w_gt + w_eq) {
        threshold = pivot;
        wanted -= w_gt;  // nodes of total == T still to keep
        break;
      } else {
        wanted -= w_gt + w_eq;
        lo = eq_end;
      }
    }
    // Among nodes of total T, the shallowest, then earliest created, are kept.
    struct Tie {
      uint64_t depth, index;
      uint32_t owner;  // shared node, or chains: shared.size() + chain
      bool operator<(const Tie& o) const {
        return depth != o.depth ? depth < o.depth : index < o.index;
      }
    };
    std::vector<Tie> ties;
    for (size_t i = 1; i < shared.size(); ++i) {
      if (shared[i].node.total < threshold) shared_kept[i] = 0;
      if (shared[i].node.total == threshold) {
        shared_kept[i] = 0;
        ties.push_back({shared[i].node.depth, shared[i].index, static_cast<uint32_t>(i)});
      }
    }
    for (size_t c = 0; c < chains.size(); ++c) {
      const Chain& chain = chains[c];
      if (chain.count > threshold) continue;
      chain_kept[c] = 0;
      if (chain.count < threshold) continue;
      for (uint32_t j = 0; j < chain.length; ++j) {
        ties.push_back({chain.first_depth + j, chain.first_index + j,
                        static_cast<uint32_t>(shared.size() + c)});
      }
    }
    if (wanted < ties.size()) {
      std::nth_element(ties.begin(), ties.begin() + wanted, ties.end());
      ties.resize(wanted);
    }
    // A chain's kept nodes are its shallowest ones (same total, increasing depth).
    for (const Tie& t : ties) {
      if (t.owner < shared.size()) {
        shared_kept[t.owner] = 1;
      } else {
        ++chain_kept[t.owner - shared.size()];
      }
    }
  }

  // Materialize the kept nodes: shared ones in creation order (parents first), then chains.
  std::vector<BuildNode> nodes;
  std::vector<uint32_t> renumber(shared.size(), 0);
  for (size_t i = 0; i < shared.size(); ++i) {
    if (!shared_kept[i]) continue;
    renumber[i] = static_cast<uint32_t>(nodes.size());
    BuildNode node = shared[i].node;
    node.parent = renumber[node.parent];
    nodes.push_back(node);
  }
  for (size_t c = 0; c < chains.size(); ++c) {
    const Chain& chain = chains[c];
    const ResolvedStack& stack = paths.stack(chain.path);
    uint32_t parent = renumber[chain.parent];
    for (uint32_t j = 0; j < chain_kept[c]; ++j) {
      const uint32_t depth = chain.first_depth + j;
      const bool leaf = j + 1 == chain.length;
      nodes.push_back(
          {PathValue(stack, depth - 1), parent, depth, chain.count, leaf ? chain.count : 0});
      parent = static_cast<uint32_t>(nodes.size() - 1);
    }
  }
  return nodes;
}

}  // namespace

namespace {

// Whether any of the 8 bytes in `word` is a control character, '"' or '\\' (bit tricks: a
// byte is flagged when it is below 0x20 or equal to either, bytes at or above 0x80 never).
inline bool HasJsonSpecial(uint64_t word) {
  constexpr uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  auto zero_byte = [](uint64_t v) { return (v - kOnes) & ~v & kHigh; };
  const uint64_t below_space = (word - kOnes * 0x20) & ~word & kHigh;
  return (below_space | zero_byte(word ^ (kOnes * '"')) | zero_byte(word ^ (kOnes * '\\'))) != 0;
}

void AppendJsonEscaped(std::string_view text, std::string* out) {
  // Names rarely hold anything to escape: skip 8 bytes at a time to the first that may need
  // it, then copy the runs between such bytes whole.
  size_t i = 0;
  for (; i + 8 <= text.size(); i += 8) {
    uint64_t word;
    std::memcpy(&word, text.data() + i, 8);
    if (HasJsonSpecial(word)) break;
  }
  size_t run = 0;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20) continue;
    out->append(text.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\t': *out += "\\t"; break;
      default: absl::StrAppendFormat(out, "\\u%04x", c);
    }
  }
  out->append(text.data() + run, text.size() - run);
}

}  // namespace

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendJsonEscaped(text, &out);
  return out;
}

std::string XmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        // Control characters are not allowed in XML 1.0.
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t') out.push_back(c);
    }
  }
  return out;
}

namespace {

// BuildFlameTree, taking the profile's functions from `movable` if given (the profile's own),
// else copying them.
FlameTree BuildTree(const Profile& profile, uint32_t max_nodes,
                    std::vector<ResolvedFunction>* movable) {
  if (max_nodes == 0) max_nodes = kDefaultFlameNodes;
  FlameTree tree;
  tree.total = profile.total;
  std::vector<BuildNode> nodes = MergeAndPrune(profile, max_nodes, &tree.pruned);
  tree.functions.reserve(profile.functions.size() + 2);
  tree.functions.emplace_back().name = "all";
  tree.functions.emplace_back().name = "[truncated]";
  if (movable != nullptr) {
    tree.functions.insert(tree.functions.end(), std::make_move_iterator(movable->begin()),
                          std::make_move_iterator(movable->end()));
    movable->clear();
  } else {
    tree.functions.insert(tree.functions.end(), profile.functions.begin(),
                          profile.functions.end());
  }

  // Children, grouped by parent (counting sort; no per-node allocations).
  std::vector<uint32_t> first_child(nodes.size() + 1, 0);
  for (uint32_t i = 1; i < nodes.size(); ++i) ++first_child[nodes[i].parent + 1];
  for (size_t i = 1; i < first_child.size(); ++i) first_child[i] += first_child[i - 1];
  std::vector<uint32_t> children(first_child.back());
  {
    std::vector<uint32_t> fill(first_child.begin(), first_child.end() - 1);
    for (uint32_t i = 1; i < nodes.size(); ++i) children[fill[nodes[i].parent]++] = i;
  }

  // Pre-order with siblings by name (flamegraph.pl's order), laying out offsets.
  tree.nodes.reserve(nodes.size());
  struct Item {
    uint32_t node, parent_out;
    uint64_t offset;
  };
  std::vector<Item> todo{{0, 0, 0}};
  while (!todo.empty()) {
    Item item = todo.back();
    todo.pop_back();
    const BuildNode& n = nodes[item.node];
    const uint32_t out = static_cast<uint32_t>(tree.nodes.size());
    tree.nodes.push_back({n.function, item.node == 0 ? 0 : item.parent_out, n.depth, n.total,
                          n.self, item.offset});
    tree.max_depth = std::max(tree.max_depth, n.depth);
    const auto begin = children.begin() + first_child[item.node];
    const auto end_it = children.begin() + first_child[item.node + 1];
    std::sort(begin, end_it, [&](uint32_t a, uint32_t b) {
      const ResolvedFunction& fa = tree.functions[nodes[a].function];
      const ResolvedFunction& fb = tree.functions[nodes[b].function];
      return std::tie(fa.name, fa.file, fa.line, fa.inlined, nodes[a].function) <
             std::tie(fb.name, fb.file, fb.line, fb.inlined, nodes[b].function);
    });
    // Children from the left edge (self and pruned samples leave a gap on the right), pushed
    // in reverse so the first sibling is emitted first.
    const size_t pushed = todo.size();
    uint64_t x = item.offset;
    for (auto it = begin; it != end_it; ++it) {
      todo.push_back({*it, out, x});
      x += nodes[*it].total;
    }
    std::reverse(todo.begin() + pushed, todo.end());
  }
  return tree;
}

}  // namespace

FlameTree BuildFlameTree(const Profile& profile, uint32_t max_nodes) {
  return BuildTree(profile, max_nodes, nullptr);
}

FlameTree BuildFlameTree(Profile&& profile, uint32_t max_nodes) {
  return BuildTree(profile, max_nodes, &profile.functions);
}

std::string RenderFolded(const Profile& profile) {
  auto clean = [](std::string_view name, std::string* out) {
    for (char c : name) out->push_back(c == ';' ? ':' : (c == '\n' || c == '\r') ? ' ' : c);
  };
  // Stacks that differ only in what the text does not show (call sites, two functions of one
  // label) are one line, as perf's stackcollapse writes them: tools that sort or diff the
  // lines would otherwise see a fraction of the stack's weight.
  std::vector<std::pair<std::string, uint64_t>> lines;
  absl::flat_hash_map<std::string, size_t> line_of;
  std::string text;
  for (const ResolvedStack& stack : profile.stacks) {
    text.clear();
    bool first = true;
    if (stack.truncated) {
      text += "[truncated]";
      first = false;
    }
    for (uint32_t f : stack.frames) {
      if (!first) text.push_back(';');
      first = false;
      clean(FrameLabel(profile.functions[f]), &text);
      text += FoldedSuffix(base::FrameKindOf(profile.functions[f].module));
    }
    if (first) text += "[unknown]";
    auto [it, added] = line_of.try_emplace(text, lines.size());
    if (added) {
      lines.emplace_back(text, stack.count);
    } else {
      lines[it->second].second += stack.count;
    }
  }
  std::string out;
  for (const auto& [line, count] : lines) absl::StrAppend(&out, line, " ", count, "\n");
  return out;
}

std::string RenderFlameJson(const FlameTree& tree) {
  std::string out;
  if (tree.nodes.empty()) return "{}";
  // Each function's fields up to "value" are the same in every node it has: written once per
  // function (a tree holds each of many functions at many places), then copied per node.
  std::vector<uint32_t> fields_at(tree.functions.size(), UINT32_MAX);
  std::string fields;  // fragments of the functions in use, back to back
  std::vector<uint32_t> fields_end;
  for (const FlameTreeNode& n : tree.nodes) {
    uint32_t& at = fields_at[n.function];
    if (at != UINT32_MAX) continue;
    at = static_cast<uint32_t>(fields_end.size());
    const ResolvedFunction& f = tree.functions[n.function];
    fields += "{\"name\":\"";
    // The label is the name alone unless the frame has a source line or was inlined.
    if (f.file.empty() && !f.inlined) {
      AppendJsonEscaped(f.name, &fields);
    } else {
      AppendJsonEscaped(FrameLabel(f), &fields);
    }
    fields += '"';
    if (!f.module.empty()) {
      fields += ",\"module\":\"";
      AppendJsonEscaped(f.module, &fields);
      fields += '"';
    }
    if (!f.file.empty()) {
      fields += ",\"function\":\"";
      AppendJsonEscaped(f.name, &fields);
      fields += "\",\"file\":\"";
      AppendJsonEscaped(f.file, &fields);
      absl::StrAppend(&fields, "\",\"line\":", f.line);
    }
    if (f.inlined) fields += ",\"inlined\":true";
    // User code, the common case, goes without (readers of earlier output see no change).
    if (const base::FrameKind kind = base::FrameKindOf(f.module); kind != base::FrameKind::kUser) {
      absl::StrAppend(&fields, ",\"kind\":\"", KindName(kind), "\"");
    }
    fields += ",\"value\":";
    fields_end.push_back(static_cast<uint32_t>(fields.size()));
  }
  // Each node: its function's fields, two numbers of at most 20 digits, 24 bytes of keys and
  // brackets, a comma, and at most two closing brackets per node closed before it: sized at
  // once and written through a pointer (a week's tree is megabytes; appended piece by piece,
  // each piece paid a capacity check and a length update).
  size_t bytes = 2;
  for (const FlameTreeNode& n : tree.nodes) {
    const uint32_t k = fields_at[n.function];
    bytes += fields_end[k] - (k == 0 ? 0 : fields_end[k - 1]) + 2 * 20 + 24 + 1 + 2;
  }
  out.resize(bytes);
  char* p = out.data();
  auto put = [&p](std::string_view text) {
    std::memcpy(p, text.data(), text.size());
    p += text.size();
  };
  auto put_number = [&p](uint64_t v) { p = std::to_chars(p, p + 20, v).ptr; };
  // Pre-order: close objects when the next node is not deeper than the open ones.
  std::vector<uint32_t> open;  // depths of open nodes
  for (size_t i = 0; i < tree.nodes.size(); ++i) {
    const FlameTreeNode& n = tree.nodes[i];
    while (!open.empty() && open.back() >= n.depth) {
      put("]}");
      open.pop_back();
    }
    if (i > 0 && p[-1] != '[') *p++ = ',';
    const uint32_t k = fields_at[n.function];
    const uint32_t begin = k == 0 ? 0 : fields_end[k - 1];
    put(std::string_view(fields).substr(begin, fields_end[k] - begin));
    put_number(n.total);
    put(",\"self\":");
    put_number(n.self);
    put(",\"children\":[");
    open.push_back(n.depth);
  }
  while (!open.empty()) {
    put("]}");
    open.pop_back();
  }
  out.resize(p - out.data());
  return out;
}

std::string RenderFlameSvg(const FlameTree& tree, const std::string& title) {
  const int height = kPadTop + static_cast<int>(tree.max_depth + 1) * kFrameHeight + kPadBottom;
  const double scale =
      tree.total == 0 ? 0 : static_cast<double>(kSvgWidth - 2 * kPadSide) / tree.total;
  std::string out;
  absl::StrAppend(&out, "<?xml version=\"1.0\" standalone=\"no\"?>\n");
  absl::StrAppendFormat(
      &out,
      "<svg id=\"strata-flame\" version=\"1.1\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" data-width=\"%d\" data-pad=\"%d\" "
      "xmlns=\"http://www.w3.org/2000/svg\">\n",
      kSvgWidth, height, kSvgWidth, height, kSvgWidth, kPadSide);
  absl::StrAppend(
      &out,
      "<style>text{font-family:Verdana,sans-serif;font-size:12px;fill:#000}"
      "g.f:hover rect{stroke:#000;stroke-width:0.5;cursor:pointer}"
      "#title{font-size:17px;text-anchor:middle}#reset{cursor:pointer}</style>\n");
  absl::StrAppendFormat(&out, "<rect width=\"100%%\" height=\"100%%\" fill=\"#f8f8f0\"/>\n");
  absl::StrAppendFormat(&out, "<text id=\"title\" x=\"%d\" y=\"22\">%s</text>\n", kSvgWidth / 2,
                        XmlEscape(title));
  absl::StrAppendFormat(&out,
                        "<text id=\"reset\" x=\"%d\" y=\"22\" style=\"display:none\">"
                        "Reset Zoom</text>\n",
                        kPadSide);
  absl::StrAppendFormat(&out, "<text id=\"details\" x=\"%d\" y=\"%d\"> </text>\n", kPadSide,
                        height - 10);
  for (const FlameTreeNode& n : tree.nodes) {
    const double width = n.total * scale;
    if (width < kMinFramePx && &n != &tree.nodes[0]) continue;
    const ResolvedFunction& f = tree.functions[n.function];
    const double x = kPadSide + n.offset * scale;
    const int y = height - kPadBottom - static_cast<int>(n.depth + 1) * kFrameHeight;
    const std::string label = FrameLabel(f);
    const std::string name = XmlEscape(label);
    absl::StrAppendFormat(&out,
                          "<g class=\"f\" data-x=\"%d\" data-w=\"%d\" data-d=\"%d\" "
                          "data-n=\"%s\"><title>%s (%d samples, %s)%s</title>",
                          n.offset, n.total, n.depth, name, name, n.total,
                          PercentText(n.total, tree.total),
                          f.module.empty() ? "" : absl::StrCat(" ", XmlEscape(f.module)));
    absl::StrAppendFormat(&out,
                          "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" rx=\"2\" "
                          "fill=\"%s\"/><text x=\"%.1f\" y=\"%d\">%s</text></g>\n",
                          x, y, width, kFrameHeight - 1,
                          n.depth == 0 ? "rgb(235,200,120)"
                                       : FrameColor(f.name, base::FrameKindOf(f.module)),
                          x + 3,
                          y + kFrameHeight - 4, XmlEscape(FitLabel(label, width)));
  }
  absl::StrAppend(&out, "<script type=\"text/ecmascript\"><![CDATA[", kSvgScript,
                  "]]></script>\n</svg>\n");
  return out;
}

std::string RenderFlameHtml(const FlameTree& tree, const std::string& title) {
  std::string svg = RenderFlameSvg(tree, title);
  // Drop the XML declaration: not allowed inside HTML.
  svg.erase(0, svg.find("<svg"));
  return absl::StrCat("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>",
                      XmlEscape(title),
                      "</title><style>body{margin:0;background:#f8f8f0}</style></head><body>\n",
                      svg, "</body></html>\n");
}

}  // namespace strata::server::query
