#include "agent/procfs/procfs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata::agent::procfs {
namespace {

// ENOENT and ESRCH both mean the process is gone (or never was).
absl::Status ErrnoStatus(int err, std::string_view what) {
  std::string message = absl::StrCat(std::string(what), ": ", strerror(err));
  switch (err) {
    case ENOENT:
    case ESRCH:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string PidPath(pid_t pid, std::string_view leaf) {
  return absl::StrCat("/proc/", pid, "/", std::string(leaf));
}

// Parses an unsigned number in `base` from the front of `*text` and consumes it.
template <typename T>
bool ConsumeNumber(std::string_view* text, int base, T* out) {
  const char* begin = text->data();
  const char* end = begin + text->size();
  auto [ptr, ec] = std::from_chars(begin, end, *out, base);
  if (ec != std::errc() || ptr == begin) return false;
  text->remove_prefix(ptr - begin);
  return true;
}

bool ConsumeChar(std::string_view* text, char c) {
  if (text->empty() || text->front() != c) return false;
  text->remove_prefix(1);
  return true;
}

void SkipSpaces(std::string_view* text) {
  while (!text->empty() && text->front() == ' ') text->remove_prefix(1);
}

}  // namespace

std::optional<Mapping> ParseMapsLine(std::string_view line) {
  // start-end perms offset dev:dev inode [path]
  Mapping m;
  if (!ConsumeNumber(&line, 16, &m.start) || !ConsumeChar(&line, '-') ||
      !ConsumeNumber(&line, 16, &m.end) || !ConsumeChar(&line, ' ')) {
    return std::nullopt;
  }
  if (m.end < m.start || line.size() < 5) return std::nullopt;
  std::string_view perms = line.substr(0, 4);
  if ((perms[0] != 'r' && perms[0] != '-') || (perms[1] != 'w' && perms[1] != '-') ||
      (perms[2] != 'x' && perms[2] != '-') || (perms[3] != 's' && perms[3] != 'p')) {
    return std::nullopt;
  }
  m.read = perms[0] == 'r';
  m.write = perms[1] == 'w';
  m.exec = perms[2] == 'x';
  m.shared = perms[3] == 's';
  line.remove_prefix(4);
  if (!ConsumeChar(&line, ' ') || !ConsumeNumber(&line, 16, &m.offset) ||
      !ConsumeChar(&line, ' ') || !ConsumeNumber(&line, 16, &m.dev_major) ||
      !ConsumeChar(&line, ':') || !ConsumeNumber(&line, 16, &m.dev_minor) ||
      !ConsumeChar(&line, ' ') || !ConsumeNumber(&line, 10, &m.inode)) {
    return std::nullopt;
  }
  if (!line.empty() && line.front() != ' ') return std::nullopt;
  // The kernel pads to a column before the path; the path itself may contain spaces.
  SkipSpaces(&line);
  constexpr std::string_view kDeleted = " (deleted)";
  if (line.size() > kDeleted.size() && line.ends_with(kDeleted)) {
    line.remove_suffix(kDeleted.size());
    m.deleted = true;
  }
  m.path = std::string(line);
  return m;
}

namespace {

absl::StatusOr<std::vector<pid_t>> ListNumericEntries(const std::string& dir_path) {
  DIR* dir = opendir(dir_path.c_str());
  if (dir == nullptr) return ErrnoStatus(errno, absl::StrCat("opendir ", dir_path));
  std::vector<pid_t> ids;
  while (const dirent* entry = readdir(dir)) {
    std::string_view name = entry->d_name;
    pid_t id = 0;
    if (ConsumeNumber(&name, 10, &id) && name.empty() && id > 0) ids.push_back(id);
  }
  closedir(dir);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

std::vector<Mapping> ParseMaps(std::string_view text, size_t* skipped_lines) {
  std::vector<Mapping> mappings;
  size_t skipped = 0;
  while (!text.empty()) {
    size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    if (line.empty()) continue;
    if (std::optional<Mapping> m = ParseMapsLine(line)) {
      mappings.push_back(std::move(*m));
    } else {
      ++skipped;
    }
  }
  if (skipped_lines != nullptr) *skipped_lines = skipped;
  return mappings;
}

const Mapping* FindMapping(const std::vector<Mapping>& mappings, uint64_t address) {
  auto it = std::upper_bound(mappings.begin(), mappings.end(), address,
                             [](uint64_t a, const Mapping& m) { return a < m.start; });
  if (it == mappings.begin()) return nullptr;
  --it;
  return it->Contains(address) ? &*it : nullptr;
}

absl::StatusOr<uint64_t> ParseStatStartTime(std::string_view stat_text) {
  // "pid (comm) state ppid ..." : comm can hold anything, so fields start after the last ')'.
  size_t close = stat_text.rfind(')');
  if (close == std::string_view::npos) {
    return absl::InvalidArgumentError("stat: no ')' after comm");
  }
  std::string_view rest = stat_text.substr(close + 1);
  // After ')' come fields 3 (state) onwards; start time is field 22, the 20th of them.
  constexpr int kFieldsToSkip = 22 - 3;
  for (int i = 0; i < kFieldsToSkip; ++i) {
    SkipSpaces(&rest);
    size_t end = rest.find(' ');
    if (end == std::string_view::npos) return absl::InvalidArgumentError("stat: too few fields");
    rest.remove_prefix(end);
  }
  SkipSpaces(&rest);
  uint64_t start_time = 0;
  if (!ConsumeNumber(&rest, 10, &start_time)) {
    return absl::InvalidArgumentError("stat: start time is not a number");
  }
  return start_time;
}

std::vector<std::string> SplitNulSeparated(std::string_view text) {
  std::vector<std::string> parts;
  while (!text.empty()) {
    size_t nul = text.find('\0');
    parts.emplace_back(text.substr(0, nul));
    if (nul == std::string_view::npos) break;
    text.remove_prefix(nul + 1);
  }
  return parts;
}

std::optional<std::string> FindEnvironValue(std::string_view environ_text,
                                            std::string_view name) {
  while (!environ_text.empty()) {
    size_t nul = environ_text.find('\0');
    std::string_view entry = environ_text.substr(0, nul);
    if (entry.size() > name.size() && entry.starts_with(name) && entry[name.size()] == '=') {
      return std::string(entry.substr(name.size() + 1));
    }
    if (nul == std::string_view::npos) break;
    environ_text.remove_prefix(nul + 1);
  }
  return std::nullopt;
}

absl::StatusOr<std::string> ReadProcFile(const std::string& path, size_t max_bytes) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::string contents;
  char buffer[16384];
  while (contents.size() < max_bytes) {
    ssize_t n = read(fd, buffer, std::min(sizeof(buffer), max_bytes - contents.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return contents;
}

absl::StatusOr<std::vector<pid_t>> ListProcesses() { return ListNumericEntries("/proc"); }

absl::StatusOr<std::vector<pid_t>> ListThreads(pid_t pid) {
  return ListNumericEntries(PidPath(pid, "task"));
}

absl::StatusOr<std::string> ReadExecutable(pid_t pid) {
  std::string path = PidPath(pid, "exe");
  std::string target(4096, '\0');
  ssize_t n = readlink(path.c_str(), target.data(), target.size());
  if (n < 0) return ErrnoStatus(errno, absl::StrCat("readlink ", path));
  target.resize(static_cast<size_t>(n));
  return target;
}

absl::StatusOr<std::vector<std::string>> ReadCommandLine(pid_t pid) {
  absl::StatusOr<std::string> text = ReadProcFile(PidPath(pid, "cmdline"));
  if (!text.ok()) return text.status();
  return SplitNulSeparated(*text);
}

absl::StatusOr<std::string> ReadComm(pid_t pid) {
  absl::StatusOr<std::string> text = ReadProcFile(PidPath(pid, "comm"));
  if (!text.ok()) return text.status();
  if (!text->empty() && text->back() == '\n') text->pop_back();
  return text;
}

absl::StatusOr<uint64_t> ReadStartTime(pid_t pid) {
  absl::StatusOr<std::string> text = ReadProcFile(PidPath(pid, "stat"));
  if (!text.ok()) return text.status();
  return ParseStatStartTime(*text);
}

std::optional<pid_t> ParseNamespacePid(std::string_view status_text) {
  for (absl::string_view line : absl::StrSplit(absl::string_view(status_text.data(), status_text.size()), '\n')) {
    if (!absl::ConsumePrefix(&line, "NSpid:")) continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, absl::ByAnyChar(" \t"),
                                                           absl::SkipEmpty());
    int value = 0;
    if (fields.empty() || !absl::SimpleAtoi(fields.back(), &value) || value <= 0) {
      return std::nullopt;
    }
    return static_cast<pid_t>(value);
  }
  return std::nullopt;
}

absl::StatusOr<pid_t> ReadNamespacePid(pid_t pid) {
  absl::StatusOr<std::string> text = ReadProcFile(PidPath(pid, "status"));
  if (!text.ok()) return text.status();
  return ParseNamespacePid(*text).value_or(pid);
}

absl::StatusOr<std::string> ReadEnviron(pid_t pid) { return ReadProcFile(PidPath(pid, "environ")); }

absl::StatusOr<std::optional<std::string>> ReadEnvironValue(pid_t pid, std::string_view name) {
  absl::StatusOr<std::string> text = ReadEnviron(pid);
  if (!text.ok()) return text.status();
  return FindEnvironValue(*text, name);
}

absl::StatusOr<std::vector<Mapping>> ReadMappings(pid_t pid) {
  absl::StatusOr<std::string> text = ReadProcFile(PidPath(pid, "maps"));
  if (!text.ok()) return text.status();
  return ParseMaps(*text);
}

}  // namespace strata::agent::procfs
