// The anchor the calling-context encoding is measured against: a stream interval's distinct
// stacks as a pprof-style batch (profile.proto: a sample per stack listing its location IDs,
// and the location, function, mapping and string tables, re-sent with every batch, as an agent
// shipping pprof each interval sends them). Frames get synthetic addresses in one mapping
// (FrameAddresses), every function a source file of its own module. Shared by
// encoding_benchmark, which prints the ratio, and BytesPerContextGuardTest, which holds it.
#ifndef STRATA_TOOLS_LOADGEN_PPROF_STYLE_H_
#define STRATA_TOOLS_LOADGEN_PPROF_STYLE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tools/loadgen/sample_stream.h"

namespace strata::loadgen {

// Protocol buffers' wire format, as generated code writes it (proto3: a zero is not written).
void PutVarint(std::string* s, uint64_t v);
void PutUint(std::string* s, int field, uint64_t v);
void PutBytes(std::string* s, int field, std::string_view b);
void PutPacked(std::string* s, int field, const std::vector<uint64_t>& v);

// Where the synthetic program is loaded, and its functions' entry points in it.
inline constexpr uint64_t kLoadBase = 0x55d4c0a00000;
inline uint64_t FunctionStart(uint32_t f) { return 0x1000 + uint64_t{f} * 0x200; }
// A stack's frame addresses, leaf first (as unwinders report them): the leaf 8 bytes into its
// function, each caller at its call site.
std::vector<uint64_t> FrameAddresses(const StreamStack& s);

// Interval `interval`'s distinct stacks (each with its count, in the caller's order) as one
// pprof-style batch.
std::string PprofStyleBatch(const SampleStream& stream,
                            const std::vector<std::pair<const StreamStack*, uint64_t>>& stacks,
                            size_t interval);

}  // namespace strata::loadgen

#endif  // STRATA_TOOLS_LOADGEN_PPROF_STYLE_H_
