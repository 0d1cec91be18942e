// Fuzz target: the scopes of a HotSpot compiled method (agent/jvm/hotspot_scopes.h), decoded
// from what the agent copies out of a JVM's memory: its PcDescs, its scopes stream and its
// metadata table. A target process may hold anything there.
//
// Input: u8 flags (bit 0: integers with the excess of JDK 20 on), u8 PcDesc count (0-63),
// per PcDesc i32 pc offset and i32 scope offset, u8 metadata count (0-31), per entry u64, u64
// the method's own Method*; then the scopes bytes. Little-endian framing. Every PcDesc's pc
// (and the pcs either side of it) is asked for, as a return address and as a sampled pc, into
// outputs of every size from 1 to HotSpotScopes::kMaxScopes.
// The scopes bytes are also read as a method's line table (hotspot_methods.h), which a target
// may hold anything in too.
// Oracles besides the sanitizers, what ScopesAt promises: at most the output's size, and a
// chain found ends with the method's own Method*, names only methods of the metadata and
// stands at bytecode indexes a method may have; a line table's rows are such indexes and
// positive lines.
#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "agent/jvm/hotspot_methods.h"
#include "agent/jvm/hotspot_scopes.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace jvm = strata::agent::jvm;

void Check(const jvm::CompiledMethodInfo& info, uint64_t pc, bool return_address,
           uint32_t excess) {
  std::array<jvm::JavaScope, jvm::HotSpotScopes::kMaxScopes> out;
  for (size_t room = 1; room <= out.size(); room *= 2) {
    const size_t n = jvm::ScopesAt(info, pc, return_address, excess, {out.data(), room});
    STRATA_FUZZ_CHECK(n <= room, "%zu scopes into room for %zu", n, room);
    if (n == 0) continue;
    STRATA_FUZZ_CHECK(out[n - 1].method == info.method,
                      "the outermost scope is not the method's own");
    for (size_t i = 0; i < n; ++i) {
      STRATA_FUZZ_CHECK(std::find(info.metadata.begin(), info.metadata.end(), out[i].method) !=
                            info.metadata.end(),
                        "scope %zu names a method outside the metadata", i);
      STRATA_FUZZ_CHECK(out[i].bci >= -1 && out[i].bci <= 0xFFFF, "scope %zu at bci %d", i,
                        out[i].bci);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::InputReader in(data, size);
  const uint32_t excess = in.U8() & 1;
  jvm::CompiledMethodInfo info;
  info.code_begin = 0x10000;
  const size_t pcs = in.U8() % 64;
  for (size_t i = 0; i < pcs; ++i) {
    const auto pc_offset = static_cast<int32_t>(in.U32());
    const auto scope_offset = static_cast<int32_t>(in.U32());
    info.pcs.push_back({pc_offset, scope_offset});
  }
  // ReadMethod keeps only ascending PcDescs.
  std::sort(info.pcs.begin(), info.pcs.end(),
            [](const auto& a, const auto& b) { return a.pc_offset < b.pc_offset; });
  const size_t metadata = in.U8() % 32;
  for (size_t i = 0; i < metadata; ++i) info.metadata.push_back(in.U64());
  info.method = in.U64();
  const std::string_view scopes = in.Bytes(in.remaining());
  info.scopes.assign(scopes.begin(), scopes.end());

  for (const jvm::CompiledMethodInfo::Pc& p : info.pcs) {
    for (int64_t delta : {-1, 0, 1}) {
      const int64_t offset = int64_t{p.pc_offset} + delta;
      const uint64_t pc = info.code_begin + static_cast<uint64_t>(offset);
      Check(info, pc, true, excess);
      Check(info, pc, false, excess);
    }
  }
  // The same bytes as a method's line table.
  if (const auto lines = jvm::DecodeLineTable(info.scopes, excess); lines.has_value()) {
    STRATA_FUZZ_CHECK(lines->size() <= jvm::kMaxJavaLines, "%zu rows", lines->size());
    for (const jvm::JavaLine& row : *lines) {
      STRATA_FUZZ_CHECK(row.bci >= 0 && row.bci <= 0xFFFF && row.line > 0, "row %d:%d", row.bci,
                        row.line);
    }
  }
  // The compressed integers alone, read to the end.
  for (size_t at = 0; at < info.scopes.size();) {
    uint32_t value = 0;
    const size_t before = at;
    if (!jvm::ReadCompressedInt(info.scopes, excess, at, &value)) break;
    STRATA_FUZZ_CHECK(at > before && at - before <= 5 && at <= info.scopes.size(),
                      "an integer of %zu bytes", at - before);
  }
  return 0;
}
