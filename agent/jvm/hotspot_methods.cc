#include "agent/jvm/hotspot_methods.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
// to the first whose type name is null. Calls `entry(bytes)` for each until it returns false.
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
      if (!entry(e)) return absl::OkStatus();
    }
  }
  return absl::DataLossError("the JVM's VMStructs table has no end");
}

}  // namespace

absl::StatusOr<HotSpotOffsets> ReadHotSpotOffsets(const elf::ElfFile& elf, int64_t bias,
                                                  const python::RemoteMemory& memory) {
  std::array<uint64_t, 10> v{};
  constexpr std::array<const char*, 10> kNames = {
      "gHotSpotVMStructs",
      "gHotSpotVMStructEntryArrayStride",
      "gHotSpotVMStructEntryTypeNameOffset",
      "gHotSpotVMStructEntryFieldNameOffset",
      "gHotSpotVMStructEntryOffsetOffset",
      "gHotSpotVMStructEntryIsStaticOffset",
      "gHotSpotVMTypes",
      "gHotSpotVMTypeEntryArrayStride",
      "gHotSpotVMTypeEntryTypeNameOffset",
      "gHotSpotVMTypeEntrySizeOffset",
  };
  for (size_t i = 0; i < kNames.size(); ++i) {
    absl::StatusOr<uint64_t> value = ReadVariable(elf, bias, memory, kNames[i]);
    if (!value.ok()) return value.status();
    v[i] = *value;
  }
  // Named values, not structured bindings: lambdas below capture them (clang 14).
  const uint64_t structs = v[0], struct_stride = v[1], struct_type = v[2], struct_field = v[3],
                 struct_offset = v[4], struct_static = v[5], types = v[6], type_stride = v[7],
                 type_name = v[8], type_size = v[9];
  if (structs == 0 || types == 0) {
    return absl::UnavailableError("the JVM has not published its VMStructs tables yet");
  }
  for (uint64_t offset : {struct_type, struct_field, struct_offset, struct_static}) {
    if (offset + 8 > struct_stride) return absl::DataLossError("bad VMStructs entry layout");
  }
  if (type_name + 8 > type_stride || type_size + 8 > type_stride) {
    return absl::DataLossError("bad VMTypes entry layout");
  }

  HotSpotOffsets out;
  struct Wanted {
    std::string_view type, field;
    uint64_t* offset;
    bool found = false;
  };
  std::array<Wanted, 8> fields = {{
      {"Method", "_constMethod", &out.method_const_method},
      {"ConstMethod", "_constants", &out.const_method_constants},
      {"ConstMethod", "_name_index", &out.const_method_name_index},
      {"ConstMethod", "_signature_index", &out.const_method_signature_index},
      {"ConstantPool", "_pool_holder", &out.constant_pool_holder},
      {"Klass", "_name", &out.klass_name},
      {"Symbol", "_length", &out.symbol_length},
      {"Symbol", "_body", &out.symbol_body},
  }};
  const uint64_t base = static_cast<uint64_t>(bias);
  absl::Status st = ForEachEntry(memory, structs, struct_stride, struct_type,
                                 [&](const uint8_t* e) {
    const std::string_view type =
        FileString(elf, python::FieldAt<uint64_t>(e, static_cast<uint32_t>(struct_type)) - base);
    const uint64_t field_ptr = python::FieldAt<uint64_t>(e, static_cast<uint32_t>(struct_field));
    if (field_ptr == 0 || python::FieldAt<int32_t>(e, static_cast<uint32_t>(struct_static))) {
      return true;
    }
    for (Wanted& w : fields) {
      if (w.found || w.type != type) continue;
      if (FileString(elf, field_ptr - base) != w.field) continue;
      *w.offset = python::FieldAt<uint64_t>(e, static_cast<uint32_t>(struct_offset));
      w.found = true;
    }
    return std::ranges::any_of(fields, [](const Wanted& w) { return !w.found; });
  });
  if (!st.ok()) return st;
  for (const Wanted& w : fields) {
    if (!w.found) {
      return absl::NotFoundError(absl::StrCat("the JVM publishes no ", std::string(w.type), "::",
                                              std::string(w.field)));
    }
  }
  bool sized = false;
  st = ForEachEntry(memory, types, type_stride, type_name, [&](const uint8_t* e) {
    const uint64_t name = python::FieldAt<uint64_t>(e, static_cast<uint32_t>(type_name));
    if (FileString(elf, name - base) != "ConstantPool") return true;
    out.constant_pool_size = python::FieldAt<uint64_t>(e, static_cast<uint32_t>(type_size));
    sized = true;
    return false;
  });
  if (!st.ok()) return st;
  if (!sized || out.constant_pool_size == 0 || out.constant_pool_size > 4096) {
    return absl::NotFoundError("the JVM publishes no size of ConstantPool");
  }
  return out;
}

