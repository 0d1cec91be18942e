// Dynamic PCCE on a program-like sample stream: encode/decode cost per context, the share of
// contexts per ID-stack depth (the paper's table), and wire bytes per distinct context per
// batch for Strata's encoding against frame-address lists, pprof-style batches and 128-bit
// stack hashes (Elastic scheme), all computed in the same run on the same stream.
//
// The packed rows use the product's codec (common/encoding/packed_contexts.h) in the version
// agents ship (kPackedContextsVersion); the older layouts (versions 2 and 1, which servers
// still accept) are reported beside it for reference, with where the bytes of each go. The agent side's cost per sample compares the
// product's IntervalAggregator with the string-keyed map it replaced.
//
// Usage: encoding_benchmark [--stream=FILE] [--write_stream=FILE] [--intervals=N] [--functions=N]
//                       [benchmark flags]
// FILE uses the text format of sample_stream.h (record_stream writes one from a live process).
// Without --stream a synthetic stream is used.
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/numbers.h"
#include "benchmark/benchmark.h"
#include "common/encoding/graph.h"
#include "agent/core/interval_aggregator.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_contexts.h"
#include "common/encoding/packed_edges.h"
#include "tools/loadgen/pprof_style.h"
#include "tools/loadgen/sample_stream.h"

namespace strata::bench {
namespace {

using loadgen::FormatSampleStream;
using loadgen::FrameAddresses;
using loadgen::FunctionStart;
using loadgen::PutBytes;
using loadgen::PutPacked;
using loadgen::PutUint;
using loadgen::PutVarint;
using loadgen::ParseSampleStream;
using loadgen::SampleStream;
using loadgen::StreamFrame;
using loadgen::StreamStack;
using loadgen::SynthesizeSampleStream;
using loadgen::SyntheticOptions;
using encoding::CallGraph;
using encoding::EdgeId;
using encoding::EncodedContext;
using encoding::Encoder;
using encoding::NodeId;
using encoding::Numbering;
using encoding::PathFrame;

size_t Gzipped(const std::string& s) {
  uLongf len = compressBound(s.size());
  std::vector<Bytef> out(len);
  compress2(out.data(), &len, reinterpret_cast<const Bytef*>(s.data()), s.size(), 6);
  return len;
}

struct SchemeBytes {
  const char* name;
  std::vector<size_t> raw;   // per interval
  std::vector<size_t> gzip;  // per interval
};

// State kept after the report, used by the timing benchmarks.
struct World {
  SampleStream stream;
  CallGraph agent_graph;
  std::shared_ptr<const Numbering> numbering;
  std::vector<std::vector<EdgeId>> paths;  // distinct paths of the last interval
  std::vector<EncodedContext> encoded;
  std::vector<uint64_t> counts;  // of `encoded`
  std::string packed;            // packed_contexts of the last interval (shipped version)
  std::string packed_v2;         // the same in version 2
  std::string packed_v1;         // the same in version 1
  std::vector<std::vector<uint64_t>> addresses;
};
World* world = nullptr;

int RunReport(World& w) {
  SampleStream& stream = w.stream;
  std::vector<NodeId> node_of(stream.function_names.size());
  CallGraph& agent = w.agent_graph;
  for (auto& n : node_of) n = agent.AddNode();
  size_t shipped_nodes = encoding::kFirstFunctionNode;
  uint64_t shipped_edges = 0;

  CallGraph server;
  encoding::NumberingCache server_cache;

  SchemeBytes strata{"strata repeated ContextCount", {}, {}};
  const std::string packed_name =
      "strata packed_contexts v" + std::to_string(encoding::kPackedContextsVersion);
  SchemeBytes packed{packed_name.c_str(), {}, {}};
  SchemeBytes packed_v2{"strata packed_contexts v2", {}, {}};
  SchemeBytes frames{"frame-address lists", {}, {}};
  SchemeBytes pprof{"pprof-style batch", {}, {}};
  SchemeBytes elastic{"128-bit hash (Elastic)", {}, {}};
  std::vector<size_t> contexts_per_interval;
  std::vector<uint64_t> samples_per_interval;
  std::vector<size_t> packed_context_bytes;  // the packed_contexts field alone
  std::vector<size_t> packed_v2_bytes;       // the same field in version 2
  std::vector<size_t> packed_v1_bytes;       // the same field in version 1
  // Where the bytes go at steady state: GraphDelta nodes and edges (with their field
  // framing), the rest of the delta message, the batch message but packed_contexts, and the
  // packed field's parts per version.
  const size_t n_iv = stream.intervals.size();
  // Steady state: the last two thirds of a long stream; without the first interval (which
  // carries the whole graph) of a short one.
  const size_t steady_from = n_iv >= 10 ? n_iv / 3 : n_iv >= 3 ? 1 : 0;
  uint64_t delta_node_bytes = 0, delta_edge_bytes = 0, delta_message_bytes = 0;
  uint64_t delta_edge_message_bytes = 0;  // the same edges one CallEdge message each
  uint64_t delta_nodes = 0, delta_edges = 0;
  uint64_t batch_header_bytes = 0, batch_header_v2_bytes = 0;
  encoding::PackedContextsCost cost_shipped, cost_v2;
  std::map<size_t, uint64_t> depth_static, depth_dynamic;
  std::map<size_t, uint64_t> leaf_id_bytes;
  absl::flat_hash_set<std::vector<uint64_t>> elastic_known;
  absl::flat_hash_set<std::pair<NodeId, std::vector<uint64_t>>> distinct_ever;
  double compute_ms_total = 0;
  uint64_t decode_errors = 0;
  std::vector<EdgeId> decoded;

  for (size_t iv = 0; iv < stream.intervals.size(); ++iv) {
    // Agent: intern each stack's edge path during the interval (aggregating equal stacks).
    std::map<std::vector<EdgeId>, uint64_t> agg;
    std::map<std::vector<EdgeId>, const StreamStack*> example;
    for (const StreamStack& s : stream.intervals[iv]) {
      std::vector<PathFrame> pf;
      for (const StreamFrame& f : s.frames) pf.push_back({node_of[f.function], f.call_site});
      auto path = agent.AddPath(pf, s.truncated);
      if (!path.ok()) {
        std::fprintf(stderr, "AddPath: %s\n", std::string(path.status().message()).c_str());
        return 1;
      }
      agg[*path] += s.count;
      example.emplace(*path, &s);
    }
    // Ship: one numbering per batch, each distinct path encoded once.
    auto t0 = std::chrono::steady_clock::now();
    auto num = Numbering::Compute(agent, agent.num_edges());
    compute_ms_total +=
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    Encoder enc(**num);
    std::string delta_msg, batch_msg, packed_msg, packed_v2_msg;
    const bool steady = iv >= steady_from;
    {  // GraphDelta
      std::string d;
      size_t before = 0;
      PutUint(&d, 1, shipped_nodes);
      for (size_t n = shipped_nodes; n < agent.num_nodes(); ++n) {
        const uint32_t f = static_cast<uint32_t>(n - encoding::kFirstFunctionNode);
        std::string node;
        PutUint(&node, 1, n);
        PutBytes(&node, 2, stream.function_names[f]);
        PutBytes(&node, 3, "/opt/demo/bin/demo_service");
        PutBytes(&node, 4, std::string(20, '\xab'));
        PutUint(&node, 5, FunctionStart(f));
        before = d.size();
        PutBytes(&d, 2, node);
        if (steady) delta_node_bytes += d.size() - before, ++delta_nodes;
      }
      PutUint(&d, 3, shipped_edges);
      auto edges = encoding::ExportEdges(agent, shipped_edges, agent.num_edges());
      // As agents ship them: packed_edges, or one CallEdge each where packing is refused.
      const auto packed_edges =
          encoding::EncodePackedEdges(*edges, static_cast<NodeId>(shipped_nodes));
      std::string one_each;  // the edges as older agents send them
      for (const auto& e : *edges) {
        std::string ce;
        PutUint(&ce, 1, e.caller);
        PutUint(&ce, 2, e.call_site);
        PutUint(&ce, 3, e.callee);
        PutBytes(&one_each, 4, ce);
      }
      before = d.size();
      if (packed_edges) {
        PutBytes(&d, 5, *packed_edges);
      } else {
        d += one_each;
      }
      if (steady) {
        delta_edge_bytes += d.size() - before;
        delta_edge_message_bytes += one_each.size();
        delta_edges += edges->size();
      }
      if (shipped_nodes < agent.num_nodes() || shipped_edges < agent.num_edges()) {
        PutBytes(&delta_msg, 2, d);
        if (steady) delta_message_bytes += delta_msg.size();
        // Server applies the delta, with the edges as it reads them from the wire.
        std::vector<encoding::CallEdge> received;
        if (packed_edges) {
          if (!encoding::DecodePackedEdges(*packed_edges, static_cast<NodeId>(shipped_nodes),
                                           edges->size(), &received)
                   .ok()) {
            std::fprintf(stderr, "packed edges do not decode\n");
            return 1;
          }
        } else {
          received.assign(edges->begin(), edges->end());
        }
        if (!encoding::AppendNodes(server, static_cast<uint32_t>(shipped_nodes),
                                   agent.num_nodes() - shipped_nodes)
                 .ok() ||
            !encoding::AppendEdges(server, shipped_edges, received).ok()) {
          std::fprintf(stderr, "server rejected the delta\n");
          return 1;
        }
      }
      shipped_nodes = agent.num_nodes();
      shipped_edges = agent.num_edges();
    }
    std::vector<std::pair<EncodedContext, uint64_t>> ctxs;
    std::string target;
    PutUint(&target, 1, 1);
    PutBytes(&target, 2, "demo");
    PutUint(&target, 3, 4242);
    PutBytes(&target, 4, "/opt/demo/bin/demo_service");
    {
      std::string b;
      PutUint(&b, 1, iv + 1);
      PutUint(&b, 2, agent.num_edges());
      PutUint(&b, 3, 1700000000000 + iv * 10000);
      PutUint(&b, 4, 1700000000000 + (iv + 1) * 10000);
      PutBytes(&b, 5, target);
      for (const auto& [path, count] : agg) {
        auto c = enc.Encode(path);
        if (!c.ok()) return 1;
        std::string cc;
        PutUint(&cc, 1, 1);
        PutUint(&cc, 2, c->leaf);
        PutPacked(&cc, 3, c->ids);
        PutUint(&cc, 4, count);
        PutBytes(&b, 6, cc);
        ++depth_dynamic[c->ids.size() - 1] += count - 1;
        if (distinct_ever.insert({c->leaf, c->ids}).second) {
          ++depth_static[c->ids.size() - 1];
          std::string v;
          PutVarint(&v, c->ids.back());
          ++leaf_id_bytes[v.size()];
        }
        ctxs.emplace_back(*std::move(c), count);
      }
      PutBytes(&batch_msg, 3, b);
    }
    {  // The product's layout: SampleBatch.packed_contexts written by the product's codec.
      std::vector<encoding::ContextRecord> records;
      records.reserve(ctxs.size());
      for (const auto& [c, count] : ctxs) records.push_back({1, c, count});
      auto p = encoding::EncodePackedContexts(records, encoding::kPackedContextsVersion,
                                              steady ? &cost_shipped : nullptr);
      if (!p.ok()) {
        std::fprintf(stderr, "EncodePackedContexts: %s\n", std::string(p.status().message()).c_str());
        return 1;
      }
      auto p2 = encoding::EncodePackedContexts(records, encoding::kPackedContextsVersion2,
                                               steady ? &cost_v2 : nullptr);
      auto p1 = encoding::EncodePackedContexts(records, encoding::kPackedContextsVersion1);
      if (!p1.ok() || !p2.ok()) return 1;
      // The server's side: unpack both versions and compare with what was packed.
      auto by_context = [](const auto& a, const auto& b) {
        return std::tie(a.context.leaf, a.context.ids) < std::tie(b.context.leaf, b.context.ids);
      };
      std::sort(records.begin(), records.end(), by_context);
      for (const std::string* buffer : {&*p, &*p2, &*p1}) {
        auto unpacked = encoding::DecodePackedContexts(*buffer);
        if (!unpacked.ok() || unpacked->size() != records.size()) {
          ++decode_errors;
          continue;
        }
        std::sort(unpacked->begin(), unpacked->end(), by_context);
        if (*unpacked != records) ++decode_errors;
      }
      std::string b;
      PutUint(&b, 1, iv + 1);
      PutUint(&b, 2, agent.num_edges());
      PutUint(&b, 3, 1700000000000 + iv * 10000);
      PutUint(&b, 4, 1700000000000 + (iv + 1) * 10000);
      PutBytes(&b, 5, target);
      std::string b2 = b;
      PutBytes(&b, 9, *p);
      PutBytes(&packed_msg, 3, b);
      PutBytes(&b2, 9, *p2);
      PutBytes(&packed_v2_msg, 3, b2);
      if (steady) {
        batch_header_bytes += packed_msg.size() - p->size();
        batch_header_v2_bytes += packed_v2_msg.size() - p2->size();
      }
      packed_context_bytes.push_back(p->size());
      packed_v2_bytes.push_back(p2->size());
      packed_v1_bytes.push_back(p1->size());
      if (iv + 1 == stream.intervals.size()) {
        w.packed = *p;
        w.packed_v2 = *p2;
        w.packed_v1 = *p1;
      }
    }
    // Server: decode every context of the batch against the batch's epoch and compare.
    auto snum = server_cache.Get(server, agent.num_edges());
    if (!snum.ok()) return 1;
    {
      size_t k = 0;
      for (const auto& [path, count] : agg) {
        bool truncated = false;
        if (!(*snum)->DecodeEdges(ctxs[k++].first, &decoded, &truncated).ok() || decoded != path) {
          ++decode_errors;
        }
      }
    }
    contexts_per_interval.push_back(agg.size());
    samples_per_interval.push_back(0);
    for (const auto& [path, count] : agg) samples_per_interval.back() += count;
    strata.raw.push_back(delta_msg.size() + batch_msg.size());
    strata.gzip.push_back(Gzipped(delta_msg + batch_msg));
    packed.raw.push_back(delta_msg.size() + packed_msg.size());
    packed.gzip.push_back(Gzipped(delta_msg + packed_msg));
    packed_v2.raw.push_back(delta_msg.size() + packed_v2_msg.size());
    packed_v2.gzip.push_back(Gzipped(delta_msg + packed_v2_msg));

    // Baselines on the same distinct stacks.
    std::string fl, el;
    for (const auto& [path, count] : agg) {
      const StreamStack& s = *example.at(path);
      std::vector<uint64_t> addrs = FrameAddresses(s);
      {
        std::string m;
        PutPacked(&m, 1, addrs);
        PutUint(&m, 2, count);
        PutBytes(&fl, 1, m);
      }
      {
        // 128-bit hash of the frame list; the full stack goes once, when first seen.
        std::string h(16, '\0');
        const uint64_t h1 = absl::HashOf(addrs), h2 = absl::HashOf(addrs, 0x9e3779b97f4a7c15ull);
        std::memcpy(h.data(), &h1, 8);
        std::memcpy(h.data() + 8, &h2, 8);
        std::string m;
        PutBytes(&m, 1, h);
        PutUint(&m, 2, count);
        PutBytes(&el, 1, m);
        if (elastic_known.insert(addrs).second) {
          std::string full;
          PutBytes(&full, 1, h);
          PutPacked(&full, 2, addrs);
          PutBytes(&el, 2, full);
        }
      }
    }
    std::vector<std::pair<const StreamStack*, uint64_t>> distinct;
    for (const auto& [path, count] : agg) distinct.emplace_back(example.at(path), count);
    const std::string pp = loadgen::PprofStyleBatch(stream, distinct, iv);
    frames.raw.push_back(fl.size());
    frames.gzip.push_back(Gzipped(fl));
    elastic.raw.push_back(el.size());
    elastic.gzip.push_back(Gzipped(el));
    pprof.raw.push_back(pp.size());
    pprof.gzip.push_back(Gzipped(pp));

    if (iv + 1 == stream.intervals.size()) {
      w.numbering = *num;
      for (const auto& [path, count] : agg) {
        w.paths.push_back(path);
        w.addresses.push_back(FrameAddresses(*example.at(path)));
      }
      for (auto& c : ctxs) {
        w.encoded.push_back(c.first);
        w.counts.push_back(c.second);
      }
    }
  }

  uint64_t total_ctx = 0, steady_ctx = 0;
  for (size_t i = 0; i < n_iv; ++i) {
    total_ctx += contexts_per_interval[i];
    if (i >= steady_from) steady_ctx += contexts_per_interval[i];
  }
  std::printf("== stream: %zu functions, %zu intervals, graph %zu nodes / %llu edges "
              "(%llu back, %llu push edges in the last epoch)\n",
              stream.function_names.size(), n_iv, agent.num_nodes(),
              static_cast<unsigned long long>(agent.num_edges()),
              static_cast<unsigned long long>([&] {
                uint64_t b = 0;
                for (EdgeId e = 0; e < agent.num_edges(); ++e) b += agent.is_back_edge(e);
                return b;
              }()),
              static_cast<unsigned long long>(w.numbering->num_push_edges()));
  std::printf("   distinct contexts per interval: first %zu, last %zu; server decode mismatches: %llu\n",
              contexts_per_interval.front(), contexts_per_interval.back(),
              static_cast<unsigned long long>(decode_errors));
  std::printf("   Numbering::Compute per batch (agent side): %.3f ms average\n",
              compute_ms_total / n_iv);

  auto print_depth = [](const char* title, const std::map<size_t, uint64_t>& m) {
    uint64_t total = 0;
    for (auto [d, c] : m) total += c;
    std::printf("   %-30s", title);
    for (size_t d = 0; d <= 4; ++d) {
      uint64_t c = 0;
      for (auto [k, v] : m) {
        if (k == d || (d == 4 && k > 4)) c += v;
      }
      std::printf("  %6.2f%%", total ? 100.0 * c / total : 0.0);
    }
    std::printf("\n");
  };
  std::printf("\n== ID stack depth (pushed entries; depth 0 = a single number), paper Table 3 style\n");
  std::printf("   %-30s  %7s  %7s  %7s  %7s  %7s\n", "", "0", "1", "2", "3", ">=4");
  print_depth("distinct contexts (static)", depth_static);
  print_depth("samples (dynamic)", depth_dynamic);
  std::printf("   varint bytes of the leaf segment id over distinct contexts:");
  for (auto [b, c] : leaf_id_bytes) std::printf("  %zuB: %llu", b, static_cast<unsigned long long>(c));
  std::printf("\n");

  std::printf("\n== wire bytes per distinct context per batch (%zu intervals; steady = intervals %zu..%zu)\n",
              n_iv, steady_from + 1, n_iv);
  std::printf("   %-28s %12s %12s %12s %14s %12s %14s\n", "scheme", "interval 1", "steady", "all",
              "steady gzip", "vs pprof", "B/sample steady");
  const SchemeBytes* schemes[] = {&strata, &packed, &packed_v2, &frames, &elastic, &pprof};
  // Bytes of intervals [from, to) per unit of `per` (contexts or samples) in them.
  auto bytes_per = [](const std::vector<size_t>& v, const auto& per, size_t from, size_t to) {
    uint64_t bytes = 0, units = 0;
    for (size_t i = from; i < to; ++i) {
      bytes += v[i];
      units += per[i];
    }
    return units ? static_cast<double>(bytes) / units : 0.0;
  };
  auto per_ctx = [&](const std::vector<size_t>& v, size_t from, size_t to) {
    return bytes_per(v, contexts_per_interval, from, to);
  };
  auto per_sample = [&](const std::vector<size_t>& v, size_t from, size_t to) {
    return bytes_per(v, samples_per_interval, from, to);
  };
  const double pprof_steady = per_ctx(pprof.raw, steady_from, n_iv);
  for (const SchemeBytes* s : schemes) {
    const double steady = per_ctx(s->raw, steady_from, n_iv);
    std::printf("   %-28s %12.2f %12.2f %12.2f %14.2f %11.1fx %14.3f\n", s->name,
                per_ctx(s->raw, 0, 1), steady, per_ctx(s->raw, 0, n_iv),
                per_ctx(s->gzip, steady_from, n_iv), steady > 0 ? pprof_steady / steady : 0.0,
                per_sample(s->raw, steady_from, n_iv));
  }
  auto print_field = [&](const std::string& name, const std::vector<size_t>& v) {
    const double steady = per_ctx(v, steady_from, n_iv);
    std::printf("   %-28s %12.2f %12.2f %12.2f %14s %11.1fx %14.3f\n", name.c_str(),
                per_ctx(v, 0, 1), steady, per_ctx(v, 0, n_iv), "-",
                steady > 0 ? pprof_steady / steady : 0.0, per_sample(v, steady_from, n_iv));
    return steady;
  };
  const double field_steady = print_field(
      "  packed_contexts field, v" + std::to_string(encoding::kPackedContextsVersion),
      packed_context_bytes);
  const double field_v2_steady = print_field("  (old v2 field, reference)", packed_v2_bytes);
  print_field("  (old v1 field, reference)", packed_v1_bytes);
  uint64_t steady_samples = 0;
  for (size_t i = steady_from; i < n_iv; ++i) steady_samples += samples_per_interval[i];
  std::printf("   steady state: %.1f samples and %.1f distinct contexts per batch on average\n",
              static_cast<double>(steady_samples) / static_cast<double>(n_iv - steady_from),
              static_cast<double>(steady_ctx) / static_cast<double>(n_iv - steady_from));
  std::printf("   (vs pprof = pprof steady bytes / scheme steady bytes, uncompressed; strata rows "
              "include GraphDelta bytes with function names; baselines send no symbol data)\n");
  const double all_in_steady = per_ctx(packed.raw, steady_from, n_iv);
  const bool small = all_in_steady <= 2.5;
  const bool vs_pprof = all_in_steady > 0 && pprof_steady / all_in_steady >= 50.0;
  std::printf("   goal (v%d all-in at steady state, graph deltas and headers included: <= 2.5 B per "
              "distinct context, >= 50x fewer than pprof-style): %.2f B %s, %.1fx %s "
              "(field alone %.2f B, %.1fx)\n\n",
              encoding::kPackedContextsVersion, all_in_steady, small ? "met" : "NOT met",
              all_in_steady > 0 ? pprof_steady / all_in_steady : 0.0, vs_pprof ? "met" : "NOT met",
              field_steady, field_steady > 0 ? pprof_steady / field_steady : 0.0);

  // Where the bytes go, per distinct context at steady state.
  const double ctx = static_cast<double>(std::max<uint64_t>(steady_ctx, 1));
  auto row = [&](const char* part, double v3_bytes, double v2_bytes) {
    std::printf("   %-46s %8.3f %8.3f\n", part, v3_bytes / ctx, v2_bytes / ctx);
  };
  auto field_rows = [&](const encoding::PackedContextsCost& a,
                        const encoding::PackedContextsCost& b) {
    row("  packed_contexts: framing (groups, flush/pad)", a.framing / 8, b.framing / 8);
    row("  packed_contexts: leaf deltas", a.leaves / 8, b.leaves / 8);
    row("  packed_contexts: ID-stack lengths", a.stack_shapes / 8, b.stack_shapes / 8);
    row("  packed_contexts: single ids", a.single_ids / 8, b.single_ids / 8);
    row("  packed_contexts: innermost ids of stacks", a.innermost_ids / 8, b.innermost_ids / 8);
    row("  packed_contexts: inner ids (recursion)", a.inner_ids / 8, b.inner_ids / 8);
    row("  packed_contexts: counts", a.counts / 8, b.counts / 8);
  };
  uint64_t field_v3_total = 0, field_v2_total = 0;
  for (size_t i = steady_from; i < n_iv; ++i) {
    field_v3_total += packed_context_bytes[i];
    field_v2_total += packed_v2_bytes[i];
  }
  std::printf("== where the bytes go at steady state (B per distinct context)\n");
  std::printf("   %-46s %8s %8s\n", "part", ("v" + std::to_string(encoding::kPackedContextsVersion)).c_str(), "v2");
  const double delta_framing = static_cast<double>(delta_message_bytes) -
                               static_cast<double>(delta_node_bytes + delta_edge_bytes);
  row("graph delta: new nodes (names, binary, build id)", delta_node_bytes, delta_node_bytes);
  row("graph delta: new edges", delta_edge_bytes, delta_edge_bytes);
  row("graph delta: message framing", delta_framing, delta_framing);
  row("batch header (sequence, epoch, times, target)", batch_header_bytes, batch_header_v2_bytes);
  field_rows(cost_shipped, cost_v2);
  row("packed_contexts field", field_v3_total, field_v2_total);
  const double steady_batches = static_cast<double>(n_iv - steady_from);
  std::printf("   %-46s %8.3f %8.3f\n\n", "all-in", all_in_steady,
              per_ctx(packed_v2.raw, steady_from, n_iv));
  const double edges_shipped = static_cast<double>(std::max<uint64_t>(delta_edges, 1));
  std::printf("   graph delta per batch: %.1f new nodes, %.1f new edges: %.1f B per edge in "
              "packed_edges, %.1f B as one CallEdge each (older agents: all-in %.3f B)\n\n",
              static_cast<double>(delta_nodes) / steady_batches,
              static_cast<double>(delta_edges) / steady_batches,
              static_cast<double>(delta_edge_bytes) / edges_shipped,
              static_cast<double>(delta_edge_message_bytes) / edges_shipped,
              all_in_steady + (static_cast<double>(delta_edge_message_bytes) -
                               static_cast<double>(delta_edge_bytes)) / ctx);
  (void)field_v2_steady;
  (void)total_ctx;
  (void)steady_ctx;
  return decode_errors == 0 ? 0 : 1;
}

void BM_NumberingCompute(benchmark::State& state) {
  for (auto _ : state) {
    auto n = Numbering::Compute(world->agent_graph, world->agent_graph.num_edges());
    benchmark::DoNotOptimize(n);
  }
  state.counters["edges"] = static_cast<double>(world->agent_graph.num_edges());
  state.counters["nodes"] = static_cast<double>(world->agent_graph.num_nodes());
}
BENCHMARK(BM_NumberingCompute)->Unit(benchmark::kMicrosecond);

// A graph reloaded by the server (after a restart, or an Unload under the session memory
// budget): its edges classified again (arg 0, as records stored without their classification
// load) against the stored classification laid out (arg 1). The world's graph, then a chain
// of 16,384 edges added against its order (Pearce-Kelly's worst case, n^2 / 2 steps).
void ReloadGraph(benchmark::State& state, const CallGraph& g) {
  std::vector<uint8_t> back;
  for (EdgeId e = 0; e < g.num_edges(); ++e) back.push_back(g.is_back_edge(e) ? 1 : 0);
  const bool restore = state.range(0) == 1;
  for (auto _ : state) {
    CallGraph r;
    absl::Status st = encoding::AppendNodes(r, encoding::kFirstFunctionNode,
                                            g.num_nodes() - encoding::kFirstFunctionNode);
    if (st.ok()) {
      st = restore ? encoding::RestoreEdges(r, g.edges(), back)
                   : encoding::AppendEdges(r, 0, g.edges());
    }
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    benchmark::DoNotOptimize(r);
  }
  state.counters["edges"] = static_cast<double>(g.num_edges());
}
void BM_GraphReload(benchmark::State& state) { ReloadGraph(state, world->agent_graph); }
BENCHMARK(BM_GraphReload)->ArgName("restore")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_ChainGraphReload(benchmark::State& state) {
  static const CallGraph* chain = [] {
    constexpr NodeId kNodes = 16384;
    auto* g = new CallGraph;
    (void)encoding::AppendNodes(*g, encoding::kFirstFunctionNode, kNodes);
    for (NodeId k = encoding::kFirstFunctionNode; k + 1 < encoding::kFirstFunctionNode + kNodes;
         ++k) {
      (void)g->AddEdge({k + 1, 0x10, k});
    }
    return g;
  }();
  ReloadGraph(state, *chain);
}
BENCHMARK(BM_ChainGraphReload)->ArgName("restore")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_EncodeContext(benchmark::State& state) {
  Encoder enc(*world->numbering);
  EncodedContext out;
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(enc.EncodeInto(world->paths[i], &out));
    if (++i == world->paths.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_EncodeContext);

void BM_DecodeContextToEdges(benchmark::State& state) {
  std::vector<EdgeId> edges;
  bool truncated;
  size_t i = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(world->numbering->DecodeEdges(world->encoded[i], &edges, &truncated));
    if (++i == world->encoded.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodeContextToEdges);

void BM_DecodeContextToFrames(benchmark::State& state) {
  bool truncated;
  size_t i = 0;
  for (auto _ : state) {
    auto f = encoding::Decode(*world->numbering, world->encoded[i], &truncated);
    benchmark::DoNotOptimize(f);
    if (++i == world->encoded.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_DecodeContextToFrames);

// The product's packed_contexts codec on the last interval's contexts; items = contexts.
// Argument: the layout version (the shipped one, and version 1 for reference).
void SetPerContextCounters(benchmark::State& state, size_t contexts) {
  state.SetItemsProcessed(state.iterations() * contexts);
  // Seconds per context, printed with an SI prefix ("150n" = 150 ns).
  state.counters["sec_per_context"] = benchmark::Counter(
      static_cast<double>(contexts),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

void BM_PackContexts(benchmark::State& state) {
  const auto version = static_cast<uint8_t>(state.range(0));
  std::vector<encoding::ContextRecord> records;
  for (size_t i = 0; i < world->encoded.size(); ++i) {
    records.push_back({1, world->encoded[i], world->counts[i]});
  }
  for (auto _ : state) {
    // Copies: the agent hands a vector over.
    auto p = encoding::EncodePackedContexts(records, version);
    benchmark::DoNotOptimize(p);
  }
  SetPerContextCounters(state, records.size());
}
BENCHMARK(BM_PackContexts)
    ->Arg(encoding::kPackedContextsVersion)
    ->Arg(encoding::kPackedContextsVersion2)
    ->Arg(encoding::kPackedContextsVersion1)
    ->Unit(benchmark::kMicrosecond);

void BM_UnpackContexts(benchmark::State& state) {
  const std::string& packed = state.range(0) == encoding::kPackedContextsVersion1 ? world->packed_v1
                              : state.range(0) == encoding::kPackedContextsVersion2
                                  ? world->packed_v2
                                  : world->packed;
  size_t n = 0;
  for (auto _ : state) {
    auto r = encoding::DecodePackedContexts(packed);
    n = r.ok() ? r->size() : 0;
    benchmark::DoNotOptimize(r);
  }
  SetPerContextCounters(state, n);
}
BENCHMARK(BM_UnpackContexts)
    ->Arg(encoding::kPackedContextsVersion)
    ->Arg(encoding::kPackedContextsVersion2)
    ->Arg(encoding::kPackedContextsVersion1)
    ->Unit(benchmark::kMicrosecond);

// The packed_edges codec on the whole agent graph's edges in discovery order, as a new agent's
// first deltas carry them; items = edges.
void BM_PackEdges(benchmark::State& state) {
  const auto edges = world->agent_graph.edges();
  for (auto _ : state) {
    auto p = encoding::EncodePackedEdges(edges, encoding::kFirstFunctionNode);
    benchmark::DoNotOptimize(p);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(edges.size()));
}
BENCHMARK(BM_PackEdges)->Unit(benchmark::kMicrosecond);

void BM_UnpackEdges(benchmark::State& state) {
  const auto edges = world->agent_graph.edges();
  const std::string packed = *encoding::EncodePackedEdges(edges, encoding::kFirstFunctionNode);
  std::vector<encoding::CallEdge> out;
  for (auto _ : state) {
    out.clear();
    if (!encoding::DecodePackedEdges(packed, encoding::kFirstFunctionNode, edges.size(), &out)
             .ok() ||
        out.size() != edges.size()) {
      state.SkipWithError("packed edges do not decode");
    }
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(edges.size()));
}
BENCHMARK(BM_UnpackEdges)->Unit(benchmark::kMicrosecond);

// Agent-side cost of one interval, per sample: the last interval's samples (one Add each, as
// the profiler does, in a fixed shuffled order), then encoding the batch.
std::vector<uint32_t> IntervalSamples() {
  std::vector<uint32_t> order;
  for (size_t i = 0; i < world->paths.size(); ++i) order.insert(order.end(), world->counts[i], i);
  std::mt19937 rng(1);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

// The product: IntervalAggregator on the sorted table, packed_contexts.
void BM_IntervalAggregator(benchmark::State& state) {
  const std::vector<uint32_t> order = IntervalSamples();
  agent::IntervalAggregator agg;
  size_t bytes = 0;
  for (auto _ : state) {
    for (uint32_t i : order) agg.Add(1, world->paths[i], 1);
    v1::SampleBatch batch;
    if (!agg.EncodeInto(*world->numbering, &batch).ok()) state.SkipWithError("encode failed");
    bytes = batch.ByteSizeLong();
  }
  state.SetItemsProcessed(state.iterations() * order.size());
  state.counters["batch_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_IntervalAggregator)->Unit(benchmark::kMicrosecond);

// Baseline: the aggregator this replaced (absl::flat_hash_map keyed by a byte string built
// per sample, repeated ContextCount messages).
void BM_StringKeyedAggregator(benchmark::State& state) {
  const std::vector<uint32_t> order = IntervalSamples();
  absl::flat_hash_map<std::string, uint64_t> counts;
  size_t bytes = 0;
  for (auto _ : state) {
    for (uint32_t i : order) {
      const auto& edges = world->paths[i];
      const uint32_t target_id = 1;
      std::string key(4 + 8 * edges.size(), '\0');
      std::memcpy(key.data(), &target_id, 4);
      std::memcpy(key.data() + 4, edges.data(), 8 * edges.size());
      counts[key] += 1;
    }
    v1::SampleBatch batch;
    Encoder encoder(*world->numbering);
    EncodedContext encoded;
    std::vector<EdgeId> edges;
    for (const auto& [key, count] : counts) {
      uint32_t target_id;
      std::memcpy(&target_id, key.data(), 4);
      edges.resize((key.size() - 4) / 8);
      std::memcpy(edges.data(), key.data() + 4, 8 * edges.size());
      if (!encoder.EncodeInto(edges, &encoded).ok()) state.SkipWithError("encode failed");
      auto* c = batch.add_contexts();
      c->set_target_id(target_id);
      c->set_leaf(encoded.leaf);
      for (uint64_t id : encoded.ids) c->add_ids(id);
      c->set_count(count);
    }
    counts.clear();
    bytes = batch.ByteSizeLong();
  }
  state.SetItemsProcessed(state.iterations() * order.size());
  state.counters["batch_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_StringKeyedAggregator)->Unit(benchmark::kMicrosecond);

// Comparison: what a hash-based scheme pays per stack to identify it (hash the frame list).
void BM_Hash128FrameList(benchmark::State& state) {
  size_t i = 0;
  for (auto _ : state) {
    const auto& a = world->addresses[i];
    benchmark::DoNotOptimize(absl::HashOf(a));
    benchmark::DoNotOptimize(absl::HashOf(a, 0x9e3779b97f4a7c15ull));
    if (++i == world->addresses.size()) i = 0;
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Hash128FrameList);

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using namespace strata::bench;
  std::string stream_path, write_path;
  SyntheticOptions opts;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view flag) -> std::optional<std::string_view> {
      if (a.substr(0, flag.size()) == flag) return a.substr(flag.size());
      return std::nullopt;
    };
    if (auto v = value("--stream=")) {
      stream_path = std::string(*v);
    } else if (auto v = value("--write_stream=")) {
      write_path = std::string(*v);
    } else if (auto v = value("--intervals=")) {
      (void)absl::SimpleAtoi(absl::string_view(v->data(), v->size()), &opts.intervals);
    } else if (auto v = value("--functions=")) {
      (void)absl::SimpleAtoi(absl::string_view(v->data(), v->size()), &opts.functions);
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rargc = static_cast<int>(rest.size());
  benchmark::Initialize(&rargc, rest.data());
  static World w;
  world = &w;
  if (!stream_path.empty()) {
    std::ifstream in(stream_path);
    std::stringstream ss;
    ss << in.rdbuf();
    auto parsed = ParseSampleStream(ss.str());
    if (!in || !parsed.ok()) {
      std::fprintf(stderr, "cannot read %s: %s\n", stream_path.c_str(),
                   parsed.ok() ? "I/O error" : std::string(parsed.status().message()).c_str());
      return 1;
    }
    w.stream = *std::move(parsed);
    std::printf("== recorded stream %s\n", stream_path.c_str());
  } else {
    w.stream = SynthesizeSampleStream(opts);
    std::printf("== synthetic stream: %u functions, %u paths in the pool, %u samples/interval, "
                "Zipf s=%.2f, seed %u\n",
                opts.functions, opts.distinct_paths, opts.samples_per_interval, opts.zipf_s,
                opts.seed);
  }
  if (!write_path.empty()) {
    std::ofstream(write_path) << FormatSampleStream(w.stream);
  }
  if (w.stream.intervals.empty()) {
    std::fprintf(stderr, "empty stream\n");
    return 1;
  }
  if (int rc = RunReport(w); rc != 0) {
    std::fprintf(stderr, "report failed\n");
    return rc;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
