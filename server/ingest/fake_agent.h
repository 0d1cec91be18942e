// Test support for ingest: what an agent sends, built the way an agent builds it (a call
// graph shipped as deltas, paths encoded against it, batches in either context form).
#ifndef STRATA_SERVER_INGEST_FAKE_AGENT_H_
#define STRATA_SERVER_INGEST_FAKE_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/encoding/graph.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_contexts.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.pb.h"

namespace strata::server::ingest {

// Mirrors what an agent does: builds a graph, ships it as a delta, encodes paths.
struct FakeAgent {
  encoding::CallGraph graph;
  std::vector<std::string> names{"<root>", "<truncated>"};
  std::vector<std::string> modules{"", ""}, build_ids{"", ""};  // by node, like names

  // The node of function `name` (names are unique), added in `module` (build ID: raw bytes,
  // may be empty) when new.
  encoding::NodeId Function(const std::string& name, const std::string& module = "/bin/demo",
                            const std::string& build_id = "") {
    for (size_t i = 2; i < names.size(); ++i) {
      if (names[i] == name) return static_cast<encoding::NodeId>(i);
    }
    names.push_back(name);
    modules.push_back(module);
    build_ids.push_back(build_id);
    return graph.AddNode();
  }
  v1::GraphDelta Delta(uint32_t from_node, uint64_t from_edge) const {
    v1::GraphDelta d;
    d.set_first_node(from_node);
    for (uint32_t n = from_node; n < graph.num_nodes(); ++n) {
      auto* fn = d.add_nodes();
      fn->set_id(n);
      fn->set_name(names[n]);
      fn->set_module(modules[n]);
      fn->set_build_id(build_ids[n]);
      fn->set_start_offset(n * 16);
    }
    d.set_first_edge(from_edge);
    for (uint64_t e = from_edge; e < graph.num_edges(); ++e) {
      auto* ce = d.add_edges();
      ce->set_caller(graph.edge(e).caller);
      ce->set_call_site(graph.edge(e).call_site);
      ce->set_callee(graph.edge(e).callee);
    }
    return d;
  }
  v1::ContextCount Context(const std::vector<std::string>& path, uint64_t count,
                           bool truncated = false) {
    std::vector<encoding::PathFrame> frames;
    for (size_t i = 0; i < path.size(); ++i) frames.push_back({Function(path[i]), 100 + i});
    std::shared_ptr<const encoding::Numbering> numbering;
    auto encoded = encoding::EncodePath(graph, frames, truncated, &numbering);
    EXPECT_TRUE(encoded.ok()) << encoded.status();
    v1::ContextCount c;
    c.set_leaf(encoded->leaf);
    for (uint64_t id : encoded->ids) c.add_ids(id);
    c.set_count(count);
    return c;
  }
};

// How a batch carries its contexts: the repeated ContextCount field (older agents) or
// packed_contexts (current agents).
enum class Form { kRepeated, kPacked };

// Moves the batch's repeated contexts into packed_contexts.
inline void Pack(v1::SampleBatch* b) {
  std::vector<encoding::ContextRecord> records;
  for (const auto& c : b->contexts()) {
    records.push_back({c.target_id(), {c.leaf(), {c.ids().begin(), c.ids().end()}}, c.count()});
  }
  auto packed = encoding::EncodePackedContexts(records);
  ASSERT_TRUE(packed.ok()) << packed.status();
  b->set_packed_contexts(*packed);
  b->clear_contexts();
}

// Batch `seq` of target 1 (service "demo", pid 42), windows of 10 s from 1'700'000'000'000.
inline v1::SampleBatch Batch(uint64_t seq, uint64_t epoch, std::vector<v1::ContextCount> contexts,
                             Form form = Form::kRepeated, uint32_t target_id = 1) {
  v1::SampleBatch b;
  b.set_sequence(seq);
  b.set_epoch(epoch);
  b.set_start_ms(1'700'000'000'000 + seq * 10'000);
  b.set_end_ms(b.start_ms() + 10'000);
  auto* t = b.add_targets();
  t->set_id(1);
  t->set_service("demo");
  t->set_pid(42);
  for (auto& c : contexts) {
    c.set_target_id(target_id);
    *b.add_contexts() = c;
  }
  if (form == Form::kPacked) Pack(&b);
  return b;
}

}  // namespace strata::server::ingest

#endif  // STRATA_SERVER_INGEST_FAKE_AGENT_H_
