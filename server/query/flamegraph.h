// Flame graphs of a Profile: the merged call tree (outermost frame at the root), pruned to a
// node budget, and its renderings — folded stacks ("a;b;c 123", for flamegraph.pl and
// speedscope), a self-contained interactive SVG (hover for details, click to zoom; inline
// script, no external resources), a standalone HTML page around that SVG, and nested JSON
// (d3-flame-graph layout, used by the web UI).
//
// Pure functions over values: a FlameTree owns its data and borrows nothing.
#ifndef STRATA_SERVER_QUERY_FLAMEGRAPH_H_
#define STRATA_SERVER_QUERY_FLAMEGRAPH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "server/query/profile.h"

namespace strata::server::query {

struct FlameTreeNode {
  uint32_t function = 0;  // index into FlameTree::functions
  uint32_t parent = 0;    // the root is its own parent
  uint32_t depth = 0;     // root: 0
  uint64_t total = 0;     // samples of this node and its callees
  uint64_t self = 0;      // samples with this node as leaf
  uint64_t offset = 0;    // samples left of this node at its depth (layout position)
};

struct FlameTree {
  uint64_t total = 0;
  // functions[0] is the root ("all"), functions[1] the "[truncated]" marker under which
  // stacks whose unwinding stopped early hang; the rest mirror Profile::functions.
  std::vector<ResolvedFunction> functions;
  // Depth-first pre-order, siblings by function name; nodes[0] is the root.
  std::vector<FlameTreeNode> nodes;
  uint32_t pruned = 0;    // nodes dropped by the budget (still counted in ancestors)
  uint32_t max_depth = 0;
};

inline constexpr uint32_t kDefaultFlameNodes = 16384;

// Merges the stacks of `profile` into a tree and keeps the `max_nodes` heaviest nodes
// (0: kDefaultFlameNodes). A kept node's ancestors are always kept.
FlameTree BuildFlameTree(const Profile& profile, uint32_t max_nodes);
// The same, taking the profile's functions instead of copying them (a week's profile holds
// thousands): `profile` is left with its stacks and no functions.
FlameTree BuildFlameTree(Profile&& profile, uint32_t max_nodes);

// One "outer;...;leaf count" line per stack of `profile` (never pruned), heaviest first.
// Frames are named by FrameLabel; ';' and line breaks inside names are replaced so every
// line parses. Kernel frames end in "_[k]" and JIT frames in "_[j]" (perf's stackcollapse),
// which flamegraph.pl colours.
std::string RenderFolded(const Profile& profile);

// {"name":"all","value":N,"self":S,"children":[...]} with "module" on function nodes and
// "kind" ("kernel" or "jit") on those of kernel and JIT code. Frames are named by FrameLabel;
// those with a source line also have "function", "file", "line" (and "inlined": true).
std::string RenderFlameJson(const FlameTree& tree);

// A standalone SVG document; frames narrower than 0.1 px at full width are left out. User
// frames are warm colours, kernel frames orange, JIT frames aqua (flamegraph.pl's palettes).
std::string RenderFlameSvg(const FlameTree& tree, const std::string& title);
// A standalone HTML document embedding the SVG (its script runs inline).
std::string RenderFlameHtml(const FlameTree& tree, const std::string& title);

// Escapes for JSON string contents / XML text and attributes.
std::string JsonEscape(std::string_view text);
std::string XmlEscape(std::string_view text);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_FLAMEGRAPH_H_