namespace {

// One type of a descriptor at `at` in Java's words ("int[]", "java.lang.String"); advances
// `at`. Empty where it does not parse.
std::string JavaType(std::string_view d, size_t& at) {
  size_t dims = 0;
  while (at < d.size() && d[at] == '[') ++dims, ++at;
  if (at >= d.size()) return {};
  std::string type;
  switch (d[at++]) {
    case 'B': type = "byte"; break;
    case 'C': type = "char"; break;
    case 'D': type = "double"; break;
    case 'F': type = "float"; break;
    case 'I': type = "int"; break;
    case 'J': type = "long"; break;
    case 'S': type = "short"; break;
    case 'Z': type = "boolean"; break;
    case 'V': type = "void"; break;
    case 'L': {
      const size_t end = d.find(';', at);
      if (end == std::string_view::npos || end == at) return {};
      type.assign(d.substr(at, end - at));
      std::replace(type.begin(), type.end(), '/', '.');
      at = end + 1;
      break;
    }
    default:
      return {};
  }
  for (size_t i = 0; i < dims; ++i) type += "[]";
  return type;
}

}  // namespace

std::optional<std::string> JavaMethodName(std::string_view class_name, std::string_view name,
                                          std::string_view descriptor) {
  if (class_name.empty() || name.empty() || descriptor.size() < 3 || descriptor[0] != '(') {
    return std::nullopt;
  }
  std::vector<std::string> args;
  size_t at = 1;
  while (at < descriptor.size() && descriptor[at] != ')') {
    std::string arg = JavaType(descriptor, at);
    if (arg.empty() || arg == "void") return std::nullopt;
    args.push_back(std::move(arg));
  }
  if (at >= descriptor.size()) return std::nullopt;
  ++at;  // ')'
  const std::string ret = JavaType(descriptor, at);
  if (ret.empty() || at != descriptor.size()) return std::nullopt;
  std::string holder(class_name);
  std::replace(holder.begin(), holder.end(), '/', '.');
  return absl::StrCat(ret, " ", holder, ".", std::string(name), "(", absl::StrJoin(args, ", "),
                      ")");
}

std::optional<HotSpotMethods::Identity> HotSpotMethods::ReadIdentity(uint64_t method) const {
  const HotSpotOffsets& o = offsets_;
  Identity id;
  if (method == 0 || method % 8 != 0 ||
      !memory_->ReadValue(method + o.method_const_method, &id.const_method) ||
      id.const_method == 0 || id.const_method % 8 != 0) {
    return std::nullopt;
  }
  // The three fields in one read of the span they lie in.
  const uint64_t lo = std::min({o.const_method_constants, o.const_method_name_index,
                                o.const_method_signature_index});
  const uint64_t hi = std::max({o.const_method_constants + 8, o.const_method_name_index + 2,
                                o.const_method_signature_index + 2});
  std::array<uint8_t, 256> span;
  if (hi - lo > span.size() || !memory_->Read(id.const_method + lo, span.data(), hi - lo)) {
    return std::nullopt;
  }
  auto at = [&](uint64_t offset) { return static_cast<uint32_t>(offset - lo); };
  id.constants = python::FieldAt<uint64_t>(span.data(), at(o.const_method_constants));
  id.name_index = python::FieldAt<uint16_t>(span.data(), at(o.const_method_name_index));
  id.signature_index = python::FieldAt<uint16_t>(span.data(), at(o.const_method_signature_index));
  if (id.constants == 0 || id.constants % 8 != 0 || id.name_index == 0 ||
      id.signature_index == 0) {
    return std::nullopt;
  }
  return id;
}

