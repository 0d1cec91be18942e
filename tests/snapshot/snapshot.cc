#include "tests/snapshot/snapshot.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/procfs/procfs.h"
#include "agent/sampler/perf_sampler.h"
#include "common/elf/elf_file.h"

namespace strata::snapshot {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'S', 'N', 'A', 'P', '1'};

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}
void PutString(std::string* out, const std::string& s) {
  Put<uint16_t>(out, static_cast<uint16_t>(std::min<size_t>(s.size(), 0xffff)));
  out->append(s.data(), std::min<size_t>(s.size(), 0xffff));
}

class Reader {
 public:
  explicit Reader(const std::string& data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - pos_ < sizeof *v) return false;
    std::memcpy(v, data_.data() + pos_, sizeof *v);
    pos_ += sizeof *v;
    return true;
  }
  bool GetBytes(size_t n, std::string* out) {
    if (data_.size() - pos_ < n) return false;
    out->assign(data_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool GetString(std::string* out) {
    uint16_t n;
    return Get(&n) && GetBytes(n, out);
  }
  bool done() const { return pos_ == data_.size(); }
  size_t pos() const { return pos_; }

 private:
  const std::string& data_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<RecordStats> Record(pid_t pid, const RecordOptions& options,
                                   const std::string& path) {
  auto sampler = agent::sampler::PerfSampler::Create();
  if (!sampler.ok()) return sampler.status();
  agent::sampler::SessionOptions session;
  session.frequency_hz = options.frequency_hz;
  session.stack_bytes = options.stack_bytes;
  session.ring_pages = 128;
  if (auto st = (*sampler)->AddSession(session); !st.ok()) return st;
  auto tids = agent::procfs::ListThreads(pid);
  if (!tids.ok()) return tids.status();
  if (auto st = (*sampler)->AttachProcess(0, pid, *tids); !st.ok()) return st;

  std::string out(kMagic, sizeof kMagic);
  RecordStats stats;
  absl::flat_hash_map<std::string, std::string> build_ids;  // path -> hex
  absl::flat_hash_set<pid_t> seen_threads(tids->begin(), tids->end());
  size_t maps_hash = 0;
  auto refresh_maps = [&]() {
    auto maps = agent::symbols::ReadProcMaps(pid);
    if (!maps.ok()) return;
    size_t hash = 0;
    for (const auto& m : *maps) hash = absl::HashOf(hash, m.start, m.end, m.offset, m.path);
    if (hash == maps_hash && stats.mapping_sets > 0) return;
    maps_hash = hash;
    std::vector<const agent::symbols::MappingInfo*> files;
    for (const auto& m : *maps) {
      if (!m.path.empty() && m.path[0] == '/') files.push_back(&m);
    }
    out.push_back('M');
    Put<uint32_t>(&out, static_cast<uint32_t>(files.size()));
    for (const agent::symbols::MappingInfo* m : files) {
      auto it = build_ids.find(m->path);
      if (it == build_ids.end()) {
        auto elf = elf::ElfFile::Open(m->path);
        it = build_ids.emplace(m->path, elf.ok() ? (*elf)->BuildIdHex() : "").first;
      }
      Put<uint64_t>(&out, m->start);
      Put<uint64_t>(&out, m->end);
      Put<uint64_t>(&out, m->offset);
      Put<uint64_t>(&out, m->inode);
      Put<uint8_t>(&out, m->exec ? 1 : 0);
      PutString(&out, m->path);
      PutString(&out, it->second);
    }
    ++stats.mapping_sets;
  };
  refresh_maps();
  const absl::Time end = absl::Now() + absl::Milliseconds(static_cast<int64_t>(options.seconds * 1000));
  while (absl::Now() < end) {
    auto ready = (*sampler)->Wait(absl::Milliseconds(20));
    if (!ready.ok()) return ready.status();
    (*sampler)->Drain([&](const agent::sampler::RawSample& s) {
      out.push_back('S');
      Put<uint32_t>(&out, s.tid);
      Put<uint64_t>(&out, s.time_ns);
      Put<uint64_t>(&out, s.pc);
      Put<uint64_t>(&out, s.sp);
      Put<uint64_t>(&out, s.fp);
      Put<uint64_t>(&out, s.ra);
      Put<uint32_t>(&out, static_cast<uint32_t>(s.stack_size));
      out.append(reinterpret_cast<const char*>(s.stack), s.stack_size);
      ++stats.samples;
    });
    // Mappings read after the drain: a dlopen seen here applies to the samples that follow.
    refresh_maps();
    auto now_tids = agent::procfs::ListThreads(pid);
    if (!now_tids.ok()) break;  // the process exited
    for (pid_t tid : *now_tids) {
      if (seen_threads.insert(tid).second) (void)(*sampler)->AttachNewThread(pid, tid);
    }
  }
  stats.threads = seen_threads.size();
  stats.lost = (*sampler)->stats().lost;
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(out.data(), static_cast<std::streamsize>(out.size()));
  if (!file.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  return stats;
}

absl::StatusOr<Snapshot> Load(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (data.size() < sizeof kMagic || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a snapshot file"));
  }
  Snapshot snap;
  Reader r(data);
  std::string magic;
  r.GetBytes(sizeof kMagic, &magic);
  auto corrupt = [&] {
    return absl::DataLossError(absl::StrCat(path, ": corrupt record at byte ", r.pos()));
  };
  while (!r.done()) {
    uint8_t type;
    if (!r.Get(&type)) return corrupt();
    if (type == 'M') {
      uint32_t count;
      if (!r.Get(&count) || count > 1000000) return corrupt();
      std::vector<Mapping> set;
      for (uint32_t i = 0; i < count; ++i) {
        Mapping m;
        uint8_t exec;
        if (!r.Get(&m.info.start) || !r.Get(&m.info.end) || !r.Get(&m.info.offset) ||
            !r.Get(&m.info.inode) || !r.Get(&exec) || !r.GetString(&m.info.path) ||
            !r.GetString(&m.build_id_hex)) {
          return corrupt();
        }
        m.info.exec = exec != 0;
        set.push_back(std::move(m));
      }
      snap.mapping_sets.push_back(std::move(set));
    } else if (type == 'S') {
      if (snap.mapping_sets.empty()) return corrupt();
      Sample s;
      uint32_t size;
      std::string bytes;
      if (!r.Get(&s.tid) || !r.Get(&s.time_ns) || !r.Get(&s.pc) || !r.Get(&s.sp) ||
          !r.Get(&s.fp) || !r.Get(&s.ra) || !r.Get(&size) || !r.GetBytes(size, &bytes)) {
        return corrupt();
      }
      s.stack.assign(bytes.begin(), bytes.end());
      s.mapping_set = snap.mapping_sets.size() - 1;
      snap.samples.push_back(std::move(s));
    } else {
      return corrupt();
    }
  }
  return snap;
}

}  // namespace strata::snapshot
