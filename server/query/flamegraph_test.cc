#include "server/query/flamegraph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "server/query/diff.h"
#include "server/query/pprof.h"

namespace strata::server {
namespace {

using ::testing::HasSubstr;

// main > a > {b: 6, c: 3}, main > d: 1 (truncated stack [truncated] > x: 2).
Profile SmallProfile() {
  Profile p;
  for (const char* name : {"main", "a", "b", "c", "d", "x"}) {
    p.functions.push_back({p.functions.size() + 100, name, "/bin/m"});
  }
  p.stacks = {{1, 6, false, {0, 1, 2}}, {2, 3, false, {0, 1, 3}}, {3, 2, true, {5}},
              {4, 1, false, {0, 4}}};
  p.total = 12;
  return p;
}

TEST(FlameTreeTest, MergesStacksInPreOrderWithOffsets) {
  FlameTree tree = BuildFlameTree(SmallProfile(), 0);
  ASSERT_EQ(tree.nodes.size(), 8u);  // all, [truncated], x, main, a, b, c, d
  EXPECT_EQ(tree.nodes[0].total, 12u);
  std::vector<std::string> names;
  for (const auto& n : tree.nodes) names.push_back(tree.functions[n.function].name);
  EXPECT_THAT(names, testing::ElementsAre("all", "[truncated]", "x", "main", "a", "b", "c", "d"));
  EXPECT_EQ(tree.nodes[3].offset, 2u);  // main follows [truncated] (2 samples)
  EXPECT_EQ(tree.nodes[6].offset, 8u);  // c follows b within a
  EXPECT_EQ(tree.nodes[5].self, 6u);
  EXPECT_EQ(tree.max_depth, 3u);
  EXPECT_EQ(tree.nodes[4].parent, 3u);
}

TEST(FlameTreeTest, PruningKeepsHeaviestConnectedNodes) {
  FlameTree tree = BuildFlameTree(SmallProfile(), 3);  // main (10), a (9), b (6)
  EXPECT_EQ(tree.pruned, 4u);
  std::vector<std::string> names;
  for (const auto& n : tree.nodes) names.push_back(tree.functions[n.function].name);
  EXPECT_THAT(names, testing::ElementsAre("all", "main", "a", "b"));
  EXPECT_EQ(tree.nodes[1].total, 10u);  // pruned children still count
}

// The straightforward merge (every node materialized, pruned by nth_element over all of
// them): BuildFlameTree must produce exactly its trees.
constexpr uint32_t kRootFunction = 0;
constexpr uint32_t kTruncatedFunction = 1;
struct BuildNode {
  uint32_t function;
  uint32_t parent;
  uint32_t depth;
  uint64_t total = 0;
  uint64_t self = 0;
};

FlameTree ReferenceBuildFlameTree(const Profile& profile, uint32_t max_nodes) {
  if (max_nodes == 0) max_nodes = kDefaultFlameNodes;
  FlameTree tree;
  tree.total = profile.total;
  tree.functions.reserve(profile.functions.size() + 2);
  tree.functions.push_back({0, "all", ""});
  tree.functions.push_back({0, "[truncated]", ""});
  tree.functions.insert(tree.functions.end(), profile.functions.begin(), profile.functions.end());

  // Merge stacks into a tree: visiting stacks in lexicographic order of their frame lists,
  // a stack shares its nodes with the previous one up to their common prefix, so no hash
  // lookups per frame are needed (they dominated on large profiles).
  auto path_of = [&](const ResolvedStack& s, size_t i) -> uint32_t {
    // The "[truncated]" marker is a leading pseudo-frame; frames are offset by 2.
    if (s.truncated) return i == 0 ? kTruncatedFunction : s.frames[i - 1] + 2;
    return s.frames[i] + 2;
  };
  auto path_size = [](const ResolvedStack& s) { return s.frames.size() + (s.truncated ? 1 : 0); };
  std::vector<uint32_t> order(profile.stacks.size());
  for (uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const ResolvedStack& sa = profile.stacks[a];
    const ResolvedStack& sb = profile.stacks[b];
    const size_t na = path_size(sa), nb = path_size(sb);
    for (size_t i = 0; i < na && i < nb; ++i) {
      const uint32_t fa = path_of(sa, i), fb = path_of(sb, i);
      if (fa != fb) return fa < fb;
    }
    return na < nb;
  });
  std::vector<BuildNode> nodes;
  nodes.push_back({kRootFunction, 0, 0, profile.total, 0});
  std::vector<uint32_t> path_nodes{0};  // node at each depth of the previous stack
  const ResolvedStack* previous = nullptr;
  for (uint32_t index : order) {
    const ResolvedStack& stack = profile.stacks[index];
    const size_t n = path_size(stack);
    size_t common = 0;
    if (previous != nullptr) {
      const size_t np = path_size(*previous);
      while (common < n && common < np && path_of(stack, common) == path_of(*previous, common)) {
        ++common;
      }
    }
    path_nodes.resize(common + 1);
    for (size_t i = 0; i < n; ++i) {
      if (i >= common) {
        const uint32_t parent = path_nodes.back();
        nodes.push_back({path_of(stack, i), parent, static_cast<uint32_t>(i + 1), 0, 0});
        path_nodes.push_back(static_cast<uint32_t>(nodes.size() - 1));
      }
      nodes[path_nodes[i + 1]].total += stack.count;
    }
    nodes[path_nodes[n]].self += stack.count;
    previous = &stack;
  }

