// Workload of source_lines_test: the innermost always-inline helper lives in this header, so
// frames of inlined code name another file than the function they were inlined into.
#ifndef STRATA_SERVER_SYMBOLIZE_TESTDATA_INLINE_WORKLOAD_H_
#define STRATA_SERVER_SYMBOLIZE_TESTDATA_INLINE_WORKLOAD_H_

namespace strata_inline_workload {

__attribute__((always_inline)) inline unsigned HeaderLeaf(volatile unsigned* sink, unsigned x) {
  const unsigned h = x * 2654435761u;
  *sink = h;
  return h ^ (h >> 13);
}

}  // namespace strata_inline_workload

#endif  // STRATA_SERVER_SYMBOLIZE_TESTDATA_INLINE_WORKLOAD_H_
