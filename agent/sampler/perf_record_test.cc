#include "agent/sampler/perf_record.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::agent::sampler {
namespace {

// Builds records the way the kernel lays them out.
class RecordBuilder {
 public:
  explicit RecordBuilder(uint32_t type) { bytes_.resize(sizeof(perf_event_header)); type_ = type; }
  RecordBuilder& U32(uint32_t v) { return Append(&v, sizeof(v)); }
  RecordBuilder& U64(uint64_t v) { return Append(&v, sizeof(v)); }
  RecordBuilder& Bytes(const std::vector<uint8_t>& v) { return Append(v.data(), v.size()); }
  std::vector<uint8_t> Build() {
    std::vector<uint8_t> out = bytes_;
    out.resize((out.size() + 7) / 8 * 8);
    perf_event_header header{type_, 0, static_cast<uint16_t>(out.size())};
    std::memcpy(out.data(), &header, sizeof(header));
    return out;
  }

 private:
  RecordBuilder& Append(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    return *this;
  }
  uint32_t type_;
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> StackBytes(size_t n) {
  std::vector<uint8_t> stack(n);
  for (size_t i = 0; i < n; ++i) stack[i] = static_cast<uint8_t>(i * 7 + 1);
  return stack;
}

std::vector<uint8_t> X86Sample(uint64_t stack_size, uint64_t dyn_size) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(100).U32(101).U64(123456789).U64(PERF_SAMPLE_REGS_ABI_64);
  b.U64(0x7ffc0000aa00).U64(0x7ffc0000a000).U64(0x401234);  // bp, sp, ip (bit order)
  b.U64(0x7f0000451234);                                      // r13
  b.U64(0xc000002000);                                        // r14
  b.U64(stack_size);
  if (stack_size != 0) b.Bytes(StackBytes(stack_size)).U64(dyn_size);
  return b.Build();
}

TEST(ParseSampleRecordTest, X86_64RegistersAndDynSizedStack) {
  std::vector<uint8_t> record = X86Sample(64, 40);
  RawSample s;
  s.session_id = 7;
  ASSERT_TRUE(ParseSampleRecord(record.data(), record.size(),
                                RegsLayoutFor(Arch::kX86_64), &s).ok());
  EXPECT_EQ(s.pid, 100u);
  EXPECT_EQ(s.tid, 101u);
  EXPECT_EQ(s.time_ns, 123456789u);
  EXPECT_EQ(s.pc, 0x401234u);
  EXPECT_EQ(s.sp, 0x7ffc0000a000u);
  EXPECT_EQ(s.fp, 0x7ffc0000aa00u);
  EXPECT_EQ(s.ra, 0u);
  EXPECT_EQ(s.g, 0xc000002000u);
  EXPECT_EQ(s.bcp, 0x7f0000451234u);
  EXPECT_EQ(s.session_id, 7u);
  ASSERT_EQ(s.stack_size, 40u);  // dyn_size, not the requested 64
  EXPECT_EQ(std::vector<uint8_t>(s.stack, s.stack + 40), StackBytes(40));
  EXPECT_GE(s.stack, record.data());
  EXPECT_LE(s.stack + s.stack_size, record.data() + record.size());
}

TEST(ParseSampleRecordTest, Mips64RegisterOrder) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(5).U32(6).U64(1).U64(PERF_SAMPLE_REGS_ABI_64);
  b.U64(0x120001000).U64(0xffffff0000).U64(0xffffff0100).U64(0x120000f00);  // pc, sp, fp, ra
  b.U64(16).Bytes(StackBytes(16)).U64(16);
  std::vector<uint8_t> record = b.Build();
  RawSample s;
  ASSERT_TRUE(
      ParseSampleRecord(record.data(), record.size(), RegsLayoutFor(Arch::kMips64), &s).ok());
  EXPECT_EQ(s.pc, 0x120001000u);
  EXPECT_EQ(s.sp, 0xffffff0000u);
  EXPECT_EQ(s.fp, 0xffffff0100u);
  EXPECT_EQ(s.ra, 0x120000f00u);
  EXPECT_EQ(s.g, 0xffffff0100u);  // r30 is Go's g
  EXPECT_EQ(s.stack_size, 16u);
}

