#include "server/symbolize/debuginfo_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/elf/elf_file.h"
#include "common/elf/go_pclntab.h"

namespace strata::server::symbolize {
namespace fs = std::filesystem;
namespace {

constexpr char kDebugSuffix[] = ".debug";
constexpr char kMetaSuffix[] = ".meta";

// One line: file name, upload time, functions, DWARF (tab-separated; the name has no tabs).
std::string MetaLine(const DebugFileInfo& info) {
  return absl::StrCat(info.file_name, "\t", info.uploaded_ms, "\t", info.functions, "\t",
                      info.has_dwarf ? 1 : 0, "\n");
}

void ParseMeta(const std::string& path, DebugFileInfo* info) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return;
  std::vector<std::string> fields = absl::StrSplit(line, '\t');
  if (fields.size() < 4) return;
  info->file_name = fields[0];
  int64_t ms = 0;
  uint64_t functions = 0;
  if (absl::SimpleAtoi(fields[1], &ms)) info->uploaded_ms = ms;
  if (absl::SimpleAtoi(fields[2], &functions)) info->functions = functions;
  info->has_dwarf = fields[3] == "1";
}

std::string CleanName(std::string_view name) {
  std::string out(name.substr(0, 256));
  for (char& c : out) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

}  // namespace

bool IsBuildIdHex(std::string_view s) {
  return s.size() >= 2 && s.size() <= 128 && s.size() % 2 == 0 &&
         std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

absl::StatusOr<DebugFileInfo> InspectDebugFile(const std::string& path) {
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf = elf::ElfFile::Open(path);
  if (!elf.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a usable ELF64 file: ", elf.status().message()));
  }
  DebugFileInfo info;
  info.build_id = (*elf)->BuildIdHex();
  if (info.build_id.empty()) {
    return absl::InvalidArgumentError(
        "the file has no GNU build ID (.note.gnu.build-id) nor Go build ID");
  }
  info.size_bytes = (*elf)->image().size();
  info.has_dwarf = (*elf)->FindSection(".debug_info") != nullptr;
  absl::StatusOr<std::vector<elf::FunctionSymbol>> symbols = (*elf)->ReadFunctionSymbols();
  // .dynsym names only what the agent already reads from the mapped file itself.
  if (symbols.ok()) {
    info.functions = static_cast<uint64_t>(std::count_if(
        symbols->begin(), symbols->end(), [](const auto& f) { return !f.from_dynsym; }));
  }
  // A stripped Go binary still has its runtime's table: names, inlined calls and lines.
  if (info.functions == 0 && !info.has_dwarf && elf::LooksLikeGo(**elf)) {
    absl::StatusOr<std::unique_ptr<elf::GoPclntab>> go = elf::GoPclntab::Find(**elf);
    if (go.ok()) info.functions = (*go)->functions().size();
  }
  if (info.functions == 0 && !info.has_dwarf) {
    return absl::InvalidArgumentError(
        "the file has neither function symbols (.symtab, .gopclntab) nor DWARF (.debug_info): "
        "upload the unstripped binary or its separate debug file");
  }
  return info;
}

absl::StatusOr<std::unique_ptr<DebugInfoStore>> DebugInfoStore::Open(std::string dir,
                                                                     uint64_t max_file_bytes) {
  std::error_code ec;
  fs::create_directories(fs::path(dir) / "tmp", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  // Leftovers of uploads a previous process did not finish.
  for (const auto& entry : fs::directory_iterator(fs::path(dir) / "tmp", ec)) {
    fs::remove(entry.path(), ec);
  }
  return std::unique_ptr<DebugInfoStore>(new DebugInfoStore(std::move(dir), max_file_bytes));
}

absl::StatusOr<std::string> DebugInfoStore::NewTemporary() {
  uint64_t n;
  {
    absl::MutexLock lock(&mu_);
    n = next_temporary_++;
  }
  std::string path = absl::StrCat(dir_, "/tmp/upload-", getpid(), "-", n);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", path));
  return path;
}

void DebugInfoStore::Discard(const std::string& temporary) {
  std::error_code ec;
  fs::remove(temporary, ec);
}

absl::StatusOr<DebugInfoStore::Stored> DebugInfoStore::Commit(const std::string& temporary,
                                                               std::string_view file_name,
                                                               std::string_view expected_build_id,
                                                               int64_t now_ms) {
  absl::StatusOr<DebugFileInfo> info = InspectDebugFile(temporary);
  if (!info.ok()) {
    Discard(temporary);
    return info.status();
  }
  if (!expected_build_id.empty() && info->build_id != expected_build_id) {
    Discard(temporary);
    return absl::InvalidArgumentError(absl::StrCat("the file's build ID is ", info->build_id,
                                                   ", not ", std::string(expected_build_id)));
  }
  info->file_name = CleanName(file_name);
  info->uploaded_ms = now_ms;
  const std::string base = absl::StrCat(dir_, "/", info->build_id);
  absl::MutexLock lock(&mu_);
  std::error_code ec;
  Stored stored{*info, fs::exists(base + kDebugSuffix, ec)};
  // The metadata first: a crash between the two renames leaves a meta without a file,
  // which List ignores; never a file described by another upload's meta.
  const std::string meta_tmp = temporary + ".meta";
  {
    std::ofstream meta(meta_tmp, std::ios::trunc);
    meta << MetaLine(*info);
    if (!meta.flush()) {
      Discard(temporary);
      Discard(meta_tmp);
      return absl::InternalError(absl::StrCat("cannot write ", meta_tmp));
    }
  }
  fs::rename(meta_tmp, base + kMetaSuffix, ec);
  if (!ec) fs::rename(temporary, base + kDebugSuffix, ec);
  if (ec) {
    Discard(temporary);
    Discard(meta_tmp);
    return absl::InternalError(absl::StrCat("cannot store ", base, ": ", ec.message()));
  }
  return stored;
}

std::optional<std::string> DebugInfoStore::PathOf(std::string_view build_id_hex) const {
  if (!IsBuildIdHex(build_id_hex)) return std::nullopt;
  std::string path = absl::StrCat(dir_, "/", std::string(build_id_hex), kDebugSuffix);
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return path;
}

std::vector<DebugFileInfo> DebugInfoStore::List() const {
  std::vector<DebugFileInfo> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(kDebugSuffix) || !entry.is_regular_file(ec)) continue;
    DebugFileInfo info;
    info.build_id = name.substr(0, name.size() - std::strlen(kDebugSuffix));
    if (!IsBuildIdHex(info.build_id)) continue;
    info.size_bytes = entry.file_size(ec);
    ParseMeta(absl::StrCat(dir_, "/", info.build_id, kMetaSuffix), &info);
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const DebugFileInfo& a, const DebugFileInfo& b) { return a.build_id < b.build_id; });
  return out;
}

