// Interpreted methods named: descriptors in Java's words, a Method* followed through a JVM's
// structures laid out by hand, and methods that change or were never methods; their source
// files and line tables (HotSpot's compressed form), and frames' bytecode pointers.
#include "agent/jvm/hotspot_methods.h"

#include <cstring>
#include <string>
#include <vector>

#include "agent/jvm/compressed_for_test.h"
#include "agent/python/fake_memory_for_test.h"
#include "gtest/gtest.h"

namespace strata::agent::jvm {
namespace {

using python::testing::FakeMemory;
using testing::LineTableWriter;

// Reads another's memory (owned elsewhere), counting calls (each one system call in a
// process's memory) where FakeMemory counts the reads of each part.
class SharedMemory final : public python::RemoteMemory {
 public:
  explicit SharedMemory(const FakeMemory* memory) : RemoteMemory(0), memory_(memory) {}
  bool Read(uint64_t address, void* out, size_t size) const override {
    ++calls;
    return memory_->Read(address, out, size);
  }
  bool ReadMany(const uint64_t* addresses, const size_t* sizes, size_t count,
                void* out) const override {
    ++calls;
    return memory_->ReadMany(addresses, sizes, count, out);
  }
  mutable uint64_t calls = 0;

 private:
  const FakeMemory* memory_;
};

TEST(DecodeLineTableTest, ReadsWhatHotSpotWrites) {
  for (uint32_t excess : {0u, 1u}) {
    // Small steps (one byte a row), a step back in lines, far bytecode indexes and lines, and a
    // row whose single byte would be the escape (bci + 31, line + 7: 0xFF).
    const std::vector<JavaLine> rows = {{0, 10}, {4, 11}, {9, 11}, {12, 8},   {300, 9},
                                        {301, 4000}, {332, 4007}, {333, 12}, {65535, 13}};
    LineTableWriter writer(excess);
    for (const JavaLine& row : rows) writer.Add(row.bci, row.line);
    std::vector<uint8_t> bytes = writer.End();
    bytes.push_back(0x55);  // what follows the table is not read
    EXPECT_EQ(DecodeLineTable(bytes, excess), rows) << "excess " << excess;
    // Cut before its end, a bytecode index before 0, and a line that is not positive.
    bytes.resize(bytes.size() - 2);
    EXPECT_EQ(DecodeLineTable(bytes, excess), std::nullopt);
    for (const std::vector<JavaLine>& bad : {std::vector<JavaLine>{{5, 3}, {-2, 4}},
                                             std::vector<JavaLine>{{5, 3}, {6, -1}}}) {
      LineTableWriter w(excess);
      for (const JavaLine& row : bad) w.Add(row.bci, row.line);
      EXPECT_EQ(DecodeLineTable(w.End(), excess), std::nullopt);
    }
  }
  // Rows out of bytecode order are kept as written (a compiler may write them so).
  LineTableWriter unordered(1);
  unordered.Add(5, 3);
  unordered.Add(2, 4);
  EXPECT_EQ(DecodeLineTable(unordered.End(), 1), (std::vector<JavaLine>{{5, 3}, {2, 4}}));
  EXPECT_EQ(DecodeLineTable(std::vector<uint8_t>{0}, 0), std::vector<JavaLine>{});
  EXPECT_EQ(DecodeLineTable({}, 0), std::nullopt);
}

TEST(JavaSourcePathTest, PackagePathAndSourceFile) {
  EXPECT_EQ(JavaSourcePath("java/util/Arrays", "Arrays.java"), "java/util/Arrays.java");
  EXPECT_EQ(JavaSourcePath("java/util/Arrays$1", "Arrays.java"), "java/util/Arrays.java");
  EXPECT_EQ(JavaSourcePath("Spin", "Spin.java"), "Spin.java");
  EXPECT_EQ(JavaSourcePath("kotlin/collections/CollectionsKt", "_Collections.kt"),
            "kotlin/collections/_Collections.kt");
}

TEST(JavaLineTest, LineAtAsHotSpotFindsIt) {
  EXPECT_EQ(JavaLineTable().LineAt(3), 0);  // no table
  // Two rows at bci 8 (a loop's condition written twice), and one out of order: sorted.
  const JavaLineTable table({{0, 20}, {15, 25}, {8, 22}, {8, 21}});
  EXPECT_EQ(table.rows(), (std::vector<JavaLine>{{0, 20}, {8, 22}, {8, 21}, {15, 25}}));
  EXPECT_EQ(table.LineAt(-1), 20);  // the method's entry
  EXPECT_EQ(table.LineAt(0), 20);
  EXPECT_EQ(table.LineAt(7), 20);
  EXPECT_EQ(table.LineAt(8), 22);   // the first row at the bci
  EXPECT_EQ(table.LineAt(9), 21);   // the last row before it
  EXPECT_EQ(table.LineAt(400), 25);
  EXPECT_EQ(table.first_line(), 20);
  EXPECT_EQ(table.LineAt(kUnknownBci), 0);  // somewhere in four lines
  const JavaLineTable one({{3, 5}});
  EXPECT_EQ(one.LineAt(2), 0);  // before the first row
  EXPECT_EQ(one.LineAt(kUnknownBci), 5);  // a one-line method is at its line anywhere
  EXPECT_EQ(JavaLineTable({{0, 5}, {4, 5}}).LineAt(kUnknownBci), 5);
  EXPECT_EQ(JavaLineTable({{0, 6}, {4, 5}}).first_line(), 5);
}

TEST(JavaMethodNameTest, NamesAsThePerfMapDoes) {
  EXPECT_EQ(JavaMethodName("java/util/DualPivotQuicksort", "sort",
                           "(Ljava/util/DualPivotQuicksort$Sorter;[IIII)V"),
            "void java.util.DualPivotQuicksort.sort(java.util.DualPivotQuicksort$Sorter, int[], "
            "int, int, int)");
  EXPECT_EQ(JavaMethodName("java/util/regex/Pattern", "split",
                           "(Ljava/lang/CharSequence;I)[Ljava/lang/String;"),
            "java.lang.String[] java.util.regex.Pattern.split(java.lang.CharSequence, int)");
  EXPECT_EQ(JavaMethodName("Spin", "main", "([Ljava/lang/String;)V"),
            "void Spin.main(java.lang.String[])");
  EXPECT_EQ(JavaMethodName("A", "f", "()J"), "long A.f()");
  EXPECT_EQ(JavaMethodName("A", "g", "([[DZBCSF)[[[Z"),
            "boolean[][][] A.g(double[][], boolean, byte, char, short, float)");
  for (const char* bad : {"", "()", "(I", "(V)V", "(Q)V", "(L;)V", "(Ljava/lang/String)V",
                          "()VV", "I"}) {
    EXPECT_EQ(JavaMethodName("A", "f", bad), std::nullopt) << bad;
  }
  EXPECT_EQ(JavaMethodName("", "f", "()V"), std::nullopt);
}

// A method's structures in a fake JVM: Method -> ConstMethod -> ConstantPool (-> its holder
// Klass -> its name) and two of the pool's slots -> the name's and the descriptor's Symbols.
class HotSpotMethodsTest : public ::testing::Test {
 protected:
  static constexpr HotSpotOffsets kOffsets = {
      .method_const_method = 8,
      .const_method_constants = 8,
      .const_method_name_index = 42,
      .const_method_signature_index = 44,
      .constant_pool_holder = 24,
      .constant_pool_size = 80,
      .klass_name = 16,
      .symbol_length = 4,
      .symbol_body = 6,
  };
  static constexpr uint64_t kMethod = 0x10000, kConstMethod = 0x11000, kPool = 0x12000,
                            kKlass = 0x13000, kSymbols = 0x14000;

