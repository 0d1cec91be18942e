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
// With each name come the method's source file (its package's path and the class's SourceFile
// attribute: "java/util/Arrays.java") and its line table (bytecode index to line, decoded from
// the compressed table after the method's bytecodes), so that frames carry lines.
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
#include <vector>

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
// And its bytecode pointer (rbp - 64, frame::interpreter_frame_bcp_offset): where the frame
// stands in its method's bytecode, saved at each call it makes (a leaf's is stale: the live one
// is in r13, RawSample::bcp).
inline constexpr uint64_t kBcpBelowReturnSlot = 72;

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
  // Lines, where the JVM publishes all of these (`lines`); methods are named without otherwise.
  bool lines = false;
  uint64_t const_method_flags = 0;      // ConstMethod::_flags (JDK 21 on _flags._flags): bit 0,
                                        // the method has a line table
  uint64_t const_method_code_size = 0;  // ConstMethod::_code_size (u2)
  uint64_t const_method_words = 0;      // ConstMethod::_constMethod_size (int, in words)
  uint64_t const_method_size = 0;       // sizeof(ConstMethod): its bytecodes follow it
  uint64_t constant_pool_source_file = 0;  // ConstantPool::_source_file_name_index (u2)
  uint32_t excess = 0;  // of the line table's compressed integers (HotSpotCodeLayout::excess)
};

// The offsets, from a JVM's tables (and its version, read through `memory`, for the line
// table's integers); NotFound where a field a name needs is missing.
absl::StatusOr<HotSpotOffsets> MethodOffsets(const HotSpotTables& tables,
                                             const python::RemoteMemory& memory);
// The same from the tables of the JVM whose libjvm.so is `elf`, loaded at `bias`
// (HotSpotTables::Read's errors too).
absl::StatusOr<HotSpotOffsets> ReadHotSpotOffsets(const elf::ElfFile& elf, int64_t bias,
                                                  const python::RemoteMemory& memory);

// One row of a method's line table: from bytecode index `bci` on, line `line`.
struct JavaLine {
  int32_t bci = 0, line = 0;
  friend bool operator==(const JavaLine&, const JavaLine&) = default;
};

// A method's compressed line table (HotSpot's CompressedLineNumberReadStream: a byte per row of
// small deltas, 0xFF and two zigzag UNSIGNED5 deltas otherwise, 0 at the end) from the start of
// `bytes`; nullopt where it does not end in `bytes` or goes where no table goes (a bytecode
// index or line out of range, at most kMaxJavaLines rows).
inline constexpr size_t kMaxJavaLines = 1 << 16;
std::optional<std::vector<JavaLine>> DecodeLineTable(std::span<const uint8_t> bytes,
                                                     uint32_t excess);

// A method's line table, sorted by bytecode index once (stably: of rows at one bci, the first
// is the one HotSpot's scan finds at it, the last the one before a later bci), with what each
// sample would otherwise scan it for.
class JavaLineTable {
 public:
  JavaLineTable() = default;
  explicit JavaLineTable(std::vector<JavaLine> rows);

  // HotSpot's Method::line_number_from_bci: the line of the row at `bci`, else of the last
  // before it (a negative bci: the method's entry); 0 where none is. At kUnknownBci, the
  // method's line where it has one line only.
  int32_t LineAt(int32_t bci) const;
  int32_t first_line() const { return first_line_; }  // 0: none
  const std::vector<JavaLine>& rows() const { return rows_; }
  friend bool operator==(const JavaLineTable& a, const JavaLineTable& b) {
    return a.rows_ == b.rows_;
  }

 private:
  std::vector<JavaLine> rows_;
  int32_t first_line_ = 0, only_line_ = 0;
};

// "pkg/path/File.java" from a class's internal name ("java/util/Arrays") and its SourceFile
// ("Arrays.java").
std::string JavaSourcePath(std::string_view class_name, std::string_view source_file);

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
    // Where its line table is (read with the rest, where the JVM publishes lines).
    uint16_t code_size = 0;
    bool has_lines = false;
    uint32_t words = 0;
    friend bool operator==(const Identity&, const Identity&) = default;
  };

  // The method at `method` and the time it was last checked, or null where it cannot be read
  // or is no method (a leaf sampled in the interpreter's entry code, before it set its frame
  // up, reads its caller's slot). `now_ns` (CLOCK_MONOTONIC): a method checked more than
  // kRecheckNs before is checked again (its Identity read: two reads), and named again when
  // that changed (six). Valid until the next call.
  struct Method {
    std::string name;
    std::string file;  // JavaSourcePath; empty where the class names no source file
    JavaLineTable lines;  // empty: no line known
    uint64_t code_begin = 0;      // its bytecodes' address (0: not known)
    Identity identity;
    uint64_t read_ns = 0;
    // For the owner: the function node it resolved this method to (0: none yet), cleared
    // when the name changed.
    mutable uint32_t owner_id = 0;

    // The bytecode index an interpreted frame's bytecode pointer `bcp` stands at; nullopt
    // outside the method's bytecodes (a slot that holds no bcp of this method).
    std::optional<int32_t> BciOf(uint64_t bcp) const;
  };
  const Method* Find(uint64_t method, uint64_t now_ns);

  static constexpr uint64_t kRecheckNs = 1'000'000'000;
  static constexpr size_t kMaxMethods = 1 << 16;

  uint64_t reads() const { return memory_->reads(); }
  // Whether methods have lines and source files (HotSpotOffsets::lines).
  bool lines() const { return offsets_.lines; }

 private:
  std::optional<Identity> ReadIdentity(uint64_t method) const;
  struct Details {
    std::string name, file;
    JavaLineTable lines;
  };
  std::optional<Details> ReadDetails(const Identity& identity) const;

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

  // The Method* and bytecode pointer of each of `frames` (innermost first: the first one's pc
  // exact, the others' return addresses) that runs in the interpreter, from the sample's stack
  // copy `stack` (from `sp` on), into `methods` and `bcps` (as many; 0 for the other frames
  // and for slots outside the copy). False when it found no method.
  bool MethodsOf(std::span<const unwind::Frame> frames, uint64_t sp,
                 std::span<const uint8_t> stack, uint64_t* methods, uint64_t* bcps) const;

 private:
  std::unique_ptr<HotSpotMethods> methods_;
  std::unique_ptr<HotSpotScopes> scopes_;
  absl::Status scopes_status_;
  uint64_t code_start_ = 0, code_end_ = 0;
  std::string module_;
};

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_HOTSPOT_METHODS_H_
