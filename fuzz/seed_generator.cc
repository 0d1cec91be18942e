// strata-fuzz-seeds OUT_DIR [ELF_FILE...]: writes the seed corpora of the fuzz targets into
// OUT_DIR/<target>/, made with the project's own encoders (agent ContextGraph, Encoder,
// EncodePackedContexts, the Spool writer) from a small synthetic program, plus seeds cut from
// the given ELF files (copies for `elf`, their CFI sections for `cfi`, MIPS64 functions for
// `mips64_prologue`). fuzz/make-seeds.sh builds the ELF files and runs it.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <linux/perf_event.h>

#include "absl/strings/str_format.h"
#include "agent/core/context_graph.h"
#include "agent/sampler/perf_regs.h"
#include "agent/spool/spool.h"
#include "common/elf/elf_file.h"
#include "common/elf/symbol_table.h"
#include "common/encoding/graph_delta_edges.h"
#include "common/encoding/numbering.h"
#include "common/encoding/packed_contexts.h"
#include "fuzz/fuzz_util.h"
#include "server/otlp/otlp_builder.h"
#include "strata/v1/ingest.pb.h"

namespace {

namespace fs = std::filesystem;
namespace enc = strata::encoding;
namespace v1 = strata::v1;
using strata::fuzz::PutChunk;
using strata::fuzz::PutUint;

std::string out_dir;

void Die(const std::string& what) {
  std::fprintf(stderr, "strata-fuzz-seeds: %s\n", what.c_str());
  std::exit(1);
}

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = fs::path(out_dir) / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) Die("cannot write " + (dir / name).string());
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Die("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A string literal with its NUL bytes.
template <size_t N>
std::string Lit(const char (&s)[N]) {
  return std::string(s, N - 1);
}

// Protobuf's delimited format: varint length, message.
template <typename M>
void AppendDelimited(std::string* out, const M& message) {
  const std::string bytes = message.SerializeAsString();
  enc::AppendVarint(out, bytes.size());
  out->append(bytes);
}

// A small program as the agent sees it: functions of two modules, sampled stacks (outermost
// first) with call sites, some truncated, one deeply recursive.
struct Program {
  strata::agent::ContextGraph graph{0x5eed5eed5eedull};
  std::map<std::string, enc::NodeId> nodes;
  struct Sample {
    uint32_t target;
    std::vector<enc::EdgeId> edges;
    uint64_t count;
  };
  std::vector<Sample> samples;

  enc::NodeId Node(const std::string& name) {
    if (auto it = nodes.find(name); it != nodes.end()) return it->second;
    const bool lib = name.starts_with("lib_");
    strata::agent::FunctionRecord f{name, lib ? "/usr/lib/x86_64-linux-gnu/libdemo.so.1"
                                              : "/usr/bin/demo-service",
                                    lib ? std::string("\x12\x34\x56\x78", 4) : std::string(),
                                    0x1000 + 0x40 * nodes.size()};
    return nodes[name] = graph.NodeFor(f);
  }
  void Add(uint32_t target, const std::vector<std::string>& stack, uint64_t count,
           bool truncated = false) {
    std::vector<enc::PathFrame> frames;
    for (size_t i = 0; i < stack.size(); ++i) {
      frames.push_back({Node(stack[i]), 0x1000 + 0x40 * frames.size() + 0x13 * i});
    }
    auto edges = graph.AddPath(frames, truncated);
    if (!edges.ok()) Die("AddPath: " + edges.status().ToString());
    samples.push_back({target, *edges, count});
  }
  // The contexts of the samples so far, encoded against the current epoch.
  std::vector<enc::ContextRecord> Records(size_t from = 0) {
    auto numbering = graph.CurrentNumbering();
    if (!numbering.ok()) Die("numbering: " + numbering.status().ToString());
    const enc::Encoder encoder(**numbering);
    std::vector<enc::ContextRecord> out;
    for (size_t i = from; i < samples.size(); ++i) {
      auto c = encoder.Encode(samples[i].edges);
      if (!c.ok()) Die("Encode: " + c.status().ToString());
      out.push_back({samples[i].target, *c, samples[i].count});
    }
    return out;
  }
};

void Populate(Program& p, int extra) {
  p.Add(1, {"_start", "main", "serve", "parse_request", "tokenize"}, 40);
  p.Add(1, {"_start", "main", "serve", "parse_request", "lib_memchr"}, 7);
  p.Add(1, {"_start", "main", "serve", "compress", "deflate", "lib_memcpy"}, 12);
  p.Add(2, {"thread_start", "worker", "deflate"}, 3);
  p.Add(2, {"thread_start", "worker"}, 1);
  p.Add(1, {"worker", "lib_memcpy"}, 2, /*truncated=*/true);
  std::vector<std::string> rec = {"_start", "main", "walk"};
  for (int i = 0; i < 24; ++i) rec.push_back(i % 3 == 2 ? "visit" : "walk");
  rec.push_back("lib_memcpy");
  p.Add(1, rec, 5);
  std::minstd_rand rng(42);
  const std::vector<std::string> fns = {"serve", "parse_request", "tokenize", "compress",
                                        "deflate", "walk", "visit", "lib_memchr", "lib_memcpy",
                                        "hash", "lookup", "respond"};
  for (int i = 0; i < extra; ++i) {
    std::vector<std::string> stack = {"_start", "main"};
    const int depth = 1 + static_cast<int>(rng() % 7);
    for (int d = 0; d < depth; ++d) stack.push_back(fns[rng() % fns.size()]);
    p.Add(1 + rng() % 3, stack, 1 + rng() % 50);
  }
}

std::string Packed(const std::vector<enc::ContextRecord>& records, uint8_t version) {
  auto packed = enc::EncodePackedContexts(records, version);
  if (!packed.ok()) Die("EncodePackedContexts: " + packed.status().ToString());
  return *packed;
}

v1::SampleBatch Batch(uint64_t seq, uint64_t epoch, const std::vector<enc::ContextRecord>& records,
                      bool packed, const std::string& capture_id = "") {
  v1::SampleBatch b;
  b.set_sequence(seq);
  b.set_epoch(epoch);
  b.set_start_ms(1'700'000'000'000 + static_cast<int64_t>(seq) * 10'000);
  b.set_end_ms(b.start_ms() + 10'000);
  for (uint32_t t = 1; t <= 3; ++t) {
    v1::Target* target = b.add_targets();
    target->set_id(t);
    target->set_service(t == 3 ? "batch-jobs" : "checkout");
    target->set_pid(4000 + t);
    target->set_executable("/usr/bin/demo-service");
  }
  if (!capture_id.empty()) b.set_capture_id(capture_id);
  if (packed) {
    b.set_packed_contexts(Packed(records, enc::kPackedContextsVersion));
  } else {
    for (const auto& r : records) {
      v1::ContextCount* c = b.add_contexts();
      c->set_target_id(r.target_id);
      c->set_leaf(r.context.leaf);
      for (uint64_t id : r.context.ids) c->add_ids(id);
      c->set_count(r.count);
    }
  }
  return b;
}

v1::AgentMessage HelloMessage() {
  v1::AgentMessage m;
  v1::Hello* h = m.mutable_hello();
  h->set_agent_id("host-a-0001");
  h->set_host("host-a");
  h->set_arch("x86_64");
  h->set_version("0.1.0");
  h->set_graph_id(0x5eed5eed5eedull);
  h->set_frequency_hz(99);
  (*h->mutable_labels())["zone"] = "eu-1";
  return m;
}

void EncodingSeeds() {
  {
    Program p;
    Populate(p, 0);
    auto records = p.Records();
    Seed("packed_contexts", "small_v3", Packed(records, enc::kPackedContextsVersion3));
    Seed("packed_contexts", "small_v2", Packed(records, enc::kPackedContextsVersion2));
    Seed("packed_contexts", "small_v1", Packed(records, enc::kPackedContextsVersion1));
  }
  {
    Program p;
    Populate(p, 120);
    auto records = p.Records();
    Seed("packed_contexts", "many_v3", Packed(records, enc::kPackedContextsVersion3));
    Seed("packed_contexts", "many_v2", Packed(records, enc::kPackedContextsVersion2));
    Seed("packed_contexts", "many_v1", Packed(records, enc::kPackedContextsVersion1));
  }
  {
    Program p;
    p.Add(1, {"main", "f"}, 1);
    Seed("packed_contexts", "one_v3", Packed(p.Records(), enc::kPackedContextsVersion3));
    Seed("packed_contexts", "one_v2", Packed(p.Records(), enc::kPackedContextsVersion2));
  }

  // Graph deltas: one message, then the same graph in small messages.
  {
    Program p;
    Populate(p, 40);
    std::string one;
    AppendDelimited(&one, p.graph.DeltaFrom(0, 0));
    Seed("graph_delta", "whole_graph", one);
    std::string split;
    uint32_t nodes = 0;
    uint64_t edges = 0;
    while (nodes < p.graph.num_nodes() || edges < p.graph.num_edges()) {
      v1::GraphDelta d = p.graph.DeltaFrom(nodes, edges, 4, 6);
      AppendDelimited(&split, d);
      nodes = d.first_node() + d.nodes_size();
      edges = d.first_edge() + d.edges_size();
      if (d.nodes_size() == 0 && d.edges_size() == 0) break;
    }
    Seed("graph_delta", "split_graph", split);
    v1::GraphDelta packed = p.graph.DeltaFrom(0, 0);
    enc::PackDeltaEdges(&packed);  // as agents send it
    std::string packed_one;
    AppendDelimited(&packed_one, packed);
    Seed("graph_delta", "whole_graph_packed_edges", packed_one);
  }
  {
    Program p;
    p.Add(1, {"a", "b", "c", "a", "b", "c", "b"}, 1);  // back edges
    p.Add(1, {"a", "c", "b", "a"}, 1);
    std::string s;
    AppendDelimited(&s, p.graph.DeltaFrom(0, 0));
    Seed("graph_delta", "cycles", s);
  }

  // Ingest streams.
  {
    Program p;
    Populate(p, 0);
    std::string s;
    AppendDelimited(&s, HelloMessage());
    v1::AgentMessage m;
    *m.mutable_graph_delta() = p.graph.DeltaFrom(0, 0);
    AppendDelimited(&s, m);
    m.Clear();
    *m.mutable_sample_batch() = Batch(1, p.graph.num_edges(), p.Records(), true);
    AppendDelimited(&s, m);
    Seed("ingest", "hello_delta_batch", s);

    // The same stream going on: repeated contexts, heartbeat, capture, resend, reconnect,
    // graph growth.
    const uint32_t nodes = p.graph.num_nodes();
    const uint64_t edges = p.graph.num_edges();
    m.Clear();
    *m.mutable_sample_batch() = Batch(2, edges, p.Records(), false);
    AppendDelimited(&s, m);
    m.Clear();
    v1::Heartbeat* hb = m.mutable_heartbeat();
    hb->set_time_ms(1'700'000'030'000);
    v1::Target* t = hb->add_targets();
    t->set_id(1);
    t->set_service("checkout");
    t->set_pid(4001);
    t->set_executable("/usr/bin/demo-service");
    AppendDelimited(&s, m);
    m.Clear();
    *m.mutable_sample_batch() = Batch(3, edges, p.Records(), true, "cap-0001");
    AppendDelimited(&s, m);
    m.Clear();
    v1::CaptureStatus* cs = m.mutable_capture_status();
    cs->set_capture_id("cap-0001");
    cs->set_samples(64);
    cs->set_effective_frequency_hz(997);
    cs->set_finished(true);
    AppendDelimited(&s, m);
    m.Clear();
    *m.mutable_sample_batch() = Batch(2, edges, p.Records(), false);  // resent after a lost Ack
    AppendDelimited(&s, m);
    AppendDelimited(&s, v1::AgentMessage());  // reconnect (harness convention)
    const size_t before = p.samples.size();
    p.Add(2, {"thread_start", "worker", "flush", "lib_write"}, 9);
    m.Clear();
    *m.mutable_graph_delta() = p.graph.DeltaFrom(nodes, edges);
    AppendDelimited(&s, m);
    m.Clear();
    *m.mutable_sample_batch() = Batch(5, p.graph.num_edges(), p.Records(before), true);
    AppendDelimited(&s, m);
    Seed("ingest", "long_stream", s);
  }
  {
    // A batch ahead of the graph (Resync), then the graph in two deltas, then the batch.
    Program p;
    Populate(p, 10);
    std::string s;
    AppendDelimited(&s, HelloMessage());
    v1::AgentMessage batch;
    *batch.mutable_sample_batch() = Batch(1, p.graph.num_edges(), p.Records(), true);
    AppendDelimited(&s, batch);
    v1::AgentMessage m;
    *m.mutable_graph_delta() = p.graph.DeltaFrom(0, 0, 8, 10);
    AppendDelimited(&s, m);
    const uint32_t nodes = m.graph_delta().first_node() + m.graph_delta().nodes_size();
    const uint64_t edges = m.graph_delta().first_edge() + m.graph_delta().edges_size();
    m.Clear();
    *m.mutable_graph_delta() = p.graph.DeltaFrom(nodes, edges);
    AppendDelimited(&s, m);
    AppendDelimited(&s, batch);
    Seed("ingest", "resync", s);
  }
}

// The spool as an agent leaves it on disk, packed in the spool fuzzer's input format.
void SpoolSeeds() {
  const std::string dir = (fs::temp_directory_path() / ("strata_fuzz_seeds_" + std::to_string(getpid()))).string();
  fs::remove_all(dir);
  Program p;
  Populate(p, 5);
  {
    strata::agent::spool::SpoolOptions options;
    options.dir = dir;
    options.segment_bytes = 600;  // several segments
    strata::agent::spool::SpoolRecovery recovery;
    auto spool = strata::agent::spool::Spool::Open(
        options, {"fuzz-agent", "fuzz-host", 0x5eed5eed5eedull},
        [](const strata::agent::spool::SpoolIdentity&, const v1::GraphDelta&) { return absl::OkStatus(); },
        &recovery);
    if (!spool.ok()) Die("Spool::Open: " + spool.status().ToString());
    const uint32_t nodes = p.graph.num_nodes();
    const uint64_t edges = p.graph.num_edges();
    if (auto st = (*spool)->AppendGraph(p.graph.DeltaFrom(0, 0)); !st.ok()) Die(st.ToString());
    for (uint64_t seq = 1; seq <= 4; ++seq) {
      if (auto st = (*spool)->Append(Batch(seq, edges, p.Records(), seq % 2 == 1)); !st.ok()) {
        Die(st.ToString());
      }
    }
    // Acknowledgements: one written into a segment with the next batch, one into the acked
    // file when the spool closes.
    (*spool)->AckThrough(1);
    const size_t before = p.samples.size();
    p.Add(3, {"thread_start", "worker", "flush", "lib_write"}, 9);
    if (auto st = (*spool)->AppendGraph(p.graph.DeltaFrom(nodes, edges)); !st.ok()) {
      Die(st.ToString());
    }
    if (auto st = (*spool)->Append(Batch(5, p.graph.num_edges(), p.Records(before), true));
        !st.ok()) {
      Die(st.ToString());
    }
    (*spool)->AckThrough(2);
  }
  const std::string agent_dir = dir + "/given/fuzz-agent";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(agent_dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::string whole, raw, torn;
  for (const std::string& name : names) {
    uint8_t tag;
    uint32_t sequence = 0;
    if (name == "graph.log") {
      tag = 0;
    } else if (name == "acked") {
      tag = 1;
    } else if (name.starts_with("batches-")) {
      tag = 2;
      sequence = static_cast<uint32_t>(std::stoull(name.substr(8)));
    } else {
      continue;  // LOCK
    }
    const std::string bytes = ReadFile(agent_dir + "/" + name);
    for (std::string* out : {&whole, &raw, &torn}) {
      out->push_back(static_cast<char>(tag | (out == &raw ? 0 : 0x80)));
      if (tag == 2) PutUint(out, sequence, 4);
      // The torn variant: the last segment cut in the middle of its last record.
      const bool cut = out == &torn && name == names.back();
      PutChunk(out, cut ? std::string_view(bytes).substr(0, bytes.size() - 7) : bytes);
    }
  }
  Seed("spool", "four_segments", whole);
  Seed("spool", "four_segments_raw", raw);
  Seed("spool", "torn_tail", torn);
  fs::remove_all(dir);
}

// perf ring seeds: records as the kernel writes them for the sampler's sample_type.
std::string SampleRecord(const strata::agent::sampler::UserRegsLayout& layout, uint32_t tid,
                         size_t stack_bytes) {
  std::string r;
  const size_t size = 8 + 8 + 8 + 8 + 8 * layout.count + 8 + stack_bytes + 8;
  PutUint(&r, PERF_RECORD_SAMPLE, 4);
  PutUint(&r, PERF_RECORD_MISC_USER, 2);
  PutUint(&r, size, 2);
  PutUint(&r, 4242, 4);  // pid
  PutUint(&r, tid, 4);
  PutUint(&r, 123456789012ull, 8);  // time
  PutUint(&r, PERF_SAMPLE_REGS_ABI_64, 8);
  for (int i = 0; i < layout.count; ++i) PutUint(&r, 0x7ffd0000ull + 0x100 * i, 8);
  PutUint(&r, stack_bytes, 8);
  for (size_t i = 0; i < stack_bytes; ++i) r.push_back(static_cast<char>(i * 7));
  PutUint(&r, stack_bytes - 16, 8);  // dyn_size
  return r;
}

// A sample with a kernel call chain (sessions with kernel stacks) and no stack copy.
std::string ChainedSampleRecord(const strata::agent::sampler::UserRegsLayout& layout) {
  std::string r;
  const uint64_t chain[] = {PERF_CONTEXT_KERNEL, 0xffffffff81000010ull, 0xffffffff81000020ull};
  const size_t size = 8 + 8 + 8 + 8 + 8 * 3 + 8 + 8 * layout.count + 8;
  PutUint(&r, PERF_RECORD_SAMPLE, 4);
  PutUint(&r, PERF_RECORD_MISC_KERNEL, 2);
  PutUint(&r, size, 2);
  PutUint(&r, 4242, 4);  // pid
  PutUint(&r, 4243, 4);  // tid
  PutUint(&r, 123456789012ull, 8);
  PutUint(&r, 3, 8);
  for (uint64_t ip : chain) PutUint(&r, ip, 8);
  PutUint(&r, PERF_SAMPLE_REGS_ABI_64, 8);
  for (int i = 0; i < layout.count; ++i) PutUint(&r, 0x7ffd0000ull + 0x100 * i, 8);
  PutUint(&r, 0, 8);  // no stack
  return r;
}

// A context switch record of an off-CPU session: the thread runs again.
std::string SwitchInRecord() {
  std::string r;
  PutUint(&r, PERF_RECORD_SWITCH, 4);
  PutUint(&r, 0, 2);
  PutUint(&r, 24, 2);
  PutUint(&r, 4242, 4);
  PutUint(&r, 4243, 4);
  PutUint(&r, 123456799012ull, 8);
  return r;
}

std::string LostRecord(uint64_t lost) {
  std::string r;
  PutUint(&r, PERF_RECORD_LOST, 4);
  PutUint(&r, 0, 2);
  PutUint(&r, 24, 2);
  PutUint(&r, 1, 8);  // id
  PutUint(&r, lost, 8);
  return r;
}

void PerfSeeds() {
  namespace s = strata::agent::sampler;
  for (bool mips : {false, true}) {
    const s::UserRegsLayout& layout = s::RegsLayoutFor(mips ? s::Arch::kMips64 : s::Arch::kX86_64);
    std::string data = SampleRecord(layout, 4243, 128) + LostRecord(3) +
                       SampleRecord(layout, 4244, 64);
    std::string seed;
    seed.push_back(static_cast<char>((mips ? 1 : 0) | (9 << 2)));  // ring of 4096 bytes
    PutUint(&seed, data.size(), 8);                                   // head
    PutUint(&seed, 0, 8);                                             // tail
    seed += data;
    Seed("perf_record", mips ? "samples_mips64" : "samples_x86_64", seed);

    // A 512-byte ring whose second record wraps around the end.
    const size_t ring = 512;
    std::string bytes(ring, '\0');
    const std::string first = SampleRecord(layout, 4245, 96);
    const std::string second = SampleRecord(layout, 4246, 160);
    const size_t tail = ring - first.size() - 64;
    std::string stream = first + second;
    for (size_t i = 0; i < stream.size(); ++i) bytes[(tail + i) % ring] = stream[i];
    seed.clear();
    seed.push_back(static_cast<char>((mips ? 1 : 0) | (6 << 2)));
    PutUint(&seed, 1024 + tail + stream.size(), 8);
    PutUint(&seed, 1024 + tail, 8);
    seed += bytes;
    Seed("perf_record", mips ? "wrapped_mips64" : "wrapped_x86_64", seed);
  }
  std::string lone;
  lone.push_back(0);
  PutUint(&lone, 0, 8);
  PutUint(&lone, 0, 8);
  lone += SampleRecord(s::RegsLayoutFor(s::Arch::kX86_64), 1, 32);
  Seed("perf_record", "parser_only", lone);
  for (const auto& [name, record] :
       {std::pair<const char*, std::string>{
            "parser_callchain", ChainedSampleRecord(s::RegsLayoutFor(s::Arch::kX86_64))},
        std::pair<const char*, std::string>{"parser_switch", SwitchInRecord()}}) {
    std::string seed;
    seed.push_back(0);
    PutUint(&seed, 0, 8);
    PutUint(&seed, 0, 8);
    seed += record;
    Seed("perf_record", name, seed);
  }
}

void ProcfsSeeds() {
  Seed("procfs", "maps",
       "55d4c8a00000-55d4c8a02000 r--p 00000000 fe:01 1311233                    /usr/bin/demo-service\n"
       "55d4c8a02000-55d4c8a08000 r-xp 00002000 fe:01 1311233                    /usr/bin/demo-service\n"
       "55d4ca1e3000-55d4ca204000 rw-p 00000000 00:00 0                          [heap]\n"
       "7f3a1c000000-7f3a1c021000 rw-p 00000000 00:00 0 \n"
       "7f3a20000000-7f3a20028000 r--p 00000000 fe:01 1050112                    /usr/lib/x86_64-linux-gnu/libc.so.6\n"
       "7f3a20028000-7f3a2019d000 r-xp 00028000 fe:01 1050112                    /usr/lib/x86_64-linux-gnu/libc.so.6\n"
       "7f3a201f0000-7f3a201f2000 rw-s 00000000 00:1a 77                         /dev/shm/strata-inproc-4242 (deleted)\n"
       "7f3a20200000-7f3a20210000 r-xp 00001000 fe:01 99                         /opt/my app/lib plugin.so\n"
       "7ffd4b5e1000-7ffd4b602000 rw-p 00000000 00:00 0                          [stack]\n"
       "7ffd4b7f8000-7ffd4b7fa000 r-xp 00000000 00:00 0                          [vdso]\n"
       "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n");
  Seed("procfs", "stat",
       "4242 (demo) service) S 1 4242 4242 0 -1 4194560 1289 0 0 0 12 3 0 0 20 0 4 0 "
       "987654 23456768 1024 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0\n");
  Seed("procfs", "cmdline", Lit("/usr/bin/demo-service\0--port\0" "8080\0--name=a b\0"));
  Seed("procfs", "environ",
       Lit("PATH=/usr/bin:/bin\0HOME=/home/svc\0STRATA_SERVICE=checkout\0LANG=C.UTF-8\0"
           "STRATA_SERVICE=shadowed\0EMPTY=\0"));
}

// What the OTel eBPF profiler sends: a Go service into the kernel, Python with lines and
// recursion, Java with source files, off-CPU nanoseconds.
void OtlpSeeds() {
  using strata::server::otlp::RequestBuilder;
  constexpr uint64_t kT0 = 1'700'000'000'000'000'000;
  RequestBuilder b;
  const int32_t api = b.Mapping("/usr/bin/api", "b1d0", 0x400000, 0x800000, 0);
  const int32_t vmlinux = b.Mapping("vmlinux");
  const int32_t libpython = b.Mapping("/usr/lib/libpython3.11.so");
  const int32_t libjvm = b.Mapping("/usr/lib/jvm/lib/server/libjvm.so");
  auto* go = b.AddResource({{"service.name", "api"}, {"host.name", "host-1"},
                            {"container.id", "c1"}});
  auto* cpu = b.AddProfile(go, "samples", "count", kT0, "cpu", 50'000'000);
  const int32_t go_stack =
      b.Stack({b.Location(vmlinux, 0xffffffff81000000, {{"ksys_write", "", 0}}, "kernel"),
               b.Location(api, 0x402000,
                          {{"main.encode", "enc.go", 5}, {"main.handle", "main.go", 20}}, "go"),
               b.Location(api, 0x401000, {}, "native")});
  b.AddSample(cpu, go_stack, b.AttributeList({{"thread.name", "w"}}), 3, kT0 + 1'000'000'000);
  auto* py = b.AddResource({{"service.name", "worker"}, {"host.name", "host-2"}});
  auto* py_cpu = b.AddProfile(py, "samples", "count", kT0);
  auto line = [&](int32_t mapping, const char* function, const char* file, int64_t at,
                  const char* kind) {
    return b.Location(mapping, 0, {{function, file, at}}, kind);
  };
  b.AddSample(py_cpu,
              b.Stack({line(libpython, "fib", "/srv/app.py", 4, "cpython"),
                       line(libpython, "fib", "/srv/app.py", 6, "cpython"),
                       line(libpython, "main", "/srv/app.py", 10, "cpython")}),
              {}, 7);
  b.AddSample(py_cpu,
              b.Stack({line(libjvm, "Spin.inner", "Spin.java", 6, "jvm"),
                       line(libjvm, "Spin.main", "Spin.java", 2, "hotspot")}),
              {}, 2);
  auto* off_cpu = b.AddProfile(py, "off_cpu", "nanoseconds", kT0, "off_cpu", 10'101'010);
  b.AddSample(off_cpu, go_stack, {}, 25'000'000);
  Seed("otlp_convert", "profiler_export", b.request().SerializeAsString());
}

// --- Seeds cut from ELF files ---

void CfiSeed(const std::string& name, const strata::elf::ElfFile& elf) {
  uint8_t arch = 0;
  if (elf.machine() == strata::elf::kMachineMips) arch = elf.big_endian() ? 2 : 1;
  std::string seed(1, static_cast<char>(arch));
  bool any = false;
  for (const char* section : {".text", ".eh_frame_hdr", ".eh_frame", ".debug_frame", ".got"}) {
    const strata::elf::Section* s = elf.FindSection(section);
    std::string_view bytes;
    if (s != nullptr) {
      auto data = elf.SectionData(*s);
      if (data.ok()) bytes = *data;
    }
    // .text only matters where FDEs cover signal trampolines; keep the seeds small.
    if (std::string_view(section) == ".text") bytes = bytes.substr(0, 1024);
    if (std::string_view(section) == ".got") bytes = bytes.substr(0, 64);
    if (std::string_view(section) == ".eh_frame" || std::string_view(section) == ".debug_frame") {
      any |= !bytes.empty();
    }
    PutUint(&seed, s != nullptr ? s->addr : 0, 8);
    PutChunk(&seed, bytes);
  }
  if (any) Seed("cfi", name, seed);
}

void MipsSeeds(const std::string& name, const strata::elf::ElfFile& elf) {
  if (elf.machine() != strata::elf::kMachineMips) return;
  auto table = strata::elf::SymbolTable::Build(elf);
  if (!table.ok()) return;
  const uint8_t flags = elf.big_endian() ? 1 : 0;
  int n = 0;
  // One function per seed.
  for (const auto& f : table->functions()) {
    if (f.end <= f.start || f.end - f.start > 2048 || n >= 6) continue;
    auto code = elf.ReadAt(f.start, f.end - f.start);
    if (!code) continue;
    std::string seed(1, static_cast<char>(flags | (f.is_plt() ? 2 : 0)));
    PutUint(&seed, f.start, 8);
    seed.push_back(1);
    PutUint(&seed, 0, 4);
    PutUint(&seed, f.end - f.start, 4);
    seed.push_back(f.is_plt() ? 1 : 0);
    seed += *code;
    Seed("mips64_prologue", absl::StrFormat("%s_fn%d", name, n++), seed);
  }
  // Several neighbouring functions with the table's ranges.
  std::vector<const strata::elf::SymbolTable::Function*> fns;
  for (const auto& f : table->functions()) {
    if (f.end > f.start && (fns.empty() || f.start >= fns.back()->end) && fns.size() < 8) {
      if (!fns.empty() && f.end - fns.front()->start > 3072) break;
      fns.push_back(&f);
    }
  }
  if (fns.size() < 2) return;
  const uint64_t base = fns.front()->start;
  auto code = elf.ReadAt(base, fns.back()->end - base);
  if (!code) return;
  std::string seed(1, static_cast<char>(flags));
  PutUint(&seed, base, 8);
  seed.push_back(static_cast<char>(fns.size()));
  for (const auto* f : fns) {
    PutUint(&seed, f->start - base, 4);
    PutUint(&seed, f->end - f->start, 4);
    seed.push_back(f->is_plt() ? 1 : 0);
  }
  seed += *code;
  Seed("mips64_prologue", name + "_table", seed);
}

void ElfSeeds(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  Seed("elf", name, ReadFile(path));
  auto elf = strata::elf::ElfFile::Open(path);
  if (!elf.ok()) Die(elf.status().ToString());
  CfiSeed(name, **elf);
  MipsSeeds(name, **elf);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Die("usage: strata-fuzz-seeds OUT_DIR [ELF_FILE...]");
  out_dir = argv[1];
  EncodingSeeds();
  SpoolSeeds();
  PerfSeeds();
  ProcfsSeeds();
  OtlpSeeds();
  for (int i = 2; i < argc; ++i) ElfSeeds(argv[i]);
  return 0;
}
