#include "server/query/flamegraph.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace strata::server {
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

// Warm colours from a stable hash of the name, so a function keeps its colour across graphs.
std::string FrameColor(std::string_view name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  const double v1 = static_cast<double>(h & 0xff) / 255.0;
  const double v2 = static_cast<double>((h >> 8) & 0xff) / 255.0;
  const double v3 = static_cast<double>((h >> 16) & 0xff) / 255.0;
  return absl::StrFormat("rgb(%d,%d,%d)", 205 + static_cast<int>(50 * v3),
                         static_cast<int>(230 * v1), static_cast<int>(55 * v2));
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

}  // namespace

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", c);
        } else {
          out.push_back(c);
        }
    }
  }
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

FlameTree BuildFlameTree(const Profile& profile, uint32_t max_nodes) {
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

std::string RenderFolded(const Profile& profile) {
  auto clean = [](std::string_view name, std::string* out) {
    for (char c : name) out->push_back(c == ';' ? ':' : (c == '\n' || c == '\r') ? ' ' : c);
  };
  std::string out;
  for (const ResolvedStack& stack : profile.stacks) {
    bool first = true;
    if (stack.truncated) {
      out += "[truncated]";
      first = false;
    }
    for (uint32_t f : stack.frames) {
      if (!first) out.push_back(';');
      first = false;
      clean(profile.functions[f].name, &out);
    }
    if (first) out += "[unknown]";
    absl::StrAppend(&out, " ", stack.count, "\n");
  }
  return out;
}

std::string RenderFlameJson(const FlameTree& tree) {
  std::string out;
  if (tree.nodes.empty()) return "{}";
  // Pre-order: close objects when the next node is not deeper than the open ones.
  std::vector<uint32_t> open;  // depths of open nodes
  for (size_t i = 0; i < tree.nodes.size(); ++i) {
    const FlameTreeNode& n = tree.nodes[i];
    while (!open.empty() && open.back() >= n.depth) {
      out += "]}";
      open.pop_back();
    }
    if (i > 0 && out.back() != '[') out.push_back(',');
    const ResolvedFunction& f = tree.functions[n.function];
    absl::StrAppend(&out, "{\"name\":\"", JsonEscape(f.name), "\"");
    if (!f.module.empty()) absl::StrAppend(&out, ",\"module\":\"", JsonEscape(f.module), "\"");
    absl::StrAppend(&out, ",\"value\":", n.total, ",\"self\":", n.self, ",\"children\":[");
    open.push_back(n.depth);
  }
  while (!open.empty()) {
    out += "]}";
    open.pop_back();
  }
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
    const std::string name = XmlEscape(f.name);
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
                          n.depth == 0 ? "rgb(235,200,120)" : FrameColor(f.name), x + 3,
                          y + kFrameHeight - 4, XmlEscape(FitLabel(f.name, width)));
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

}  // namespace strata::server
