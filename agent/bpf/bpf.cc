#include "agent/bpf/bpf.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace strata::agent::bpf {
namespace {

long Bpf(int command, bpf_attr* attr) {
  return syscall(__NR_bpf, command, attr, sizeof(*attr));
}

absl::Status ErrnoStatus(int error, std::string_view what) {
  std::string message = absl::StrCat(std::string(what), ": ", std::strerror(error));
  if (error == EPERM || error == EACCES) return absl::PermissionDeniedError(message);
  if (error == ENOSYS || error == EINVAL || error == EOPNOTSUPP) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

void CopyName(std::string_view name, char (&out)[BPF_OBJ_NAME_LEN]) {
  const size_t n = std::min(name.size(), sizeof(out) - 1);
  std::memcpy(out, name.data(), n);
  out[n] = '\0';
}

uint64_t Pointer(const void* p) { return reinterpret_cast<uintptr_t>(p); }

}  // namespace

void LoadMap(std::vector<Insn>& program, uint8_t dst, int map_fd) {
  program.push_back({BPF_LD | BPF_DW | BPF_IMM, dst, BPF_PSEUDO_MAP_FD, 0, map_fd});
  program.push_back({0, 0, 0, 0, 0});
}

std::vector<Insn> ProgramBuilder::Build() && {
  for (const Fixup& f : fixups_) {
    const size_t target = targets_[f.label];
    if (target == kUnbound) return {};
    const int64_t off = static_cast<int64_t>(target) - static_cast<int64_t>(f.at) - 1;
    if (off < INT16_MIN || off > INT16_MAX) return {};
    program_[f.at].off = static_cast<int16_t>(off);
  }
  return std::move(program_);
}

absl::StatusOr<base::UniqueFd> CreateMap(bpf_map_type type, uint32_t key_size,
                                         uint32_t value_size, uint32_t max_entries,
                                         std::string_view name) {
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.map_type = type;
  attr.key_size = key_size;
  attr.value_size = value_size;
  attr.max_entries = max_entries;
  CopyName(name, attr.map_name);
  const long fd = Bpf(BPF_MAP_CREATE, &attr);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("bpf map ", std::string(name)));
  return base::UniqueFd(static_cast<int>(fd));
}

absl::Status UpdateElement(int map_fd, const void* key, const void* value) {
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.map_fd = static_cast<uint32_t>(map_fd);
  attr.key = Pointer(key);
  attr.value = Pointer(value);
  attr.flags = BPF_ANY;
  if (Bpf(BPF_MAP_UPDATE_ELEM, &attr) != 0) return ErrnoStatus(errno, "bpf map update");
  return absl::OkStatus();
}

absl::Status DeleteElement(int map_fd, const void* key) {
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.map_fd = static_cast<uint32_t>(map_fd);
  attr.key = Pointer(key);
  if (Bpf(BPF_MAP_DELETE_ELEM, &attr) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, "bpf map delete");
  }
  return absl::OkStatus();
}

absl::Status LookupElement(int map_fd, const void* key, void* value) {
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.map_fd = static_cast<uint32_t>(map_fd);
  attr.key = Pointer(key);
  attr.value = Pointer(value);
  if (Bpf(BPF_MAP_LOOKUP_ELEM, &attr) == 0) return absl::OkStatus();
  if (errno == ENOENT) return absl::NotFoundError("bpf map: no such key");
  return ErrnoStatus(errno, "bpf map lookup");
}