  HotSpotMethodsTest() {
    memory_ = new FakeMemory;
    for (uint64_t region : {kMethod, kConstMethod, kPool, kKlass, kSymbols}) {
      memory_->Map(region, 0x1000);
    }
    memory_->Put(kMethod + kOffsets.method_const_method, kConstMethod);
    memory_->Put(kConstMethod + kOffsets.const_method_constants, kPool);
    Put16(kConstMethod + kOffsets.const_method_name_index, 5);
    Put16(kConstMethod + kOffsets.const_method_signature_index, 7);
    memory_->Put(kPool + kOffsets.constant_pool_holder, kKlass);
    memory_->Put(kKlass + kOffsets.klass_name, PutSymbol(0, "com/example/Service"));
    memory_->Put(kPool + kOffsets.constant_pool_size + 5 * 8, PutSymbol(1, "handle"));
    memory_->Put(kPool + kOffsets.constant_pool_size + 7 * 8,
                 PutSymbol(2, "(Ljava/lang/String;)I"));
    methods_ = std::make_unique<HotSpotMethods>(kOffsets,
                                                std::unique_ptr<python::RemoteMemory>(memory_));
  }

  void Put16(uint64_t address, uint16_t value) {
    for (auto& [start, bytes] : memory_->regions) {
      if (address >= start && address + 2 <= start + bytes.size()) {
        std::memcpy(bytes.data() + (address - start), &value, 2);
      }
    }
  }
  // The `n`th symbol's address, holding `text`.
  uint64_t PutSymbol(int n, const std::string& text) {
    const uint64_t symbol = kSymbols + 0x100 * static_cast<uint64_t>(n);
    Put16(symbol + kOffsets.symbol_length, static_cast<uint16_t>(text.size()));
    std::vector<uint8_t>& bytes = memory_->regions[kSymbols];
    std::memcpy(bytes.data() + (symbol - kSymbols) + kOffsets.symbol_body, text.data(),
                text.size());
    return symbol;
  }

