// Compares an unwound stack with the shadow-stack ground truth the test workloads keep
// (tests/mips64/programs/shadow_defs.h): symbol name -> function id, and the frame-by-frame
// match shared by the recorded-stack test and the in-process sampler accuracy test
// (tests/mips64/inproc).
#ifndef STRATA_COMMON_UNWIND_MIPS64_TRUTH_MATCH_H_
#define STRATA_COMMON_UNWIND_MIPS64_TRUTH_MATCH_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string_view>
#include <vector>

#include "common/unwind/unwind_types.h"

namespace strata::unwind::mips64 {

// Same order as the enum in tests/mips64/programs/shadow_defs.h.
inline constexpr const char* kWorkloadNames[] = {
    "main",      "work",        "leaf",           "recurse",   "use_alloca",
    "big_frame", "tail_caller", "tail_target",    "qsort_cmp", "sorter",
    "epilogue_heavy", "lib_entry", "lib_leaf", "lib_callback", "thread_main"};
inline constexpr int kMainId = 0;
inline constexpr int kThreadMainId = 14;

// Function id of a symbol name (GCC clones such as "leaf.constprop.0" count as "leaf"), or -1.
inline int IdOf(std::string_view name) {
  if (auto dot = name.find('.'); dot != std::string_view::npos) name = name.substr(0, dot);
  for (int i = 0; i < static_cast<int>(std::size(kWorkloadNames)); ++i) {
    if (name == kWorkloadNames[i]) return i;
  }
  return -1;
}

struct SampleMatch {
  std::vector<int> got;    // instrumented frames unwound, innermost first
  std::vector<int> truth;  // expected, innermost first
  size_t correct = 0;
  size_t lost = 0;         // truth frames that were tail-called away (not expected)
  bool transition = false; // leaf in a prologue/epilogue, outside its shadow push/pop
  bool exact = false;
};

// `id_of(pc)` maps an absolute pc to a function id (-1: not instrumented). `ids`/`tail`: the
// shadow stack at sample time, outermost first. Return addresses are looked up at pc - 4 (the
// call, on both architectures the call instruction lies before it).
template <typename IdOf>
SampleMatch MatchSample(const Frame* frames, size_t n, const std::vector<int>& ids,
                        const std::vector<bool>& tail_in, IdOf&& id_of) {
  SampleMatch m;
  int leaf_id = -1;
  for (size_t i = 0; i < n; ++i) {
    const int id = id_of(i == 0 ? frames[i].pc : frames[i].pc - 1);
    // The shadow-stack bookkeeping itself may call a runtime helper (__tls_get_addr for the
    // per-thread stack in a shared library): a sample there is in the caller's push/pop.
    if (i == 0 || (i == 1 && leaf_id < 0 && m.got.empty())) leaf_id = id;
    if (id >= 0) m.got.push_back(id);
    if (id == kMainId || id == kThreadMainId) break;  // the truth ends here
  }
  m.truth.assign(ids.rbegin(), ids.rend());
  std::vector<bool> tail(tail_in.rbegin(), tail_in.rend());
  // The leaf may be inside an instrumented function's prologue/epilogue, before its push or
  // after its pop: then the truth has it on top of the shadow stack. Recursion
  // (truth[0] == leaf_id) is ambiguous; only a chain one longer counts there.
  if (leaf_id >= 0 && !m.got.empty() && m.got[0] == leaf_id &&
      (m.truth.empty() || m.truth[0] != leaf_id || m.got.size() == m.truth.size() + 1)) {
    m.truth.insert(m.truth.begin(), leaf_id);
    tail.insert(tail.begin(), false);
    m.transition = true;
  }
  // Match, allowing tail-called-away frames to be missing (counted).
  size_t gi = 0;
  for (size_t k = 0; k < m.truth.size(); ++k) {
    if (gi < m.got.size() && m.got[gi] == m.truth[k]) {
      ++gi;
      ++m.correct;
    } else if (tail[k]) {
      ++m.lost;
    }
  }
  m.exact = m.correct + m.lost == m.truth.size() && gi == m.got.size();
  return m;
}

struct MatchTotals {
  size_t samples = 0, exact = 0, transition = 0, expected_frames = 0, correct_frames = 0,
         tail_lost = 0;
  void Add(const SampleMatch& m) {
    ++samples;
    exact += m.exact;
    transition += m.transition;
    expected_frames += m.truth.size() - m.lost;
    correct_frames += m.correct;
    tail_lost += m.lost;
  }
};

}  // namespace strata::unwind::mips64

#endif  // STRATA_COMMON_UNWIND_MIPS64_TRUTH_MATCH_H_
