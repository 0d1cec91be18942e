#include "agent/spool/spool.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/spool/spool_records.h"
#include "common/base/crc32c.h"
#include "common/encoding/packed_contexts.h"

namespace strata::agent::spool {
namespace {

namespace fs = std::filesystem;
using namespace records;  // NOLINT(build/namespaces): the file format, this module's own

constexpr char kGraphFile[] = "graph.log";
constexpr char kLockFile[] = "LOCK";
constexpr char kAckedFile[] = "acked";
constexpr char kSegmentPrefix[] = "batches-";
constexpr char kSegmentSuffix[] = ".log";

absl::Status ErrnoError(const std::string& what, const std::string& path, int error) {
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(error));
  if (error == ENOSPC || error == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return ErrnoError("cannot read", path, error);
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return data;
}

absl::Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoError("cannot write", path, errno);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Appends whole records and makes them durable; on failure the file is cut back to
// `size`, so no torn record stays behind a good one.
absl::Status AppendDurably(int fd, uint64_t size, std::string_view data, const std::string& path) {
  absl::Status st = WriteAll(fd, data, path);
  if (st.ok() && fdatasync(fd) != 0) st = ErrnoError("cannot sync", path, errno);
  if (!st.ok()) (void)ftruncate(fd, static_cast<off_t>(size));
  return st;
}

void SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)fsync(fd);
  close(fd);
}

// A file name for an agent ID: [A-Za-z0-9._-] as is (no leading dot), the rest as %XX.
std::string DirectoryName(std::string_view agent_id) {
  std::string out;
  for (size_t i = 0; i < agent_id.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(agent_id[i]);
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') || c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out.empty() ? "%" : out;
}

// For the operator's accounting only (what was recovered, what was dropped).
uint64_t SamplesOf(const v1::SampleBatch& batch) {
  uint64_t samples = 0;
  for (const auto& c : batch.contexts()) samples += c.count();
  if (!batch.packed_contexts().empty()) {
    auto records = encoding::DecodePackedContexts(batch.packed_contexts());
    if (records.ok()) {
      for (const auto& r : *records) samples += r.count;
    }
  }
  return samples;
}

// Locks `dir`/LOCK; -1 with `*held` set when another process holds it.
absl::StatusOr<int> LockDirectory(const std::string& dir, bool* held) {
  *held = false;
  const std::string path = dir + "/" + kLockFile;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot open", path, errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    close(fd);
    if (error == EWOULDBLOCK) {
      *held = true;
      return -1;
    }
    return ErrnoError("cannot lock", path, error);
  }
  return fd;
}

}  // namespace

struct Spool::Segment {
  uint64_t first_sequence = 0;
  std::string path;
  int fd = -1;          // read-write for the segment taking appends, else read-only
  uint64_t bytes = 0;
  size_t live = 0;      // entries still in the spool
};

Spool::Spool(SpoolOptions options, std::string path, int lock_fd)
    : options_(std::move(options)), path_(std::move(path)), lock_fd_(lock_fd) {}

