// The names of HotSpot's interpreted Java frames. The template interpreter's frames keep rbp,
// so the walk leaves them by frame pointers, but their code is the interpreter's, the same for
// every method: the perf map names it "Interpreter". Each such frame holds its Method* at
// rbp - 24 (x86-64: frame::interpreter_frame_method_offset), copied with the sample's stack;
// the method's class, name and signature are read from the JVM's memory (Method ->
// ConstMethod -> ConstantPool -> Symbol) at offsets the JVM publishes for its serviceability
// agent (gHotSpotVMStructs, gHotSpotVMTypes in libjvm.so), once per method and checked again
// every second (a class unloaded frees its methods' memory for others).
//
// Names are those the JVM's perf map gives the method's compiled code ("RET CLASS.NAME(ARGS)",
// Java's type names), so a method's interpreted and compiled frames are one function in views.
// x86-64 only, as HotSpotFrames. Owned by the stack recorder's per-target state; one thread.
#ifndef STRATA_AGENT_JVM_HOTSPOT_METHODS_H_
#define STRATA_AGENT_JVM_HOTSPOT_METHODS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "agent/jvm/hotspot_scopes.h"
#include "agent/jvm/hotspot_tables.h"
#include "agent/python/remote_memory.h"
#include "common/elf/elf_file.h"
#include "common/unwind/unwind_types.h"

namespace strata::agent::jvm {

// Where an interpreted frame's Method* is, from the frame's return address slot (rbp + 8).
inline constexpr uint64_t kMethodBelowReturnSlot = 32;

// The offsets of the fields a method's name is read through, from the JVM's own tables.
struct HotSpotOffsets {
  uint64_t method_const_method = 0;       // Method::_constMethod
  uint64_t const_method_constants = 0;    // ConstMethod::_constants
  uint64_t const_method_name_index = 0;   // ConstMethod::_name_index (u2)
  uint64_t const_method_signature_index = 0;  // ConstMethod::_signature_index (u2)
  uint64_t constant_pool_holder = 0;      // ConstantPool::_pool_holder
  uint64_t constant_pool_size = 0;        // sizeof(ConstantPool): its slots follow it
  uint64_t klass_name = 0;                // Klass::_name
  uint64_t symbol_length = 0;             // Symbol::_length (u2)
  uint64_t symbol_body = 0;               // Symbol::_body
};

// The offsets, from a JVM's tables; NotFound where a field is missing.
absl::StatusOr<HotSpotOffsets> MethodOffsets(const HotSpotTables& tables);
// The same from the tables of the JVM whose libjvm.so is `elf`, loaded at `bias`
// (HotSpotTables::Read's errors too).
absl::StatusOr<HotSpotOffsets> ReadHotSpotOffsets(const elf::ElfFile& elf, int64_t bias,
                                                  const python::RemoteMemory& memory);

// "RET CLASS.NAME(ARGS)" from a class's internal name ("java/util/Arrays"), a method's name
// and its descriptor ("([II)V"); nullopt for a descriptor that does not parse.
std::optional<std::string> JavaMethodName(std::string_view class_name, std::string_view name,
                                          std::string_view descriptor);

// The names of one JVM's methods, cached by Method*.
class HotSpotMethods {
 public:
  HotSpotMethods(HotSpotOffsets offsets, std::unique_ptr<python::RemoteMemory> memory)
      : offsets_(offsets), memory_(std::move(memory)) {}

  // What tells one method at an address from another that took its place: its ConstMethod,
  // the constant pool and the two indexes into it (a class unloaded frees all of them).
  struct Identity {
    uint64_t const_method = 0, constants = 0;
    uint16_t name_index = 0, signature_index = 0;
    friend bool operator==(const Identity&, const Identity&) = default;
  };

  // The method at `method` and the time it was last checked, or null where it cannot be read
  // or is no method (a leaf sampled in the interpreter's entry code, before it set its frame
  // up, reads its caller's slot). `now_ns` (CLOCK_MONOTONIC): a method checked more than
  // kRecheckNs before is checked again (its Identity read: two reads), and named again when
  // that changed (six). Valid until the next call.
  struct Method {
    std::string name;
    Identity identity;
    uint64_t read_ns = 0;
    // For the owner: the function node it resolved this method to (0: none yet), cleared
    // when the name changed.
    mutable uint32_t owner_id = 0;
  };
  const Method* Find(uint64_t method, uint64_t now_ns);

  static constexpr uint64_t kRecheckNs = 1'000'000'000;
  static constexpr size_t kMaxMethods = 1 << 16;

  uint64_t reads() const { return memory_->reads(); }

 private:
  std::optional<Identity> ReadIdentity(uint64_t method) const;
  std::optional<std::string> ReadName(const Identity& identity) const;

  HotSpotOffsets offsets_;
  std::unique_ptr<python::RemoteMemory> memory_;
  absl::flat_hash_map<uint64_t, Method> methods_;
};

// One JVM's template interpreter as stacks meet it: where its code is (once the perf map names
// it), the module its methods are named in (the map's, as their compiled code's), the methods
// and the scopes of its compiled code. Owned by the stack recorder's per-target state.
class HotSpotInterpreter {
 public:
  // The interpreter of the JVM `pid` whose libjvm.so is `elf`, loaded at `bias`: its tables
  // read once (ReadHotSpotOffsets' errors).
  static absl::StatusOr<std::unique_ptr<HotSpotInterpreter>> Attach(pid_t pid,
                                                                    const elf::ElfFile& elf,
                                                                    int64_t bias);
  explicit HotSpotInterpreter(std::unique_ptr<HotSpotMethods> methods)
      : methods_(std::move(methods)) {}

  // The perf map's "Interpreter" entry: [start, end), absolute, in `module`.
  void SetCode(uint64_t start, uint64_t end, std::string module);
  // The module alone (the perf map's), where compiled code's frames are named before any
  // stack has met the interpreter.
  void SetModule(std::string module) { module_ = std::move(module); }
  bool code_known() const { return code_end_ != 0; }
  bool Contains(uint64_t pc) const { return pc >= code_start_ && pc < code_end_; }
  const std::string& module() const { return module_; }
  HotSpotMethods& methods() { return *methods_; }
  // The inlined calls of its compiled code; null where the JVM's layout is not one the agent
  // reads (why: scopes_status()).
  HotSpotScopes* scopes() { return scopes_.get(); }
  const absl::Status& scopes_status() const { return scopes_status_; }
  void SetScopes(absl::StatusOr<std::unique_ptr<HotSpotScopes>> scopes);

  // The Method* of each of `frames` (innermost first: the first one's pc exact, the others'
  // return addresses) that runs in the interpreter, from the sample's stack copy `stack`
  // (from `sp` on), into `methods` (as many; 0 for the other frames and for slots outside the
  // copy). False when it found none.
  bool MethodsOf(std::span<const unwind::Frame> frames, uint64_t sp,
                 std::span<const uint8_t> stack, uint64_t* methods) const;

 private:
  std::unique_ptr<HotSpotMethods> methods_;
  std::unique_ptr<HotSpotScopes> scopes_;
  absl::Status scopes_status_;
  uint64_t code_start_ = 0, code_end_ = 0;
  std::string module_;
};

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_HOTSPOT_METHODS_H_