TEST(ParseSampleRecordTest, NoUserContextHasNoRegistersOrStack) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(1).U32(2).U64(3).U64(PERF_SAMPLE_REGS_ABI_NONE).U64(0);  // no regs; stack size 0
  std::vector<uint8_t> record = b.Build();
  RawSample s;
  s.pc = 99;
  ASSERT_TRUE(
      ParseSampleRecord(record.data(), record.size(), RegsLayoutFor(Arch::kX86_64), &s).ok());
  EXPECT_EQ(s.pc, 0u);
  EXPECT_EQ(s.sp, 0u);
  EXPECT_EQ(s.stack, nullptr);
  EXPECT_EQ(s.stack_size, 0u);
}

TEST(ParseSampleRecordTest, RejectsEveryTruncationAndInconsistentSizes) {
  std::vector<uint8_t> record = X86Sample(32, 32);
  const UserRegsLayout& layout = RegsLayoutFor(Arch::kX86_64);
  // Every proper prefix is an error, never a read past the end (ASan would catch one).
  for (size_t n = 0; n < record.size(); ++n) {
    std::vector<uint8_t> prefix(record.begin(), record.begin() + n);
    RawSample s;
    EXPECT_FALSE(ParseSampleRecord(prefix.data(), prefix.size(), layout, &s).ok()) << n;
  }
  std::vector<uint8_t> bad = X86Sample(32, 33);
  RawSample s;
  EXPECT_FALSE(ParseSampleRecord(bad.data(), bad.size(), layout, &s).ok());
  // A stack size larger than the record.
  RecordBuilder huge(PERF_RECORD_SAMPLE);
  huge.U32(1).U32(1).U64(1).U64(PERF_SAMPLE_REGS_ABI_64).U64(1).U64(2).U64(3).U64(4).U64(5);
  huge.U64(~0ull);
  bad = huge.Build();
  EXPECT_FALSE(ParseSampleRecord(bad.data(), bad.size(), layout, &s).ok());
  bad = RecordBuilder(PERF_RECORD_LOST).U64(1).U64(2).Build();
  EXPECT_FALSE(ParseSampleRecord(bad.data(), bad.size(), layout, &s).ok());
}

TEST(ParseLostRecordTest, ReadsCount) {
  std::vector<uint8_t> record = RecordBuilder(PERF_RECORD_LOST).U64(1).U64(42).Build();
  EXPECT_EQ(ParseLostRecord(record.data(), record.size()).value(), 42u);
  EXPECT_FALSE(ParseLostRecord(record.data(), 16).ok());
  std::vector<uint8_t> other = X86Sample(0, 0);
  EXPECT_FALSE(ParseLostRecord(other.data(), other.size()).ok());
}

// A synthetic ring: a control page and a small data area the test writes records into.
class FakeRing {
 public:
  explicit FakeRing(size_t data_size) : data_(data_size) {
    std::memset(&control_, 0, sizeof(control_));
  }
  // Starts the ring at an arbitrary position, as after a long run.
  void StartAt(uint64_t position) { control_.data_head = control_.data_tail = position; }
  void Write(const std::vector<uint8_t>& record) {
    for (size_t i = 0; i < record.size(); ++i) {
      data_[(control_.data_head + i) % data_.size()] = record[i];
    }
    control_.data_head += record.size();
  }
  RingReader Reader() { return RingReader(&control_, data_.data(), data_.size()); }
  perf_event_mmap_page& control() { return control_; }

 private:
  perf_event_mmap_page control_;
  std::vector<uint8_t> data_;
};

