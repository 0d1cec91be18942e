#include "agent/jvm/hotspot_scopes.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/jvm/hotspot_frames.h"

namespace strata::agent::jvm {
namespace {

// Where a scope's chain ends (DebugInformationRecorder::serialized_null).
constexpr uint32_t kSerializedNull = 0;
// How long a chain is followed before it is taken for a misread.
constexpr size_t kMaxChain = 64;
// A bytecode index is under 65536 (a method's code is at most that long); written plus one.
constexpr uint32_t kMaxBciPlusOne = 1 << 16;
// What is copied of one nmethod at most: its PcDescs, scopes and metadata.
constexpr uint64_t kMaxDebugInfoBytes = 1 << 20;
// Hops through a code heap's segment map before it is taken for a misread (a 16 MiB method of
// 128-byte segments takes 517).
constexpr int kMaxHops = 1 << 12;
// An nmethod's header fields all lie in its first bytes.
constexpr size_t kHeaderBytes = 512;

// What a method's copy takes.
size_t Bytes(const CompiledMethodInfo& info) {
  return info.pcs.size() * sizeof(CompiledMethodInfo::Pc) + info.scopes.size() +
         info.metadata.size() * 8;
}

template <typename T>
T HeaderField(const std::array<uint8_t, kHeaderBytes>& header, uint64_t offset) {
  return python::FieldAt<T>(header.data(), static_cast<uint32_t>(offset));
}

}  // namespace

absl::StatusOr<HotSpotCodeLayout> CodeLayout(const HotSpotTables& t,
                                             const python::RemoteMemory& memory) {
  HotSpotCodeLayout l;
  std::string missing;
  auto need = [&missing](std::optional<uint64_t> value, const char* name) {
    if (!value.has_value() && missing.empty()) missing = name;
    return value.value_or(0);
  };
  l.heaps = need(t.Address("CodeCache", "_heaps"), "CodeCache::_heaps");
  l.array_length = need(t.Offset("GrowableArrayBase", "_len"), "GrowableArrayBase::_len");
  l.array_data = need(t.Offset("GrowableArray<int>", "_data"), "GrowableArray<int>::_data");
  l.heap_memory = need(t.Offset("CodeHeap", "_memory"), "CodeHeap::_memory");
  l.heap_segmap = need(t.Offset("CodeHeap", "_segmap"), "CodeHeap::_segmap");
  l.heap_log2_segment_size =
      need(t.Offset("CodeHeap", "_log2_segment_size"), "CodeHeap::_log2_segment_size");
  l.space_low = need(t.Offset("VirtualSpace", "_low"), "VirtualSpace::_low");
  l.space_high = need(t.Offset("VirtualSpace", "_high_boundary"), "VirtualSpace::_high_boundary");
  l.heap_block_size = need(t.Size("HeapBlock"), "sizeof(HeapBlock)");
  l.heap_block_used = need(t.Offset("HeapBlock::Header", "_used"), "HeapBlock::Header::_used");
  l.compile_id = need(t.Offset("nmethod", "_compile_id"), "nmethod::_compile_id");
  l.pc_desc_size = need(t.Size("PcDesc"), "sizeof(PcDesc)");
  l.pc_desc_pc_offset = need(t.Offset("PcDesc", "_pc_offset"), "PcDesc::_pc_offset");
  l.pc_desc_scope_offset =
      need(t.Offset("PcDesc", "_scope_decode_offset"), "PcDesc::_scope_decode_offset");
  l.pcs_begin = need(t.Offset("nmethod", "_scopes_pcs_offset"), "nmethod::_scopes_pcs_offset");
  l.out_of_line = t.Offset("nmethod", "_immutable_data").has_value();
  if (l.out_of_line) {
    l.method = need(t.Offset("nmethod", "_method"), "nmethod::_method");
    l.code_begin = need(t.Offset("CodeBlob", "_code_offset"), "CodeBlob::_code_offset");
    l.immutable_data = *t.Offset("nmethod", "_immutable_data");
    l.scopes_begin =
        need(t.Offset("nmethod", "_scopes_data_offset"), "nmethod::_scopes_data_offset");
    l.pcs_end = l.scopes_begin;
    l.scopes_end =
        need(t.Offset("nmethod", "_immutable_data_size"), "nmethod::_immutable_data_size");
    l.mutable_data = need(t.Offset("CodeBlob", "_mutable_data"), "CodeBlob::_mutable_data");
    l.metadata_begin =
        need(t.Offset("CodeBlob", "_relocation_size"), "CodeBlob::_relocation_size");
    l.metadata_end =
        need(t.Offset("CodeBlob", "_mutable_data_size"), "CodeBlob::_mutable_data_size");
  } else {
    l.method = need(t.Offset("CompiledMethod", "_method"), "CompiledMethod::_method");
    l.code_begin = need(t.Offset("CodeBlob", "_code_begin"), "CodeBlob::_code_begin");
    l.pcs_end = need(t.Offset("nmethod", "_dependencies_offset"), "nmethod::_dependencies_offset");
    l.scopes_begin = need(t.Offset("CompiledMethod", "_scopes_data_begin"),
                          "CompiledMethod::_scopes_data_begin");
    l.metadata_begin = need(t.Offset("nmethod", "_metadata_offset"), "nmethod::_metadata_offset");
  }
  l.low_bound = t.Address("CodeCache", "_low_bound").value_or(0);
  l.high_bound = t.Address("CodeCache", "_high_bound").value_or(0);
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat("the JVM publishes no ", missing));
  }
  for (uint64_t offset : {l.compile_id, l.method, l.code_begin, l.pcs_begin, l.pcs_end,
                          l.scopes_begin, l.scopes_end, l.metadata_begin, l.metadata_end,
                          l.immutable_data, l.mutable_data}) {
    if (offset + 8 > kHeaderBytes) return absl::DataLossError("an nmethod field past its header");
  }
  if (l.pc_desc_size < 8 || l.pc_desc_size > 64 || l.pc_desc_pc_offset + 4 > l.pc_desc_size ||
      l.pc_desc_scope_offset + 4 > l.pc_desc_size) {
    return absl::DataLossError("bad PcDesc layout");
  }
  absl::StatusOr<uint32_t> excess = CompressedIntExcess(t, memory);
  if (!excess.ok()) return excess.status();
  l.excess = *excess;
  return l;
}

