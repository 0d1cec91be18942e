// Frame kinds by module name: the convention agents use to say that a function node is kernel
// code or JIT code, and that queries use to mark such frames. Carrying the kind in the module
// name keeps the wire, the store and every tool that prints "function (module)" unchanged, the
// way perf names "[kernel.kallsyms]" and "[xfs]".
//
//   kernel image     "[kernel.kallsyms]"
//   kernel module    "[kernel:MODULE]"         e.g. "[kernel:xfs]"
//   JIT code         "[jit]"                   anonymous executable memory without a perf map
//                    "[jit:PATH]"              named from the perf map at PATH
//   Python           "[python:FILE]"           a function read from a CPython interpreter's
//                                              frames (FILE: its co_filename)
//   Java             "[java:FILE]"             a method read from a HotSpot JVM's memory
//                    "[java]"                  (FILE: its package's path and its class's
//                                              SourceFile, "java/util/Arrays.java"; none:
//                                              the class names no source file)
//
// Python and Java functions' offsets (call sites, leaf addresses) are lines: a caller's call
// site is its line + 1 (one past, as a return address is), a leaf's address its line.
//
// Every other module name (a file path, "[vdso]", "[unknown]") is user code.
#ifndef STRATA_COMMON_BASE_FRAME_KIND_H_
#define STRATA_COMMON_BASE_FRAME_KIND_H_

#include <string>
#include <string_view>
#include <utility>

namespace strata::base {

enum class FrameKind { kUser = 0, kKernel = 1, kJit = 2, kPython = 3, kJava = 4 };

inline constexpr std::string_view kKernelModule = "[kernel.kallsyms]";
inline constexpr std::string_view kJitModule = "[jit]";
inline constexpr std::string_view kJavaModule = "[java]";

inline std::string KernelModuleName(std::string_view module) {
  if (module.empty()) return std::string(kKernelModule);
  return "[kernel:" + std::string(module) + "]";
}

inline std::string JitModuleName(std::string_view perf_map_path) {
  if (perf_map_path.empty()) return std::string(kJitModule);
  return "[jit:" + std::string(perf_map_path) + "]";
}

inline std::string PythonModuleName(std::string_view file) {
  return "[python:" + std::string(file) + "]";
}

inline std::string JavaModuleName(std::string_view file) {
  if (file.empty()) return std::string(kJavaModule);
  return "[java:" + std::string(file) + "]";
}

// The file of a Python or Java module ("[python:FILE]", "[java:FILE]"); empty for others.
inline std::string_view SourceFileOf(std::string_view module) {
  for (std::string_view prefix : {std::string_view("[python:"), std::string_view("[java:")}) {
    if (module.starts_with(prefix) && module.ends_with("]")) {
      return module.substr(prefix.size(), module.size() - prefix.size() - 1);
    }
  }
  return {};
}

// Whether the kind's offsets are lines (Python and Java functions), not machine addresses.
inline bool OffsetsAreLines(FrameKind kind) {
  return kind == FrameKind::kPython || kind == FrameKind::kJava;
}

inline FrameKind FrameKindOf(std::string_view module) {
  if (module == kKernelModule || (module.starts_with("[kernel:") && module.ends_with("]"))) {
    return FrameKind::kKernel;
  }
  if (module == kJitModule || (module.starts_with("[jit:") && module.ends_with("]"))) {
    return FrameKind::kJit;
  }
  if (module.starts_with("[python:") && module.ends_with("]")) return FrameKind::kPython;
  if (module == kJavaModule || (module.starts_with("[java:") && module.ends_with("]"))) {
    return FrameKind::kJava;
  }
  return FrameKind::kUser;
}

// A Java method's name as every JVM process names it. A hidden class (a lambda's
// "Svc$$Lambda$1+0x00007fbe58000a08", a method handle's "LambdaForm$MH/0x0000000800c0c400") is
// named with its address in the JVM that defined it, so each release's process would name the
// same lambda anew; the address is dropped, as JFR drops it ("Svc$$Lambda$1.run()"). Other
// names are returned unchanged.
inline std::string WithoutHiddenClassAddresses(std::string_view name) {
  std::string out;
  size_t copied = 0;  // name[0, copied) is in `out`
  for (size_t at = name.find("0x"); at != std::string_view::npos; at = name.find("0x", at + 2)) {
    // "+0x", "/0x" or ".0x" (the '/' of an internal class name written as '.'), hex digits,
    // then the '.' before the method's name: no Java identifier starts with a digit.
    if (at == 0 || (name[at - 1] != '+' && name[at - 1] != '/' && name[at - 1] != '.')) continue;
    size_t end = at + 2;
    while (end < name.size() && ((name[end] >= '0' && name[end] <= '9') ||
                                 (name[end] >= 'a' && name[end] <= 'f'))) {
      ++end;
    }
    if (end == at + 2 || end >= name.size() || name[end] != '.') continue;
    out.append(name.substr(copied, at - 1 - copied));
    copied = end;
  }
  if (copied == 0) return std::string(name);
  out.append(name.substr(copied));
  return out;
}

// A file name without the version it ends in: "gosvc-v2" and "app-1.4.2" are "gosvc" and "app",
// "libssl.so.3" is "libssl.so", "python3.11" is "python3". The version is the trailing run of
// numbers each after a '-', '_', '.' or '@' (a 'v' before the number allowed); a name that is
// nothing but numbers and separators ("1.2") is kept whole.
inline std::string_view WithoutVersionSuffix(std::string_view file_name) {
  size_t end = file_name.size();
  while (true) {
    size_t at = end;
    while (at > 0 && file_name[at - 1] >= '0' && file_name[at - 1] <= '9') --at;
    if (at == end) break;
    if (at > 0 && file_name[at - 1] == 'v') --at;
    if (at < 2) break;
    const char separator = file_name[at - 1];
    if (separator != '-' && separator != '_' && separator != '.' && separator != '@') break;
    end = at - 1;
  }
  const std::string_view name = file_name.substr(0, end);
  const bool named = name.find_first_not_of("0123456789-_.@v") != std::string_view::npos;
  return named ? name : file_name;
}

// What names the same code in another process, on another host or in another release of the
// same program: a module's kind and the part of its name that does not move with them. A file
// by its name without the directory (a release installed in a directory of its own, a Nix
// store path) and without the version it ends in (a release's binary named after it); JIT
// code by no name at all (a perf map's path holds the process ID); a Python function's file
// by its name too. Kernel modules keep their whole name.
struct ModuleIdentity {
  FrameKind kind;
  std::string_view name;  // a part of the module name given
  bool operator==(const ModuleIdentity&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const ModuleIdentity& m) {
    return H::combine(std::move(h), m.kind, m.name);
  }
};

inline ModuleIdentity IdentityOf(std::string_view module) {
  const FrameKind kind = FrameKindOf(module);
  auto file_name = [](std::string_view path) {
    const size_t slash = path.rfind('/');
    return slash == std::string_view::npos ? path : path.substr(slash + 1);
  };
  switch (kind) {
    case FrameKind::kKernel: return {kind, module};
    case FrameKind::kJit: return {kind, {}};
    case FrameKind::kPython:
      return {kind, file_name(SourceFileOf(module))};
    // A Java method's name holds its class and signature, and agents before Java frames had
    // their kind named it in the JVM's perf map: the same code as that JIT code.
    case FrameKind::kJava: return {FrameKind::kJit, {}};
    case FrameKind::kUser: break;
  }
  return {kind, WithoutVersionSuffix(file_name(module))};
}

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_FRAME_KIND_H_
