#include "agent/jvm/hotspot_frames.h"

#include <algorithm>
#include <cstring>

namespace strata::agent::jvm {
namespace {

// x86-64 encodings of the instructions HotSpot's entry code is made of.
constexpr uint8_t kStackBang[] = {0x89, 0x84, 0x24};  // mov [rsp + disp32], eax
constexpr uint8_t kJmpRel32 = 0xe9;  // what a method made not entrant starts with
constexpr size_t kStackBangSize = 7;  // and its size: the jump overwrites its first 5 bytes
constexpr uint8_t kPushRbp = 0x55;
constexpr uint8_t kMovRbpRsp[2][3] = {{0x48, 0x8b, 0xec}, {0x48, 0x89, 0xe5}};
constexpr uint8_t kSubRspImm8[] = {0x48, 0x83, 0xec};
constexpr uint8_t kSubRspImm32[] = {0x48, 0x81, 0xec};
constexpr uint8_t kMovRspDisp8Rbp[] = {0x48, 0x89, 0x6c, 0x24};   // mov [rsp + disp8], rbp
constexpr uint8_t kMovRspDisp32Rbp[] = {0x48, 0x89, 0xac, 0x24};  // mov [rsp + disp32], rbp

// Frames larger than this are taken for a misreading.
constexpr uint32_t kMaxFrameBytes = 1 << 20;

bool At(std::span<const uint8_t> code, size_t i, std::span<const uint8_t> pattern) {
  return i + pattern.size() <= code.size() &&
         std::equal(pattern.begin(), pattern.end(), code.begin() + i);
}

int32_t Imm32(std::span<const uint8_t> code, size_t i) {
  int32_t v;
  std::memcpy(&v, code.data() + i, sizeof(v));
  return v;
}

std::optional<symbols::JitFrameLayout> Checked(uint32_t entry, uint32_t body, int64_t frame) {
  if (frame < 16 || frame > kMaxFrameBytes || frame % 8 != 0) return std::nullopt;
  return symbols::JitFrameLayout{entry, body, static_cast<uint32_t>(frame)};
}

// The stack bang, or the jump written over it, ends at `i`.
bool AfterStackBang(std::span<const uint8_t> code, size_t i) {
  if (i < kStackBangSize) return false;
  const size_t at = i - kStackBangSize;
  return (At(code, at, kStackBang) && Imm32(code, at + 3) < 0) || code[at] == kJmpRel32;
}

// mov [rsp + disp], rbp at `i`: its displacement and size.
bool SavesRbp(std::span<const uint8_t> code, size_t i, int64_t* disp, size_t* size) {
  if (At(code, i, kMovRspDisp8Rbp) && i + 5 <= code.size()) {
    *disp = static_cast<int8_t>(code[i + 4]);
    *size = 5;
    return true;
  }
  if (At(code, i, kMovRspDisp32Rbp) && i + 8 <= code.size()) {
    *disp = Imm32(code, i + 4);
    *size = 8;
    return true;
  }
  return false;
}

}  // namespace

std::optional<symbols::JitFrameLayout> DecodeHotSpotEntry(std::span<const uint8_t> code) {
  for (size_t i = 0; i < code.size(); ++i) {
    // [stack bang] push rbp; [sub rsp, N]: the return address and rbp above N bytes.
    if (code[i] == kPushRbp && AfterStackBang(code, i)) {
      size_t j = i + 1;
      // A frame pointer kept after all (native wrappers, -XX:+PreserveFramePointer): the
      // frame-pointer walk is exact there, whatever the code does to rsp later.
      if (At(code, j, kMovRbpRsp[0]) || At(code, j, kMovRbpRsp[1])) return std::nullopt;
      int64_t n = 0;
      if (At(code, j, kSubRspImm8) && j + 4 <= code.size()) {
        n = static_cast<int8_t>(code[j + 3]);
        j += 4;
      } else if (At(code, j, kSubRspImm32) && j + 7 <= code.size()) {
        n = Imm32(code, j + 3);
        j += 7;
      }
      return Checked(static_cast<uint32_t>(i + 1), static_cast<uint32_t>(j), n + 16);
    }
    // sub rsp, N; mov [rsp + N - 8], rbp: the frame made in one step (nothing is pushed; a
    // sample between the two instructions reads a stale rbp). A jump written over the sub
    // leaves the mov, whose displacement still gives N.
    int64_t disp = 0;
    size_t mov_size = 0;
    if (At(code, i, kSubRspImm32) && i + 7 <= code.size() &&
        SavesRbp(code, i + 7, &disp, &mov_size) &&
        disp == static_cast<int64_t>(Imm32(code, i + 3)) - 8) {
      return Checked(static_cast<uint32_t>(i + 7), static_cast<uint32_t>(i + 7), disp + 16);
    }
    // The same with the short sub of a small frame (JDK 27's C2: sub rsp, 0x18).
    if (At(code, i, kSubRspImm8) && i + 4 <= code.size() &&
        SavesRbp(code, i + 4, &disp, &mov_size) &&
        disp == static_cast<int64_t>(static_cast<int8_t>(code[i + 3])) - 8) {
      return Checked(static_cast<uint32_t>(i + 4), static_cast<uint32_t>(i + 4), disp + 16);
    }
    if (code[i] == kJmpRel32 && SavesRbp(code, i + kStackBangSize, &disp, &mov_size)) {
      return Checked(static_cast<uint32_t>(i + 7), static_cast<uint32_t>(i + 7), disp + 16);
    }
  }
  return std::nullopt;
}

bool IsCompiledMethodName(std::string_view name) {
  const size_t open = name.find('(');
  if (open == std::string_view::npos || open == 0 || !name.ends_with(")")) return false;
  const std::string_view head = name.substr(0, open);  // "RET CLASS.METHOD"
  const size_t space = head.rfind(' ');
  return space != std::string_view::npos && space + 1 < head.size() &&
         head.substr(space + 1).find('.') != std::string_view::npos;
}

std::optional<symbols::JitFrameLayout> HotSpotFrames::Layout(uint64_t start, uint64_t size,
                                                             std::string_view name) const {
  if (!IsCompiledMethodName(name)) return std::nullopt;
  uint8_t code[kEntryScanBytes];
  const size_t n = static_cast<size_t>(std::min<uint64_t>(size, sizeof(code)));
  if (n == 0 || !memory_->Read(start, code, n)) return std::nullopt;
  return DecodeHotSpotEntry(std::span<const uint8_t>(code, n));
}

}  // namespace strata::agent::jvm