  // Keep the heaviest nodes. A parent is at least as heavy as its child and shallower, so
  // this order never keeps a node without its parent.
  std::vector<uint8_t> keep(nodes.size(), 1);
  if (nodes.size() - 1 > max_nodes) {
    std::vector<uint32_t> order(nodes.size() - 1);
    for (uint32_t i = 0; i < order.size(); ++i) order[i] = i + 1;
    std::nth_element(order.begin(), order.begin() + max_nodes, order.end(),
                     [&](uint32_t a, uint32_t b) {
                       if (nodes[a].total != nodes[b].total) return nodes[a].total > nodes[b].total;
                       if (nodes[a].depth != nodes[b].depth) return nodes[a].depth < nodes[b].depth;
                       return a < b;
                     });
    for (size_t i = max_nodes; i < order.size(); ++i) keep[order[i]] = 0;
    tree.pruned = static_cast<uint32_t>(order.size() - max_nodes);
  }

  // Children of kept nodes, grouped by parent (counting sort; no per-node allocations).
  std::vector<uint32_t> first_child(nodes.size() + 1, 0);
  for (uint32_t i = 1; i < nodes.size(); ++i) {
    if (keep[i]) ++first_child[nodes[i].parent + 1];
  }
  for (size_t i = 1; i < first_child.size(); ++i) first_child[i] += first_child[i - 1];
  std::vector<uint32_t> children(first_child.back());
  {
    std::vector<uint32_t> fill(first_child.begin(), first_child.end() - 1);
    for (uint32_t i = 1; i < nodes.size(); ++i) {
      if (keep[i]) children[fill[nodes[i].parent]++] = i;
    }
  }

  // Pre-order with siblings by name (flamegraph.pl's order), laying out offsets.
  tree.nodes.reserve(nodes.size() - tree.pruned);
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
      const std::string& na = tree.functions[nodes[a].function].name;
      const std::string& nb = tree.functions[nodes[b].function].name;
      return na != nb ? na < nb : nodes[a].function < nodes[b].function;
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

// Random profiles: paths through a small call tree (so prefixes are shared), some truncated,
// some empty, small counts (many ties), and distinct functions sharing a name.
// Deep stacks over many functions also exercise the comparison past the packed sort keys.
Profile RandomProfile(std::mt19937_64& rng, size_t stacks, bool deep) {
  Profile p;
  const size_t functions = deep ? 2 + rng() % 5000 : 2 + rng() % 40;
  for (size_t i = 0; i < functions; ++i) {
    p.functions.push_back({i + 1, "f" + std::to_string(i % (functions / 2 + 1)), "/bin/m"});
  }
  std::set<std::pair<bool, std::vector<uint32_t>>> seen;
  for (size_t s = 0; s < stacks; ++s) {
    ResolvedStack stack{s + 1, 1 + rng() % 4, rng() % 5 == 0, {}};
    const size_t depth = rng() % (deep ? 40 : 9);
    uint32_t f = 0;
    for (size_t d = 0; d < depth; ++d) {
      f = static_cast<uint32_t>((f * 3 + rng() % 3) % functions);
      stack.frames.push_back(f);
    }
    if (!seen.insert({stack.truncated, stack.frames}).second) continue;  // stacks are distinct
    p.total += stack.count;
    p.stacks.push_back(std::move(stack));
  }
  return p;
}

TEST(FlameTreeTest, MatchesReferenceMergeOnRandomProfiles) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    const Profile p = RandomProfile(rng, 1 + rng() % 200, round % 3 == 0);
    for (uint32_t max_nodes : {0u, 1u, 2u, 3u, 7u, 20u, 64u, 500u}) {
      const FlameTree want = ReferenceBuildFlameTree(p, max_nodes);
      const FlameTree got = BuildFlameTree(p, max_nodes);
      ASSERT_EQ(got.total, want.total);
      ASSERT_EQ(got.pruned, want.pruned) << round << " " << max_nodes;
      ASSERT_EQ(got.max_depth, want.max_depth) << round << " " << max_nodes;
      ASSERT_EQ(got.nodes.size(), want.nodes.size()) << round << " " << max_nodes;
      for (size_t i = 0; i < want.nodes.size(); ++i) {
        const FlameTreeNode& a = got.nodes[i];
        const FlameTreeNode& b = want.nodes[i];
        ASSERT_TRUE(a.function == b.function && a.parent == b.parent && a.depth == b.depth &&
                    a.total == b.total && a.self == b.self && a.offset == b.offset)
            << "round " << round << " max_nodes " << max_nodes << " node " << i;
      }
    }
  }
}

