// Inlined calls of compiled Java code: HotSpot's compressed integers, the scope chain at a pc
// (a return address's own PcDesc, a sampled pc's next one), and an nmethod found through a code
// cache laid out by hand, read once, checked again and read again when its code changed.
#include "agent/jvm/hotspot_scopes.h"

#include <cstring>
#include <vector>

#include "agent/jvm/compressed_for_test.h"
#include "agent/python/fake_memory_for_test.h"
#include "gtest/gtest.h"

namespace strata::agent::jvm {
namespace {

using python::testing::FakeMemory;
using testing::WriteCompressed;

TEST(ReadCompressedIntTest, ReadsWhatHotSpotWrites) {
  for (uint32_t excess : {0u, 1u}) {
    for (uint32_t value : {0u, 1u, 190u, 191u, 192u, 255u, 1000u, 12345u, 1u << 20, 0x7fffffffu,
                           0xfffffffeu}) {
      std::vector<uint8_t> bytes = {0xAA};
      WriteCompressed(value, excess, &bytes);
      size_t at = 1;
      uint32_t read = 0;
      ASSERT_TRUE(ReadCompressedInt(bytes, excess, at, &read)) << value << " excess " << excess;
      EXPECT_EQ(read, value) << "excess " << excess;
      EXPECT_EQ(at, bytes.size()) << value << " excess " << excess;
    }
  }
  // Cut short, and a byte the encoding with an excess never writes.
  size_t at = 0;
  uint32_t v = 0;
  const std::vector<uint8_t> cut = {200, 200};
  EXPECT_FALSE(ReadCompressedInt(cut, 0, at, &v));
  at = 0;
  const std::vector<uint8_t> zero = {0};
  EXPECT_FALSE(ReadCompressedInt(zero, 1, at, &v));
  at = 0;
  EXPECT_TRUE(ReadCompressedInt(zero, 0, at, &v));
  EXPECT_EQ(v, 0u);
}

constexpr uint64_t kOuter = 0x7000, kMiddle = 0x7100, kInner = 0x7200;

// One scope's record: its caller's offset, its method's index in the metadata (1-based), its
// bci + 1 (HotSpot's InvocationEntryBci is -1) and three offsets nobody here reads.
size_t AddScope(uint32_t sender, uint32_t method_index, uint32_t excess,
                std::vector<uint8_t>* scopes, int32_t bci = 4) {
  const size_t at = scopes->size();
  for (uint32_t v : {sender, method_index, static_cast<uint32_t>(bci + 1), 0u, 0u, 0u}) {
    WriteCompressed(v, excess, scopes);
  }
  return at;
}

// outer (at 0x40 calls into middle, inlined; at 0x80 middle calls into inner, inlined too).
CompiledMethodInfo ThreeScopes(uint32_t excess) {
  CompiledMethodInfo info;
  info.code_begin = 0x1000;
  info.method = kOuter;
  info.metadata = {kOuter, kMiddle, kInner};
  info.scopes = {0xFF};  // HotSpot's first byte, so that no scope is at offset 0
  const size_t outer = AddScope(0, 1, excess, &info.scopes, 17);
  const size_t middle = AddScope(static_cast<uint32_t>(outer), 2, excess, &info.scopes, 300);
  const size_t inner = AddScope(static_cast<uint32_t>(middle), 3, excess, &info.scopes, -1);
  info.pcs = {{-1, 0},
              {0x40, static_cast<int32_t>(inner)},
              {0x80, static_cast<int32_t>(middle)},
              {0x101, 0}};
  return info;
}

// The methods of the scopes at `pc`.
std::vector<uint64_t> Scopes(const CompiledMethodInfo& info, uint64_t pc, bool return_address,
                             uint32_t excess, size_t room = HotSpotScopes::kMaxScopes) {
  std::vector<JavaScope> scopes(room);
  scopes.resize(ScopesAt(info, pc, return_address, excess, scopes));
  std::vector<uint64_t> out;
  for (const JavaScope& s : scopes) out.push_back(s.method);
  return out;
}

TEST(ScopesAtTest, AReturnAddressHasItsOwnPcDescASampledPcTheNextOne) {
  for (uint32_t excess : {0u, 1u}) {
    const CompiledMethodInfo info = ThreeScopes(excess);
    const std::vector<uint64_t> three = {kInner, kMiddle, kOuter};
    const std::vector<uint64_t> two = {kMiddle, kOuter};
    EXPECT_EQ(Scopes(info, 0x1040, true, excess), three);
    EXPECT_EQ(Scopes(info, 0x1080, true, excess), two);
    EXPECT_TRUE(Scopes(info, 0x1041, true, excess).empty());  // no call returns there
    // A sampled pc takes the first PcDesc after it (HotSpot's pc_desc_near(pc + 1)).
    EXPECT_EQ(Scopes(info, 0x1000, false, excess), three);
    EXPECT_EQ(Scopes(info, 0x103f, false, excess), three);
    EXPECT_EQ(Scopes(info, 0x1040, false, excess), two);
    EXPECT_TRUE(Scopes(info, 0x1090, false, excess).empty());  // the end's sentinel
    EXPECT_TRUE(Scopes(info, 0x0fff, false, excess).empty());
    // Cut at the innermost scopes: the compiled method's own frame stays.
    EXPECT_EQ(Scopes(info, 0x1040, true, excess, 2), two);
    // Each scope where it is in its method's bytecode (the inner one at its entry).
    std::vector<JavaScope> scopes(HotSpotScopes::kMaxScopes);
    ASSERT_EQ(ScopesAt(info, 0x1040, true, excess, scopes), 3u);
    EXPECT_EQ(scopes[0], (JavaScope{kInner, -1}));
    EXPECT_EQ(scopes[1], (JavaScope{kMiddle, 300}));
    EXPECT_EQ(scopes[2], (JavaScope{kOuter, 17}));
  }
}

TEST(ScopesAtTest, ChainsThatCannotBeRightAreNone) {
  CompiledMethodInfo info = ThreeScopes(0);
  EXPECT_TRUE(Scopes(info, 0x1040, true, 1).empty());  // read with the wrong excess
  CompiledMethodInfo other = info;
  other.method = 0x9999;  // the outermost scope is not the method's own
  EXPECT_TRUE(Scopes(other, 0x1040, true, 0).empty());
  other = info;
  other.metadata.pop_back();  // an index past the metadata
  EXPECT_TRUE(Scopes(other, 0x1040, true, 0).empty());
  other = info;
  other.pcs[1].scope_offset = static_cast<int32_t>(other.scopes.size());  // past the end
  EXPECT_TRUE(Scopes(other, 0x1040, true, 0).empty());
  // A scope whose caller follows it (a loop, or bytes that are no scopes).
  other = info;
  const size_t at = other.scopes.size();
  AddScope(static_cast<uint32_t>(at + 1), 3, 0, &other.scopes);
  other.pcs[1].scope_offset = static_cast<int32_t>(at);
  EXPECT_TRUE(Scopes(other, 0x1040, true, 0).empty());
}

// A JVM's code cache laid out by hand (JDK 17's form): CodeCache::_heaps -> the array of heaps
// -> one CodeHeap (its memory and segment map) -> a used block -> the nmethod, whose PcDescs,
// scopes and metadata follow its code.
class HotSpotScopesTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kHeapsStatic = 0x1000, kBoundsStatics = 0x1100, kArray = 0x2000,
                            kArrayData = 0x2100, kHeap = 0x3000, kSegmap = 0x200000,
                            kLow = 0x100000, kHigh = 0x110000, kBlock = kLow + 4 * 128,
                            kBlob = kBlock + 16,
                            kCode = kBlob + 0x300, kPcs = kBlob + 0x480, kScopes = kBlob + 0x420,
                            kMetadata = kBlob + 0x400;

