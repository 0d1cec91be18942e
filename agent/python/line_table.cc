#include "agent/python/line_table.h"

namespace strata::agent::python {
namespace {

// 3.8, 3.9 (Objects/codeobject.c, PyCode_Addr2Line): (unsigned offset delta, signed line delta)
// pairs; the line changes once the offset passed an entry's start.
int LnotabLine(std::string_view table, int first_line, int64_t offset) {
  int line = first_line;
  int64_t addr = 0;
  for (size_t i = 0; i + 1 < table.size(); i += 2) {
    addr += static_cast<uint8_t>(table[i]);
    if (addr > offset) break;
    line += static_cast<int8_t>(table[i + 1]);
  }
  return line;
}

// 3.10 (Objects/codeobject.c, PyLineTable_NextAddressRange): each pair ends a range of
// `delta` bytes at line += ldelta; ldelta == -128 marks a range without a line.
int Linetable310Line(std::string_view table, int first_line, int64_t offset) {
  int computed = first_line;
  int64_t end = 0;
  for (size_t i = 0; i + 1 < table.size(); i += 2) {
    const int64_t start = end;
    end += static_cast<uint8_t>(table[i]);
    const int8_t ldelta = static_cast<int8_t>(table[i + 1]);
    int line = -1;
    if (ldelta != -128) {
      computed += ldelta;
      line = computed;
    }
    if (start <= offset && offset < end) return line;
  }
  return -1;
}

// 3.11+ (Objects/locations.md): entries of one header byte (bit 7 set; code in bits 3-6;
// length - 1 in code units in bits 0-2) and varint operands (6 bits per byte, bit 6: more).
class LocationReader {
 public:
  explicit LocationReader(std::string_view table) : table_(table) {}
  bool done() const { return pos_ >= table_.size(); }
  uint8_t Byte() { return pos_ < table_.size() ? static_cast<uint8_t>(table_[pos_++]) : 0; }
  uint32_t Varint() {
    uint32_t read = Byte();
    uint32_t value = read & 63;
    uint32_t shift = 0;
    while ((read & 64) && shift < 30 && !done()) {
      read = Byte();
      shift += 6;
      value |= (read & 63) << shift;
    }
    return value;
  }
  int SignedVarint() {
    const uint32_t v = Varint();
    return (v & 1) ? -static_cast<int>(v >> 1) : static_cast<int>(v >> 1);
  }
  // Skips the rest of the entry: operand bytes have bit 7 clear.
  void SkipToEntry() {
    while (!done() && !(static_cast<uint8_t>(table_[pos_]) & 0x80)) ++pos_;
  }

 private:
  std::string_view table_;
  size_t pos_ = 0;
};

int LocationsLine(std::string_view table, int first_line, int64_t offset) {
  constexpr int kNone = 15, kLong = 14, kNoColumns = 13, kOneLine0 = 10, kOneLine2 = 12;
  LocationReader in(table);
  int computed = first_line;
  int64_t end = 0;
  while (!in.done()) {
    const uint8_t header = in.Byte();
    if (!(header & 0x80)) return -1;  // not at an entry: malformed
    const int code = (header >> 3) & 15;
    const int64_t start = end;
    end += ((header & 7) + 1) * 2;  // code units of 2 bytes
    int delta = 0;
    if (code == kLong || code == kNoColumns) {
      delta = in.SignedVarint();
    } else if (code >= kOneLine0 && code <= kOneLine2) {
      delta = code - kOneLine0;
    }
    computed += delta;
    in.SkipToEntry();
    if (start <= offset && offset < end) return code == kNone ? -1 : computed;
  }
  return -1;
}

}  // namespace

int LineForOffset(LineTableFormat format, std::string_view table, int first_line,
                  int64_t byte_offset) {
  if (byte_offset < 0) return first_line;
  switch (format) {
    case LineTableFormat::kLnotab:
      return LnotabLine(table, first_line, byte_offset);
    case LineTableFormat::kLinetable310:
      return Linetable310Line(table, first_line, byte_offset);
    case LineTableFormat::kLocations311:
      return LocationsLine(table, first_line, byte_offset);
  }
  return -1;
}

}  // namespace strata::agent::python
