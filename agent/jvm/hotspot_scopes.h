// The calls HotSpot's JIT inlined into a compiled Java method. C1 and C2 inline small and hot
// callees into their caller's code, so a pc of a compiled method may run a method inside a
// method inside it, while the perf map names only the outermost: a profile would give the
// callees' time to their caller and hide every call they make from each other.
//
// The JIT records the inlined calls for each pc it may stop at (calls, safepoints, implicit
// checks) in the method's debug information: a PcDesc per such pc (its offset in the code and
// where its scope is), the scopes (compressed: the caller scope's offset, the method's index
// in the method's metadata table, the bytecode index), and that metadata table. The agent
// finds the nmethod around a pc through the code cache's segment map, copies those three
// parts from the JVM's memory once per compiled method the walk meets, and decodes the scope
// chain of each pc once. A return address has a PcDesc of its own; a sampled pc takes the
// next one after it, as HotSpot's AsyncGetCallTrace does.
//
// The layout is read from the JVM's own tables (HotSpotTables) in one of its two forms: JDK
// 17 to 22 (CompiledMethod, offsets from the nmethod) and JDK 23 on (the nmethod's immutable
// and mutable data out of line). x86-64 only, as the rest of agent/jvm. Owned by the stack
// recorder's per-target state (through HotSpotInterpreter); one thread.
#ifndef STRATA_AGENT_JVM_HOTSPOT_SCOPES_H_
#define STRATA_AGENT_JVM_HOTSPOT_SCOPES_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "agent/jvm/hotspot_tables.h"
#include "agent/python/remote_memory.h"
#include "agent/symbols/perf_map.h"

namespace strata::agent::jvm {

// Where one JVM keeps its compiled code and an nmethod's debug information.
struct HotSpotCodeLayout {
  // CodeCache::_heaps: the address of a GrowableArray<CodeHeap*>*.
  uint64_t heaps = 0;
  uint64_t array_length = 0, array_data = 0;  // GrowableArrayBase::_len, GrowableArray::_data
  // A CodeHeap's memory and segment map (VirtualSpaces, their _low and _high), and the log2
  // of its segment size; a blob follows its HeapBlock header (sizeof(HeapBlock)).
  uint64_t heap_memory = 0, heap_segmap = 0, heap_log2_segment_size = 0;
  uint64_t space_low = 0, space_high = 0;
  uint64_t heap_block_size = 0;
  uint64_t heap_block_used = 0;  // HeapBlock::Header::_used (bool)
  // The nmethod's own Method* and its compile ID (what tells one nmethod at an address from
  // the next one there).
  uint64_t method = 0, compile_id = 0;
  // PcDesc: its size and fields (ints).
  uint64_t pc_desc_size = 0, pc_desc_pc_offset = 0, pc_desc_scope_offset = 0;

  // JDK 17 to 22: CodeBlob::_code_begin (a pointer); the PcDescs from nmethod +
  // _scopes_pcs_offset to nmethod + _dependencies_offset; the scopes from
  // CompiledMethod::_scopes_data_begin (a pointer) to the PcDescs; the metadata from nmethod +
  // _metadata_offset to the scopes.
  // JDK 23 on (out_of_line): the code at nmethod + CodeBlob::_code_offset (an int); the
  // PcDescs from _immutable_data + _scopes_pcs_offset to _immutable_data +
  // _scopes_data_offset, the scopes from there to _immutable_data + _immutable_data_size; the
  // metadata from CodeBlob::_mutable_data + _relocation_size to _mutable_data +
  // _mutable_data_size.
  bool out_of_line = false;
  uint64_t code_begin = 0;
  uint64_t pcs_begin = 0, pcs_end = 0;
  uint64_t scopes_begin = 0, scopes_end = 0;
  uint64_t metadata_begin = 0, metadata_end = 0;
  uint64_t immutable_data = 0, mutable_data = 0;
  // CodeCache::_low_bound and _high_bound: the addresses of the code cache's bounds (0: not
  // published; every pc is then looked up).
  uint64_t low_bound = 0, high_bound = 0;
  // The scopes' compressed integers (UNSIGNED5) exclude this many byte values: 0 until JDK 19,
  // 1 from JDK 20 (its CompressedStream never writes a zero byte), by the JVM's major version.
  uint32_t excess = 0;
};

// The layout from a JVM's tables, and its major version read through `memory`. NotFound where
// a field is missing (a JVM of neither form), Unavailable where the version cannot be read.
absl::StatusOr<HotSpotCodeLayout> CodeLayout(const HotSpotTables& tables,
                                             const python::RemoteMemory& memory);

// The excess of a JVM's compressed integers (HotSpotCodeLayout::excess), from its major
// version; NotFound where it publishes none, Unavailable where it cannot be read.
absl::StatusOr<uint32_t> CompressedIntExcess(const HotSpotTables& tables,
                                             const python::RemoteMemory& memory);

// One of the scopes' compressed integers at `at` in `bytes` (HotSpot's UNSIGNED5: a byte below
// 192 ends the number, each byte after the first is worth 64 times the one before, at most five
// bytes); advances `at`. False past the end.
bool ReadCompressedInt(std::span<const uint8_t> bytes, uint32_t excess, size_t& at,
                       uint32_t* value);

// One scope of a compiled pc: the method it runs and where in its bytecode (-1: the method's
// entry, before its first bytecode; kUnknownBci: not known).
inline constexpr int32_t kUnknownBci = INT32_MIN;
struct JavaScope {
  uint64_t method = 0;
  int32_t bci = 0;
  friend bool operator==(const JavaScope&, const JavaScope&) = default;
};

// One nmethod's debug information, as copied.
struct CompiledMethodInfo {
  uint64_t blob = 0;        // the nmethod's address
  uint64_t code_begin = 0;  // what PcDesc offsets count from
  uint64_t method = 0;      // its own Method*
  int32_t compile_id = 0;
  struct Pc {
    int32_t pc_offset, scope_offset;
  };
  std::vector<Pc> pcs;          // ascending pc offsets
  std::vector<uint8_t> scopes;  // the scopes stream
  std::vector<uint64_t> metadata;
};

// Each scope at `pc` in `info`'s code, innermost first (the last one is the compiled method's
// own), into `out`; how many (0: no scope known there). `return_address`:
// the pc after a call (its PcDesc's own pc); else a sampled pc, whose scope is that of the
// first PcDesc after it.
size_t ScopesAt(const CompiledMethodInfo& info, uint64_t pc, bool return_address,
                uint32_t excess, std::span<JavaScope> out);

// The perf map's entry around a pc (ProcessAddressSpace::PerfMapEntryAt, which reads the map
// again for code newer than its last read).
using PerfMapLookup = absl::FunctionRef<bool(uint64_t pc, symbols::PerfMap::Symbol* out)>;

// The scopes of one JVM's compiled code, read from its memory.
class HotSpotScopes {
 public:
  // Scopes of more inlined calls than this are cut at their innermost ones.
  static constexpr size_t kMaxScopes = 16;
  // nmethods kept, and their debug information's bytes: all dropped past either.
  static constexpr size_t kMaxMethods = 4096;
  static constexpr size_t kMaxBytes = 8 << 20;
  // Return addresses' chains kept; all dropped past it.
  static constexpr size_t kMaxPcs = 1 << 16;
  static constexpr uint64_t kRecheckNs = 1'000'000'000;

