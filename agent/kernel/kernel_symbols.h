// agent/kernel (strata::agent::kernel): the running kernel's text symbols, for naming the
// kernel frames of samples taken with kernel stacks. Loaded once from /proc/kallsyms (the
// kernel image and its modules) by the StackRecorder's owner; immutable afterwards.
//
// Only text symbols ('t'/'T') are kept, in one sorted array of addresses and one arena of
// names (about 4.5 MiB for a 120,000-symbol distribution kernel). A pc belongs to the closest
// symbol at or below it. Offsets are relative to the kernel's _text (modules: to the module's
// lowest text symbol), so a function keeps its identity across boots with KASLR.
#ifndef STRATA_AGENT_KERNEL_KERNEL_SYMBOLS_H_
#define STRATA_AGENT_KERNEL_KERNEL_SYMBOLS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"

namespace strata::agent::kernel {

struct KernelSymbol {
  std::string_view name;    // valid as long as the KernelSymbols
  std::string_view module;  // "" for the kernel image, else the module's name ("xfs")
  uint64_t offset = 0;      // of the symbol's start, from the image's (module's) base
};

class KernelSymbols {
 public:
  // Parses kallsyms text. FailedPrecondition when every address reads 0 (kernel.kptr_restrict
  // hides them from this process) or there are no text symbols; InvalidArgument for a line
  // that is not "ADDRESS TYPE NAME [\[MODULE\]]".
  static absl::StatusOr<std::unique_ptr<KernelSymbols>> Parse(std::string_view text);
  // Reads and parses `path` (by default /proc/kallsyms); Unavailable if it cannot be read.
  static absl::StatusOr<std::unique_ptr<KernelSymbols>> Load(
      const std::string& path = "/proc/kallsyms");

  // The symbol covering `pc`; false below the first symbol.
  bool Lookup(uint64_t pc, KernelSymbol* out) const;

  size_t size() const { return addresses_.size(); }
  // The kernel's GNU build ID (raw bytes) from /sys/kernel/notes, or "" when unknown.
  const std::string& build_id() const { return build_id_; }
  void set_build_id(std::string id) { build_id_ = std::move(id); }

 private:
  KernelSymbols() = default;
  // Parse over lines from `next_line` (false at the end).
  static absl::StatusOr<std::unique_ptr<KernelSymbols>> Build(
      absl::FunctionRef<bool(std::string_view*)> next_line);

  std::vector<uint64_t> addresses_;     // ascending
  std::vector<uint32_t> name_offsets_;  // into names_ (NUL-terminated), parallel to addresses_
  std::vector<uint16_t> modules_;       // index into module_names_ (0: the kernel image)
  std::string names_;
  std::vector<std::string> module_names_;
  std::vector<uint64_t> module_bases_;  // lowest text address of each module
  std::string build_id_;
};

// The GNU build ID in an ELF note section's bytes (e.g. /sys/kernel/notes); "" if none.
std::string BuildIdFromNotes(std::string_view notes);

}  // namespace strata::agent::kernel

#endif  // STRATA_AGENT_KERNEL_KERNEL_SYMBOLS_H_