absl::StatusOr<uint32_t> CompressedIntExcess(const HotSpotTables& tables,
                                             const python::RemoteMemory& memory) {
  const std::optional<uint64_t> major_at =
      tables.Address("Abstract_VM_Version", "_vm_major_version");
  if (!major_at.has_value()) {
    return absl::NotFoundError("the JVM publishes no Abstract_VM_Version::_vm_major_version");
  }
  int32_t major = 0;
  if (!memory.ReadValue(*major_at, &major)) {
    return absl::UnavailableError("cannot read the JVM's major version");
  }
  return major >= 20 ? 1 : 0;
}

bool ReadCompressedInt(std::span<const uint8_t> bytes, uint32_t excess, size_t& at,
                       uint32_t* value) {
  // A byte of 192 or more says another follows, whatever the excess (L + X is 192).
  constexpr uint32_t kLast = 192;
  uint64_t sum = 0;
  for (int i = 0, shift = 0; i < 5; ++i, shift += 6) {
    if (at >= bytes.size()) return false;
    const uint32_t b = bytes[at++];
    if (b < excess) return false;  // a byte the encoding never writes
    sum += uint64_t{b - excess} << shift;
    if (b < kLast || i == 4) break;
  }
  *value = static_cast<uint32_t>(sum);
  return true;
}