Spool::~Spool() {
  // An agent that stops with batches unacknowledged leaves them on the disk.
  if (!entries_.empty() && (graph_unsynced_ || unsynced_segment_ != nullptr)) (void)SyncAll();
  if (acked_through_ > acked_recorded_) WriteAckedFile();
  for (auto& s : segments_) {
    if (s->fd >= 0) close(s->fd);
  }
  if (graph_fd_ >= 0) close(graph_fd_);
  if (acked_fd_ >= 0) close(acked_fd_);
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::StatusOr<std::unique_ptr<Spool>> Spool::Open(const SpoolOptions& options,
                                                   const SpoolIdentity& fresh,
                                                   const GraphRestorer& restore,
                                                   SpoolRecovery* recovery) {
  *recovery = SpoolRecovery();
  recovery->identity = fresh;
  if (options.dir.empty()) return std::unique_ptr<Spool>(new Spool(options, "", -1));
  // Generated identities live apart from given ones: only they may be adopted.
  const std::string parent = options.dir + (options.adopt ? "/generated" : "/given");
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", parent, ": ", ec.message()));
  if (::access(parent.c_str(), W_OK) != 0) return ErrnoError("cannot write to", parent, errno);

  if (options.adopt) {
    // An earlier agent without a given ID that left batches behind: resume as it.
    std::vector<std::string> candidates;
    for (const auto& e : fs::directory_iterator(parent, ec)) {
      if (e.is_directory(ec)) candidates.push_back(e.path().string());
    }
    std::sort(candidates.begin(), candidates.end());
    for (const std::string& dir : candidates) {
      bool held = false;
      auto lock = LockDirectory(dir, &held);
      if (!lock.ok() || held) continue;
      std::unique_ptr<Spool> spool(new Spool(options, dir, *lock));
      SpoolRecovery found;
      found.identity = fresh;
      absl::Status st = spool->Recover(fresh, restore, &found);
      if (!st.ok()) return st;
      if (found.resumed) {
        *recovery = found;
        return spool;
      }
      // Nothing left to deliver: an abandoned directory.
      spool.reset();
      fs::remove_all(dir, ec);
    }
  }

  const std::string dir = parent + "/" + DirectoryName(fresh.agent_id);
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  bool held = false;
  auto lock = LockDirectory(dir, &held);
  if (!lock.ok()) return lock.status();
  if (held) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another strata-agent runs as agent ID '", fresh.agent_id, "' (", dir, "/", kLockFile,
        " is locked): give each agent its own --agent-id or --spool-dir"));
  }
  std::unique_ptr<Spool> spool(new Spool(options, dir, *lock));
  absl::Status st = spool->Recover(fresh, restore, recovery);
  if (!st.ok()) return st;
  return spool;
}