TEST(RingReaderTest, DeliversWrappedRecordContiguouslyAndAdvancesTail) {
  FakeRing ring(1024);
  std::vector<uint8_t> first = X86Sample(64, 64);    // 160 bytes
  std::vector<uint8_t> second = X86Sample(512, 500);  // wraps the end of the ring
  std::vector<uint8_t> lost = RecordBuilder(PERF_RECORD_LOST).U64(0).U64(3).Build();
  ring.StartAt(1024 * 5 + 1024 - first.size() - 64);
  ring.Write(first);
  ring.Write(second);
  ring.Write(lost);
  RingReader reader = ring.Reader();
  EXPECT_TRUE(reader.HasData());

  std::vector<std::vector<uint8_t>> seen;
  std::vector<uint8_t> scratch(kMaxRecordSize);
  RingReader::ReadResult result = reader.ReadAll(
      [&](const uint8_t* record, size_t size) { seen.emplace_back(record, record + size); },
      scratch.data());
  EXPECT_FALSE(result.corrupt);
  EXPECT_EQ(result.records, 3u);
  EXPECT_EQ(result.bytes, first.size() + second.size() + lost.size());
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], first);
  EXPECT_EQ(seen[1], second);
  EXPECT_EQ(seen[2], lost);
  EXPECT_EQ(ring.control().data_tail, ring.control().data_head);
  EXPECT_FALSE(reader.HasData());

  RawSample s;
  ASSERT_TRUE(
      ParseSampleRecord(seen[1].data(), seen[1].size(), RegsLayoutFor(Arch::kX86_64), &s).ok());
  EXPECT_EQ(s.stack_size, 500u);
  EXPECT_EQ(std::vector<uint8_t>(s.stack, s.stack + 500), StackBytes(500));
}

TEST(RingReaderTest, CorruptHeaderChainIsDiscarded) {
  FakeRing ring(1024);
  ring.Write(X86Sample(16, 16));
  std::vector<uint8_t> garbage(24, 0);  // size 0 header
  ring.Write(garbage);
  std::vector<uint8_t> scratch(kMaxRecordSize);
  size_t records = 0;
  RingReader reader = ring.Reader();
  RingReader::ReadResult result =
      reader.ReadAll([&](const uint8_t*, size_t) { ++records; }, scratch.data());
  EXPECT_EQ(records, 1u);
  EXPECT_TRUE(result.corrupt);
  EXPECT_EQ(ring.control().data_tail, ring.control().data_head);

  // A header claiming more bytes than were published.
  FakeRing short_ring(1024);
  std::vector<uint8_t> record = X86Sample(16, 16);
  record.resize(record.size() - 8);
  short_ring.Write(record);
  reader = short_ring.Reader();
  records = 0;
  result = reader.ReadAll([&](const uint8_t*, size_t) { ++records; }, scratch.data());
  EXPECT_EQ(records, 0u);
  EXPECT_TRUE(result.corrupt);
}

TEST(RegsLayoutTest, HostArchIsSupportedHere) {
  absl::StatusOr<Arch> arch = HostArch();
  ASSERT_TRUE(arch.ok()) << arch.status();
#if defined(__x86_64__)
  EXPECT_EQ(*arch, Arch::kX86_64);
  EXPECT_EQ(RegsLayoutFor(*arch).mask,
            (1ull << 6) | (1ull << 7) | (1ull << 8) | (1ull << 21) | (1ull << 22));
#endif
}

TEST(ParseSampleRecordTest, CallChainPartsAreKeptApart) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(100).U32(101).U64(5);
  // A kernel part, then the user part of the kernel's frame-pointer walk (user_frame_chain).
  b.U64(6).U64(PERF_CONTEXT_KERNEL).U64(0xffffffff81000010).U64(0xffffffff81000020)
      .U64(0xffffffff81000030).U64(PERF_CONTEXT_USER).U64(0x401000);
  b.U64(PERF_SAMPLE_REGS_ABI_64).U64(0x10).U64(0x20).U64(0x401234).U64(0).U64(0);
  b.U64(0);  // no stack
  std::vector<uint8_t> record = b.Build();
  RawSample s;
  ASSERT_TRUE(ParseSampleRecord(record.data(), record.size(), RegsLayoutFor(Arch::kX86_64), &s,
                                /*callchain=*/true)
                  .ok());
  ASSERT_EQ(s.kernel_depth, 3u);
  EXPECT_EQ(s.kernel_pcs[0], 0xffffffff81000010u);
  EXPECT_EQ(s.kernel_pcs[2], 0xffffffff81000030u);
  ASSERT_EQ(s.user_depth, 1u);
  EXPECT_EQ(s.user_pcs[0], 0x401000u);
  EXPECT_EQ(s.pc, 0x401234u);
  EXPECT_EQ(s.kind, RawEventKind::kSample);
}