size_t ScopesAt(const CompiledMethodInfo& info, uint64_t pc, bool return_address,
                uint32_t excess, std::span<JavaScope> out) {
  if (pc < info.code_begin || out.empty()) return 0;
  const uint64_t offset = pc - info.code_begin + (return_address ? 0 : 1);
  if (offset > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) return 0;
  // A return address's PcDesc is its own; a sampled pc's the first after it (HotSpot's
  // pc_desc_near(pc + 1)).
  auto it = std::lower_bound(info.pcs.begin(), info.pcs.end(), static_cast<int32_t>(offset),
                             [](const CompiledMethodInfo::Pc& p, int32_t o) {
                               return p.pc_offset < o;
                             });
  if (it == info.pcs.end() || (return_address && it->pc_offset != static_cast<int32_t>(offset))) {
    return 0;
  }
  std::array<JavaScope, kMaxChain> chain;
  size_t n = 0;
  const std::span<const uint8_t> scopes = info.scopes;
  uint32_t decode = static_cast<uint32_t>(it->scope_offset);
  while (decode != kSerializedNull) {
    size_t at = decode;
    uint32_t sender = 0, index = 0, bci = 0;
    if (n == chain.size() || !ReadCompressedInt(scopes, excess, at, &sender) ||
        !ReadCompressedInt(scopes, excess, at, &index) || index == 0 ||
        index > info.metadata.size() || !ReadCompressedInt(scopes, excess, at, &bci) ||
        bci > kMaxBciPlusOne) {
      return 0;
    }
    // Written as bci - InvocationEntryBci (-1).
    chain[n++] = {info.metadata[index - 1], static_cast<int32_t>(bci) - 1};
    // Callers are written before their callees: a sender at or after its scope is a misread.
    if (sender >= decode) return 0;
    decode = sender;
  }
  // The outermost scope is the compiled method's own (else the bytes were not what they seemed).
  if (n == 0 || chain[n - 1].method != info.method) return 0;
  const size_t kept = std::min(n, out.size());  // the outermost ones
  std::copy(chain.begin() + static_cast<std::ptrdiff_t>(n - kept), chain.begin() +
            static_cast<std::ptrdiff_t>(n), out.begin());
  return kept;
}

uint64_t HotSpotScopes::FindBlob(uint64_t pc) const {
  const HotSpotCodeLayout& l = layout_;
  uint64_t array = 0;
  if (!memory_->ReadValue(l.heaps, &array) || array == 0) return 0;
  int32_t length = 0;
  uint64_t data = 0;
  if (!memory_->ReadValue(array + l.array_length, &length) ||
      !memory_->ReadValue(array + l.array_data, &data) || length <= 0 || length > 16) {
    return 0;
  }
  std::array<uint64_t, 16> heaps;
  if (!memory_->Read(data, heaps.data(), static_cast<size_t>(length) * 8)) return 0;
  for (int32_t h = 0; h < length; ++h) {
    uint64_t low = 0, high = 0, segmap = 0;
    int32_t log2 = 0;
    const uint64_t heap = heaps[static_cast<size_t>(h)];
    if (!memory_->ReadValue(heap + l.heap_memory + l.space_low, &low) ||
        !memory_->ReadValue(heap + l.heap_memory + l.space_high, &high) || pc < low ||
        pc >= high) {
      continue;
    }
    if (!memory_->ReadValue(heap + l.heap_segmap + l.space_low, &segmap) ||
        !memory_->ReadValue(heap + l.heap_log2_segment_size, &log2) || log2 < 4 || log2 > 20) {
      return 0;
    }
    // Each segment's byte says how many segments back to hop towards its block's first one
    // (0 there; 0xFF for a free segment). A hop is at most 254 segments.
    uint64_t segment = (pc - low) >> log2;
    for (int hops = 0;; ++hops) {
      uint8_t back = 0;
      if (hops > kMaxHops || !memory_->ReadValue(segmap + segment, &back) || back == 0xFF ||
          back > segment) {
        return 0;
      }
      if (back == 0) break;
      segment -= back;
    }
    const uint64_t block = low + (segment << log2);
    uint8_t used = 0;
    if (!memory_->ReadValue(block + l.heap_block_used, &used) || used == 0) return 0;
    return block + l.heap_block_size;
  }
  return 0;
}

