// Adaptive binary range coder of packed_contexts version 3 (the LZMA coder's arithmetic:
// 32-bit range, 11-bit probabilities, carries propagated through a cached byte) and the
// binarization of unsigned integers on top of it.
//
// The encoder appends to a caller's string; the decoder reads a byte range it does not own
// and supplies zero bytes past its end (the encoder drops the zero bytes its flush would end
// with). Nothing here allocates but the output string. Malformed input cannot make the decoder loop or read out of
// bounds: every call decodes a bounded number of bits, and the caller checks the values and
// how many bytes were read.
#ifndef STRATA_COMMON_ENCODING_RANGE_CODER_H_
#define STRATA_COMMON_ENCODING_RANGE_CODER_H_

#include <algorithm>
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
// Direct bits coded at once (the range, at least 2^24, keeps 2^8 or more per part).
inline constexpr int kDirectChunk = 16;

// Signed values as unsigned ones for the integer models: 0, -1, 1, -2, ... as 0, 1, 2, 3, ...
inline uint64_t ZigZag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}
inline int64_t UnZigZag(uint64_t v) {
  return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1);
}

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

  // The low `bits` (<= 64) bits of `value` at probability 1/2 each, most significant
  // first, in chunks of up to kDirectChunk bits: a chunk of k bits splits the range into
  // 2^k equal parts of range >> k (the remainder unused).
  void EncodeDirect(uint64_t value, int bits) {
    if (meter_ != nullptr) *meter_ += bits;
    while (bits > 0) {
      const int k = bits < kDirectChunk ? bits : kDirectChunk;
      bits -= k;
      const auto chunk = static_cast<uint32_t>((value >> bits) & ((uint64_t{1} << k) - 1));
      range_ >>= k;
      low_ += uint64_t{range_} * chunk;
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
    failed_ = false;
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

  // A malformed stream may hold a chunk beyond its bits; it reads as the largest value.
  uint64_t DecodeDirect(int bits) {
    uint64_t v = 0;
    while (bits > 0) {
      const int k = bits < kDirectChunk ? bits : kDirectChunk;
      bits -= k;
      range_ >>= k;
      const uint32_t most = (uint32_t{1} << k) - 1;
      const uint32_t chunk = std::min(code_ / range_, most);
      code_ -= range_ * chunk;
      v = (v << k) | chunk;
      Normalize();
    }
    return v;
  }

  // Marks the stream malformed (a code no encoder writes); EndsExactly then fails.
  void Fail() { failed_ = true; }

  // The stream ends as the encoder ends one: every byte was read (bytes past the end count
  // as zeros), the last one is not a zero the encoder would have dropped, and the last four
  // bytes read are the final value the encoder picks for the interval left (so no other
  // bytes decode to the same symbols).
  bool EndsExactly() const {
    if (failed_ || pos_ < bytes_.size() || (!bytes_.empty() && bytes_.back() == 0)) return false;
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
  bool failed_ = false;
};

// Unsigned 64-bit integers: the bit width c of the value (0..64), then the value's bits
// below its top one: the first kModeledBits adaptive (per width and the bits above them),
// the rest at probability 1/2. The width: the decisions c > 0, c > 1, ... (at most
// kUnary of them, or until one is 0); when all kUnary say more, c - kUnary as a 6-bit
// tree of decisions (node 1, then 2 * node + bit, most significant bit first). kUnary = 64
// suits fields whose values are mostly small (a decision or two); a smaller kUnary bounds
// the decisions of large values such as ids.
template <int kUnary>
class UintModel {
 public:
  static constexpr int kModeledBits = 2;
  static constexpr int kTreeBits = 6;
  static_assert(kUnary == 64 || (kUnary >= 1 && kUnary + (1 << kTreeBits) > 64));

  void Encode(Encoder& rc, uint64_t v) {
    const int c = std::bit_width(v);
    EncodeWidth(rc, c);
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

  // A width beyond 64 (only in a malformed stream) marks the decoder failed and reads 0.
  uint64_t Decode(Decoder& rc) {
    const int c = DecodeWidth(rc);
    if (c <= 1) return static_cast<uint64_t>(c);
    const int low_bits = c - 1;
    const int modeled = low_bits < kModeledBits ? low_bits : kModeledBits;
    size_t node = 1;
    for (int i = 1; i <= modeled; ++i) {
      node = node * 2 + static_cast<size_t>(rc.DecodeBit(mantissa_[c][node]));
    }
    const uint64_t top = node - (size_t{1} << modeled);  // the modeled bits
    const int rest = low_bits - modeled;
    return (uint64_t{1} << low_bits) | (top << rest) | rc.DecodeDirect(rest);
  }

 private:
  void EncodeWidth(Encoder& rc, int c) {
    for (int i = 0; i < kUnary && i < 64; ++i) {
      rc.EncodeBit(unary_[i], c > i ? 1 : 0);
      if (c <= i) return;
    }
    if (kUnary == 64) return;
    size_t node = 1;
    for (int i = kTreeBits - 1; i >= 0; --i) {
      const int bit = ((c - kUnary) >> i) & 1;
      rc.EncodeBit(tree_[node], bit);
      node = node * 2 + static_cast<size_t>(bit);
    }
  }

  int DecodeWidth(Decoder& rc) {
    for (int i = 0; i < kUnary && i < 64; ++i) {
      if (rc.DecodeBit(unary_[i]) == 0) return i;
    }
    if (kUnary == 64) return 64;
    size_t node = 1;
    for (int i = 0; i < kTreeBits; ++i) {
      node = node * 2 + static_cast<size_t>(rc.DecodeBit(tree_[node]));
    }
    const int c = kUnary + static_cast<int>(node - (size_t{1} << kTreeBits));
    if (c > 64) {
      rc.Fail();
      return 0;
    }
    return c;
  }

  std::array<Prob, kUnary < 64 ? kUnary : 64> unary_{};
  std::array<Prob, kUnary < 64 ? (size_t{1} << kTreeBits) : 1> tree_{};
  std::array<std::array<Prob, size_t{1} << kModeledBits>, 65> mantissa_{};
};

// Fields of mostly small values (lengths, deltas, counts) and fields of ids.
using SmallUintModel = UintModel<64>;
using IdModel = UintModel<4>;

}  // namespace strata::encoding::range_coding

#endif  // STRATA_COMMON_ENCODING_RANGE_CODER_H_