absl::Status Spool::Recover(const SpoolIdentity& fresh, const GraphRestorer& restore,
                            SpoolRecovery* recovery) {
  recovery->path = path_;
  // The identity of the earlier run, from graph.log's first record.
  const std::string graph_path = path_ + "/" + kGraphFile;
  std::string graph_data;
  std::vector<Record> graph_records;
  uint64_t graph_good_end = 0;
  bool have_identity = false;
  v1::Hello hello;
  if (::access(graph_path.c_str(), F_OK) == 0) {
    auto data = ReadWholeFile(graph_path);
    if (!data.ok()) return data.status();
    graph_data = std::move(*data);
    graph_records = ParseRecords(graph_data, &recovery->corrupt_records, &graph_good_end);
    have_identity = !graph_records.empty() && graph_records[0].type == kHelloRecord &&
                    hello.ParseFromString(std::string(graph_records[0].payload)) &&
                    !hello.agent_id().empty();
  }

  // The last acknowledgement written: the acked file's, or a later one that went into a
  // segment with a batch (not synced: losing it only resends what the server already has,
  // and the server knows it).
  uint64_t acked = 0;
  if (auto data = ReadWholeFile(path_ + "/" + kAckedFile);
      data.ok() && data->size() == 12 &&
      base::Crc32c(data->substr(0, 8)) == GetU32(data->data() + 8)) {
    acked = SequenceOf(data->data());
  }
  acked_recorded_ = acked;

  // Every whole batch record of every segment, oldest first.
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kSegmentPrefix, 0) == 0 && name.size() > sizeof kSegmentSuffix &&
        name.ends_with(kSegmentSuffix)) {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  uint64_t last_sequence = 0;
  for (const std::string& name : names) {
    auto segment = std::make_unique<Segment>();
    segment->path = path_ + "/" + name;
    auto data = ReadWholeFile(segment->path);
    if (!data.ok()) {
      ++recovery->corrupt_records;
      fs::remove(segment->path, ec);
      continue;
    }
    uint64_t good_end = 0;
    std::vector<Record> records = ParseRecords(*data, &recovery->corrupt_records, &good_end);
    segment->bytes = data->size();
    for (const Record& r : records) {
      if (r.type == kAckRecord && r.payload.size() == 8) {
        acked = std::max(acked, SequenceOf(r.payload.data()));
        continue;
      }
      v1::SampleBatch batch;
      if (r.type != kBatchRecord || !batch.ParseFromString(std::string(r.payload)) ||
          batch.sequence() <= last_sequence) {
        ++recovery->corrupt_records;
        continue;
      }
      last_sequence = batch.sequence();
      if (batch.sequence() <= acked) continue;
      Slot slot;
      slot.entry = {batch.sequence(), batch.epoch(), SamplesOf(batch)};
      slot.counted = true;
      slot.segment = segment.get();
      slot.offset = r.offset;
      slot.length = static_cast<uint32_t>(kRecordHeader + r.payload.size());
      if (segment->live++ == 0) segment->first_sequence = batch.sequence();
      entries_.push_back(std::move(slot));
    }
    if (segment->live == 0) {
      fs::remove(segment->path, ec);
      continue;
    }
    segment->fd = open(segment->path.c_str(), O_RDONLY | O_CLOEXEC);
    if (segment->fd < 0) return ErrnoError("cannot open", segment->path, errno);
    segments_.push_back(std::move(segment));
  }
  // An acknowledgement in a later segment covers batches of earlier ones.
  acked_through_ = acked;
  DropThrough(acked);

  if (entries_.empty() || !have_identity) {
    // Nothing to deliver (or no identity to deliver it under): start over.
    recovery->orphaned_batches += entries_.size();
    recovery->last_sequence = last_sequence;
    while (!segments_.empty()) DropSegment(segments_.front().get(), false);
    entries_.clear();
    return StartOver(fresh);
  }

  // Resume: the same incarnation, its graph restored as far as it is whole.
  recovery->resumed = true;
  recovery->identity.agent_id = hello.agent_id();
  recovery->identity.graph_id = hello.graph_id();
  recovery->identity.host = fresh.host;
  uint64_t restored_edges = 0;
  uint64_t keep_bytes = graph_good_end;
  for (size_t i = 1; i < graph_records.size(); ++i) {
    const Record& r = graph_records[i];
    if (r.type == kSequenceRecord && r.payload.size() == 8) {
      sequences_reserved_ = std::max(sequences_reserved_, SequenceOf(r.payload.data()));
      continue;
    }
    v1::GraphDelta delta;
    absl::Status st = r.type == kGraphRecord && delta.ParseFromString(std::string(r.payload))
                          ? restore(recovery->identity, delta)
                          : absl::DataLossError("not a graph record");
    if (!st.ok()) {
      ++recovery->corrupt_records;
      keep_bytes = r.offset;  // later deltas would not be contiguous
      break;
    }
    ++recovery->graph_records;
    restored_edges = delta.first_edge() + static_cast<uint64_t>(delta.edges_size());
  }
  // The batches after the last one on disk may have reached the server all the same.
  recovery->last_sequence = std::max(last_sequence, sequences_reserved_);
  if (keep_bytes < graph_data.size()) {
    // A graph cut short (a torn or corrupt record, a delta that does not follow on) is behind
    // what the server may have been sent: resumed, it would number new functions and edges
    // as the server knows others, and every later batch would be decoded wrong. The batches
    // go, counted, and the agent starts a new graph.
    recovery->orphaned_batches += entries_.size();
    recovery->resumed = false;
    recovery->identity = fresh;
    recovery->graph_records = 0;
    while (!segments_.empty()) DropSegment(segments_.front().get(), false);
    entries_.clear();
    return StartOver(fresh);
  }
  // Batches encoded against graph that was lost cannot be decoded by anyone; their records
  // go from disk too, or a graph that grows again would make them decodable, wrongly.
  std::vector<Segment*> rewrite;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->entry.epoch > restored_edges) {
      ++recovery->orphaned_batches;
      --it->segment->live;
      if (rewrite.empty() || rewrite.back() != it->segment) rewrite.push_back(it->segment);
      it = entries_.erase(it);
    } else {
      ++recovery->batches;
      recovery->samples += it->entry.samples;
      ++it;
    }
  }
  for (Segment* segment : rewrite) {
    if (segment->live == 0) continue;
    absl::Status st = RewriteSegment(segment);
    if (!st.ok()) return st;
  }
  for (size_t i = 0; i < segments_.size();) {
    if (segments_[i]->live == 0) {
      DropSegment(segments_[i].get(), false);
    } else {
      ++i;
    }
  }
  // The segments' acknowledgements may have gone with the segments rewritten or dropped.
  if (acked_through_ > acked_recorded_) WriteAckedFile();
  graph_fd_ = open(graph_path.c_str(), O_WRONLY | O_CLOEXEC);
  if (graph_fd_ < 0) return ErrnoError("cannot open", graph_path, errno);
  if (keep_bytes < graph_data.size() && ftruncate(graph_fd_, static_cast<off_t>(keep_bytes)) != 0) {
    return ErrnoError("cannot truncate", graph_path, errno);
  }
  if (lseek(graph_fd_, 0, SEEK_END) < 0) return ErrnoError("cannot seek", graph_path, errno);
  graph_bytes_ = keep_bytes;
  append_to_last_ = false;  // new batches go to a new segment
  return absl::OkStatus();
}