std::unique_ptr<CompiledMethodInfo> HotSpotScopes::ReadMethod(uint64_t blob) const {
  const HotSpotCodeLayout& l = layout_;
  std::array<uint8_t, kHeaderBytes> header;
  if (!memory_->Read(blob, header.data(), header.size())) return nullptr;
  auto info = std::make_unique<CompiledMethodInfo>();
  info->blob = blob;
  info->method = HeaderField<uint64_t>(header, l.method);
  info->compile_id = HeaderField<int32_t>(header, l.compile_id);
  uint64_t pcs[2], scopes[2], metadata[2];
  auto offset = [&](uint64_t base, uint64_t field) {
    return base + static_cast<uint64_t>(static_cast<int64_t>(HeaderField<int32_t>(header, field)));
  };
  if (l.out_of_line) {
    info->code_begin = offset(blob, l.code_begin);
    const uint64_t immutable = HeaderField<uint64_t>(header, l.immutable_data);
    const uint64_t mutable_data = HeaderField<uint64_t>(header, l.mutable_data);
    if (immutable == 0 || mutable_data == 0) return nullptr;
    pcs[0] = offset(immutable, l.pcs_begin);
    pcs[1] = scopes[0] = offset(immutable, l.scopes_begin);
    scopes[1] = offset(immutable, l.scopes_end);
    metadata[0] = offset(mutable_data, l.metadata_begin);
    metadata[1] = offset(mutable_data, l.metadata_end);
  } else {
    info->code_begin = HeaderField<uint64_t>(header, l.code_begin);
    pcs[0] = offset(blob, l.pcs_begin);
    pcs[1] = offset(blob, l.pcs_end);
    scopes[0] = HeaderField<uint64_t>(header, l.scopes_begin);
    scopes[1] = pcs[0];
    metadata[0] = offset(blob, l.metadata_begin);
    metadata[1] = scopes[0];
  }
  // A sane layout: each part in order, the three together bounded.
  if (info->method == 0 || info->method % 8 != 0 || pcs[1] < pcs[0] || scopes[1] < scopes[0] ||
      metadata[1] < metadata[0] || (metadata[1] - metadata[0]) % 8 != 0 ||
      (pcs[1] - pcs[0]) % l.pc_desc_size != 0 ||
      pcs[1] - pcs[0] + scopes[1] - scopes[0] + metadata[1] - metadata[0] > kMaxDebugInfoBytes) {
    return nullptr;
  }
  // The three parts in one system call, one after another in `bytes`.
  const uint64_t addresses[3] = {pcs[0], scopes[0], metadata[0]};
  const size_t sizes[3] = {pcs[1] - pcs[0], scopes[1] - scopes[0], metadata[1] - metadata[0]};
  std::vector<uint8_t> bytes(sizes[0] + sizes[1] + sizes[2]);
  if (!bytes.empty() && !memory_->ReadMany(addresses, sizes, 3, bytes.data())) return nullptr;
  const uint8_t* const pc_bytes = bytes.data();
  const uint8_t* const scope_bytes = pc_bytes + sizes[0];
  info->scopes.assign(scope_bytes, scope_bytes + sizes[1]);
  info->metadata.resize(sizes[2] / 8);
  if (sizes[2] > 0) std::memcpy(info->metadata.data(), scope_bytes + sizes[1], sizes[2]);
  info->pcs.reserve(sizes[0] / l.pc_desc_size);
  for (size_t at = 0; at < sizes[0]; at += l.pc_desc_size) {
    const uint8_t* p = pc_bytes + at;
    const CompiledMethodInfo::Pc pc{
        python::FieldAt<int32_t>(p, static_cast<uint32_t>(l.pc_desc_pc_offset)),
        python::FieldAt<int32_t>(p, static_cast<uint32_t>(l.pc_desc_scope_offset))};
    if (!info->pcs.empty() && pc.pc_offset < info->pcs.back().pc_offset) return nullptr;
    info->pcs.push_back(pc);
  }
  return info;
}

const HotSpotScopes::Method* HotSpotScopes::MethodAt(uint64_t code_start, uint64_t pc,
                                                     uint64_t now_ns) {
  auto it = methods_.find(code_start);
  if (it != methods_.end()) {
    Method& m = it->second;
    if (now_ns - m.read_ns < kRecheckNs) return m.info.blob != 0 ? &m : nullptr;
    // Still the same nmethod: its Method* and compile ID where they were (one system call).
    struct {
      uint64_t method = 0;
      int32_t compile_id = 0;
    } now;
    const uint64_t at[2] = {m.info.blob + layout_.method, m.info.blob + layout_.compile_id};
    const size_t sizes[2] = {8, 4};
    uint8_t bytes[12];
    if (m.info.blob != 0 && memory_->ReadMany(at, sizes, 2, bytes)) {
      std::memcpy(&now.method, bytes, 8);
      std::memcpy(&now.compile_id, bytes + 8, 4);
    }
    if (m.info.blob != 0 && now.method == m.info.method && now.compile_id == m.info.compile_id) {
      m.read_ns = now_ns;
      return &m;
    }
    bytes_ -= Bytes(m.info);
    methods_.erase(it);
  }
  if (methods_.size() >= kMaxMethods || bytes_ >= kMaxBytes) {
    methods_.clear();
    bytes_ = 0;
  }
  Method& m = methods_[code_start];
  m.read_ns = now_ns;
  m.generation = next_generation_++;
  const uint64_t blob = FindBlob(pc);
  std::unique_ptr<CompiledMethodInfo> info = blob != 0 ? ReadMethod(blob) : nullptr;
  // What is not known stays so until it is checked again (a blob not found is read again then).
  if (info == nullptr || pc < info->code_begin) return nullptr;
  ++methods_read_;
  m.info = std::move(*info);
  bytes_ += Bytes(m.info);
  return &m;
}