absl::StatusOr<base::UniqueFd> LoadProgram(bpf_prog_type type, std::span<const Insn> program,
                                           std::string_view name, uint32_t flags) {
  static constexpr char kLicense[] = "GPL";
  std::string log(64 * 1024, '\0');
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.prog_type = type;
  attr.insns = Pointer(program.data());
  attr.insn_cnt = static_cast<uint32_t>(program.size());
  attr.license = Pointer(kLicense);
  attr.prog_flags = flags;
  CopyName(name, attr.prog_name);
  long fd = Bpf(BPF_PROG_LOAD, &attr);
  if (fd >= 0) return base::UniqueFd(static_cast<int>(fd));
  const int error = errno;
  if (error == EPERM || error == ENOSYS) return ErrnoStatus(error, "bpf program");
  // Again with the verifier's log, for the error.
  attr.log_buf = Pointer(log.data());
  attr.log_size = static_cast<uint32_t>(log.size());
  attr.log_level = 1;
  fd = Bpf(BPF_PROG_LOAD, &attr);
  if (fd >= 0) return base::UniqueFd(static_cast<int>(fd));
  log.resize(strnlen(log.data(), log.size()));
  // The end of the log says why.
  if (log.size() > 2000) log = "..." + log.substr(log.size() - 2000);
  return absl::InvalidArgumentError(
      absl::StrCat("bpf program ", std::string(name), " refused: ", std::strerror(errno), "\n", log));
}

absl::StatusOr<ProgramRuns> RunsOf(int program_fd) {
  bpf_prog_info info;
  std::memset(&info, 0, sizeof(info));
  bpf_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.info.bpf_fd = static_cast<uint32_t>(program_fd);
  attr.info.info_len = sizeof(info);
  attr.info.info = Pointer(&info);
  if (Bpf(BPF_OBJ_GET_INFO_BY_FD, &attr) != 0) return ErrnoStatus(errno, "bpf program info");
  return ProgramRuns{info.run_cnt, info.run_time_ns};
}

absl::StatusOr<RingReader> RingReader::Map(int map_fd, uint32_t data_bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* consumer = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, map_fd, 0);
  if (consumer == MAP_FAILED) return ErrnoStatus(errno, "mmap of a bpf ring's consumer page");
  // The producer page, then the data mapped twice in a row: a record that wraps is contiguous.
  void* producer = mmap(nullptr, page + 2 * size_t{data_bytes}, PROT_READ, MAP_SHARED, map_fd,
                        static_cast<off_t>(page));
  if (producer == MAP_FAILED) {
    const int error = errno;
    munmap(consumer, page);
    return ErrnoStatus(error, "mmap of a bpf ring's data");
  }
  RingReader reader(static_cast<uint8_t*>(consumer), static_cast<uint8_t*>(producer),
                    data_bytes, page);
  reader.read_ = std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(consumer))
                     .load(std::memory_order_acquire);
  return reader;
}

RingReader::RingReader(RingReader&& other) noexcept
    : consumer_(std::exchange(other.consumer_, nullptr)),
      producer_(std::exchange(other.producer_, nullptr)),
      data_bytes_(other.data_bytes_),
      page_(other.page_),
      read_(other.read_) {}

RingReader::~RingReader() {
  if (consumer_ != nullptr) munmap(consumer_, page_);
  if (producer_ != nullptr) munmap(producer_, page_ + 2 * size_t{data_bytes_});
}

bool RingReader::Next(std::span<const uint8_t>* record, uint64_t* position) {
  const uint64_t produced =
      std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(producer_))
          .load(std::memory_order_acquire);
  while (read_ < produced) {
    const uint8_t* header = producer_ + page_ + (read_ & (data_bytes_ - 1));
    const uint32_t length = std::atomic_ref<uint32_t>(*const_cast<uint32_t*>(
                                reinterpret_cast<const uint32_t*>(header)))
                                .load(std::memory_order_acquire);
    if (length & BPF_RINGBUF_BUSY_BIT) return false;  // reserved, not committed yet
    const uint32_t size = length & ~(BPF_RINGBUF_BUSY_BIT | BPF_RINGBUF_DISCARD_BIT);
    const uint64_t at = read_;
    read_ += (size + BPF_RINGBUF_HDR_SZ + 7) & ~uint64_t{7};
    if (length & BPF_RINGBUF_DISCARD_BIT) continue;
    *record = {header + BPF_RINGBUF_HDR_SZ, size};
    *position = at;
    return true;
  }
  return false;
}

void RingReader::Release(uint64_t position) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(consumer_))
      .store(std::min(position, read_), std::memory_order_release);
}

}  // namespace strata::agent::bpf