// An empty spool for `fresh`: graph.log holds only its identity.
absl::Status Spool::StartOver(const SpoolIdentity& fresh) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kSegmentPrefix, 0) == 0 || name == kAckedFile) fs::remove(e.path(), ec);
  }
  acked_through_ = 0;
  acked_recorded_ = 0;
  v1::Hello hello;
  hello.set_agent_id(fresh.agent_id);
  hello.set_host(fresh.host);
  hello.set_graph_id(fresh.graph_id);
  std::string contents(kMagic, sizeof kMagic);
  AppendRecord(kHelloRecord, hello, &contents);
  // A new incarnation numbers its batches from 1.
  AppendRecord(kSequenceRecord, &contents,
               [](std::string& to) { to += SequenceBytes(kSequenceBlock); });
  const std::string graph_path = path_ + "/" + kGraphFile;
  const std::string tmp = graph_path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  absl::Status st = WriteAll(fd, contents, tmp);
  if (st.ok() && fdatasync(fd) != 0) st = ErrnoError("cannot sync", tmp, errno);
  close(fd);
  if (st.ok() && rename(tmp.c_str(), graph_path.c_str()) != 0) {
    st = ErrnoError("cannot rename", tmp, errno);
  }
  if (!st.ok()) return st;
  SyncDirectory(path_);
  if (graph_fd_ >= 0) close(graph_fd_);
  graph_fd_ = open(graph_path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (graph_fd_ < 0) return ErrnoError("cannot open", graph_path, errno);
  graph_bytes_ = contents.size();
  graph_unsynced_ = false;
  sequences_reserved_ = kSequenceBlock;
  append_to_last_ = false;
  return absl::OkStatus();
}

// Keeps only the segment's live records: written to a new file that replaces it.
absl::Status Spool::RewriteSegment(Segment* segment) {
  const std::string tmp = segment->path + ".tmp";
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError("cannot create", tmp, errno);
  std::string contents(kMagic, sizeof kMagic);
  std::vector<std::pair<Slot*, uint64_t>> moved;
  for (Slot& slot : entries_) {
    if (slot.segment != segment) continue;
    std::string record(slot.length, '\0');
    if (pread(segment->fd, record.data(), record.size(), static_cast<off_t>(slot.offset)) !=
        static_cast<ssize_t>(record.size())) {
      close(fd);
      unlink(tmp.c_str());
      return ErrnoError("cannot read", segment->path, errno);
    }
    moved.emplace_back(&slot, contents.size());
    contents += record;
  }
  absl::Status st = AppendDurably(fd, 0, contents, tmp);
  if (st.ok() && rename(tmp.c_str(), segment->path.c_str()) != 0) {
    st = ErrnoError("cannot rename", tmp, errno);
  }
  if (!st.ok()) {
    close(fd);
    unlink(tmp.c_str());
    return st;
  }
  SyncDirectory(path_);
  close(segment->fd);
  segment->fd = fd;
  segment->bytes = contents.size();
  for (auto& [slot, offset] : moved) slot->offset = offset;
  return absl::OkStatus();
}

void Spool::DropAll() {
  while (!segments_.empty()) DropSegment(segments_.front().get(), true);
  for (Slot& slot : entries_) {  // those the disk refused, or an in-memory spool's
    ++stats_.batches_dropped;
    stats_.samples_dropped += CountSlotSamples(slot);
  }
  entries_.clear();
}

size_t Spool::ResumableBatches() const {
  if (path_.empty() || graph_abandoned_) return 0;
  return static_cast<size_t>(std::count_if(entries_.begin(), entries_.end(),
                                           [](const Slot& s) { return s.segment != nullptr; }));
}

