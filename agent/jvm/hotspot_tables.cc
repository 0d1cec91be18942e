#include "agent/jvm/hotspot_tables.h"

#include <array>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/python/interpreter.h"

namespace strata::agent::jvm {
namespace {

// A NUL-terminated string of libjvm.so's file at `vaddr` (its tables' names are literals).
std::string_view FileString(const elf::ElfFile& elf, uint64_t vaddr) {
  for (size_t size = 64; size >= 8; size /= 2) {
    const std::string_view bytes = python::FileBytesAt(elf, vaddr, size);
    if (bytes.empty()) continue;
    const size_t end = bytes.find('\0');
    return end == std::string_view::npos ? std::string_view() : bytes.substr(0, end);
  }
  return {};
}

// The value of the exported variable `name` (8 bytes) of the running JVM.
absl::StatusOr<uint64_t> ReadVariable(const elf::ElfFile& elf, int64_t bias,
                                      const python::RemoteMemory& memory, const char* name) {
  const std::optional<uint64_t> vaddr = python::FindObjectSymbol(elf, name);
  if (!vaddr.has_value()) return absl::NotFoundError(absl::StrCat("libjvm.so exports no ", name));
  uint64_t value = 0;
  if (!memory.ReadValue(*vaddr + static_cast<uint64_t>(bias), &value)) {
    return absl::UnavailableError(absl::StrCat("cannot read the JVM's ", name));
  }
  return value;
}

// One of the JVM's tables (VMStructs, VMTypes): entries of `stride` bytes from `address`, up
// to the first whose type name is null. Calls `entry(bytes)` for each.
template <typename Entry>
absl::Status ForEachEntry(const python::RemoteMemory& memory, uint64_t address, uint64_t stride,
                          uint64_t type_name_offset, Entry entry) {
  constexpr size_t kBatch = 64;
  constexpr size_t kMaxEntries = 1 << 16;
  if (stride < 8 || stride > 256 || type_name_offset + 8 > stride) {
    return absl::DataLossError(absl::StrCat("bad table stride ", stride));
  }
  std::vector<uint8_t> bytes(kBatch * stride);
  for (size_t at = 0; at < kMaxEntries; at += kBatch) {
    if (!memory.Read(address + at * stride, bytes.data(), bytes.size())) {
      // The table's end may be near its mapping's end: one entry at a time.
      for (size_t i = 0; i < kBatch; ++i) {
        if (!memory.Read(address + (at + i) * stride, bytes.data() + i * stride, stride)) {
          return absl::UnavailableError("cannot read the JVM's VMStructs tables");
        }
        if (python::FieldAt<uint64_t>(bytes.data() + i * stride,
                                      static_cast<uint32_t>(type_name_offset)) == 0) {
          break;
        }
      }
    }
    for (size_t i = 0; i < kBatch; ++i) {
      const uint8_t* e = bytes.data() + i * stride;
      if (python::FieldAt<uint64_t>(e, static_cast<uint32_t>(type_name_offset)) == 0) {
        return absl::OkStatus();
      }
      entry(e);
    }
  }
  return absl::DataLossError("the JVM's VMStructs table has no end");
}

std::string Key(std::string_view type, std::string_view field) {
  std::string key(type);
  key += "::";
  key += field;
  return key;
}

template <typename Map>
std::optional<uint64_t> Get(const Map& map, const std::string& key) {
  auto it = map.find(key);
  return it == map.end() ? std::nullopt : std::optional<uint64_t>(it->second);
}

}  // namespace

absl::StatusOr<HotSpotTables> HotSpotTables::Read(const elf::ElfFile& elf, int64_t bias,
                                                  const python::RemoteMemory& memory) {
  constexpr std::array<const char*, 11> kNames = {
      "gHotSpotVMStructs",
      "gHotSpotVMStructEntryArrayStride",
      "gHotSpotVMStructEntryTypeNameOffset",
      "gHotSpotVMStructEntryFieldNameOffset",
      "gHotSpotVMStructEntryOffsetOffset",
      "gHotSpotVMStructEntryIsStaticOffset",
      "gHotSpotVMStructEntryAddressOffset",
      "gHotSpotVMTypes",
      "gHotSpotVMTypeEntryArrayStride",
      "gHotSpotVMTypeEntryTypeNameOffset",
      "gHotSpotVMTypeEntrySizeOffset",
  };
  std::array<uint64_t, kNames.size()> v{};
  for (size_t i = 0; i < kNames.size(); ++i) {
    absl::StatusOr<uint64_t> value = ReadVariable(elf, bias, memory, kNames[i]);
    if (!value.ok()) return value.status();
    v[i] = *value;
  }
  const uint64_t structs = v[0], struct_stride = v[1], struct_type = v[2], struct_field = v[3],
                 struct_offset = v[4], struct_static = v[5], struct_address = v[6],
                 types = v[7], type_stride = v[8], type_name = v[9], type_size = v[10];
  if (structs == 0 || types == 0) {
    return absl::UnavailableError("the JVM has not published its VMStructs tables yet");
  }
  for (uint64_t offset : {struct_type, struct_field, struct_offset, struct_static,
                          struct_address}) {
    if (offset + 8 > struct_stride) return absl::DataLossError("bad VMStructs entry layout");
  }
  if (type_name + 8 > type_stride || type_size + 8 > type_stride) {
    return absl::DataLossError("bad VMTypes entry layout");
  }
  const uint64_t base = static_cast<uint64_t>(bias);
  auto at = [](const uint8_t* e, uint64_t offset) {
    return python::FieldAt<uint64_t>(e, static_cast<uint32_t>(offset));
  };
  HotSpotTables out;
  absl::Status st = ForEachEntry(memory, structs, struct_stride, struct_type,
                                 [&](const uint8_t* e) {
    const uint64_t field_name = at(e, struct_field);
    if (field_name == 0) return;
    const std::string_view type = FileString(elf, at(e, struct_type) - base);
    const std::string_view field = FileString(elf, field_name - base);
    if (type.empty() || field.empty()) return;
    if (python::FieldAt<int32_t>(e, static_cast<uint32_t>(struct_static)) != 0) {
      out.addresses_.try_emplace(Key(type, field), at(e, struct_address));
    } else {
      out.offsets_.try_emplace(Key(type, field), at(e, struct_offset));
    }
  });
  if (!st.ok()) return st;
  st = ForEachEntry(memory, types, type_stride, type_name, [&](const uint8_t* e) {
    const std::string_view name = FileString(elf, at(e, type_name) - base);
    if (!name.empty()) out.sizes_.try_emplace(std::string(name), at(e, type_size));
  });
  if (!st.ok()) return st;
  return out;
}

std::optional<uint64_t> HotSpotTables::Offset(std::string_view type,
                                              std::string_view field) const {
  return Get(offsets_, Key(type, field));
}

std::optional<uint64_t> HotSpotTables::Address(std::string_view type,
                                               std::string_view field) const {
  return Get(addresses_, Key(type, field));
}

std::optional<uint64_t> HotSpotTables::Size(std::string_view type) const {
  return Get(sizes_, std::string(type));
}

void HotSpotTables::SetOffset(std::string_view type, std::string_view field, uint64_t offset) {
  offsets_[Key(type, field)] = offset;
}

void HotSpotTables::SetAddress(std::string_view type, std::string_view field,
                               uint64_t address) {
  addresses_[Key(type, field)] = address;
}

void HotSpotTables::SetSize(std::string_view type, uint64_t size) {
  sizes_[std::string(type)] = size;
}

}  // namespace strata::agent::jvm
