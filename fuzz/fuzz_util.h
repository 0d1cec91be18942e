// Helpers shared by the fuzz targets (harness side only: framing of structured inputs,
// oracles, scratch directories). The decoders under test are always the project's own.
#ifndef STRATA_FUZZ_FUZZ_UTIL_H_
#define STRATA_FUZZ_FUZZ_UTIL_H_

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>

namespace strata::fuzz {

// A property the code under test documents was violated: report and abort, so libFuzzer
// keeps the input as a crash.
#define STRATA_FUZZ_CHECK(cond, ...)                                            \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "fuzz check failed at %s:%d: %s\n", __FILE__,        \
                   __LINE__, #cond);                                            \
      std::fprintf(stderr, "  " __VA_ARGS__);                                   \
      std::fprintf(stderr, "\n");                                               \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

// Reads little-endian fields from the front of the input; past the end every read yields
// zeros (and empty views), so a harness reads its whole layout and never fails.
class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data), size) {}
  explicit InputReader(std::string_view data) : data_(data) {}

  size_t remaining() const { return data_.size() - pos_; }
  bool empty() const { return remaining() == 0; }

  uint64_t Uint(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) {
      if (pos_ < data_.size()) v |= uint64_t{static_cast<uint8_t>(data_[pos_++])} << (8 * i);
    }
    return v;
  }
  uint8_t U8() { return static_cast<uint8_t>(Uint(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Uint(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Uint(4)); }
  uint64_t U64() { return Uint(8); }
  // Up to n bytes.
  std::string_view Bytes(size_t n) {
    n = std::min(n, remaining());
    std::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  // A u32 length, then that many bytes (clamped to what is left).
  std::string_view Chunk() { return Bytes(U32()); }
  std::string_view Rest() { return Bytes(remaining()); }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

// Writers of the same framing (seed generator).
inline void PutUint(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
inline void PutChunk(std::string* out, std::string_view bytes) {
  PutUint(out, bytes.size(), 4);
  out->append(bytes);
}

// A per-process scratch directory, on tmpfs when there is one (the spool fsyncs and RocksDB
// writes files for every input), removed at exit.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    std::filesystem::path base = "/dev/shm";
    if (access(base.c_str(), W_OK) != 0) base = std::filesystem::temp_directory_path();
    auto* path = new std::string(
        (base / ("strata_fuzz_" + std::to_string(getpid()))).string());
    std::filesystem::remove_all(*path);
    std::filesystem::create_directories(*path);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(ScratchDir(), ec);
    });
    return path;
  }();
  return *dir;
}

}  // namespace strata::fuzz

#endif  // STRATA_FUZZ_FUZZ_UTIL_H_
