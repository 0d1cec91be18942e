// Fuzz target: decoding of the perf mmap ring (agent/sampler/perf_record.h): the ring walk
// (records wrapping around the end, corrupt header chains, data_head/data_tail as the kernel
// left them) and the PERF_RECORD_SAMPLE / PERF_RECORD_LOST parsers, for each architecture's
// register layout.
//
// Input: u8 flags (bit 0: register layout, x86-64 or MIPS64; bits 2-5: ring size
// 2^(3 + n) bytes), u64 data_head, u64 data_tail, then the ring's bytes (zero-padded
// or cut to the ring size). Each record the walk yields goes through both parsers.
// Oracles besides the sanitizers: records handed out lie in the ring or the scratch buffer
// and have the size their header says; a parsed sample's stack lies inside its record.
#include <linux/perf_event.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "agent/sampler/perf_record.h"
#include "agent/sampler/perf_regs.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace s = strata::agent::sampler;
  strata::fuzz::InputReader in(data, size);
  const uint8_t flags = in.U8();
  const s::Arch arch = (flags & 1) ? s::Arch::kMips64 : s::Arch::kX86_64;
  const size_t ring_size = size_t{1} << (3 + ((flags >> 2) & 15));
  const s::UserRegsLayout& layout = s::RegsLayoutFor(arch);

  perf_event_mmap_page control;
  std::memset(&control, 0, sizeof control);
  control.data_head = in.U64();
  control.data_tail = in.U64();
  const std::string_view bytes = in.Rest();
  // Exactly the ring's size, so ASan sees any read past its end.
  std::unique_ptr<uint8_t[]> ring(new uint8_t[ring_size]);
  std::memset(ring.get(), 0, ring_size);
  std::memcpy(ring.get(), bytes.data(), std::min(bytes.size(), ring_size));
  std::unique_ptr<uint8_t[]> scratch(new uint8_t[s::kMaxRecordSize]);

  s::RingReader reader(&control, ring.get(), ring_size);
  (void)reader.HasData();
  const uint64_t tail_before = control.data_tail;
  size_t records = 0;
  const s::RingReader::ReadResult result = reader.ReadAll(
      [&](const uint8_t* record, size_t record_size) {
        ++records;
        const bool in_ring = record >= ring.get() && record + record_size <= ring.get() + ring_size;
        const bool in_scratch =
            record == scratch.get() && record_size <= s::kMaxRecordSize;
        STRATA_FUZZ_CHECK(in_ring || in_scratch, "record of %zu bytes outside ring and scratch",
                          record_size);
        perf_event_header header;
        std::memcpy(&header, record, sizeof header);
        STRATA_FUZZ_CHECK(header.size == record_size, "record size %zu, header says %u",
                          record_size, header.size);
        s::RawSample sample;
        if (s::ParseSampleRecord(record, record_size, layout, &sample).ok() &&
            sample.stack != nullptr) {
          STRATA_FUZZ_CHECK(sample.stack >= record &&
                                sample.stack + sample.stack_size <= record + record_size,
                            "sample stack outside its record");
        }
        (void)s::ParseLostRecord(record, record_size);
      },
      scratch.get());
  STRATA_FUZZ_CHECK(result.records == records, "%zu records reported, %zu seen", result.records,
                    records);
  STRATA_FUZZ_CHECK(control.data_tail == control.data_head,
                    "the walk stopped at tail %llu, head %llu (tail was %llu)",
                    static_cast<unsigned long long>(control.data_tail),
                    static_cast<unsigned long long>(control.data_head),
                    static_cast<unsigned long long>(tail_before));

  // The parsers on the raw bytes too (records as the sampler hands them from a scratch copy).
  const auto* raw = reinterpret_cast<const uint8_t*>(bytes.data());
  std::vector<uint8_t> copy(raw, raw + bytes.size());  // exact size for ASan
  s::RawSample sample;
  if (s::ParseSampleRecord(copy.data(), copy.size(), layout, &sample).ok() &&
      sample.stack != nullptr) {
    STRATA_FUZZ_CHECK(sample.stack >= copy.data() &&
                          sample.stack + sample.stack_size <= copy.data() + copy.size(),
                      "sample stack outside its record");
  }
  (void)s::ParseLostRecord(copy.data(), copy.size());
  // With a kernel call chain, as sessions with kernel stacks parse them.
  s::RawSample chained;
  if (s::ParseSampleRecord(copy.data(), copy.size(), layout, &chained, /*callchain=*/true).ok() &&
      chained.kernel_depth > 0) {
    const auto* first = reinterpret_cast<const uint8_t*>(chained.kernel_pcs);
    STRATA_FUZZ_CHECK(first >= copy.data() &&
                          first + chained.kernel_depth * 8 <= copy.data() + copy.size(),
                      "kernel chain outside its record");
  }
  (void)s::ParseSwitchRecord(copy.data(), copy.size(), &chained);
  return 0;
}
