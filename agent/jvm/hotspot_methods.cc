#include "agent/jvm/hotspot_methods.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::agent::jvm {
absl::StatusOr<HotSpotOffsets> MethodOffsets(const HotSpotTables& tables) {
  HotSpotOffsets out;
  struct Wanted {
    std::string_view type, field;
    uint64_t* offset;
  };
  const std::array<Wanted, 8> fields = {{
      {"Method", "_constMethod", &out.method_const_method},
      {"ConstMethod", "_constants", &out.const_method_constants},
      {"ConstMethod", "_name_index", &out.const_method_name_index},
      {"ConstMethod", "_signature_index", &out.const_method_signature_index},
      {"ConstantPool", "_pool_holder", &out.constant_pool_holder},
      {"Klass", "_name", &out.klass_name},
      {"Symbol", "_length", &out.symbol_length},
      {"Symbol", "_body", &out.symbol_body},
  }};
  for (const Wanted& w : fields) {
    const std::optional<uint64_t> offset = tables.Offset(w.type, w.field);
    if (!offset.has_value()) {
      return absl::NotFoundError(absl::StrCat("the JVM publishes no ", std::string(w.type), "::",
                                              std::string(w.field)));
    }
    *w.offset = *offset;
  }
  out.constant_pool_size = tables.Size("ConstantPool").value_or(0);
  if (out.constant_pool_size == 0 || out.constant_pool_size > 4096) {
    return absl::NotFoundError("the JVM publishes no size of ConstantPool");
  }
  return out;
}

absl::StatusOr<HotSpotOffsets> ReadHotSpotOffsets(const elf::ElfFile& elf, int64_t bias,
                                                  const python::RemoteMemory& memory) {
  absl::StatusOr<HotSpotTables> tables = HotSpotTables::Read(elf, bias, memory);
  if (!tables.ok()) return tables.status();
  return MethodOffsets(*tables);
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
  absl::StatusOr<HotSpotTables> tables = HotSpotTables::Read(elf, bias, *memory);
  if (!tables.ok()) return tables.status();
  absl::StatusOr<HotSpotOffsets> offsets = MethodOffsets(*tables);
  if (!offsets.ok()) return offsets.status();
  absl::StatusOr<HotSpotCodeLayout> layout = CodeLayout(*tables, *memory);
  auto java = std::make_unique<HotSpotInterpreter>(
      std::make_unique<HotSpotMethods>(*offsets, std::move(memory)));
  if (layout.ok()) {
    java->SetScopes(
        std::make_unique<HotSpotScopes>(*layout, std::make_unique<python::RemoteMemory>(pid)));
  } else {
    java->SetScopes(layout.status());
  }
  return java;
}

void HotSpotInterpreter::SetScopes(absl::StatusOr<std::unique_ptr<HotSpotScopes>> scopes) {
  if (scopes.ok()) {
    scopes_ = *std::move(scopes);
    scopes_status_ = absl::OkStatus();
  } else {
    scopes_.reset();
    scopes_status_ = scopes.status();
  }
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
