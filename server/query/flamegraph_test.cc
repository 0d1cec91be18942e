#include "server/query/flamegraph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/testing/sanitizers.h"
#include "server/query/diff.h"
#include "server/query/pprof.h"

namespace strata::server::query {
namespace {

using ::testing::HasSubstr;

// A function of a profile (file, line and inlined only where a test has lines).
ResolvedFunction Fn(uint64_t id, std::string name, std::string module, std::string file = "",
                    uint32_t line = 0, bool inlined = false) {
  ResolvedFunction f;
  f.id = id;
  f.name = std::move(name);
  f.module = std::move(module);
  f.file = std::move(file);
  f.line = line;
  f.inlined = inlined;
  return f;
}

// A source frame of a call site.
symbolize::SourceFrame Line(std::string function, std::string file, uint32_t line,
                            bool inlined) {
  symbolize::SourceFrame frame;
  frame.function = std::move(function);
  frame.file = std::move(file);
  frame.line = line;
  frame.inlined = inlined;
  return frame;
}

// main > a > {b: 6, c: 3}, main > d: 1 (truncated stack [truncated] > x: 2).
Profile SmallProfile() {
  Profile p;
  for (const char* name : {"main", "a", "b", "c", "d", "x"}) {
    p.functions.push_back(Fn(p.functions.size() + 100, name, "/bin/m"));
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
  EXPECT_THAT(names, ::testing::ElementsAre("all", "[truncated]", "x", "main", "a", "b", "c", "d"));
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
  EXPECT_THAT(names, ::testing::ElementsAre("all", "main", "a", "b"));
  EXPECT_EQ(tree.nodes[1].total, 10u);  // pruned children still count
}

// A deliberately naive flame tree, written from the documented rules and sharing no code with
// BuildFlameTree: a recursive tree of std::map children; nodes ranked for pruning by total
// (heaviest first), then depth (shallowest first), then first appearance (pre-order with
// children by function index); output in pre-order with siblings by name, then function.
struct NaiveNode {
  uint32_t function = 0;  // index into FlameTree::functions
  uint32_t depth = 0;
  uint64_t total = 0, self = 0;
  uint32_t rank_order = 0;  // pre-order position, children by function index
  bool kept = true;
  std::map<uint32_t, std::unique_ptr<NaiveNode>> children;
};

void NaiveNumber(NaiveNode* n, uint32_t* next, std::vector<NaiveNode*>* all) {
  n->rank_order = (*next)++;
  if (n->depth > 0) all->push_back(n);
  for (auto& [function, child] : n->children) NaiveNumber(child.get(), next, all);
}

void NaiveEmit(const NaiveNode& n, uint32_t parent_out, uint64_t offset, FlameTree* tree) {
  const uint32_t out = static_cast<uint32_t>(tree->nodes.size());
  tree->nodes.push_back({n.function, n.depth == 0 ? 0 : parent_out, n.depth, n.total, n.self,
                         offset});
  tree->max_depth = std::max(tree->max_depth, n.depth);
  std::vector<const NaiveNode*> kept;
  for (const auto& [function, child] : n.children) {
    if (child->kept) kept.push_back(child.get());
  }
  std::sort(kept.begin(), kept.end(), [&](const NaiveNode* a, const NaiveNode* b) {
    const std::string& na = tree->functions[a->function].name;
    const std::string& nb = tree->functions[b->function].name;
    return na != nb ? na < nb : a->function < b->function;
  });
  for (const NaiveNode* child : kept) {
    NaiveEmit(*child, out, offset, tree);
    offset += child->total;
  }
}

FlameTree NaiveFlameTree(const Profile& profile, uint32_t max_nodes) {
  if (max_nodes == 0) max_nodes = kDefaultFlameNodes;
  FlameTree tree;
  tree.total = profile.total;
  tree.functions.push_back(Fn(0, "all", ""));
  tree.functions.push_back(Fn(0, "[truncated]", ""));
  for (const ResolvedFunction& f : profile.functions) tree.functions.push_back(f);

  NaiveNode root;
  root.total = profile.total;
  for (const ResolvedStack& stack : profile.stacks) {
    std::vector<uint32_t> path;
    if (stack.truncated) path.push_back(1);
    for (uint32_t f : stack.frames) path.push_back(f + 2);
    NaiveNode* at = &root;
    for (uint32_t function : path) {
      std::unique_ptr<NaiveNode>& child = at->children[function];
      if (!child) {
        child = std::make_unique<NaiveNode>();
        child->function = function;
        child->depth = at->depth + 1;
      }
      child->total += stack.count;
      at = child.get();
    }
    at->self += stack.count;
  }

  uint32_t next = 0;
  std::vector<NaiveNode*> all;
  NaiveNumber(&root, &next, &all);
  std::sort(all.begin(), all.end(), [](const NaiveNode* a, const NaiveNode* b) {
    if (a->total != b->total) return a->total > b->total;
    if (a->depth != b->depth) return a->depth < b->depth;
    return a->rank_order < b->rank_order;
  });
  for (size_t i = max_nodes; i < all.size(); ++i) {
    all[i]->kept = false;
    ++tree.pruned;
  }
  NaiveEmit(root, 0, 0, &tree);
  return tree;
}

// Random profiles: paths through a small call tree (so prefixes are shared), some truncated,
// some empty, small counts (many ties), and distinct functions sharing a name.
// Deep stacks over many functions also exercise the comparison past the packed sort keys.
Profile RandomProfile(std::mt19937_64& rng, size_t stacks, bool deep) {
  Profile p;
  const size_t functions = deep ? 2 + rng() % 5000 : 2 + rng() % 40;
  for (size_t i = 0; i < functions; ++i) {
    p.functions.push_back(Fn(i + 1, "f" + std::to_string(i % (functions / 2 + 1)), "/bin/m"));
  }
  std::set<std::pair<bool, FrameIndices>> seen;
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

TEST(FlameTreeTest, MatchesNaiveTreeOnRandomProfiles) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < strata::testing::Trials(300); ++round) {
    const Profile p = RandomProfile(rng, 1 + rng() % 200, round % 3 == 0);
    for (uint32_t max_nodes : {0u, 1u, 2u, 3u, 7u, 20u, 64u, 500u}) {
      const FlameTree want = NaiveFlameTree(p, max_nodes);
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
      // Taking the profile's functions builds the same tree and leaves the stacks.
      Profile taken = p;
      const FlameTree moved = BuildFlameTree(std::move(taken), max_nodes);
      EXPECT_TRUE(taken.functions.empty());
      ASSERT_EQ(taken.stacks.size(), p.stacks.size());
      ASSERT_EQ(moved.functions.size(), got.functions.size());
      for (size_t i = 0; i < got.functions.size(); ++i) {
        ASSERT_EQ(moved.functions[i].name, got.functions[i].name) << i;
        ASSERT_EQ(moved.functions[i].module, got.functions[i].module) << i;
      }
      ASSERT_EQ(moved.nodes.size(), got.nodes.size());
      for (size_t i = 0; i < got.nodes.size(); ++i) {
        ASSERT_TRUE(moved.nodes[i].function == got.nodes[i].function &&
                    moved.nodes[i].total == got.nodes[i].total &&
                    moved.nodes[i].offset == got.nodes[i].offset)
            << "round " << round << " max_nodes " << max_nodes << " node " << i;
      }
    }
  }
}

TEST(FlameTreeTest, Renderings) {
  const Profile p = SmallProfile();
  EXPECT_EQ(RenderFolded(p), "main;a;b 6\nmain;a;c 3\n[truncated];x 2\nmain;d 1\n");
  {
    // Stacks whose lines read the same (another function named b; a call site the text does
    // not show) are one line.
    Profile twice = p;
    twice.functions.push_back(Fn(200, "b", "/bin/m"));
    twice.stacks.push_back({5, 4, false, {0, 1, 6}});
    twice.stacks.push_back({6, 1, false, {0, 1, 2}});
    EXPECT_EQ(RenderFolded(twice), "main;a;b 11\nmain;a;c 3\n[truncated];x 2\nmain;d 1\n");
  }
  FlameTree tree = BuildFlameTree(p, 0);
  EXPECT_THAT(RenderFlameJson(tree),
              HasSubstr("{\"name\":\"b\",\"module\":\"/bin/m\",\"value\":6,"
                        "\"self\":6,\"children\":[]},{\"name\":\"c\""));
  const std::string svg = RenderFlameSvg(tree, "t <&>");
  EXPECT_THAT(svg, HasSubstr("<text id=\"title\" x=\"600\" y=\"22\">t &lt;&amp;&gt;</text>"));
  EXPECT_THAT(svg, HasSubstr("<title>b (6 samples, 50.00%) /bin/m</title>"));
  EXPECT_THAT(RenderFlameHtml(tree, "t"), ::testing::StartsWith("<!DOCTYPE html>"));
}

TEST(FlameTreeTest, JsonEscapesNamesAndModules) {
  EXPECT_EQ(JsonEscape("plain::name(int)"), "plain::name(int)");
  EXPECT_EQ(JsonEscape(std::string("a\"b\\c\nd\te\x01" "f", 11)),
            "a\\\"b\\\\c\\nd\\te\\u0001f");
  EXPECT_EQ(JsonEscape("\"\""), "\\\"\\\"");
  EXPECT_EQ(JsonEscape(""), "");
  Profile p;
  p.functions = {Fn(1, "operator\"\"_x", "C:\\bin\\m")};
  p.stacks = {{1, 5, false, {0}}};
  p.total = 5;
  EXPECT_THAT(RenderFlameJson(BuildFlameTree(p, 0)),
              HasSubstr(R"({"name":"operator\"\"_x","module":"C:\\bin\\m","value":5,)"));
}

// Names are scanned 8 bytes at a time: a byte to escape is found at any position of a long
// name, and bytes that are not (UTF-8, DEL, the rest of ASCII) never are.
TEST(FlameTreeTest, JsonEscapesAtEveryPositionOfLongNames) {
  for (char special : {'"', '\\', '\n', '\t', '\x01', '\x1f'}) {
    for (size_t at = 0; at < 21; ++at) {
      std::string name(21, 'x');
      name[at] = special;
      std::string want = name.substr(0, at);
      switch (special) {
        case '"': want += "\\\""; break;
        case '\\': want += "\\\\"; break;
        case '\n': want += "\\n"; break;
        case '\t': want += "\\t"; break;
        default: want += special == '\x01' ? "\\u0001" : "\\u001f";
      }
      want += name.substr(at + 1);
      EXPECT_EQ(JsonEscape(name), want) << at;
    }
  }
  const std::string plain = "caf\xc3\xa9::\x7f !#[]{}~ns::Long<With, Templates>()";
  EXPECT_EQ(JsonEscape(plain), plain);
}

// Kernel and JIT frames (by module name, common/base/frame_kind.h) are told apart in every
// rendering: folded suffixes, JSON kinds, SVG palettes; pprof keeps their modules as mappings.
TEST(FlameTreeTest, KernelAndJitFramesAreMarked) {
  Profile p;
  p.functions = {Fn(1, "main", "/bin/m"),
                 Fn(2, "do_syscall_64", "[kernel.kallsyms]"),
                 Fn(3, "xfs_read", "[kernel:xfs]"),
                 Fn(4, "Lambda.run", "[jit:/tmp/perf-1.map]")};
  p.stacks = {{1, 4, false, {0, 1, 2}}, {2, 1, false, {0, 3}}};
  p.total = 5;
  EXPECT_EQ(RenderFolded(p), "main;do_syscall_64_[k];xfs_read_[k] 4\nmain;Lambda.run_[j] 1\n");
  FlameTree tree = BuildFlameTree(p, 0);
  const std::string json = RenderFlameJson(tree);
  EXPECT_THAT(json, HasSubstr("\"name\":\"xfs_read\",\"module\":\"[kernel:xfs]\","
                              "\"kind\":\"kernel\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"Lambda.run\",\"module\":\"[jit:/tmp/perf-1.map]\","
                              "\"kind\":\"jit\""));
  EXPECT_THAT(json, HasSubstr("\"name\":\"main\",\"module\":\"/bin/m\",\"value\""));
  // Each frame's fill: orange (blue 0) for the kernel, aqua (green = blue) for JIT code, warm
  // (red >= 205) for user code.
  const std::string svg = RenderFlameSvg(tree, "t");
  auto fill_of = [&](const std::string& name) {
    const size_t at = svg.find(absl::StrCat("data-n=\"", name, "\""));
    EXPECT_NE(at, std::string::npos) << name;
    const size_t fill = svg.find("fill=\"rgb(", at) + 10;
    int r = 0, g = 0, b = 0;
    EXPECT_EQ(std::sscanf(svg.c_str() + fill, "%d,%d,%d", &r, &g, &b), 3);
    return std::tuple{r, g, b};
  };
  auto [kr, kg, kb] = fill_of("do_syscall_64");
  EXPECT_GE(kr, 190);
  EXPECT_GE(kg, 90);
  EXPECT_LE(kg, 155);
  EXPECT_EQ(kb, 0);
  auto [jr, jg, jb] = fill_of("Lambda.run");
  EXPECT_LE(jr, 110);
  EXPECT_EQ(jg, jb);
  EXPECT_GE(jg, 165);
  auto [ur, ug, ub] = fill_of("main");
  EXPECT_GE(ur, 205);
  EXPECT_LE(ub, 55);
  // pprof: the kernel image, the kernel module and the JIT map are mappings of their own.
  const std::string raw = EncodePprofProto(p, {1000, 2000});
  for (const char* module : {"[kernel.kallsyms]", "[kernel:xfs]", "[jit:/tmp/perf-1.map]"}) {
    EXPECT_THAT(raw, HasSubstr(module));
  }
}

// Python frames ([python:FILE]) and Java frames ([java:FILE]) are marked like kernel and JIT
// frames: folded suffix, JSON kind, a green fill.
TEST(FlameTreeTest, PythonAndJavaFramesAreMarked) {
  struct Case {
    const char* module;
    const char* suffix;
    const char* kind;
  };
  for (const Case& c : {Case{"[python:/srv/app.py]", "_[p]", "python"},
                        Case{"[java:com/acme/Worker.java]", "_[j]", "java"},
                        Case{"[java]", "_[j]", "java"}}) {
    Profile p;
    p.functions = {Fn(1, "main", "/usr/bin/python3.11"), Fn(2, "Worker.run", c.module)};
    p.stacks = {{1, 3, false, {0, 1}}};
    p.total = 3;
    EXPECT_EQ(RenderFolded(p), absl::StrCat("main;Worker.run", c.suffix, " 3\n"));
    FlameTree tree = BuildFlameTree(p, 0);
    EXPECT_THAT(RenderFlameJson(tree),
                HasSubstr(absl::StrCat("\"name\":\"Worker.run\",\"module\":\"", c.module,
                                       "\",\"kind\":\"", c.kind, "\"")));
    const std::string svg = RenderFlameSvg(tree, "t");
    const size_t at = svg.find("data-n=\"Worker.run\"");
    ASSERT_NE(at, std::string::npos);
    int r = 0, g = 0, b = 0;
    ASSERT_EQ(std::sscanf(svg.c_str() + svg.find("fill=\"rgb(", at) + 10, "%d,%d,%d", &r, &g, &b),
              3);
    EXPECT_GT(g, r) << c.module;
    EXPECT_GT(g, b) << c.module;
  }
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

// A release in a directory of its own, a JVM restarted (its perf map named by the new process
// ID, its method then named by a newer agent as a Java frame), a Python release's files in
// another directory: the same functions, matched. Another program of another name, or kernel
// code of a user function's name, is not.
TEST(DiffTest, FunctionsMatchAcrossReleaseDirectoriesAndProcesses) {
  auto profile = [](const std::string& release, const std::string& pid) {
    Profile p;
    p.functions = {Fn(1, "main", "/srv/releases/" + release + "/bin/svc"),
                   Fn(2, "Lcom/acme/Cart;::total", "[jit:/tmp/perf-" + pid + ".map]"),
                   Fn(3, "handle", "[python:/srv/releases/" + release + "/app/views.py]"),
                   Fn(4, "main", "/srv/releases/" + release + "/bin/other"),
                   Fn(5, "handle", "[kernel.kallsyms]")};
    p.stacks = {{1, 4, false, {0, 1}}, {2, 4, false, {0, 2}}, {3, 2, false, {3, 4}}};
    p.total = 10;
    return p;
  };
  Profile base = profile("1.4.1", "811");
  Profile now = profile("1.4.2", "4177");
  now.functions[1].module = "[java:com/acme/Cart.java]";  // named by a newer agent: a Java frame
  now.stacks[0].count = 6;  // Cart.total: 40 % -> 50 %
  now.total = 12;
  const ProfileDiff d = DiffProfiles(base, now, 10);
  std::set<std::string> rows;
  for (const FunctionChange& f : d.functions) {
    EXPECT_TRUE(rows.insert(f.function.name + " " + f.function.module).second)
        << f.function.name << " has two rows";
    if (f.function.name == "Lcom/acme/Cart;::total") {
      EXPECT_EQ(f.base_self, 4u);
      EXPECT_EQ(f.self, 6u);
    }
  }
  // Every path kept its row: three paths, each in both profiles.
  EXPECT_EQ(d.paths.size(), 3u);
  for (const PathChange& p : d.paths) EXPECT_GT(p.base_samples, 0u);
  EXPECT_EQ(base::IdentityOf("/srv/releases/1/bin/svc"), base::IdentityOf("/opt/bin/svc"));
  EXPECT_NE(base::IdentityOf("/opt/bin/svc"), base::IdentityOf("/opt/bin/other"));
  // A binary named after its release, a library after its version.
  EXPECT_EQ(base::IdentityOf("/opt/gosvc-v1"), base::IdentityOf("/opt/gosvc-v2"));
  EXPECT_EQ(base::IdentityOf("/opt/app-1.4.2"), base::IdentityOf("/opt/app_1.5"));
  EXPECT_EQ(base::IdentityOf("/lib/libssl.so.1.1"), base::IdentityOf("/lib/libssl.so.3"));
  EXPECT_EQ(base::IdentityOf("/usr/bin/python3.11"), base::IdentityOf("/usr/bin/python3.12"));
  EXPECT_NE(base::IdentityOf("/usr/bin/python3.11"), base::IdentityOf("/usr/bin/python2.7"));
  EXPECT_NE(base::IdentityOf("/opt/svc2"), base::IdentityOf("/opt/svc3"));
  EXPECT_EQ(base::WithoutVersionSuffix("1.2"), "1.2");
  EXPECT_EQ(base::WithoutVersionSuffix("x-v"), "x-v");
  EXPECT_EQ(base::WithoutVersionSuffix("x-1"), "x");
  EXPECT_NE(base::IdentityOf("[kernel.kallsyms]"), base::IdentityOf("[kernel:xfs]"));
  EXPECT_EQ(base::IdentityOf("[jit:/tmp/perf-1.map]"), base::IdentityOf("[jit]"));
  EXPECT_EQ(base::IdentityOf("[python:/a/1/views.py]"), base::IdentityOf("[python:views.py]"));
  EXPECT_NE(base::IdentityOf("[python:/a/views.py]"), base::IdentityOf("/a/views.py"));
  // A Java method is its name (class and signature), whether named from the JVM's tables or,
  // by older agents, from its perf map.
  EXPECT_EQ(base::IdentityOf("[java:com/acme/Cart.java]"),
            base::IdentityOf("[jit:/tmp/perf-9.map]"));
  EXPECT_EQ(base::IdentityOf("[java]"), base::IdentityOf("[java:Cart.java]"));
  EXPECT_NE(base::IdentityOf("[java:Cart.java]"), base::IdentityOf("[python:Cart.java]"));
  EXPECT_EQ(base::FrameKindOf("[java]"), base::FrameKind::kJava);
  EXPECT_EQ(base::FrameKindOf("[javax]"), base::FrameKind::kUser);
  EXPECT_EQ(base::SourceFileOf("[java:a/B.java]"), "a/B.java");
  EXPECT_EQ(base::SourceFileOf("[python:/x.py]"), "/x.py");
  EXPECT_EQ(base::SourceFileOf("/usr/bin/x"), "");
  EXPECT_EQ(base::IdentityOf("[vdso]").name, "[vdso]");
}

// A deliberately naive diff, written from DiffProfiles' contract and sharing no code with it:
// functions and paths keyed by (name, module) strings in std::map, every total recounted from
// the stacks. Rows tied in magnitude may come in any order, so the check below compares
// against the set of all rows instead of a sequence.
using NaiveKey = std::pair<std::string, std::string>;  // (name, module)

double NaiveShare(uint64_t part, uint64_t total) {
  return total == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(total);
}

struct NaiveFunctionRow {
  uint64_t base_self = 0, self = 0, base_total = 0, total = 0;
};
struct NaivePathRow {
  uint64_t base_samples = 0, samples = 0;
};
using NaivePathKey = std::pair<bool, std::vector<NaiveKey>>;  // (truncated, frames)

struct NaiveDiff {
  std::map<NaiveKey, NaiveFunctionRow> functions;
  std::map<NaivePathKey, NaivePathRow> paths;
};

NaiveDiff NaiveDiffProfiles(const Profile& base, const Profile& current) {
  NaiveDiff diff;
  for (const Profile* p : {&base, &current}) {
    const bool is_base = p == &base;
    // Per function of the profile: self where it is the leaf, total where it appears at all.
    for (uint32_t f = 0; f < p->functions.size(); ++f) {
      uint64_t self = 0, total = 0;
      for (const ResolvedStack& s : p->stacks) {
        if (std::find(s.frames.begin(), s.frames.end(), f) != s.frames.end()) total += s.count;
        if (!s.frames.empty() && s.frames.back() == f) self += s.count;
      }
      if (total == 0) continue;
      NaiveFunctionRow& row = diff.functions[{p->functions[f].name, p->functions[f].module}];
      (is_base ? row.base_self : row.self) += self;
      (is_base ? row.base_total : row.total) += total;
    }
    for (const ResolvedStack& s : p->stacks) {
      NaivePathKey key{s.truncated, {}};
      for (uint32_t f : s.frames) key.second.push_back({p->functions[f].name, p->functions[f].module});
      (is_base ? diff.paths[key].base_samples : diff.paths[key].samples) += s.count;
    }
  }
  return diff;
}

// Checks one table of a diff against the naive rows: every returned row is a real row with the
// right figures and a non-zero change, rows are in order of magnitude, as many as the limit
// allows, and no row left out is larger than the smallest returned.
template <typename Row, typename Key, typename Naive, typename KeyOf, typename Check,
          typename Magnitude>
void ExpectLargestRows(const std::vector<Row>& got, const std::map<Key, Naive>& naive,
                       size_t limit, KeyOf key_of, Check check, Magnitude magnitude) {
  std::set<Key> returned;
  for (size_t i = 0; i < got.size(); ++i) {
    const Key key = key_of(got[i]);
    auto it = naive.find(key);
    ASSERT_NE(it, naive.end()) << "row " << i << " is not in either profile";
    ASSERT_TRUE(returned.insert(key).second) << "row " << i << " returned twice";
    check(got[i], it->second);
    ASSERT_NE(magnitude(it->second), 0.0) << "row " << i << " has no change";
    if (i > 0) {
      ASSERT_GE(magnitude(naive.at(key_of(got[i - 1]))), magnitude(it->second));
    }
  }
  size_t changed = 0;
  double smallest_returned = got.empty() ? 0 : magnitude(naive.at(key_of(got.back())));
  for (const auto& [key, row] : naive) {
    if (magnitude(row) == 0) continue;
    ++changed;
    if (!returned.contains(key)) {
      ASSERT_LE(magnitude(row), smallest_returned);
    }
  }
  ASSERT_EQ(got.size(), std::min(limit, changed));
}

TEST(DiffTest, MatchesNaiveDiffOnRandomProfiles) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < strata::testing::Trials(200); ++round) {
    SCOPED_TRACE(round);
    Profile base = RandomProfile(rng, 1 + rng() % 150, round % 2 == 0);
    Profile current = RandomProfile(rng, 1 + rng() % 150, round % 2 == 0);
    // Same (name, module) under another ID in one profile: such paths must still match.
    if (!current.functions.empty()) current.functions[0].id += 1000;
    const NaiveDiff naive = NaiveDiffProfiles(base, current);
    auto path_delta = [&](const NaivePathRow& r) {
      return NaiveShare(r.samples, current.total) - NaiveShare(r.base_samples, base.total);
    };
    auto self_delta = [&](const NaiveFunctionRow& r) {
      return NaiveShare(r.self, current.total) - NaiveShare(r.base_self, base.total);
    };
    auto total_delta = [&](const NaiveFunctionRow& r) {
      return NaiveShare(r.total, current.total) - NaiveShare(r.base_total, base.total);
    };
    for (size_t limit : {size_t{1}, size_t{5}, size_t{1000}}) {
      SCOPED_TRACE(limit);
      const ProfileDiff got = DiffProfiles(base, current, limit);
      EXPECT_EQ(got.base_total, base.total);
      EXPECT_EQ(got.total, current.total);
      ExpectLargestRows(
          got.paths, naive.paths, limit,
          [](const PathChange& c) {
            NaivePathKey key{c.truncated, {}};
            for (const ResolvedFunction& f : c.frames) key.second.push_back({f.name, f.module});
            return key;
          },
          [&](const PathChange& c, const NaivePathRow& r) {
            ASSERT_EQ(c.base_samples, r.base_samples);
            ASSERT_EQ(c.samples, r.samples);
            ASSERT_EQ(c.delta_pct, path_delta(r));
          },
          [&](const NaivePathRow& r) { return std::abs(path_delta(r)); });
      ExpectLargestRows(
          got.functions, naive.functions, limit,
          [](const FunctionChange& c) { return NaiveKey{c.function.name, c.function.module}; },
          [&](const FunctionChange& c, const NaiveFunctionRow& r) {
            ASSERT_EQ(c.base_self, r.base_self);
            ASSERT_EQ(c.self, r.self);
            ASSERT_EQ(c.base_total, r.base_total);
            ASSERT_EQ(c.total, r.total);
            ASSERT_EQ(c.self_delta_pct, self_delta(r));
            ASSERT_EQ(c.total_delta_pct, total_delta(r));
          },
          // Ties on self (callers without self samples) are broken by the total change.
          [&](const NaiveFunctionRow& r) {
            return std::abs(self_delta(r)) * 1e6 + std::abs(total_delta(r));
          });
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

uint64_t ReadVarint(std::string_view in, size_t* pos) {
  uint64_t v = 0;
  for (int shift = 0; *pos < in.size(); shift += 7) {
    const uint8_t b = static_cast<uint8_t>(in[(*pos)++]);
    v |= uint64_t{b & 0x7fu} << shift;
    if (b < 0x80) break;
  }
  return v;
}

// The fields of a protobuf message by number (wire types 0 and 2 only: all pprof.cc
// writes), varints as decimal text.
std::multimap<uint32_t, std::string> Fields(std::string_view in) {
  std::multimap<uint32_t, std::string> out;
  for (size_t pos = 0; pos < in.size();) {
    const uint64_t tag = ReadVarint(in, &pos);
    if ((tag & 7) == 0) {
      out.emplace(tag >> 3, std::to_string(ReadVarint(in, &pos)));
    } else {
      const uint64_t n = ReadVarint(in, &pos);
      out.emplace(tag >> 3, std::string(in.substr(pos, n)));
      pos += n;
    }
  }
  return out;
}

std::vector<uint64_t> Packed(std::string_view bytes) {
  std::vector<uint64_t> out;
  for (size_t pos = 0; pos < bytes.size();) out.push_back(ReadVarint(bytes, &pos));
  return out;
}

// Counts in sampling periods become time at the rate: [samples/count, T/nanoseconds] with T
// the profile type, the period in nanoseconds, and the count shown by default.
TEST(PprofTest, SampleTypesAreCountAndTimeOfTheProfileType) {
  const std::string raw =
      EncodePprofProto(SmallProfile(), {1000, 2000, v1::PROFILE_OFF_CPU, 100});
  auto profile = Fields(raw);
  std::vector<std::string> strings;
  for (auto [it, end] = profile.equal_range(6); it != end; ++it) strings.push_back(it->second);
  auto value_type = [&](const std::string& bytes) {
    auto f = Fields(bytes);
    return std::pair{strings.at(std::stoull(f.find(1)->second)),
                     strings.at(std::stoull(f.find(2)->second))};
  };
  std::vector<std::pair<std::string, std::string>> types;
  for (auto [it, end] = profile.equal_range(1); it != end; ++it) {
    types.push_back(value_type(it->second));
  }
  EXPECT_THAT(types, ::testing::ElementsAre(std::pair{"samples", "count"},
                                          std::pair{"off-cpu", "nanoseconds"}));
  EXPECT_EQ(value_type(profile.find(11)->second),
            (std::pair<std::string, std::string>{"off-cpu", "nanoseconds"}));
  EXPECT_EQ(profile.find(12)->second, "10000000");  // 1e9 / 100 Hz
  EXPECT_EQ(strings.at(std::stoull(profile.find(14)->second)), "samples");
  std::vector<std::vector<uint64_t>> values;
  for (auto [it, end] = profile.equal_range(2); it != end; ++it) {
    values.push_back(Packed(Fields(it->second).find(2)->second));
  }
  EXPECT_THAT(values, ::testing::ElementsAre(
                          ::testing::ElementsAre(6, 60'000'000), ::testing::ElementsAre(3, 30'000'000),
                          ::testing::ElementsAre(2, 20'000'000), ::testing::ElementsAre(1, 10'000'000)));
  // CPU at the default rate.
  profile = Fields(EncodePprofProto(SmallProfile(), {1000, 2000}));
  strings.clear();
  for (auto [it, end] = profile.equal_range(6); it != end; ++it) strings.push_back(it->second);
  EXPECT_EQ(value_type(profile.find(11)->second),
            (std::pair<std::string, std::string>{"cpu", "nanoseconds"}));
  EXPECT_EQ(profile.find(12)->second, "10101010");  // 1e9 / 99 Hz
}

// Callers' call sites with lines are locations of their own (address: the call instruction,
// one before the return address), Line entries innermost first; call sites without lines
// and stacks without sites keep the function's location.
TEST(PprofTest, CallSitesWithLinesAreLocationsOfTheirOwn) {
  const Profile small = SmallProfile();
  CallSiteLines sites;
  sites.sites = {{0x40, 0x90}, {0x40, 0x98}, {}, {0x44}};
  sites.lines[{0, 0x40}] = {Line("helper", "m.cc", 7, true), Line("main", "m.cc", 30, false)};
  sites.lines[{1, 0x90}] = {Line("a", "a.cc", 12, false)};
  const std::string raw = EncodePprofProto(small, {1000, 2000, v1::PROFILE_CPU, 99, nullptr, &sites});
  auto profile = Fields(raw);
  std::vector<std::string> strings;
  for (auto [it, end] = profile.equal_range(6); it != end; ++it) strings.push_back(it->second);
  // Location ID -> (address, [(function name, line)...]).
  std::map<uint64_t, std::pair<uint64_t, std::vector<std::pair<std::string, uint64_t>>>> locations;
  std::map<uint64_t, std::string> function_names;
  for (auto [it, end] = profile.equal_range(5); it != end; ++it) {
    auto f = Fields(it->second);
    function_names[std::stoull(f.find(1)->second)] = strings.at(std::stoull(f.find(2)->second));
  }
  for (auto [it, end] = profile.equal_range(4); it != end; ++it) {
    auto f = Fields(it->second);
    auto& loc = locations[std::stoull(f.find(1)->second)];
    if (auto a = f.find(3); a != f.end()) loc.first = std::stoull(a->second);
    for (auto [l, lend] = f.equal_range(4); l != lend; ++l) {
      auto line = Fields(l->second);
      loc.second.emplace_back(function_names.at(std::stoull(line.find(1)->second)),
                              line.count(2) ? std::stoull(line.find(2)->second) : 0);
    }
  }
  std::vector<std::vector<uint64_t>> samples;
  for (auto [it, end] = profile.equal_range(2); it != end; ++it) {
    samples.push_back(Packed(Fields(it->second).find(1)->second));
  }
  ASSERT_EQ(samples.size(), 4u);
  // main > a > b: main at 0x40 (its inline chain), a at 0x90; b, the leaf, its function.
  ASSERT_EQ(samples[0].size(), 3u);
  EXPECT_EQ(samples[0][0], 3u);  // b's function location
  const auto& main_site = locations.at(samples[0][2]);
  EXPECT_EQ(main_site.first, 0x3fu);
  EXPECT_THAT(main_site.second, ::testing::ElementsAre(std::pair<std::string, uint64_t>{"helper", 7},
                                                     std::pair<std::string, uint64_t>{"main", 30}));
  const auto& a_site = locations.at(samples[0][1]);
  EXPECT_EQ(a_site.first, 0x8fu);
  EXPECT_THAT(a_site.second, ::testing::ElementsAre(std::pair<std::string, uint64_t>{"a", 12}));
  // main > a > c: the same main site is the same location; a's site 0x98 has no lines.
  EXPECT_EQ(samples[1][2], samples[0][2]);
  EXPECT_EQ(samples[1][1], 2u);
  // [truncated] x: no sites; main > d from 0x44: no lines there.
  EXPECT_THAT(samples[2], ::testing::ElementsAre(6u));
  EXPECT_THAT(samples[3], ::testing::ElementsAre(5u, 1u));
}

TEST(PprofTest, LeafLinesSplitAStackInProportion) {
  std::vector<LeafLine> lines(3);
  lines[0].weight = 1;
  lines[1].weight = 6;
  lines[2].weight = 3;
  EXPECT_THAT(SplitByLeafLines(10, lines), ::testing::ElementsAre(1, 6, 3));
  // Remainders go to the heaviest lines; parts always sum to the count.
  EXPECT_THAT(SplitByLeafLines(4, lines), ::testing::ElementsAre(0, 3, 1));
  EXPECT_THAT(SplitByLeafLines(0, lines), ::testing::ElementsAre(0, 0, 0));
  EXPECT_TRUE(SplitByLeafLines(5, {}).empty());
}

// Frames with source lines are labelled "name file:line [inlined]" in every rendering, and
// the JSON also has them as fields; lines of one function stay apart.
TEST(FlameTreeTest, FramesWithLinesAreLabelledWithThem) {
  Profile p;
  p.functions = {Fn(100, "main", "/bin/m", "m.cc", 30, false),
                 Fn(100, "helper", "/bin/m", "m.cc", 7, true),
                 Fn(101, "leaf", "/bin/m", "l.cc", 3, false),
                 Fn(101, "leaf", "/bin/m", "l.cc", 4, false)};
  p.stacks = {{1, 5, false, {0, 1, 2}}, {1, 2, false, {0, 1, 3}}};
  p.total = 7;
  EXPECT_EQ(RenderFolded(p),
            "main m.cc:30;helper m.cc:7 [inlined];leaf l.cc:3 5\n"
            "main m.cc:30;helper m.cc:7 [inlined];leaf l.cc:4 2\n");
  const FlameTree tree = BuildFlameTree(p, 0);
  EXPECT_EQ(tree.nodes.size(), 5u);  // root, main, helper, two leaf lines
  const std::string json = RenderFlameJson(tree);
  EXPECT_THAT(json, HasSubstr(R"("name":"helper m.cc:7 [inlined]","module":"/bin/m",)"
                              R"("function":"helper","file":"m.cc","line":7,"inlined":true)"));
  EXPECT_THAT(json, HasSubstr(R"("name":"leaf l.cc:4")"));
  EXPECT_THAT(RenderFlameSvg(tree, "t"), HasSubstr("helper m.cc:7 [inlined]"));
  EXPECT_EQ(FrameLabel(Fn(1, "f", "/bin/m")), "f");
  EXPECT_EQ(FrameLabel(Fn(1, "f", "/bin/m", "f.cc", 0, false)), "f f.cc");
}

}  // namespace
}  // namespace strata::server::query