  HotSpotScopes(HotSpotCodeLayout layout, std::unique_ptr<python::RemoteMemory> memory)
      : layout_(layout), memory_(std::move(memory)) {}

  // Each scope at `pc` (`return_address`: as ScopesAt), innermost first, where the perf map
  // (`lookup`) names the code around it as a compiled Java method; empty elsewhere and where the
  // JVM's memory says nothing (a return address without its PcDesc, a read failed). A sampled
  // pc without a PcDesc after it is its method's, at kUnknownBci. A pc's chain found more than
  // kRecheckNs before `now_ns` is checked again: against its method, itself checked again
  // (its compile ID and Method*: one system call) and read again when another took its
  // place; a pc the map did not name is looked up again. Return addresses' chains are kept
  // by pc; a sampled pc's (at a new address in most samples) is found each time, from the
  // method around it (the last few the map named are kept for a second). Valid until the
  // next call.
  std::span<const JavaScope> At(uint64_t pc, bool return_address, uint64_t now_ns,
                               PerfMapLookup lookup);

  size_t methods_read() const { return methods_read_; }

 private:
  struct Method {
    CompiledMethodInfo info;
    uint64_t read_ns = 0;
    uint64_t generation = 0;
  };
  struct Chain {
    uint64_t code_start = 0;  // 0: the map named no compiled method there
    uint64_t generation = 0;  // of the method it was read from
    uint64_t checked_ns = 0;  // when it was read or last checked
    uint8_t size = 0;
    JavaScope scopes[kMaxScopes];
  };
  // A perf map entry looked up for a sampled pc: [start, end), whether it names a compiled
  // method, and when it was looked up.
  struct Range {
    uint64_t start = 0, end = 0;
    bool compiled = false;
    uint64_t looked_up_ns = 0;
  };
  static constexpr size_t kRecentRanges = 8;

  // The nmethod whose blob holds `pc`, by the code cache's segment map; 0 where none.
  uint64_t FindBlob(uint64_t pc) const;
  std::unique_ptr<CompiledMethodInfo> ReadMethod(uint64_t blob) const;
  // The method whose code starts at `code_start`, read or checked as `At` says.
  const Method* MethodAt(uint64_t code_start, uint64_t pc, uint64_t now_ns);
  // Whether `pc` may be in the code cache (CodeCache::_low_bound, _high_bound, read once).
  bool InCodeCache(uint64_t pc, uint64_t now_ns);
  // The chain of a sampled pc, into leaf_.
  std::span<const JavaScope> LeafAt(uint64_t pc, uint64_t now_ns, PerfMapLookup lookup);

  HotSpotCodeLayout layout_;
  std::unique_ptr<python::RemoteMemory> memory_;
  absl::flat_hash_map<uint64_t, Method> methods_;  // by perf map start
  absl::flat_hash_map<uint64_t, Chain> chains_;    // of return addresses, by pc
  Chain leaf_;
  std::array<Range, kRecentRanges> recent_;
  size_t recent_next_ = 0;
  uint64_t low_bound_ = 0, high_bound_ = 0;  // 0, 0: not read (yet)
  uint64_t bounds_read_ns_ = 0;
  uint64_t next_generation_ = 1;
  size_t methods_read_ = 0;
  size_t bytes_ = 0;  // of the methods kept
};

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_HOTSPOT_SCOPES_H_