namespace {

std::string ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Copies `from` to `to` through a temporary file beside `to`, synced before the rename.
absl::Status CopyAtomically(const std::string& from, const std::string& to) {
  const std::string temporary = to + ".copying";
  std::error_code ec;
  fs::copy_file(from, temporary, fs::copy_options::overwrite_existing, ec);
  if (!ec) {
    const int fd = open(temporary.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) ec = std::error_code(errno, std::generic_category());
    if (fd >= 0) close(fd);
  }
  if (!ec) fs::rename(temporary, to, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(temporary, ignored);
    return absl::InternalError(absl::StrCat("copy ", from, " to ", to, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<size_t> CopyDebugFiles(const std::string& from, const std::string& to) {
  std::error_code ec;
  if (!fs::is_directory(from, ec)) return 0;
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("create ", to, ": ", ec.message()));
  size_t copied = 0;
  for (const auto& entry : fs::directory_iterator(from, ec)) {
    const std::string name = entry.path().filename().string();
    if (!name.ends_with(kDebugSuffix) || !entry.is_regular_file(ec)) continue;
    const std::string build_id = name.substr(0, name.size() - std::strlen(kDebugSuffix));
    if (!IsBuildIdHex(build_id)) continue;
    const std::string source = absl::StrCat(from, "/", build_id);
    const std::string target = absl::StrCat(to, "/", build_id);
    const std::string meta = ReadSmallFile(source + kMetaSuffix);
    std::error_code size_ec;
    if (fs::exists(target + kDebugSuffix, size_ec) &&
        fs::file_size(target + kDebugSuffix, size_ec) == entry.file_size(size_ec) && !size_ec &&
        ReadSmallFile(target + kMetaSuffix) == meta) {
      continue;
    }
    if (fs::exists(source + kMetaSuffix, size_ec)) {
      if (absl::Status st = CopyAtomically(source + kMetaSuffix, target + kMetaSuffix); !st.ok()) {
        return st;
      }
    }
    if (absl::Status st = CopyAtomically(source + kDebugSuffix, target + kDebugSuffix); !st.ok()) {
      return st;
    }
    ++copied;
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", from, ": ", ec.message()));
  return copied;
}

}  // namespace strata::server::symbolize
