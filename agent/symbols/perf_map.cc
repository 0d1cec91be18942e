#include "agent/symbols/perf_map.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/procfs/procfs.h"

namespace strata::agent::symbols {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

// Hex number at the front of `s` (optional 0x), consumed. False without digits or on overflow.
bool TakeHex(std::string_view* s, uint64_t* out) {
  std::string_view v = *s;
  if (v.size() >= 2 && v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) v.remove_prefix(2);
  uint64_t value = 0;
  size_t i = 0;
  for (; i < v.size(); ++i) {
    const char c = v[i];
    int digit;
    if (c >= '0' && c <= '9') digit = c - '0';
    else if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    else break;
    if (value >> 60 != 0) return false;
    value = value << 4 | static_cast<uint64_t>(digit);
  }
  if (i == 0) return false;
  *out = value;
  s->remove_prefix(s->size() - (v.size() - i));
  return true;
}

size_t SkipBlanks(std::string_view s) {
  size_t i = 0;
  while (i < s.size() && IsBlank(s[i])) ++i;
  return i;
}

// Reads at most this much per read(2); a line longer than this is not an entry.
constexpr size_t kChunkBytes = 64 * 1024;

}  // namespace

bool ParsePerfMapLine(std::string_view line, PerfMapLine* out) {
  line.remove_prefix(SkipBlanks(line));
  uint64_t start = 0, size = 0;
  if (!TakeHex(&line, &start)) return false;
  size_t blanks = SkipBlanks(line);
  if (blanks == 0) return false;
  line.remove_prefix(blanks);
  if (!TakeHex(&line, &size)) return false;
  blanks = SkipBlanks(line);
  if (blanks == 0) return false;
  line.remove_prefix(blanks);
  while (!line.empty() && IsBlank(line.back())) line.remove_suffix(1);
  if (line.empty() || size == 0 || start > std::numeric_limits<uint64_t>::max() - size) {
    return false;
  }
  *out = {start, size, line};
  return true;
}

size_t PerfMap::AddText(std::string_view text) {
  size_t used = 0;
  for (;;) {
    const size_t nl = text.find('\n', used);
    if (nl == std::string_view::npos) return used;
    PerfMapLine line;
    if (ParsePerfMapLine(text.substr(used, nl - used), &line)) {
      Add(line.start, line.size, line.name);
    }
    used = nl + 1;
  }
}

void PerfMap::Add(uint64_t start, uint64_t size, std::string_view name) {
  if (size == 0 || start > std::numeric_limits<uint64_t>::max() - size || name.empty() ||
      name.size() > kMaxNameBytes) {
    return;
  }
  const uint64_t end = start + size;
  if (names_.size() + name.size() > kMaxNameBytes) {
    Compact();
    // Mostly live names: compacting again soon would not free enough to be worth it.
    if (names_.size() + name.size() > kMaxNameBytes / 4 * 3) {
      Clear();
      ++resets_;
    }
  }
  if (ranges_.size() + 2 > kMaxEntries) {
    Clear();
    ++resets_;
  }
  const uint32_t offset = static_cast<uint32_t>(names_.size());
  names_.append(name);
  const Range added{end, start, offset, static_cast<uint32_t>(name.size())};
  // Cut what the new entry covers out of the older ones: the range starting before it keeps
  // its head (and its tail when the new entry lies inside it), ranges starting inside it keep
  // only their tails. (Inserting or erasing invalidates btree iterators: none is reused.)
  auto it = ranges_.lower_bound(start);
  if (it != ranges_.begin()) {
    auto before = std::prev(it);
    if (before->second.end > start) {
      const Range old = before->second;
      before->second.end = start;
      if (old.end > end) {  // inside `old`: nothing else overlaps
        ranges_.emplace(end, old);
        ranges_.insert_or_assign(start, added);
        return;
      }
    }
  }
  while (it != ranges_.end() && it->first < end) {
    const Range old = it->second;
    it = ranges_.erase(it);
    if (old.end > end) {
      ranges_.emplace(end, old);
      break;
    }
  }
  ranges_.insert_or_assign(start, added);
}

bool PerfMap::Lookup(uint64_t addr, Symbol* out) const {
  auto it = ranges_.upper_bound(addr);
  if (it == ranges_.begin()) return false;
  --it;
  if (addr >= it->second.end) return false;
  out->start = it->second.function_start;
  out->end = it->second.end;
  out->name = std::string_view(names_).substr(it->second.name_offset, it->second.name_size);
  return true;
}