TEST(FlameTreeTest, Renderings) {
  const Profile p = SmallProfile();
  EXPECT_EQ(RenderFolded(p), "main;a;b 6\nmain;a;c 3\n[truncated];x 2\nmain;d 1\n");
  FlameTree tree = BuildFlameTree(p, 0);
  EXPECT_THAT(RenderFlameJson(tree),
              HasSubstr("{\"name\":\"b\",\"module\":\"/bin/m\",\"value\":6,\"self\":6,"
                        "\"children\":[]},{\"name\":\"c\""));
  const std::string svg = RenderFlameSvg(tree, "t <&>");
  EXPECT_THAT(svg, HasSubstr("<text id=\"title\" x=\"600\" y=\"22\">t &lt;&amp;&gt;</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>b (6 samples, 50.00%) /bin/m</title>"));
  EXPECT_THAT(RenderFlameHtml(tree, "t"), testing::StartsWith("<!DOCTYPE html>"));
}

TEST(DiffTest, ComparesShares) {
  Profile base = SmallProfile();
  Profile now = SmallProfile();
  now.stacks[0].count = 2;  // b: 6/12 -> 2/8
  now.total = 8;
  ProfileDiff d = DiffProfiles(base, now, 10);
  ASSERT_FALSE(d.functions.empty());
  EXPECT_EQ(d.functions[0].function.name, "b");
  EXPECT_NEAR(d.functions[0].self_delta_pct, 25.0 - 50.0, 1e-9);
  EXPECT_EQ(d.paths[0].frames.back().name, "b");
  EXPECT_EQ(d.paths[0].base_samples, 6u);
  EXPECT_EQ(d.paths[0].samples, 2u);
}

// The plain diff (a string key per path): DiffProfiles must produce exactly its results.
double RefShare(uint64_t part, uint64_t total) {
  return total == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(total);
}

std::string RefFunctionKey(const ResolvedFunction& f) {
  std::string key = f.name;
  key.push_back('\0');
  key += f.module;
  return key;
}

// Keeps the `limit` largest by `magnitude`, sorted, dropping zero changes.
template <typename T, typename F>
void RefKeepLargest(std::vector<T>* rows, size_t limit, F magnitude) {
  std::erase_if(*rows, [&](const T& r) { return magnitude(r) == 0; });
  auto cmp = [&](const T& a, const T& b) { return magnitude(a) > magnitude(b); };
  if (rows->size() > limit) {
    std::nth_element(rows->begin(), rows->begin() + limit, rows->end(), cmp);
    rows->resize(limit);
  }
  std::stable_sort(rows->begin(), rows->end(), cmp);
}

