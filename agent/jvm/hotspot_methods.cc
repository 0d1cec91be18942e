#include "agent/jvm/hotspot_methods.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::agent::jvm {
absl::StatusOr<HotSpotOffsets> MethodOffsets(const HotSpotTables& tables,
                                             const python::RemoteMemory& memory) {
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
  // Lines: optional, all or none.
  const std::optional<uint64_t> flags = tables.Offset("ConstMethod", "_flags").has_value()
                                            ? tables.Offset("ConstMethod", "_flags")
                                            : tables.Offset("ConstMethod", "_flags._flags");
  const std::optional<uint64_t> code_size = tables.Offset("ConstMethod", "_code_size");
  const std::optional<uint64_t> words = tables.Offset("ConstMethod", "_constMethod_size");
  const std::optional<uint64_t> size = tables.Size("ConstMethod");
  const std::optional<uint64_t> source = tables.Offset("ConstantPool", "_source_file_name_index");
  if (flags.has_value() && code_size.has_value() && words.has_value() && size.has_value() &&
      source.has_value() && *size <= 4096 && *source + 2 <= out.constant_pool_size) {
    out.const_method_flags = *flags;
    out.const_method_code_size = *code_size;
    out.const_method_words = *words;
    out.const_method_size = *size;
    out.constant_pool_source_file = *source;
    const absl::StatusOr<uint32_t> excess = CompressedIntExcess(tables, memory);
    out.lines = excess.ok();
    out.excess = excess.value_or(0);
  }
  return out;
}

absl::StatusOr<HotSpotOffsets> ReadHotSpotOffsets(const elf::ElfFile& elf, int64_t bias,
                                                  const python::RemoteMemory& memory) {
  absl::StatusOr<HotSpotTables> tables = HotSpotTables::Read(elf, bias, memory);
  if (!tables.ok()) return tables.status();
  return MethodOffsets(*tables, memory);
}

std::optional<std::vector<JavaLine>> DecodeLineTable(std::span<const uint8_t> bytes,
                                                     uint32_t excess) {
  std::vector<JavaLine> rows;
  int64_t bci = 0, line = 0;
  // HotSpot's zigzag (UNSIGNED5::decode_sign).
  auto signed_int = [](uint32_t v) { return static_cast<int64_t>((v >> 1) ^ (0u - (v & 1))); };
  for (size_t at = 0; at < bytes.size();) {
    const uint8_t next = bytes[at++];
    if (next == 0) return rows;
    if (next == 0xFF) {
      uint32_t bci_delta = 0, line_delta = 0;
      if (!ReadCompressedInt(bytes, excess, at, &bci_delta) ||
          !ReadCompressedInt(bytes, excess, at, &line_delta)) {
        return std::nullopt;
      }
      bci += static_cast<int32_t>(signed_int(bci_delta));
      line += static_cast<int32_t>(signed_int(line_delta));
    } else {
      bci += next >> 3;
      line += next & 7;
    }
    // A method's code is under 64 KiB; a line is positive.
    if (bci < 0 || bci > 0xFFFF || line <= 0 || line > INT32_MAX || rows.size() == kMaxJavaLines) {
      return std::nullopt;
    }
    rows.push_back({static_cast<int32_t>(bci), static_cast<int32_t>(line)});
  }
  return std::nullopt;
}

std::string JavaSourcePath(std::string_view class_name, std::string_view source_file) {
  const size_t slash = class_name.rfind('/');
  if (slash == std::string_view::npos) return std::string(source_file);
  return absl::StrCat(std::string(class_name.substr(0, slash + 1)), std::string(source_file));
}

JavaLineTable::JavaLineTable(std::vector<JavaLine> rows) : rows_(std::move(rows)) {
  std::stable_sort(rows_.begin(), rows_.end(),
                   [](const JavaLine& a, const JavaLine& b) { return a.bci < b.bci; });
  bool one = !rows_.empty();
  for (const JavaLine& row : rows_) {
    if (first_line_ == 0 || row.line < first_line_) first_line_ = row.line;
    one = one && row.line == rows_.front().line;
  }
  only_line_ = one ? rows_.front().line : 0;
}

int32_t JavaLineTable::LineAt(int32_t bci) const {
  if (bci == kUnknownBci) return only_line_;
  const int32_t at = std::max(bci, 0);
  auto it = std::upper_bound(rows_.begin(), rows_.end(), at,
                             [](int32_t b, const JavaLine& row) { return b < row.bci; });
  if (it == rows_.begin()) return 0;
  --it;
  while (it->bci == at && it != rows_.begin() && std::prev(it)->bci == at) --it;
  return it->line;
}

