#include "agent/sampler/cpu_filter.h"

#include <linux/bpf.h>
#include <sys/stat.h>

#include <cstddef>
#include <utility>
#include <vector>

namespace strata::agent::sampler {
namespace {

// The control array's one value: samples dropped, and whether every sample passes.
struct Control {
  uint64_t dropped;
  uint64_t pass;
};

// The kernel's inode of the initial pid namespace (PROC_PID_INIT_INO).
constexpr ino_t kInitPidNamespaceInode = 0xEFFFFFFCu;

constexpr int16_t kPidSlot = -4, kZeroSlot = -8;

std::vector<bpf::Insn> FilterProgram(int targets, int control, int chain) {
  using namespace bpf;  // NOLINT: the instruction builders
  ProgramBuilder b;
  const auto other = b.NewLabel(), write = b.NewLabel();
  b.Add(MovReg(kR6, kR1));  // the context, for the tail call
  b.Add(Call(BPF_FUNC_get_current_pid_tgid));
  b.Add(AluImm(BPF_RSH, kR0, 32));
  b.Add(Store(BPF_W, kFp, kR0, kPidSlot));
  b.AddMap(kR1, targets);
  b.Add(MovReg(kR2, kFp));
  b.Add(AluImm(BPF_ADD, kR2, kPidSlot));
  b.Add(Call(BPF_FUNC_map_lookup_elem));
  b.AddJump(JumpImm(BPF_JEQ, kR0, 0, 0), other);
  // A target: the chained program decides (a tail call does not return); without one, write.
  b.Bind(write);
  b.Add(MovReg(kR1, kR6));
  b.AddMap(kR2, chain);
  b.Add(MovImm(kR3, 0));
  b.Add(Call(BPF_FUNC_tail_call));
  b.Add(MovImm(kR0, 1));
  b.Add(Exit());
  // Another process: dropped and counted, unless every sample passes.
  b.Bind(other);
  b.Add(StoreImm(BPF_W, kFp, kZeroSlot, 0));
  b.AddMap(kR1, control);
  b.Add(MovReg(kR2, kFp));
  b.Add(AluImm(BPF_ADD, kR2, kZeroSlot));
  b.Add(Call(BPF_FUNC_map_lookup_elem));
  const auto drop = b.NewLabel();
  b.AddJump(JumpImm(BPF_JEQ, kR0, 0, 0), drop);
  b.Add(Load(BPF_DW, kR1, kR0, static_cast<int16_t>(offsetof(Control, pass))));
  b.AddJump(JumpImm(BPF_JNE, kR1, 0, 0), write);
  b.Add(MovImm(kR1, 1));
  b.Add({BPF_STX | BPF_ATOMIC | BPF_DW, kR0, kR1,
         static_cast<int16_t>(offsetof(Control, dropped)), BPF_ADD});
  b.Bind(drop);
  b.Add(MovImm(kR0, 0));
  b.Add(Exit());
  return std::move(b).Build();
}

}  // namespace

bool InInitialPidNamespace() {
  struct stat st;
  return stat("/proc/self/ns/pid", &st) == 0 && st.st_ino == kInitPidNamespaceInode;
}

absl::StatusOr<std::unique_ptr<CpuSampleFilter>> CpuSampleFilter::Create() {
  if (!InInitialPidNamespace()) {
    return absl::UnavailableError("the agent does not run in the host's pid namespace");
  }
  absl::StatusOr<base::UniqueFd> targets = bpf::CreateMap(
      BPF_MAP_TYPE_HASH, sizeof(uint32_t), sizeof(uint32_t), kMaxTargets, "cpu_targets");
  if (!targets.ok()) return targets.status();
  absl::StatusOr<base::UniqueFd> control =
      bpf::CreateMap(BPF_MAP_TYPE_ARRAY, sizeof(uint32_t), sizeof(Control), 1, "cpu_filter");
  if (!control.ok()) return control.status();
  absl::StatusOr<base::UniqueFd> chain = bpf::CreateMap(
      BPF_MAP_TYPE_PROG_ARRAY, sizeof(uint32_t), sizeof(uint32_t), 1, "cpu_chain");
  if (!chain.ok()) return chain.status();
  const std::vector<bpf::Insn> program =
      FilterProgram(targets->get(), control->get(), chain->get());
  if (program.empty()) return absl::InternalError("cpu sample filter: program not built");
  absl::StatusOr<base::UniqueFd> loaded =
      bpf::LoadProgram(BPF_PROG_TYPE_PERF_EVENT, program, "cpu_filter");
  if (!loaded.ok()) return loaded.status();
  return std::unique_ptr<CpuSampleFilter>(new CpuSampleFilter(
      std::move(*targets), std::move(*control), std::move(*chain), std::move(*loaded)));
}

absl::Status CpuSampleFilter::SetTarget(pid_t pid, bool sampled) {
  const uint32_t key = static_cast<uint32_t>(pid);
  if (!sampled) return bpf::DeleteElement(targets_.get(), &key);
  const uint32_t one = 1;
  absl::Status status = bpf::UpdateElement(targets_.get(), &key, &one);
  if (!status.ok()) (void)Pass();
  return status;
}

absl::Status CpuSampleFilter::Chain(int program_fd) {
  const uint32_t key = 0;
  if (program_fd < 0) return bpf::DeleteElement(chain_.get(), &key);
  const uint32_t fd = static_cast<uint32_t>(program_fd);
  return bpf::UpdateElement(chain_.get(), &key, &fd);
}

absl::Status CpuSampleFilter::Pass() {
  const uint32_t key = 0;
  Control control{dropped(), 1};
  absl::Status status = bpf::UpdateElement(control_.get(), &key, &control);
  if (status.ok()) passing_ = true;
  return status;
}

uint64_t CpuSampleFilter::dropped() const {
  const uint32_t key = 0;
  Control control{};
  return bpf::LookupElement(control_.get(), &key, &control).ok() ? control.dropped : 0;
}

}  // namespace strata::agent::sampler