ProfileDiff ReferenceDiffProfiles(const Profile& base, const Profile& current, size_t limit) {
  ProfileDiff diff;
  diff.base_total = base.total;
  diff.total = current.total;

  // A dense key per (name, module) over both profiles: rows of the function table, and the
  // alphabet of path keys (so path keys stay short).
  absl::flat_hash_map<std::string, uint32_t> function_row;
  auto global_ids = [&](const Profile& p) {
    std::vector<uint32_t> ids(p.functions.size());
    for (size_t i = 0; i < p.functions.size(); ++i) {
      auto [it, inserted] = function_row.try_emplace(RefFunctionKey(p.functions[i]),
                                                     diff.functions.size());
      if (inserted) diff.functions.push_back({p.functions[i]});
      ids[i] = it->second;
    }
    return ids;
  };
  const std::vector<uint32_t> base_ids = global_ids(base);
  const std::vector<uint32_t> current_ids = global_ids(current);

  auto add_functions = [&](const Profile& p, const std::vector<uint32_t>& ids, bool is_base) {
    for (const FunctionTotals& t : TopFunctions(p, false)) {
      FunctionChange& row = diff.functions[ids[t.function]];
      (is_base ? row.base_self : row.self) += t.self;
      (is_base ? row.base_total : row.total) += t.total;
    }
  };
  add_functions(base, base_ids, true);
  add_functions(current, current_ids, false);

  // Paths are materialized (frames copied) only for the rows that are returned.
  struct PathRow {
    const Profile* profile;
    uint32_t stack;
    uint64_t base_samples = 0, samples = 0;
    double delta_pct = 0;
  };
  std::vector<PathRow> path_rows;
  absl::flat_hash_map<std::string, size_t> path_row;
  std::string key;
  auto add_paths = [&](const Profile& p, const std::vector<uint32_t>& ids, bool is_base) {
    path_row.reserve(path_row.size() + p.stacks.size());
    for (uint32_t i = 0; i < p.stacks.size(); ++i) {
      const ResolvedStack& s = p.stacks[i];
      key.assign(1, s.truncated ? 'T' : 'F');
      for (uint32_t f : s.frames) {
        key.append(reinterpret_cast<const char*>(&ids[f]), sizeof(uint32_t));
      }
      auto [it, inserted] = path_row.try_emplace(key, path_rows.size());
      if (inserted) path_rows.push_back({&p, i});
      (is_base ? path_rows[it->second].base_samples : path_rows[it->second].samples) += s.count;
    }
  };
  add_paths(base, base_ids, true);
  add_paths(current, current_ids, false);
  for (PathRow& row : path_rows) {
    row.delta_pct = RefShare(row.samples, current.total) - RefShare(row.base_samples, base.total);
  }
  RefKeepLargest(&path_rows, limit, [](const PathRow& r) { return std::abs(r.delta_pct); });
  for (const PathRow& row : path_rows) {
    const ResolvedStack& s = row.profile->stacks[row.stack];
    PathChange change;
    change.truncated = s.truncated;
    change.frames.reserve(s.frames.size());
    for (uint32_t f : s.frames) change.frames.push_back(row.profile->functions[f]);
    change.base_samples = row.base_samples;
    change.samples = row.samples;
    change.delta_pct = row.delta_pct;
    diff.paths.push_back(std::move(change));
  }

  for (FunctionChange& row : diff.functions) {
    row.self_delta_pct = RefShare(row.self, current.total) - RefShare(row.base_self, base.total);
    row.total_delta_pct = RefShare(row.total, current.total) - RefShare(row.base_total, base.total);
  }
  // Ties on self (e.g. callers without self samples) are broken by the total change.
  RefKeepLargest(&diff.functions, limit, [](const FunctionChange& r) {
    return std::abs(r.self_delta_pct) * 1e6 + std::abs(r.total_delta_pct);
  });
  return diff;
}

TEST(DiffTest, MatchesReferenceDiffOnRandomProfiles) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    Profile base = RandomProfile(rng, 1 + rng() % 150, round % 2 == 0);
    Profile current = RandomProfile(rng, 1 + rng() % 150, round % 2 == 0);
    // Same (name, module) under another ID in one profile: such paths must still match.
    if (!current.functions.empty()) current.functions[0].id += 1000;
    for (size_t limit : {size_t{1}, size_t{5}, size_t{1000}}) {
      const ProfileDiff want = ReferenceDiffProfiles(base, current, limit);
      const ProfileDiff got = DiffProfiles(base, current, limit);
      ASSERT_EQ(got.paths.size(), want.paths.size()) << round;
      for (size_t i = 0; i < want.paths.size(); ++i) {
        const PathChange& a = got.paths[i];
        const PathChange& b = want.paths[i];
        ASSERT_EQ(a.truncated, b.truncated) << round << " path " << i;
        ASSERT_EQ(a.base_samples, b.base_samples) << round << " path " << i;
        ASSERT_EQ(a.samples, b.samples) << round << " path " << i;
        ASSERT_EQ(a.delta_pct, b.delta_pct) << round << " path " << i;
        ASSERT_EQ(a.frames.size(), b.frames.size()) << round << " path " << i;
        for (size_t f = 0; f < a.frames.size(); ++f) {
          ASSERT_EQ(a.frames[f].id, b.frames[f].id) << round << " path " << i;
        }
      }
      ASSERT_EQ(got.functions.size(), want.functions.size()) << round;
      for (size_t i = 0; i < want.functions.size(); ++i) {
        ASSERT_EQ(got.functions[i].function.id, want.functions[i].function.id) << round;
        ASSERT_EQ(got.functions[i].self, want.functions[i].self) << round;
        ASSERT_EQ(got.functions[i].base_total, want.functions[i].base_total) << round;
      }
    }
  }
}

TEST(PprofTest, GzipsAnEncodedProfile) {
  auto data = EncodePprof(SmallProfile(), {1000, 2000});
  ASSERT_TRUE(data.ok());
  EXPECT_EQ(data->substr(0, 2), "\x1f\x8b");
  const std::string raw = EncodePprofProto(SmallProfile(), {1000, 2000});
  EXPECT_THAT(raw, HasSubstr("samples"));
  EXPECT_THAT(raw, HasSubstr("/bin/m"));
}

}  // namespace
}  // namespace strata::server