bool HotSpotScopes::InCodeCache(uint64_t pc, uint64_t now_ns) {
  if (high_bound_ == 0 && layout_.low_bound != 0 && layout_.high_bound != 0 &&
      (bounds_read_ns_ == 0 || now_ns - bounds_read_ns_ >= kRecheckNs)) {
    bounds_read_ns_ = now_ns;
    uint64_t low = 0, high = 0;
    if (memory_->ReadValue(layout_.low_bound, &low) &&
        memory_->ReadValue(layout_.high_bound, &high) && low < high) {
      low_bound_ = low;
      high_bound_ = high;
    }
  }
  return high_bound_ == 0 || (pc >= low_bound_ && pc < high_bound_);
}

std::span<const JavaScope> HotSpotScopes::LeafAt(uint64_t pc, uint64_t now_ns,
                                                PerfMapLookup lookup) {
  const Range* range = nullptr;
  for (const Range& r : recent_) {
    if (pc >= r.start && pc < r.end && now_ns - r.looked_up_ns < kRecheckNs) {
      range = &r;
      break;
    }
  }
  if (range == nullptr) {
    symbols::PerfMap::Symbol entry;
    if (!lookup(pc, &entry)) return {};
    Range& r = recent_[recent_next_++ % recent_.size()];
    r = {entry.start, entry.end, IsCompiledMethodName(entry.name), now_ns};
    range = &r;
  }
  if (!range->compiled) return {};
  const Method* m = MethodAt(range->start, pc, now_ns);
  if (m == nullptr) return {};
  leaf_.size = static_cast<uint8_t>(
      ScopesAt(m->info, pc, /*return_address=*/false, layout_.excess, {leaf_.scopes, kMaxScopes}));
  // No PcDesc after the pc (a method without calls or loops records none but its end): the
  // method itself, where in it unknown (as AsyncGetCallTrace's frame without a PcDesc).
  if (leaf_.size == 0 && m->info.method != 0) {
    leaf_.scopes[0] = {m->info.method, kUnknownBci};
    leaf_.size = 1;
  }
  return {leaf_.scopes, leaf_.size};
}

std::span<const JavaScope> HotSpotScopes::At(uint64_t pc, bool return_address, uint64_t now_ns,
                                            PerfMapLookup lookup) {
  if (!InCodeCache(pc, now_ns)) return {};
  if (!return_address) return LeafAt(pc, now_ns, lookup);
  auto it = chains_.find(pc);
  if (it != chains_.end()) {
    Chain& c = it->second;
    // A chain is taken as it is for a second (as its method would be), then checked against
    // its method.
    if (now_ns - c.checked_ns < kRecheckNs) return {c.scopes, c.size};
    if (c.code_start != 0) {
      if (const Method* m = MethodAt(c.code_start, pc, now_ns);
          m != nullptr && m->generation == c.generation) {
        c.checked_ns = now_ns;
        return {c.scopes, c.size};
      }
    }
  } else {
    if (chains_.size() >= kMaxPcs) chains_.clear();
    it = chains_.try_emplace(pc).first;
  }
  Chain& c = it->second;
  c = Chain{};
  c.checked_ns = now_ns;
  // A return address is looked up by its call, which may be its method's last instruction.
  symbols::PerfMap::Symbol entry;
  if (!lookup(pc - 1, &entry) || !IsCompiledMethodName(entry.name)) return {};
  const Method* m = MethodAt(entry.start, pc, now_ns);
  if (m == nullptr) return {};
  c.code_start = entry.start;
  c.generation = m->generation;
  c.size = static_cast<uint8_t>(
      ScopesAt(m->info, pc, /*return_address=*/true, layout_.excess, {c.scopes, kMaxScopes}));
  return {c.scopes, c.size};
}

}  // namespace strata::agent::jvm