  static HotSpotCodeLayout Layout() {
    HotSpotCodeLayout l;
    l.heaps = kHeapsStatic;
    l.low_bound = kBoundsStatics;
    l.high_bound = kBoundsStatics + 8;
    l.array_length = 0;
    l.array_data = 8;
    l.heap_memory = 8;
    l.heap_segmap = 64;
    l.heap_log2_segment_size = 200;
    l.space_low = 16;
    l.space_high = 8;
    l.heap_block_size = 16;
    l.heap_block_used = 8;
    l.method = 112;
    l.compile_id = 304;
    l.pc_desc_size = 16;
    l.pc_desc_pc_offset = 0;
    l.pc_desc_scope_offset = 4;
    l.code_begin = 32;
    l.pcs_begin = 268;
    l.pcs_end = 272;
    l.scopes_begin = 120;
    l.metadata_begin = 260;
    return l;
  }

  void PutBytes(uint64_t address, const void* bytes, size_t size) {
    for (auto& [start, region] : memory_->regions) {
      if (address >= start && address + size <= start + region.size()) {
        std::memcpy(region.data() + (address - start), bytes, size);
        return;
      }
    }
    ADD_FAILURE() << "unmapped " << address;
  }
  template <typename T>
  void PutValue(uint64_t address, T value) {
    PutBytes(address, &value, sizeof(T));
  }

