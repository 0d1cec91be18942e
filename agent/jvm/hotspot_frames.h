// The frames of HotSpot's compiled Java methods, for the unwinder. C1 and C2 code keeps no
// frame pointer (unless the JVM runs with -XX:+PreserveFramePointer): rbp is a register like
// any other, so a walk by frame pointers ends at the first compiled frame. Each compiled
// method's entry code builds a frame of a fixed size, and that code says the size: the
// layout is read from the method's first bytes in the JVM's memory, once per method the
// walk meets (symbols::JitFrameLayouts, asked by the target's address space).
//
// x86-64 only: HotSpot's only other JIT on the agent's architectures would be MIPS64's, and
// Debian's JDK there is Zero (an interpreter, no JIT code).
#ifndef STRATA_AGENT_JVM_HOTSPOT_FRAMES_H_
#define STRATA_AGENT_JVM_HOTSPOT_FRAMES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "agent/python/remote_memory.h"
#include "agent/symbols/process_address_space.h"

namespace strata::agent::jvm {

// How many of a code object's first bytes the entry code is looked for in: past the inline
// cache check of a virtual method's unverified entry, its alignment and the stack bang.
inline constexpr size_t kEntryScanBytes = 96;

// The frame layout HotSpot's x86-64 entry code at the start of `code` (a compiled method's
// first bytes) builds, or nullopt where `code` starts with neither of its two forms:
//   [stack bang] push rbp; [mov rbp, rsp]; [sub rsp, N]    (C1, and C2 with a stack bang)
//   sub rsp, N; mov [rsp + N - 8], rbp                     (C2 without one; N in 8 bits
//                                                           or 32)
// A method made not entrant keeps its frames' code: the jump HotSpot writes over its stack
// bang leaves the push and the sub behind it.
std::optional<symbols::JitFrameLayout> DecodeHotSpotEntry(std::span<const uint8_t> code);

// Whether a perf map name is a compiled Java method's ("RET CLASS.METHOD(ARGS)"), not one of
// the stubs, adapters and blobs HotSpot names alongside ("StubRoutines (1)", "Interpreter",
// "I2C/C2I adapters"), whose frames keep rbp.
bool IsCompiledMethodName(std::string_view name);

// The layouts of one JVM's compiled methods, read from its memory.
class HotSpotFrames final : public symbols::JitFrameLayouts {
 public:
  explicit HotSpotFrames(std::unique_ptr<python::RemoteMemory> memory)
      : memory_(std::move(memory)) {}

  std::optional<symbols::JitFrameLayout> Layout(uint64_t start, uint64_t size,
                                                std::string_view name) const override;

 private:
  std::unique_ptr<python::RemoteMemory> memory_;
};

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_HOTSPOT_FRAMES_H_