std::optional<int32_t> HotSpotMethods::Method::BciOf(uint64_t bcp) const {
  if (code_begin == 0 || bcp < code_begin || bcp >= code_begin + identity.code_size) {
    return std::nullopt;
  }
  return static_cast<int32_t>(bcp - code_begin);
}

namespace {

// The most of a method's line table read (a longer one is not read: no lines).
constexpr uint64_t kMaxTableBytes = 64 << 10;

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
  // The fields in one read of the span they lie in.
  uint64_t lo = std::min({o.const_method_constants, o.const_method_name_index,
                          o.const_method_signature_index});
  uint64_t hi = std::max({o.const_method_constants + 8, o.const_method_name_index + 2,
                          o.const_method_signature_index + 2});
  if (o.lines) {
    lo = std::min({lo, o.const_method_flags, o.const_method_code_size, o.const_method_words});
    hi = std::max({hi, o.const_method_flags + 1, o.const_method_code_size + 2,
                   o.const_method_words + 4});
  }
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
  if (o.lines) {
    // The flags' low byte holds bit 0 (u2 until JDK 20, u4 from 21; little-endian).
    id.has_lines = (span[at(o.const_method_flags)] & 1) != 0;
    id.code_size = python::FieldAt<uint16_t>(span.data(), at(o.const_method_code_size));
    id.words = python::FieldAt<uint32_t>(span.data(), at(o.const_method_words));
  }
  return id;
}