TEST(ParseSampleRecordTest, UserFrameChainWithoutAKernelPart) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(100).U32(101).U64(5);
  // exclude_callchain_kernel: the user pc and the return addresses found from rbp.
  b.U64(4).U64(PERF_CONTEXT_USER).U64(0x401234).U64(0x401500).U64(0x401600);
  b.U64(PERF_SAMPLE_REGS_ABI_64).U64(0x10).U64(0x20).U64(0x401234).U64(0).U64(0);
  b.U64(0);
  std::vector<uint8_t> record = b.Build();
  RawSample s;
  ASSERT_TRUE(ParseSampleRecord(record.data(), record.size(), RegsLayoutFor(Arch::kX86_64), &s,
                                /*callchain=*/true)
                  .ok());
  EXPECT_EQ(s.kernel_depth, 0u);
  ASSERT_EQ(s.user_depth, 3u);
  EXPECT_EQ(s.user_pcs[0], 0x401234u);
  EXPECT_EQ(s.user_pcs[2], 0x401600u);
}

TEST(ParseSampleRecordTest, UserOnlyCallChainHasNoKernelFrames) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(1).U32(2).U64(3).U64(0);  // empty chain: sampled in user mode
  b.U64(PERF_SAMPLE_REGS_ABI_64).U64(1).U64(2).U64(3).U64(5).U64(4);  // bp sp ip r13 r14
  b.U64(0);                                                            // no stack
  std::vector<uint8_t> record = b.Build();
  RawSample s;
  ASSERT_TRUE(ParseSampleRecord(record.data(), record.size(), RegsLayoutFor(Arch::kX86_64), &s,
                                true)
                  .ok());
  EXPECT_EQ(s.kernel_depth, 0u);
}

TEST(ParseSampleRecordTest, CallChainLongerThanTheRecordIsTruncated) {
  RecordBuilder b(PERF_RECORD_SAMPLE);
  b.U32(1).U32(2).U64(3).U64(1000).U64(PERF_CONTEXT_KERNEL);
  std::vector<uint8_t> record = b.Build();
  RawSample s;
  EXPECT_FALSE(ParseSampleRecord(record.data(), record.size(), RegsLayoutFor(Arch::kX86_64), &s,
                                 true)
                   .ok());
}

TEST(ParseSwitchRecordTest, PerThreadAndCpuWide) {
  std::vector<uint8_t> in = RecordBuilder(PERF_RECORD_SWITCH).U32(10).U32(11).U64(999).Build();
  RawSample s;
  s.session_id = 3;
  absl::StatusOr<bool> out = ParseSwitchRecord(in.data(), in.size(), &s);
  ASSERT_TRUE(out.ok());
  EXPECT_FALSE(*out);
  EXPECT_EQ(s.kind, RawEventKind::kSwitchIn);
  EXPECT_EQ(s.pid, 10u);
  EXPECT_EQ(s.tid, 11u);
  EXPECT_EQ(s.time_ns, 999u);
  EXPECT_EQ(s.session_id, 3u);

  std::vector<uint8_t> wide =
      RecordBuilder(PERF_RECORD_SWITCH_CPU_WIDE).U32(7).U32(8).U32(20).U32(21).U64(5).Build();
  perf_event_header header;
  std::memcpy(&header, wide.data(), sizeof(header));
  header.misc = PERF_RECORD_MISC_SWITCH_OUT;
  std::memcpy(wide.data(), &header, sizeof(header));
  out = ParseSwitchRecord(wide.data(), wide.size(), &s);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(*out);
  EXPECT_EQ(s.pid, 20u);
  EXPECT_EQ(s.tid, 21u);

  // Truncated sample_id, and another record type.
  std::vector<uint8_t> shortened = RecordBuilder(PERF_RECORD_SWITCH).U32(10).Build();
  EXPECT_FALSE(ParseSwitchRecord(shortened.data(), shortened.size(), &s).ok());
  std::vector<uint8_t> lost = RecordBuilder(PERF_RECORD_LOST).U64(1).U64(2).Build();
  EXPECT_FALSE(ParseSwitchRecord(lost.data(), lost.size(), &s).ok());
}

}  // namespace
}  // namespace strata::agent::sampler
