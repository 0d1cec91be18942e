#include "common/elf/debug_file.h"

#include <lzma.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::elf {
namespace {

constexpr uint32_t kShtSymtab = 2;
// Decoder memory (mostly the LZMA2 dictionary): enough for `xz -9` (64 MiB dictionary).
constexpr uint64_t kMaxXzDecoderMemory = uint64_t{80} << 20;

bool HasSymtab(const ElfFile& elf) {
  return std::any_of(elf.sections().begin(), elf.sections().end(),
                     [](const Section& s) { return s.type == kShtSymtab && s.size > 0; });
}

std::string_view DirName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? std::string_view() : path.substr(0, slash);
}

// Why a candidate is not the module's debug file, or "" when it is.
std::string Mismatch(const ElfFile& module, const std::optional<DebugLink>& link,
                     const ElfFile& candidate) {
  if (candidate.machine() != module.machine() || candidate.big_endian() != module.big_endian()) {
    return "another machine";
  }
  if (!module.build_id().empty()) {
    if (candidate.build_id() != module.build_id()) {
      return absl::StrCat("build ID ", candidate.BuildIdHex().empty() ? "none" : candidate.BuildIdHex(),
                          ", want ", module.BuildIdHex());
    }
  } else {
    // Without a build ID only the link's CRC ties the file to the module (this reads the
    // whole file, which is why the build ID is checked first when there is one).
    uint32_t crc = Crc32(candidate.image());
    if (!link.has_value() || crc != link->crc) {
      return absl::StrCat("CRC32 ", absl::Hex(crc, absl::kZeroPad8), ", want ",
                          link.has_value() ? absl::StrCat(absl::Hex(link->crc, absl::kZeroPad8))
                                           : "a debug link");
    }
  }
  if (!HasSymtab(candidate)) return "no symbol table";
  return {};
}

}  // namespace

std::string BuildIdDebugPath(std::string_view debug_dir, std::string_view build_id_hex) {
  if (build_id_hex.size() < 3) return {};
  for (char c : build_id_hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return {};
  }
  while (debug_dir.size() > 1 && debug_dir.back() == '/') debug_dir.remove_suffix(1);
  std::string out(debug_dir);
  out.append("/.build-id/").append(build_id_hex.substr(0, 2)).append("/");
  out.append(build_id_hex.substr(2)).append(".debug");
  return out;
}

std::optional<DebugLink> ReadDebugLink(const ElfFile& elf) {
  const Section* section = elf.FindSection(".gnu_debuglink");
  if (section == nullptr) return std::nullopt;
  absl::StatusOr<std::string_view> data = elf.SectionData(*section);
  if (!data.ok()) return std::nullopt;
  ByteReader r = elf.Reader(*data);
  std::string_view name = r.CString();
  r.Seek((r.pos() + 3) & ~size_t{3});  // the CRC is 4-byte aligned
  uint32_t crc = r.U32();
  if (!r.ok() || name.empty() || name == "." || name == ".." ||
      name.find('/') != std::string_view::npos) {
    return std::nullopt;
  }
  return DebugLink{std::string(name), crc};
}

uint32_t Crc32(std::string_view bytes, uint32_t crc) {
  // liblzma's CRC-32 is zlib's (IEEE 802.3, reflected, inverted), as binutils and GDB use.
  return lzma_crc32(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), crc);
}