  // The nmethod with `info`'s PcDescs, scopes and metadata, and `compile_id`.
  void PutMethod(const CompiledMethodInfo& info, int32_t compile_id) {
    const HotSpotCodeLayout l = Layout();
    PutValue<uint64_t>(kBlob + l.method, info.method);
    PutValue<int32_t>(kBlob + l.compile_id, compile_id);
    PutValue<uint64_t>(kBlob + l.code_begin, kCode);
    PutValue<int32_t>(kBlob + l.metadata_begin, static_cast<int32_t>(kMetadata - kBlob));
    PutValue<uint64_t>(kBlob + l.scopes_begin, kScopes);
    PutValue<int32_t>(kBlob + l.pcs_begin, static_cast<int32_t>(kPcs - kBlob));
    PutValue<int32_t>(kBlob + l.pcs_end,
                      static_cast<int32_t>(kPcs - kBlob + 16 * info.pcs.size()));
    ASSERT_LE(kMetadata + 8 * info.metadata.size(), kScopes);
    ASSERT_LE(kScopes + info.scopes.size(), kPcs);
    PutBytes(kMetadata, info.metadata.data(), 8 * info.metadata.size());
    PutBytes(kScopes, info.scopes.data(), info.scopes.size());
    for (size_t i = 0; i < info.pcs.size(); ++i) {
      PutValue<int32_t>(kPcs + 16 * i, info.pcs[i].pc_offset);
      PutValue<int32_t>(kPcs + 16 * i + 4, info.pcs[i].scope_offset);
    }
  }

  HotSpotScopesTest() {
    memory_ = new FakeMemory;
    memory_->Map(kHeapsStatic, 8);
    memory_->Map(kBoundsStatics, 16);
    memory_->Map(kArray, 0x200);
    memory_->Map(kHeap, 0x200);
    memory_->Map(kSegmap, 0x200);
    memory_->Map(kLow, kHigh - kLow);
    const HotSpotCodeLayout l = Layout();
    PutValue<uint64_t>(kHeapsStatic, kArray);
    PutValue<uint64_t>(kBoundsStatics, kLow);
    PutValue<uint64_t>(kBoundsStatics + 8, kHigh);
    PutValue<int32_t>(kArray + l.array_length, 1);
    PutValue<uint64_t>(kArray + l.array_data, kArrayData);
    PutValue<uint64_t>(kArrayData, kHeap);
    PutValue<uint64_t>(kHeap + l.heap_memory + l.space_low, kLow);
    PutValue<uint64_t>(kHeap + l.heap_memory + l.space_high, kHigh);
    PutValue<uint64_t>(kHeap + l.heap_segmap + l.space_low, kSegmap);
    PutValue<int32_t>(kHeap + l.heap_log2_segment_size, 7);
    // Segments 0-3 free, the block from segment 4 on: each byte hops back towards it.
    for (uint64_t s = 0; s < 4; ++s) PutValue<uint8_t>(kSegmap + s, 0xFF);
    for (uint64_t s = 4; s < 32; ++s) PutValue<uint8_t>(kSegmap + s, static_cast<uint8_t>(s - 4));
    PutValue<uint8_t>(kBlock + l.heap_block_used, 1);
    info_ = ThreeScopes(0);
    info_.code_begin = kCode;
    PutMethod(info_, 7);
    map_.Add(kCode, 0x100, "long A.outer(long)");
    map_.Add(kCode + 0x100, 0x100, "Interpreter");
    scopes_ = std::make_unique<HotSpotScopes>(Layout(), std::unique_ptr<FakeMemory>(memory_));
  }

