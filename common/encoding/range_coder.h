// Adaptive binary range coder of packed_contexts version 3 (the LZMA coder's arithmetic:
// 32-bit range, 11-bit probabilities, carries propagated through a cached byte) and the
// binarization of unsigned integers on top of it.
//
// The encoder appends to a caller's string; the decoder reads a byte range it does not own
// and supplies zero bytes past its end (the encoder drops the zero bytes its flush would end
// with). Neither allocates. Malformed input cannot make the decoder loop or read out of
// bounds: every call decodes a bounded number of bits, and the caller checks the values and
// how many bytes were read.
#ifndef STRATA_COMMON_ENCODING_RANGE_CODER_H_
#define STRATA_COMMON_ENCODING_RANGE_CODER_H_

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::encoding::range_coding {

inline constexpr int kProbBits = 11;
inline constexpr uint32_t kProbOne = uint32_t{1} << kProbBits;
// Adaptation rate: a probability moves 1/2^kAdaptShift of the way to the bit seen.
inline constexpr int kAdaptShift = 4;
inline constexpr uint32_t kTopValue = uint32_t{1} << 24;

// Probability (in 1/kProbOne) that the next bit is 0.
struct Prob {
  uint16_t p = kProbOne / 2;
  void Update(int bit) {
    if (bit == 0) {
      p = static_cast<uint16_t>(p + ((kProbOne - p) >> kAdaptShift));
    } else {
      p = static_cast<uint16_t>(p - (p >> kAdaptShift));
    }
  }
};

// The value in [low, low + range) with the most trailing zero bits (whole bytes); its low
// 32 bits are the last four bytes of a stream (the same modulo 2^32 for low modulo 2^32).
inline uint64_t FinalValue(uint64_t low, uint32_t range) {
  for (int k = 32; k > 0; k -= 8) {
    const uint64_t mask = (uint64_t{1} << k) - 1;
    const uint64_t v = (low + mask) & ~mask;
    if (v - low < range) return v;
  }
  return low;
}

class Encoder {
 public:
  explicit Encoder(std::string* out) : out_(out) {}

  // From now on adds the ideal cost in bits of each coded decision to *bits (null: stop).
  void Meter(double* bits) { meter_ = bits; }

  void EncodeBit(Prob& prob, int bit) {
    if (meter_ != nullptr) {
      *meter_ -= std::log2((bit == 0 ? prob.p : kProbOne - prob.p) / double{kProbOne});
    }
    const uint32_t bound = (range_ >> kProbBits) * prob.p;
    if (bit == 0) {
      range_ = bound;
    } else {
      low_ += bound;
      range_ -= bound;
    }
    prob.Update(bit);
    Normalize();
  }

  // The low `bits` (<= 64) bits of `value` at probability 1/2 each, most significant first.
  void EncodeDirect(uint64_t value, int bits) {
    if (meter_ != nullptr) *meter_ += bits;
    while (bits-- > 0) {
      range_ >>= 1;
      if ((value >> bits) & 1) low_ += range_;
      Normalize();
    }
  }

  // Writes the last bytes: the value with the most trailing zero bits inside the final
  // interval (FinalValue), without the zero bytes it ends with.
  void Finish() {
    low_ = FinalValue(low_, range_);
    for (int i = 0; i < 5; ++i) ShiftLow();
    while (out_->size() > start_ && out_->back() == 0) out_->pop_back();
  }

 private:
  void Normalize() {
    while (range_ < kTopValue) {
      range_ <<= 8;
      ShiftLow();
    }
  }

  // Moves the top byte of low_ out; 0xFF bytes wait until a carry into them is ruled out.
  void ShiftLow() {
    if (static_cast<uint32_t>(low_) < 0xFF000000u || (low_ >> 32) != 0) {
      const auto carry = static_cast<uint8_t>(low_ >> 32);
      uint8_t byte = cache_;
      do {
        // The first byte of the stream is always 0 (the start of the interval); skip it.
        if (!first_) out_->push_back(static_cast<char>(static_cast<uint8_t>(byte + carry)));
        first_ = false;
        byte = 0xFF;
      } while (--pending_ != 0);
      cache_ = static_cast<uint8_t>(low_ >> 24);
    }
    ++pending_;
    low_ = (low_ & 0x00FFFFFFu) << 8;
  }

  std::string* out_;
  size_t start_ = out_->size();
  uint64_t low_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  uint8_t cache_ = 0;
  uint64_t pending_ = 1;
  bool first_ = true;
  double* meter_ = nullptr;
};

class Decoder {
 public:
  // Starts decoding `bytes`. false when they cannot start a stream.
  bool Start(std::string_view bytes) {
    bytes_ = bytes;
    pos_ = 0;
    range_ = 0xFFFFFFFFu;
    code_ = 0;
    window_ = 0;
    for (int i = 0; i < 4; ++i) code_ = (code_ << 8) | NextByte();
    return code_ < range_;
  }

  int DecodeBit(Prob& prob) {
    const uint32_t bound = (range_ >> kProbBits) * prob.p;
    int bit;
    if (code_ < bound) {
      range_ = bound;
      bit = 0;
    } else {
      code_ -= bound;
      range_ -= bound;
      bit = 1;
    }
    prob.Update(bit);
    Normalize();
    return bit;
  }

  uint64_t DecodeDirect(int bits) {
    uint64_t v = 0;
    while (bits-- > 0) {
      range_ >>= 1;
      const uint32_t bit = code_ >= range_ ? 1 : 0;
      code_ -= range_ & (0u - bit);
      v = (v << 1) | bit;
      Normalize();
    }
    return v;
  }

  // The stream ends as the encoder ends one: every byte was read (bytes past the end count
  // as zeros), the last one is not a zero the encoder would have dropped, and the last four
  // bytes read are the final value the encoder picks for the interval left (so no other
  // bytes decode to the same symbols).
  bool EndsExactly() const {
    if (pos_ < bytes_.size() || (!bytes_.empty() && bytes_.back() == 0)) return false;
    const uint32_t low = window_ - code_;  // modulo 2^32
    return static_cast<uint32_t>(FinalValue(low, range_)) == window_;
  }

 private:
  uint32_t NextByte() {
    const uint32_t byte = pos_ < bytes_.size() ? static_cast<uint8_t>(bytes_[pos_]) : 0u;
    ++pos_;
    window_ = (window_ << 8) | byte;
    return byte;
  }
  void Normalize() {
    while (range_ < kTopValue) {
      range_ <<= 8;
      code_ = (code_ << 8) | NextByte();
    }
  }

  std::string_view bytes_;
  size_t pos_ = 0;
  uint32_t range_ = 0xFFFFFFFFu;
  uint32_t code_ = 0;
  uint32_t window_ = 0;  // the last four bytes read
};

// Unsigned 64-bit integers: the bit width c of the value (0..64) in unary with one adaptive
// probability per step, then the value's bits below its top one: the first kModeledBits
// adaptive (per width and the bits above them), the rest at probability 1/2.
class UintModel {
 public:
  static constexpr int kModeledBits = 2;

  void Encode(Encoder& rc, uint64_t v) {
    const int c = std::bit_width(v);
    for (int i = 0; i < c; ++i) rc.EncodeBit(width_[i], 1);
    if (c < 64) rc.EncodeBit(width_[c], 0);
    if (c <= 1) return;
    const int low_bits = c - 1;
    const int modeled = low_bits < kModeledBits ? low_bits : kModeledBits;
    size_t node = 1;
    for (int i = 1; i <= modeled; ++i) {
      const int bit = static_cast<int>((v >> (low_bits - i)) & 1);
      rc.EncodeBit(mantissa_[c][node], bit);
      node = node * 2 + static_cast<size_t>(bit);
    }
    rc.EncodeDirect(v, low_bits - modeled);
  }

  uint64_t Decode(Decoder& rc) {
    int c = 0;
    while (c < 64 && rc.DecodeBit(width_[c]) == 1) ++c;
    if (c <= 1) return static_cast<uint64_t>(c);
    const int low_bits = c - 1;
    const int modeled = low_bits < kModeledBits ? low_bits : kModeledBits;
    size_t node = 1;
    for (int i = 1; i <= modeled; ++i) node = node * 2 + static_cast<size_t>(rc.DecodeBit(mantissa_[c][node]));
    const uint64_t top = node - (size_t{1} << modeled);  // the modeled bits
    const int rest = low_bits - modeled;
    return (uint64_t{1} << low_bits) | (top << rest) | rc.DecodeDirect(rest);
  }

 private:
  std::array<Prob, 64> width_{};
  std::array<std::array<Prob, size_t{1} << kModeledBits>, 65> mantissa_{};
};

}  // namespace strata::encoding::range_coding

#endif  // STRATA_COMMON_ENCODING_RANGE_CODER_H_