void Spool::AbandonGraph() {
  if (path_.empty() || graph_abandoned_) return;
  graph_abandoned_ = true;
  // No identity left: a restart starts over. (Shrinking a file needs no free space.)
  (void)ftruncate(graph_fd_, 0);
  graph_bytes_ = 0;
  graph_unsynced_ = false;
}

absl::Status Spool::AppendGraph(const v1::GraphDelta& delta) {
  if (path_.empty()) return absl::OkStatus();
  if (graph_abandoned_) return absl::FailedPreconditionError("the spool's graph was abandoned");
  std::string record;
  AppendRecord(kGraphRecord, delta, &record);
  absl::Status st = AppendGraphRecord(record);
  if (st.ok()) Written();
  return st;
}

absl::Status Spool::AppendGraphRecord(const std::string& record) {
  absl::Status st = WriteAll(graph_fd_, record, path_ + "/" + kGraphFile);
  if (!st.ok()) {
    // Cut back to the last whole record; position appends there.
    (void)ftruncate(graph_fd_, static_cast<off_t>(graph_bytes_));
    (void)lseek(graph_fd_, static_cast<off_t>(graph_bytes_), SEEK_SET);
    return st;
  }
  graph_bytes_ += record.size();
  graph_unsynced_ = true;
  return absl::OkStatus();
}

absl::Status Spool::SyncGraph() {
  if (path_.empty() || graph_abandoned_ || !graph_unsynced_) return absl::OkStatus();
  if (fdatasync(graph_fd_) != 0) {
    return ErrnoError("cannot sync", path_ + "/" + kGraphFile, errno);
  }
  graph_unsynced_ = false;
  ++stats_.graph_syncs;
  return absl::OkStatus();
}

absl::Status Spool::ReserveSequences(uint64_t through) {
  std::string record;
  AppendRecord(kSequenceRecord, &record, [&](std::string& to) { to += SequenceBytes(through); });
  absl::Status st = AppendGraphRecord(record);
  if (st.ok()) st = SyncGraph();
  if (!st.ok()) {
    // A restart could number batches as the server has others: it starts over instead.
    AbandonGraph();
    return absl::Status(st.code(), absl::StrCat("cannot reserve batch sequence numbers: ",
                                                st.message(), "; a restart starts a new graph"));
  }
  sequences_reserved_ = through;
  return absl::OkStatus();
}