std::optional<HotSpotMethods::Details> HotSpotMethods::ReadDetails(const Identity& id) const {
  const HotSpotOffsets& o = offsets_;
  // The pool's holder, the pool's slots of the name and the descriptor (the slots follow the
  // pool; each holds its Symbol*) and the index of its source file's slot.
  const uint64_t slots = id.constants + o.constant_pool_size;
  const uint64_t fields_at[4] = {id.constants + o.constant_pool_holder,
                                 slots + uint64_t{id.name_index} * 8,
                                 slots + uint64_t{id.signature_index} * 8,
                                 id.constants + o.constant_pool_source_file};
  const size_t field_sizes[4] = {8, 8, 8, 2};
  std::array<uint8_t, 26> fields;
  if (!memory_->ReadMany(fields_at, field_sizes, o.lines ? 4 : 3, fields.data())) {
    return std::nullopt;
  }
  const uint64_t holder = python::FieldAt<uint64_t>(fields.data(), 0);
  const uint16_t source_index = o.lines ? python::FieldAt<uint16_t>(fields.data(), 24) : 0;
  if (holder == 0 || holder % 8 != 0) return std::nullopt;
  // Class name, name, descriptor and source file (where the class names one).
  uint64_t symbols[4] = {0, python::FieldAt<uint64_t>(fields.data(), 8),
                         python::FieldAt<uint64_t>(fields.data(), 16), 0};
  const uint64_t pointers_at[2] = {holder + o.klass_name, slots + uint64_t{source_index} * 8};
  const size_t pointer_sizes[2] = {8, 8};
  uint64_t pointers[2] = {0, 0};
  if (!memory_->ReadMany(pointers_at, pointer_sizes, source_index != 0 ? 2 : 1, pointers)) {
    return std::nullopt;
  }
  symbols[0] = pointers[0];
  symbols[3] = pointers[1];
  const size_t count = symbols[3] != 0 && symbols[3] % 8 == 0 ? 4 : 3;
  uint64_t lengths_at[4];
  const size_t length_sizes[4] = {2, 2, 2, 2};
  for (size_t i = 0; i < count; ++i) {
    if (symbols[i] == 0 || symbols[i] % 8 != 0) return std::nullopt;
    lengths_at[i] = symbols[i] + o.symbol_length;
  }
  uint16_t lengths[4] = {0, 0, 0, 0};
  if (!memory_->ReadMany(lengths_at, length_sizes, count, lengths)) return std::nullopt;
  constexpr uint16_t kMaxLength = 1024;
  uint64_t bodies_at[5];
  size_t body_sizes[5];
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (lengths[i] == 0 || lengths[i] > kMaxLength) return std::nullopt;
    bodies_at[i] = symbols[i] + o.symbol_body;
    body_sizes[i] = lengths[i];
    total += lengths[i];
  }
  // The line table, in the same call: from the end of the bytecodes to the end of the
  // ConstMethod (the other tables after it are laid out from that end).
  const uint64_t table_at = id.const_method + o.const_method_size + id.code_size;
  const uint64_t method_end = id.const_method + uint64_t{id.words} * 8;
  size_t table_size = 0;
  if (id.has_lines && method_end > table_at) {
    table_size = static_cast<size_t>(std::min<uint64_t>(method_end - table_at, kMaxTableBytes));
  }
  size_t segments = count;
  if (table_size > 0) {
    bodies_at[segments] = table_at;
    body_sizes[segments++] = table_size;
  }
  std::string text(total + table_size, '\0');
  if (!memory_->ReadMany(bodies_at, body_sizes, segments, text.data())) return std::nullopt;
  const std::string_view all = std::string_view(text).substr(0, total);
  // Modified UTF-8 of names and descriptors: no NUL, no control character.
  if (std::ranges::any_of(all, [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
    return std::nullopt;
  }
  const std::string_view class_name = all.substr(0, lengths[0]);
  std::optional<std::string> name =
      JavaMethodName(class_name, all.substr(lengths[0], lengths[1]),
                     all.substr(size_t{lengths[0]} + lengths[1], lengths[2]));
  if (!name.has_value()) return std::nullopt;
  Details details;
  details.name = *std::move(name);
  if (count == 4) {
    details.file = JavaSourcePath(class_name, all.substr(total - lengths[3]));
  }
  if (table_size > 0) {
    const auto* table = reinterpret_cast<const uint8_t*>(text.data() + total);
    std::optional<std::vector<JavaLine>> lines =
        DecodeLineTable({table, table_size}, o.excess);
    if (lines.has_value()) details.lines = JavaLineTable(*std::move(lines));
  }
  return details;
}

const HotSpotMethods::Method* HotSpotMethods::Find(uint64_t method, uint64_t now_ns) {
  auto it = methods_.find(method);
  if (it != methods_.end() && now_ns - it->second.read_ns < kRecheckNs) return &it->second;
  const std::optional<Identity> identity = ReadIdentity(method);
  if (it != methods_.end() && identity == it->second.identity) {
    it->second.read_ns = now_ns;
    return &it->second;
  }
  std::optional<Details> details;
  if (identity.has_value()) details = ReadDetails(*identity);
  if (!details.has_value()) {
    if (it != methods_.end()) methods_.erase(it);
    return nullptr;
  }
  if (it == methods_.end()) {
    if (methods_.size() >= kMaxMethods) methods_.clear();
    it = methods_.try_emplace(method).first;
  }
  Method& m = it->second;
  if (m.name != details->name || m.file != details->file || m.lines != details->lines) {
    m.name = std::move(details->name);
    m.file = std::move(details->file);
    m.lines = std::move(details->lines);
    m.owner_id = 0;
  }
  m.identity = *identity;
  m.code_begin = offsets_.lines ? identity->const_method + offsets_.const_method_size : 0;
  m.read_ns = now_ns;
  return &m;
}

absl::StatusOr<std::unique_ptr<HotSpotInterpreter>> HotSpotInterpreter::Attach(
    pid_t pid, const elf::ElfFile& elf, int64_t bias) {
  auto memory = std::make_unique<python::RemoteMemory>(pid);
  absl::StatusOr<HotSpotTables> tables = HotSpotTables::Read(elf, bias, *memory);
  if (!tables.ok()) return tables.status();
  absl::StatusOr<HotSpotOffsets> offsets = MethodOffsets(*tables, *memory);
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
                                   std::span<const uint8_t> stack, uint64_t* methods,
                                   uint64_t* bcps) const {
  bool any = false;
  for (size_t i = 0; i < frames.size(); ++i) {
    methods[i] = 0;
    bcps[i] = 0;
    const unwind::Frame& f = frames[i];
    if (!Contains(i == 0 ? f.pc : f.pc - 1) || f.ra_slot < sp + kMethodBelowReturnSlot) continue;
    const uint64_t at = f.ra_slot - kMethodBelowReturnSlot - sp;
    if (at + 8 > stack.size()) continue;
    std::memcpy(&methods[i], stack.data() + at, 8);
    any |= methods[i] != 0;
    if (f.ra_slot >= sp + kBcpBelowReturnSlot) {
      std::memcpy(&bcps[i], stack.data() + (f.ra_slot - kBcpBelowReturnSlot - sp), 8);
    }
  }
  return any;
}

}  // namespace strata::agent::jvm