  FakeMemory* memory_;  // owned by methods_
  std::unique_ptr<HotSpotMethods> methods_;
};

// The same method where the JVM publishes lines: its ConstMethod's flags, code size and size,
// 10 bytes of code after the ConstMethod and the line table after them; its pool's source file.
TEST_F(HotSpotMethodsTest, ReadsTheSourceFileAndLineTableWithTheName) {
  HotSpotOffsets offsets = kOffsets;
  offsets.lines = true;
  offsets.const_method_flags = 28;
  offsets.const_method_code_size = 32;
  offsets.const_method_words = 24;
  offsets.const_method_size = 48;
  offsets.constant_pool_source_file = 54;
  offsets.excess = 1;
  memory_->Put(kConstMethod + 24, uint32_t{32});  // 256 bytes
  Put16(kConstMethod + 28, 0x0401);                // has a line table (bit 0), and other flags
  Put16(kConstMethod + 32, 10);
  LineTableWriter writer(offsets.excess);
  writer.Add(0, 40);
  writer.Add(6, 42);
  const std::vector<uint8_t> table = writer.End();
  std::memcpy(memory_->regions[kConstMethod].data() + 48 + 10, table.data(), table.size());
  Put16(kPool + 54, 13);
  memory_->Put(kPool + kOffsets.constant_pool_size + 13 * 8, PutSymbol(5, "Service.java"));
  // The memory read with these offsets (the fixture's methods_ still own it), and without.
  auto shared = std::make_unique<SharedMemory>(memory_);
  const SharedMemory* calls = shared.get();
  HotSpotMethods methods(offsets, std::move(shared));
  auto shared_too = std::make_unique<SharedMemory>(memory_);
  const SharedMemory* calls_without = shared_too.get();
  HotSpotMethods without(kOffsets, std::move(shared_too));
  ASSERT_NE(without.Find(kMethod, 1'000), nullptr);
  const HotSpotMethods::Method* m = methods.Find(kMethod, 1'000);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name, "int com.example.Service.handle(java.lang.String)");
  EXPECT_EQ(m->file, "com/example/Service.java");
  EXPECT_EQ(m->lines.rows(), (std::vector<JavaLine>{{0, 40}, {6, 42}}));
  EXPECT_EQ(calls->calls, calls_without->calls);  // as many system calls as a name alone
  EXPECT_EQ(calls->calls, 6u);
  // A frame's bytecode pointer inside the code, and pointers that are not.
  const uint64_t code = kConstMethod + 48;
  EXPECT_EQ(m->BciOf(code + 7), 7);
  EXPECT_EQ(m->lines.LineAt(*m->BciOf(code + 7)), 42);
  EXPECT_EQ(m->BciOf(code + 10), std::nullopt);
  EXPECT_EQ(m->BciOf(code - 1), std::nullopt);

  // No SourceFile attribute, no line table: the name alone.
  Put16(kPool + 54, 0);
  Put16(kConstMethod + 28, 0x0400);
  m = methods.Find(kMethod, 1'000 + 2 * HotSpotMethods::kRecheckNs);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name, "int com.example.Service.handle(java.lang.String)");
  EXPECT_EQ(m->file, "");
  EXPECT_TRUE(m->lines.rows().empty());
}

TEST_F(HotSpotMethodsTest, NamesAMethodOnceAndAgainAfterASecond) {
  const HotSpotMethods::Method* m = methods_->Find(kMethod, 1'000);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name, "int com.example.Service.handle(java.lang.String)");
  m->owner_id = 7;
  const uint64_t reads = memory_->reads;
  EXPECT_EQ(methods_->Find(kMethod, 2'000), m);
  EXPECT_EQ(memory_->reads, reads);  // cached

  // A second later the method is checked: the same ConstMethod, pool and indexes, two reads.
  m = methods_->Find(kMethod, 1'000 + HotSpotMethods::kRecheckNs);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(memory_->reads, reads + 2);
  EXPECT_EQ(m->owner_id, 7u);

  // The class was unloaded and the memory holds another method, with a ConstMethod of its
  // own: named again at its next check, without the old node.
  constexpr uint64_t kOther = kConstMethod + 0x200;
  memory_->Put(kOther + kOffsets.const_method_constants, kPool);
  Put16(kOther + kOffsets.const_method_name_index, 9);
  Put16(kOther + kOffsets.const_method_signature_index, 11);
  memory_->Put(kPool + kOffsets.constant_pool_size + 9 * 8, PutSymbol(3, "close"));
  memory_->Put(kPool + kOffsets.constant_pool_size + 11 * 8, PutSymbol(4, "()V"));
  memory_->Put(kMethod + kOffsets.method_const_method, kOther);
  EXPECT_EQ(methods_->Find(kMethod, 1'500'000'000)->name,
            "int com.example.Service.handle(java.lang.String)");
  m = methods_->Find(kMethod, 1'000 + 2 * HotSpotMethods::kRecheckNs);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->name, "void com.example.Service.close()");
  EXPECT_EQ(m->owner_id, 0u);
}

TEST_F(HotSpotMethodsTest, WhatIsNoMethodIsNotNamed) {
  EXPECT_EQ(methods_->Find(0, 1), nullptr);
  EXPECT_EQ(methods_->Find(kMethod + 4, 1), nullptr);  // misaligned
  EXPECT_EQ(methods_->Find(0x90000, 1), nullptr);      // unmapped
  // A slot holding some other pointer: its "ConstMethod" leads nowhere.
  memory_->Put(kMethod + 0x800 + kOffsets.method_const_method, 0x5000);
  EXPECT_EQ(methods_->Find(kMethod + 0x800, 1), nullptr);
  // A symbol of absurd length, or one holding control bytes.
  Put16(kSymbols + 0x100 + kOffsets.symbol_length, 60000);
  EXPECT_EQ(methods_->Find(kMethod, 1), nullptr);
  PutSymbol(1, std::string("ha\nndle"));
  EXPECT_EQ(methods_->Find(kMethod, 1), nullptr);
  PutSymbol(1, "handle");
  ASSERT_NE(methods_->Find(kMethod, 1), nullptr);
  // A method no longer readable is forgotten, not served from the cache.
  memory_->Put(kMethod + kOffsets.method_const_method, 0);
  EXPECT_EQ(methods_->Find(kMethod, 1 + HotSpotMethods::kRecheckNs), nullptr);
}

// A sample's frames: the leaf and one caller in the interpreter's code, one in compiled code,
// and an interpreter frame whose slot lies beyond the stack copy.
TEST(HotSpotInterpreterTest, MethodsAreReadFromTheirFramesSlots) {
  HotSpotInterpreter interpreter(nullptr);
  constexpr uint64_t kSp = 0x7000'0000;
  std::vector<uint8_t> stack(256);
  auto put = [&](uint64_t address, uint64_t value) {
    std::memcpy(stack.data() + (address - kSp), &value, 8);
  };
  const unwind::Frame frames[] = {
      {0x5000, kSp, kSp + 0x40},         // leaf in the interpreter: its slot at sp + 0x20
      {0x9001, kSp + 0x50, kSp + 0x80},  // compiled code
      {0x5101, kSp + 0x90, kSp + 0xc0},  // the interpreter, returned to
      {0x5201, kSp + 0xd0, kSp + 0x400},  // the interpreter, its slot beyond the copy
  };
  put(kSp + 0x40 - kMethodBelowReturnSlot, 0x1234'5678);
  put(kSp + 0x80 - kMethodBelowReturnSlot, 0xdead);
  put(kSp + 0xc0 - kMethodBelowReturnSlot, 0x2345'6780);
  put(kSp + 0xc0 - kBcpBelowReturnSlot, 0x3456'7800);
  uint64_t methods[4] = {9, 9, 9, 9}, bcps[4] = {9, 9, 9, 9};
  EXPECT_FALSE(interpreter.code_known());
  EXPECT_FALSE(interpreter.MethodsOf(frames, kSp, stack, methods, bcps));  // no code known yet
  EXPECT_EQ(methods[0], 0u);

  interpreter.SetCode(0x5000, 0x6000, "[jit:/tmp/perf-1.map]");
  ASSERT_TRUE(interpreter.MethodsOf(frames, kSp, stack, methods, bcps));
  EXPECT_EQ(methods[0], 0x1234'5678u);
  EXPECT_EQ(bcps[0], 0u);  // its bcp slot lies below the stack pointer
  EXPECT_EQ(methods[1], 0u);
  EXPECT_EQ(methods[2], 0x2345'6780u);
  EXPECT_EQ(bcps[2], 0x3456'7800u);
  EXPECT_EQ(methods[3], 0u);
  EXPECT_EQ(bcps[3], 0u);
  EXPECT_EQ(interpreter.module(), "[jit:/tmp/perf-1.map]");
  // The code ends before its end address.
  EXPECT_TRUE(interpreter.Contains(0x5fff));
  EXPECT_FALSE(interpreter.Contains(0x6000));
}

}  // namespace
}  // namespace strata::agent::jvm
