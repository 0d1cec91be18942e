// HotSpot's writers of compressed integers and line tables, for tests of their readers.
#ifndef STRATA_AGENT_JVM_COMPRESSED_FOR_TEST_H_
#define STRATA_AGENT_JVM_COMPRESSED_FOR_TEST_H_

#include <cstdint>
#include <vector>

namespace strata::agent::jvm::testing {

// HotSpot's writer (utilities/unsigned5.hpp): a value below L in one byte, else a byte of L
// and above carrying 6 bits and the rest after it; every byte offset by the excess.
inline void WriteCompressed(uint32_t value, uint32_t excess, std::vector<uint8_t>* out) {
  const uint32_t low = 192 - excess;  // L
  uint32_t sum = value;
  for (int i = 0;; ++i) {
    if (sum < low || i == 4) {
      out->push_back(static_cast<uint8_t>(sum + excess));
      return;
    }
    sum -= low;
    out->push_back(static_cast<uint8_t>(low + (sum % 64) + excess));
    sum >>= 6;
  }
}

// HotSpot's CompressedLineNumberWriteStream: each row as deltas from the last, in one byte
// where the bci's fits 5 bits and the line's 3 (unsigned), else 0xFF and both as zigzag
// integers; a row that adds nothing is skipped. `End` writes the terminator.
class LineTableWriter {
 public:
  explicit LineTableWriter(uint32_t excess) : excess_(excess) {}
  void Add(int32_t bci, int32_t line) {
    const int32_t bci_delta = bci - bci_, line_delta = line - line_;
    bci_ = bci;
    line_ = line;
    if (bci_delta == 0 && line_delta == 0) return;
    if ((bci_delta & ~0x1F) == 0 && (line_delta & ~0x7) == 0) {
      const auto value = static_cast<uint8_t>((bci_delta << 3) | line_delta);
      if (value != 0xFF) {
        bytes_.push_back(value);
        return;
      }
    }
    bytes_.push_back(0xFF);
    WriteCompressed(Zigzag(bci_delta), excess_, &bytes_);
    WriteCompressed(Zigzag(line_delta), excess_, &bytes_);
  }
  std::vector<uint8_t> End() {
    bytes_.push_back(0);
    return bytes_;
  }

 private:
  static uint32_t Zigzag(int32_t v) {
    return (static_cast<uint32_t>(v) << 1) ^ static_cast<uint32_t>(v >> 31);
  }
  uint32_t excess_;
  int32_t bci_ = 0, line_ = 0;
  std::vector<uint8_t> bytes_;
};

}  // namespace strata::agent::jvm::testing

#endif  // STRATA_AGENT_JVM_COMPRESSED_FOR_TEST_H_
