// FDO profiles from production samples: the leaf addresses of a service's continuous CPU
// profile (what an IP-sampling `perf record` gives AutoFDO's create_llvm_prof), resolved with
// the modules' DWARF, written as an LLVM sample profile in its text format, which
// `llvm-profdata merge --sample` reads and `clang -fprofile-sample-use` compiles with.
//
// Per out-of-line function (by linkage name): total samples, and body samples per line offset
// from the function's declaration line; code inlined at a call site is a nested record under
// the call site's line offset, with offsets from the inlined function's own declaration line.
// Samples in PLT stubs ("f@plt") count as head samples of their target f: the call was into f.
// Addresses without DWARF are left out (they have no lines to count).
#ifndef STRATA_SERVER_QUERY_FDO_H_
#define STRATA_SERVER_QUERY_FDO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/query/lines.h"
#include "server/store/store.h"
#include "server/symbolize/symbolizer.h"

namespace strata::server::query {

struct LlvmSampleProfile {
  std::string text;
  uint64_t samples = 0;     // samples written (with DWARF, or PLT)
  uint64_t unresolved = 0;  // samples left out: no DWARF for their module
  uint64_t functions = 0;   // top-level function records
};

// `functions` gives the records of the addresses' functions.
absl::StatusOr<LlvmSampleProfile> EncodeLlvmSampleProfile(FunctionLookup* functions,
                                                         symbolize::Symbolizer* symbolizer,
                                                         const LeafAddressCounts& addresses);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_FDO_H_