void PerfMap::Clear() {
  ranges_.clear();
  names_.clear();
  names_.shrink_to_fit();
}

// Drops the names of overridden entries from the arena (pieces of one cut entry share theirs).
void PerfMap::Compact() {
  std::string names;
  absl::btree_map<uint64_t, uint32_t> moved;  // old offset -> new offset
  for (auto& [start, r] : ranges_) {
    auto [m, inserted] = moved.try_emplace(r.name_offset, static_cast<uint32_t>(names.size()));
    if (inserted) names.append(names_, r.name_offset, r.name_size);
    r.name_offset = m->second;
  }
  names_ = std::move(names);
}

absl::Status PerfMapFile::Update() {
  // Not blocking: a FIFO put at the path would otherwise hold the open until a writer came.
  const int fd = open(open_path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", open_path_));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::NotFoundError(absl::StrCat("cannot stat ", open_path_));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(open_path_, ": not a regular file"));
  }
  const int64_t mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (st.st_dev == device_ && st.st_ino == inode_ && size == size_ && mtime_ns == mtime_ns_ &&
      !read_cut_short_) {
    close(fd);
    return absl::OkStatus();
  }
  if (st.st_dev != device_ || st.st_ino != inode_ || size < consumed_ ||
      !TailUnchanged(fd)) {
    // Another file (the process exec'd, or its pid was reused) or rewritten (HotSpot writes
    // each map over the last, in place): start over.
    map_.Clear();
    consumed_ = 0;
    skipping_line_ = false;
  }
  device_ = st.st_dev;
  inode_ = st.st_ino;
  size_ = size;
  mtime_ns_ = mtime_ns;
  std::vector<char> buffer(kChunkBytes);
  // A bounded share per call: a file of gigabytes (a sparse one costs its writer nothing) is
  // read over many calls instead of holding the caller for minutes.
  const uint64_t stop = consumed_ + std::min<uint64_t>(size - consumed_, kMaxBytesPerUpdate);
  read_cut_short_ = stop < size;
  while (consumed_ < stop) {
    const ssize_t n = pread(fd, buffer.data(), buffer.size(), static_cast<off_t>(consumed_));
    if (n <= 0) break;
    bytes_read_ += static_cast<uint64_t>(n);
    std::string_view text(buffer.data(), static_cast<size_t>(n));
    if (skipping_line_) {
      const size_t nl = text.find('\n');
      if (nl == std::string_view::npos) {
        consumed_ += text.size();
        continue;
      }
      consumed_ += nl + 1;
      skipping_line_ = false;
      continue;
    }
    const size_t used = map_.AddText(text);
    consumed_ += used;
    if (used == 0) {
      if (text.size() < buffer.size()) break;  // an incomplete last line: wait for the rest
      consumed_ += text.size();  // a line longer than a chunk
      skipping_line_ = true;
    }
  }
  RememberTail(fd);
  close(fd);
  return absl::OkStatus();
}

bool PerfMapFile::TailUnchanged(int fd) const {
  if (tail_.empty()) return true;
  char bytes[kTailBytes];
  const ssize_t n = pread(fd, bytes, tail_.size(), static_cast<off_t>(consumed_ - tail_.size()));
  return n == static_cast<ssize_t>(tail_.size()) && tail_ == std::string_view(bytes, tail_.size());
}

void PerfMapFile::RememberTail(int fd) {
  char bytes[kTailBytes];
  const size_t want = static_cast<size_t>(std::min<uint64_t>(consumed_, kTailBytes));
  const ssize_t n = pread(fd, bytes, want, static_cast<off_t>(consumed_ - want));
  tail_.assign(bytes, n == static_cast<ssize_t>(want) ? want : 0);
}

PerfMapPaths PerfMapPathsOf(pid_t pid) {
  // The pid as the process itself sees it: a containerized runtime names its file after that.
  const pid_t ns_pid = procfs::ReadNamespacePid(pid).value_or(pid);
  std::string map_path = absl::StrCat("/tmp/perf-", ns_pid, ".map");
  return {absl::StrCat("/proc/", pid, "/root", map_path), std::move(map_path)};
}

}  // namespace strata::agent::symbols