  std::vector<uint64_t> At(uint64_t pc, bool return_address, uint64_t now_ns) {
    std::vector<uint64_t> methods;
    auto lookup = [this](uint64_t at, symbols::PerfMap::Symbol* out) {
      return map_.Lookup(at, out);
    };
    for (const JavaScope& s : scopes_->At(pc, return_address, now_ns, lookup)) {
      methods.push_back(s.method);
    }
    return methods;
  }

  FakeMemory* memory_;  // owned by scopes_
  CompiledMethodInfo info_;
  symbols::PerfMap map_;
  std::unique_ptr<HotSpotScopes> scopes_;
};

TEST_F(HotSpotScopesTest, ReadsAMethodOnceAndEachPcsChainOnce) {
  const std::vector<uint64_t> three = {kInner, kMiddle, kOuter};
  const std::vector<uint64_t> two = {kMiddle, kOuter};
  EXPECT_EQ(At(kCode + 0x40, true, 1000), three);
  EXPECT_EQ(scopes_->methods_read(), 1u);
  const uint64_t reads = memory_->reads;
  EXPECT_EQ(At(kCode + 0x40, true, 2000), three);
  EXPECT_EQ(At(kCode + 0x80, true, 3000), two);
  EXPECT_EQ(At(kCode + 0x10, false, 4000), three);
  // A sampled pc past the last PcDesc with a scope: the method's own, where in it unknown.
  EXPECT_EQ(At(kCode + 0x90, false, 4500), std::vector<uint64_t>{kOuter});
  auto lookup = [this](uint64_t at, symbols::PerfMap::Symbol* out) {
    return map_.Lookup(at, out);
  };
  const std::span<const JavaScope> past = scopes_->At(kCode + 0x90, false, 4500, lookup);
  ASSERT_EQ(past.size(), 1u);
  EXPECT_EQ(past[0].bci, kUnknownBci);
  EXPECT_EQ(memory_->reads, reads);  // from what was read
  // Code the map names as something else: nothing read.
  EXPECT_TRUE(At(kCode + 0x140, false, 5000).empty());
  EXPECT_EQ(memory_->reads, reads);
}

TEST_F(HotSpotScopesTest, AMethodIsCheckedEverySecondAndReadAgainWhenReplaced) {
  const std::vector<uint64_t> three = {kInner, kMiddle, kOuter};
  EXPECT_EQ(At(kCode + 0x40, true, 1000), three);
  uint64_t reads = memory_->reads;
  // A second on, the same nmethod: its Method* and compile ID read, nothing else (FakeMemory
  // counts each of ReadMany's ranges).
  const uint64_t later = 1000 + HotSpotScopes::kRecheckNs;
  EXPECT_EQ(At(kCode + 0x40, true, later), three);
  EXPECT_EQ(memory_->reads, reads + 2);
  EXPECT_EQ(scopes_->methods_read(), 1u);
  // Another nmethod at the same address (the first one freed): read again.
  CompiledMethodInfo replaced = info_;
  replaced.pcs[1].scope_offset = replaced.pcs[2].scope_offset;
  PutMethod(replaced, 8);
  EXPECT_EQ(At(kCode + 0x40, true, later + 1), three);  // not checked again yet
  const std::vector<uint64_t> two = {kMiddle, kOuter};
  EXPECT_EQ(At(kCode + 0x40, true, later + HotSpotScopes::kRecheckNs), two);
  EXPECT_EQ(scopes_->methods_read(), 2u);
}

TEST_F(HotSpotScopesTest, WhatTheCodeCacheDoesNotHoldHasNoScopes) {
  // The block freed: no nmethod there, and none asked for again within the second.
  PutValue<uint8_t>(kBlock + Layout().heap_block_used, 0);
  EXPECT_TRUE(At(kCode + 0x40, true, 1000).empty());
  const uint64_t reads = memory_->reads;
  EXPECT_TRUE(At(kCode + 0x40, true, 2000).empty());
  EXPECT_EQ(memory_->reads, reads);
  // Used again: found at the next check.
  PutValue<uint8_t>(kBlock + Layout().heap_block_used, 1);
  const std::vector<uint64_t> three = {kInner, kMiddle, kOuter};
  EXPECT_EQ(At(kCode + 0x40, true, 1000 + HotSpotScopes::kRecheckNs), three);
  // Code the map names in a free segment, and outside the code cache (nothing read).
  map_.Add(kLow + 0x80, 0x40, "long C.g()");
  EXPECT_TRUE(At(kLow + 0x90, false, 5000).empty());
  map_.Add(kHigh + 0x1000, 0x100, "long B.f()");
  const uint64_t before = memory_->reads;
  EXPECT_TRUE(At(kHigh + 0x1010, false, 5000).empty());
  EXPECT_TRUE(At(kHigh + 0x1010, true, 5000).empty());
  EXPECT_EQ(memory_->reads, before);
}

TEST_F(HotSpotScopesTest, ASampledPcsMethodIsTheOneTheMapNamedWithinTheSecond) {
  const std::vector<uint64_t> three = {kInner, kMiddle, kOuter};
  EXPECT_EQ(At(kCode + 0x10, false, 1000), three);
  map_.Add(kCode, 0x100, "Interpreter");  // the map rewritten since
  EXPECT_EQ(At(kCode + 0x20, false, 2000), three);
  EXPECT_TRUE(At(kCode + 0x20, false, 1000 + HotSpotScopes::kRecheckNs).empty());
}

TEST(CodeLayoutTest, TakesEitherFormFromTheTables) {
  FakeMemory memory;
  memory.Map(0x5000, 8);
  memory.Put(0x5000, 17);
  HotSpotTables tables;
  tables.SetAddress("CodeCache", "_heaps", 0x4000);
  tables.SetAddress("Abstract_VM_Version", "_vm_major_version", 0x5000);
  tables.SetOffset("GrowableArrayBase", "_len", 0);
  tables.SetOffset("GrowableArray<int>", "_data", 8);
  tables.SetOffset("CodeHeap", "_memory", 8);
  tables.SetOffset("CodeHeap", "_segmap", 120);
  tables.SetOffset("CodeHeap", "_log2_segment_size", 256);
  tables.SetOffset("VirtualSpace", "_low", 16);
  tables.SetOffset("VirtualSpace", "_high_boundary", 8);
  tables.SetSize("HeapBlock", 16);
  tables.SetOffset("HeapBlock::Header", "_used", 8);
  tables.SetOffset("nmethod", "_compile_id", 304);
  tables.SetSize("PcDesc", 16);
  tables.SetOffset("PcDesc", "_pc_offset", 0);
  tables.SetOffset("PcDesc", "_scope_decode_offset", 4);
  tables.SetOffset("nmethod", "_scopes_pcs_offset", 268);
  // JDK 17's form.
  tables.SetOffset("CompiledMethod", "_method", 112);
  tables.SetOffset("CodeBlob", "_code_begin", 32);
  tables.SetOffset("nmethod", "_dependencies_offset", 272);
  tables.SetOffset("CompiledMethod", "_scopes_data_begin", 120);
  absl::StatusOr<HotSpotCodeLayout> l = CodeLayout(tables, memory);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(l.status().message().find("nmethod::_metadata_offset"), std::string::npos);
  tables.SetOffset("nmethod", "_metadata_offset", 260);
  l = CodeLayout(tables, memory);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_FALSE(l->out_of_line);
  EXPECT_EQ(l->excess, 0u);
  EXPECT_EQ(l->pcs_end, 272u);
  // JDK 25's form, and a release whose integers exclude the zero byte.
  memory.Put(0x5000, 25);
  tables.SetOffset("nmethod", "_immutable_data", 96);
  tables.SetOffset("nmethod", "_method", 80);
  tables.SetOffset("CodeBlob", "_code_offset", 36);
  tables.SetOffset("nmethod", "_scopes_data_offset", 200);
  tables.SetOffset("nmethod", "_immutable_data_size", 160);
  tables.SetOffset("CodeBlob", "_mutable_data", 16);
  tables.SetOffset("CodeBlob", "_relocation_size", 28);
  tables.SetOffset("CodeBlob", "_mutable_data_size", 48);
  l = CodeLayout(tables, memory);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_TRUE(l->out_of_line);
  EXPECT_EQ(l->excess, 1u);
  EXPECT_EQ(l->method, 80u);
  EXPECT_EQ(l->pcs_end, 200u);
  EXPECT_EQ(l->scopes_begin, 200u);
  EXPECT_EQ(l->metadata_begin, 28u);
}

}  // namespace
}  // namespace strata::agent::jvm