std::optional<std::string> HotSpotMethods::ReadName(const Identity& id) const {
  const HotSpotOffsets& o = offsets_;
  // The pool's holder, and the pool's slots of the name and the descriptor (the slots follow
  // the pool; each holds its Symbol*).
  const uint64_t slots = id.constants + o.constant_pool_size;
  const uint64_t pointers_at[3] = {id.constants + o.constant_pool_holder,
                                   slots + uint64_t{id.name_index} * 8,
                                   slots + uint64_t{id.signature_index} * 8};
  const size_t pointer_sizes[3] = {8, 8, 8};
  uint64_t pointers[3];  // holder, name, descriptor
  if (!memory_->ReadMany(pointers_at, pointer_sizes, 3, pointers) || pointers[0] == 0 ||
      pointers[0] % 8 != 0) {
    return std::nullopt;
  }
  uint64_t symbols[3] = {0, pointers[1], pointers[2]};  // class name, name, descriptor
  if (!memory_->ReadValue(pointers[0] + o.klass_name, &symbols[0])) return std::nullopt;
  uint64_t lengths_at[3];
  const size_t length_sizes[3] = {2, 2, 2};
  for (int i = 0; i < 3; ++i) {
    if (symbols[i] == 0 || symbols[i] % 8 != 0) return std::nullopt;
    lengths_at[i] = symbols[i] + o.symbol_length;
  }
  uint16_t lengths[3];
  if (!memory_->ReadMany(lengths_at, length_sizes, 3, lengths)) return std::nullopt;
  constexpr uint16_t kMaxLength = 1024;
  uint64_t bodies_at[3];
  size_t body_sizes[3];
  for (int i = 0; i < 3; ++i) {
    if (lengths[i] == 0 || lengths[i] > kMaxLength) return std::nullopt;
    bodies_at[i] = symbols[i] + o.symbol_body;
    body_sizes[i] = lengths[i];
  }
  std::string text(size_t{lengths[0]} + lengths[1] + lengths[2], '\0');
  if (!memory_->ReadMany(bodies_at, body_sizes, 3, text.data())) return std::nullopt;
  // Modified UTF-8 of names and descriptors: no NUL, no control character.
  if (std::ranges::any_of(text, [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
    return std::nullopt;
  }
  const std::string_view all = text;
  return JavaMethodName(all.substr(0, lengths[0]), all.substr(lengths[0], lengths[1]),
                        all.substr(size_t{lengths[0]} + lengths[1]));
}

const HotSpotMethods::Method* HotSpotMethods::Find(uint64_t method, uint64_t now_ns) {
  auto it = methods_.find(method);
  if (it != methods_.end() && now_ns - it->second.read_ns < kRecheckNs) return &it->second;
  const std::optional<Identity> identity = ReadIdentity(method);
  if (it != methods_.end() && identity == it->second.identity) {
    it->second.read_ns = now_ns;
    return &it->second;
  }
  std::optional<std::string> name;
  if (identity.has_value()) name = ReadName(*identity);
  if (!name.has_value()) {
    if (it != methods_.end()) methods_.erase(it);
    return nullptr;
  }
  if (it == methods_.end()) {
    if (methods_.size() >= kMaxMethods) methods_.clear();
    it = methods_.try_emplace(method).first;
  }
  Method& m = it->second;
  if (m.name != *name) {
    m.name = *std::move(name);
    m.owner_id = 0;
  }
  m.identity = *identity;
  m.read_ns = now_ns;
  return &m;
}

absl::StatusOr<std::unique_ptr<HotSpotInterpreter>> HotSpotInterpreter::Attach(
    pid_t pid, const elf::ElfFile& elf, int64_t bias) {
  auto memory = std::make_unique<python::RemoteMemory>(pid);
  absl::StatusOr<HotSpotOffsets> offsets = ReadHotSpotOffsets(elf, bias, *memory);
  if (!offsets.ok()) return offsets.status();
  return std::make_unique<HotSpotInterpreter>(
      std::make_unique<HotSpotMethods>(*offsets, std::move(memory)));
}

void HotSpotInterpreter::SetCode(uint64_t start, uint64_t end, std::string module) {
  code_start_ = start;
  code_end_ = end;
  module_ = std::move(module);
}

bool HotSpotInterpreter::MethodsOf(std::span<const unwind::Frame> frames, uint64_t sp,
                                   std::span<const uint8_t> stack, uint64_t* methods) const {
  bool any = false;
  for (size_t i = 0; i < frames.size(); ++i) {
    methods[i] = 0;
    const unwind::Frame& f = frames[i];
    if (!Contains(i == 0 ? f.pc : f.pc - 1) || f.ra_slot < sp + kMethodBelowReturnSlot) continue;
    const uint64_t at = f.ra_slot - kMethodBelowReturnSlot - sp;
    if (at + 8 > stack.size()) continue;
    std::memcpy(&methods[i], stack.data() + at, 8);
    any |= methods[i] != 0;
  }
  return any;
}

}  // namespace strata::agent::jvm
