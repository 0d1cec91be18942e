// The tables a HotSpot JVM publishes for its serviceability agent (gHotSpotVMStructs and
// gHotSpotVMTypes in libjvm.so): the offset of each field of its C++ structures, the address
// of each static one and the size of each type, by name. They are how the agent reads a JVM's
// methods and compiled code without knowing its version: the names stay, the offsets move.
// Read once per JVM; the tables' pointers and strides are set at the JVM's start, their
// strings are read from the file.
#ifndef STRATA_AGENT_JVM_HOTSPOT_TABLES_H_
#define STRATA_AGENT_JVM_HOTSPOT_TABLES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "agent/python/remote_memory.h"
#include "common/elf/elf_file.h"

namespace strata::agent::jvm {

class HotSpotTables {
 public:
  // The tables of the JVM whose libjvm.so is `elf`, loaded at `bias`, through `memory`.
  // NotFound where `elf` exports no tables, Unavailable where the JVM's memory cannot be read
  // or it has not published them yet, DataLoss for tables that do not parse.
  static absl::StatusOr<HotSpotTables> Read(const elf::ElfFile& elf, int64_t bias,
                                            const python::RemoteMemory& memory);

  // A field's offset in its type ("Method", "_constMethod"); nullopt where not published.
  std::optional<uint64_t> Offset(std::string_view type, std::string_view field) const;
  // A static field's address in the JVM ("CodeCache", "_heaps").
  std::optional<uint64_t> Address(std::string_view type, std::string_view field) const;
  // sizeof(type).
  std::optional<uint64_t> Size(std::string_view type) const;

  // For tests: a table of the given entries.
  void SetOffset(std::string_view type, std::string_view field, uint64_t offset);
  void SetAddress(std::string_view type, std::string_view field, uint64_t address);
  void SetSize(std::string_view type, uint64_t size);

 private:
  absl::flat_hash_map<std::string, uint64_t> offsets_;    // "Type::field"
  absl::flat_hash_map<std::string, uint64_t> addresses_;  // "Type::field", static
  absl::flat_hash_map<std::string, uint64_t> sizes_;
};

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_HOTSPOT_TABLES_H_