absl::StatusOr<std::string> DecompressXz(std::string_view xz, size_t max_bytes) {
  lzma_stream strm = LZMA_STREAM_INIT;
  lzma_ret ret = lzma_stream_decoder(&strm, kMaxXzDecoderMemory, LZMA_CONCATENATED);
  if (ret != LZMA_OK) return absl::ResourceExhaustedError("cannot start an xz decoder");
  struct End {
    lzma_stream* s;
    ~End() { lzma_end(s); }
  } end{&strm};
  strm.next_in = reinterpret_cast<const uint8_t*>(xz.data());
  strm.avail_in = xz.size();
  // One byte past the bound tells "exactly max_bytes" from "more".
  const size_t limit = max_bytes == SIZE_MAX ? max_bytes : max_bytes + 1;
  std::string out;
  size_t produced = 0;
  for (;;) {
    if (produced == out.size()) {
      if (out.size() >= limit) break;
      out.resize(std::min(limit, std::max<size_t>(out.size() * 2, 1 << 16)));
    }
    strm.next_out = reinterpret_cast<uint8_t*>(out.data()) + produced;
    strm.avail_out = out.size() - produced;
    ret = lzma_code(&strm, LZMA_FINISH);
    produced = out.size() - strm.avail_out;
    if (ret == LZMA_STREAM_END) break;
    switch (ret) {
      case LZMA_OK:
        continue;
      case LZMA_FORMAT_ERROR:
        return absl::InvalidArgumentError("not xz data");
      case LZMA_OPTIONS_ERROR:
        return absl::InvalidArgumentError("unsupported xz options");
      case LZMA_DATA_ERROR:
        return absl::DataLossError("corrupt xz data");
      case LZMA_BUF_ERROR:
        return absl::DataLossError("truncated xz data");
      case LZMA_MEMLIMIT_ERROR:
        return absl::ResourceExhaustedError(absl::StrCat(
            "xz data needs more than ", kMaxXzDecoderMemory >> 20, " MiB to decode"));
      case LZMA_MEM_ERROR:
        return absl::ResourceExhaustedError("out of memory decoding xz data");
      default:
        return absl::InternalError(absl::StrCat("xz decoder error ", static_cast<int>(ret)));
    }
  }
  if (produced > max_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("xz data decompresses to more than ", max_bytes, " bytes"));
  }
  out.resize(produced);
  return out;
}

absl::StatusOr<std::unique_ptr<ElfFile>> ReadMiniDebugInfo(const ElfFile& elf, size_t max_bytes) {
  const Section* section = elf.FindSection(".gnu_debugdata");
  if (section == nullptr) return absl::NotFoundError("no .gnu_debugdata");
  absl::StatusOr<std::string_view> data = elf.SectionData(*section);
  if (!data.ok()) return data.status();
  absl::StatusOr<std::string> image = DecompressXz(*data, max_bytes);
  if (!image.ok()) {
    return absl::Status(image.status().code(),
                        absl::StrCat(".gnu_debugdata: ", image.status().message()));
  }
  absl::StatusOr<std::unique_ptr<ElfFile>> mini = ElfFile::FromBytes(*std::move(image));
  if (!mini.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(".gnu_debugdata: ", mini.status().message()));
  }
  if ((*mini)->machine() != elf.machine() || (*mini)->big_endian() != elf.big_endian()) {
    return absl::InvalidArgumentError(".gnu_debugdata: ELF image of another machine");
  }
  return mini;
}

std::vector<std::string> DebugFileCandidates(const ElfFile& module, std::string_view module_path) {
  std::vector<std::string> out;
  if (std::string p = BuildIdDebugPath(kDebugDir, module.BuildIdHex()); !p.empty()) {
    out.push_back(std::move(p));
  }
  std::optional<DebugLink> link = ReadDebugLink(module);
  if (link.has_value() && module_path.starts_with('/')) {
    const std::string dir(DirName(module_path));
    out.push_back(dir + "/" + link->name);
    out.push_back(dir + "/.debug/" + link->name);
    out.push_back(std::string(kDebugDir) + dir + "/" + link->name);
  }
  return out;
}

absl::StatusOr<DebugFile> OpenDebugFile(const ElfFile& module, std::string_view module_path,
                                        std::string_view root) {
  std::optional<DebugLink> link = ReadDebugLink(module);
  std::vector<std::string> rejected;
  for (std::string& path : DebugFileCandidates(module, module_path)) {
    const std::string open_path = std::string(root) + path;
    struct stat st;
    if (stat(open_path.c_str(), &st) != 0 && (errno == ENOENT || errno == ENOTDIR)) continue;
    absl::StatusOr<std::unique_ptr<ElfFile>> elf = ElfFile::Open(open_path);
    if (!elf.ok()) {
      rejected.push_back(std::string(elf.status().message()));
      continue;
    }
    if (std::string why = Mismatch(module, link, **elf); !why.empty()) {
      rejected.push_back(absl::StrCat(path, ": ", why));
      continue;
    }
    return DebugFile{*std::move(elf), std::move(path)};
  }
  if (rejected.empty()) return absl::NotFoundError("no debug file");
  return absl::NotFoundError(absl::StrCat("no matching debug file (rejected ",
                                          absl::StrJoin(rejected, "; "), ")"));
}

std::string RootOf(std::string_view open_path, std::string_view path) {
  if (path.empty() || path.front() != '/' || open_path.size() <= path.size() ||
      !open_path.ends_with(path)) {
    return {};
  }
  return std::string(open_path.substr(0, open_path.size() - path.size()));
}

}  // namespace strata::elf