absl::Status Spool::OpenSegment(uint64_t first_sequence) {
  auto segment = std::make_unique<Segment>();
  segment->first_sequence = first_sequence;
  segment->path = absl::StrFormat("%s/%s%020u%s", path_, kSegmentPrefix, first_sequence,
                                  kSegmentSuffix);
  segment->fd = open(segment->path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (segment->fd < 0) return ErrnoError("cannot create", segment->path, errno);
  absl::Status st = AppendDurably(segment->fd, 0, std::string_view(kMagic, sizeof kMagic),
                                  segment->path);
  if (!st.ok()) {
    close(segment->fd);
    unlink(segment->path.c_str());
    return st;
  }
  SyncDirectory(path_);
  segment->bytes = sizeof kMagic;
  segments_.push_back(std::move(segment));
  append_to_last_ = true;
  return absl::OkStatus();
}

absl::Status Spool::Append(const v1::SampleBatch& batch) {
  Slot slot;
  slot.entry = {batch.sequence(), batch.epoch(), 0};  // samples counted if ever needed
  absl::Status st;
  absl::Status reserved;
  if (!path_.empty() && !graph_abandoned_ && batch.sequence() > sequences_reserved_) {
    reserved = ReserveSequences(batch.sequence() + kSequenceBlock - 1);
  }
  if (!path_.empty()) {
    if (!append_to_last_ || segments_.back()->bytes >= options_.segment_bytes) {
      // The segment left behind is synced now: only the one taking appends waits.
      if (unsynced_segment_ != nullptr) st = SyncAll();
      if (st.ok()) st = OpenSegment(batch.sequence());
    }
    if (st.ok()) {
      Segment* segment = segments_.back().get();
      // An acknowledgement not yet on disk goes in the same write, ahead of the batch.
      const uint64_t acked = acked_through_;
      std::string records;
      if (acked > acked_recorded_) {
        AppendRecord(kAckRecord, &records, [&](std::string& to) { to += SequenceBytes(acked); });
      }
      const size_t ack_bytes = records.size();
      AppendRecord(kBatchRecord, batch, &records);
      st = WriteAll(segment->fd, records, segment->path);
      if (st.ok()) {
        acked_recorded_ = std::max(acked_recorded_, acked);
        slot.segment = segment;
        slot.offset = segment->bytes + ack_bytes;
        slot.length = static_cast<uint32_t>(records.size() - ack_bytes);
        segment->bytes += records.size();
        ++segment->live;
        unsynced_segment_ = segment;
        slot.unsynced_since = absl::Now();
        Written(slot.unsynced_since);
      } else {
        (void)ftruncate(segment->fd, static_cast<off_t>(segment->bytes));
        (void)lseek(segment->fd, static_cast<off_t>(segment->bytes), SEEK_SET);
      }
    }
    if (!st.ok()) ++stats_.write_errors;
  }
  if (slot.segment == nullptr) {
    slot.memory = std::make_shared<const std::string>(batch.SerializeAsString());
  }
  entries_.push_back(std::move(slot));
  EnforceBounds();
  return st.ok() ? reserved : st;
}

absl::StatusOr<v1::SampleBatch> Spool::Read(size_t i) const { return ReadSlot(entries_[i]); }

uint64_t Spool::CountSlotSamples(Slot& slot) {
  if (!slot.counted) {
    absl::StatusOr<v1::SampleBatch> batch = ReadSlot(slot);
    slot.entry.samples = batch.ok() ? SamplesOf(*batch) : 0;
    slot.counted = true;
  }
  return slot.entry.samples;
}

absl::StatusOr<v1::SampleBatch> Spool::ReadSlot(const Slot& slot) const {
  v1::SampleBatch batch;
  if (slot.segment == nullptr) {
    if (!batch.ParseFromString(*slot.memory)) return absl::DataLossError("unparsable batch");
    return batch;
  }
  std::string record(slot.length, '\0');
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = pread(slot.segment->fd, record.data() + done, record.size() - done,
                            static_cast<off_t>(slot.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoError("cannot read", slot.segment->path, n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
  }
  uint64_t corrupt = 0, good_end = 0;
  // Re-checked on the way out: the disk may have changed under us since.
  std::string framed(kMagic, sizeof kMagic);
  framed += record;
  std::vector<Record> records = ParseRecords(framed, &corrupt, &good_end);
  if (records.size() != 1 || records[0].type != kBatchRecord ||
      !batch.ParseFromString(std::string(records[0].payload))) {
    return absl::DataLossError(absl::StrCat("corrupt batch record in ", slot.segment->path,
                                            " at offset ", slot.offset));
  }
  return batch;
}

void Spool::DropSegment(Segment* segment, bool count_as_dropped) {
  if (segment == unsynced_segment_) unsynced_segment_ = nullptr;
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->segment != segment) {
      ++it;
      continue;
    }
    if (count_as_dropped) {
      ++stats_.batches_dropped;
      stats_.samples_dropped += CountSlotSamples(*it);
    }
    it = entries_.erase(it);
  }
  if (segment->fd >= 0) close(segment->fd);
  std::error_code ec;
  fs::remove(segment->path, ec);
  const bool last = !segments_.empty() && segments_.back().get() == segment;
  if (last) append_to_last_ = false;
  segments_.erase(std::find_if(segments_.begin(), segments_.end(),
                               [segment](const auto& s) { return s.get() == segment; }));
}

void Spool::EnforceBounds() {
  // Batches held in memory (no directory, or the disk refused them): the oldest go first.
  size_t in_memory = 0;
  for (const Slot& s : entries_) in_memory += s.segment == nullptr;
  for (auto it = entries_.begin();
       in_memory > options_.max_memory_batches && it != entries_.end();) {
    if (it->segment != nullptr) {
      ++it;
      continue;
    }
    ++stats_.batches_dropped;
    stats_.samples_dropped += CountSlotSamples(*it);
    it = entries_.erase(it);
    --in_memory;
  }
  // On disk: whole segments, oldest first.
  while (!segments_.empty() && stats().bytes > options_.max_bytes) {
    DropSegment(segments_.front().get(), true);
  }
}

void Spool::WriteAckedFile() {
  if (acked_fd_ < 0) {
    const std::string path = path_ + "/" + kAckedFile;
    acked_fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
  }
  if (acked_fd_ < 0) return;
  std::string record = SequenceBytes(acked_through_);
  record.resize(12);
  PutU32(base::Crc32c(std::string_view(record).substr(0, 8)), record.data() + 8);
  // The whole file is this record: a longer one (damaged, or left by something else)
  // reads as no acknowledgement at all, and every acknowledged batch came back.
  // (Once cut to one record, later writes of the same size keep it so.)
  if (pwrite(acked_fd_, record.data(), 12, 0) == 12) {
    acked_recorded_ = acked_through_;
    if (!acked_file_cut_) acked_file_cut_ = ftruncate(acked_fd_, 12) == 0;
  }
}

void Spool::AckThrough(uint64_t sequence) {
  // Recorded with the next batch's write, or when the spool closes (WriteAckedFile).
  if (!path_.empty()) acked_through_ = std::max(acked_through_, sequence);
  DropThrough(sequence);
  // What is not synced yet is the server's now, but for batches still unacknowledged: those
  // are due a delay after the oldest of them was written. (An acknowledgement read after the
  // next batch was written leaves that one's delay to run.)
  if (sync_due_ == absl::InfiniteFuture()) return;
  absl::Time oldest = absl::InfiniteFuture();
  for (auto it = entries_.rbegin(); it != entries_.rend() && !SyncedOnDisk(*it); ++it) {
    oldest = std::min(oldest, it->unsynced_since);
  }
  if (oldest == absl::InfiniteFuture()) {
    NothingToSync();
  } else {
    sync_due_ = oldest + options_.sync_delay;
  }
}

void Spool::DropThrough(uint64_t sequence) {
  while (!entries_.empty() && entries_.front().entry.sequence <= sequence) {
    if (entries_.front().segment != nullptr) --entries_.front().segment->live;
    entries_.pop_front();
  }
  for (size_t i = 0; i < segments_.size();) {
    const size_t before = segments_.size();
    DropIfAcknowledged(segments_[i].get());
    if (segments_.size() == before) ++i;
  }
}

void Spool::DropIfAcknowledged(Segment* segment) {
  if (segment->live > 0) return;
  if (append_to_last_ && segment == segments_.back().get()) return;
  DropSegment(segment, false);
}

void Spool::Written(absl::Time when) {
  if (sync_due_ == absl::InfiniteFuture()) sync_due_ = when + options_.sync_delay;
}

void Spool::NothingToSync() {
  // (The graph may still need syncing: the server is not sent graph a restart would lose.)
  sync_due_ = absl::InfiniteFuture();
  unsynced_segment_ = nullptr;
}

absl::Status Spool::SyncAll() {
  // The graph first: a synced batch must find its graph after a power loss.
  if (absl::Status st = SyncGraph(); !st.ok()) return st;
  if (unsynced_segment_ != nullptr && fdatasync(unsynced_segment_->fd) != 0) {
    return ErrnoError("cannot sync", unsynced_segment_->path, errno);
  }
  // The writes not synced before are the newest (batches kept in memory among them).
  for (auto it = entries_.rbegin(); it != entries_.rend() && !SyncedOnDisk(*it); ++it) {
    it->unsynced_since = absl::InfiniteFuture();
  }
  NothingToSync();
  return absl::OkStatus();
}

absl::Status Spool::SyncIfDue(absl::Time now) {
  if (now < sync_due_) return absl::OkStatus();
  absl::Status st = SyncAll();
  // Tried again at the next write rather than at every call.
  if (!st.ok()) sync_due_ = absl::InfiniteFuture();
  return st;
}

void Spool::Remove(uint64_t sequence) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->entry.sequence != sequence) continue;
    Segment* segment = it->segment;
    entries_.erase(it);
    if (segment != nullptr && --segment->live == 0) DropIfAcknowledged(segment);
    if (entries_.empty()) NothingToSync();
    return;
  }
}

SpoolStats Spool::stats() const {
  SpoolStats s = stats_;
  s.batches = entries_.size();
  s.bytes = path_.empty() ? 0 : graph_bytes_;
  for (const auto& segment : segments_) s.bytes += segment->bytes;
  return s;
}

}  // namespace strata::agent::spool
