// Fuzz target: the server's conversion of an OTLP profiles Export request
// (server/otlp/otlp_convert.h ConvertRequest), what any client holding the agent role may send.
//
// Input: the request's protobuf bytes. Oracles besides the sanitizers: a request is refused
// with an error or converted into a result whose indexes all point inside it, whose stacks
// have one call site per frame but the leaf or none (and then not all unknown), whose cells
// add up to its sample count and whose leaf lines are Python or Java lines of a function of
// the request.
#include <cstdint>
#include <string>

#include "common/base/frame_kind.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "server/ingest/limits.h"
#include "server/otlp/otlp_convert.h"

namespace {

namespace otlp = strata::server::otlp;
constexpr int64_t kNowMs = 1'800'000'000'000;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // parse errors of mutated inputs are expected
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  otlp::otlp_v1::ExportProfilesServiceRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  const strata::server::ingest::IngestLimits limits;
  absl::StatusOr<otlp::ConvertedRequest> r = otlp::ConvertRequest(request, limits, "", kNowMs);
  if (!r.ok()) {
    STRATA_FUZZ_CHECK(!r.status().message().empty(), "an error without a message");
    return 0;
  }
  for (const otlp::ConvertedStack& stack : r->stacks) {
    STRATA_FUZZ_CHECK(!stack.functions.empty(), "a stack without frames");
    for (uint32_t f : stack.functions) {
      STRATA_FUZZ_CHECK(f < r->functions.size(), "function %u of %zu", f, r->functions.size());
    }
    STRATA_FUZZ_CHECK(stack.call_sites.empty() ||
                          stack.call_sites.size() + 1 == stack.functions.size(),
                      "%zu call sites for %zu frames", stack.call_sites.size(),
                      stack.functions.size());
    bool known = stack.call_sites.empty();
    for (uint64_t site : stack.call_sites) known |= site != 0;
    STRATA_FUZZ_CHECK(known, "call sites kept with none known");
  }
  uint64_t samples = 0;
  for (const otlp::ConvertedCell& cell : r->cells) {
    STRATA_FUZZ_CHECK(cell.stack < r->stacks.size(), "stack %u of %zu", cell.stack,
                      r->stacks.size());
    STRATA_FUZZ_CHECK(cell.count > 0, "a cell without samples");
    samples += cell.count;
  }
  STRATA_FUZZ_CHECK(samples == r->samples, "cells add up to %llu, not %llu",
                    static_cast<unsigned long long>(samples),
                    static_cast<unsigned long long>(r->samples));
  for (const otlp::ConvertedLeafLine& l : r->leaf_lines) {
    STRATA_FUZZ_CHECK(l.function < r->functions.size(), "leaf line of function %u of %zu",
                      l.function, r->functions.size());
    STRATA_FUZZ_CHECK(l.line > 0 && l.count > 0, "leaf line %u with %llu samples", l.line,
                      static_cast<unsigned long long>(l.count));
    const std::string& module = r->functions[l.function].module;
    STRATA_FUZZ_CHECK(strata::base::OffsetsAreLines(strata::base::FrameKindOf(module)),
                      "a leaf line of %s", module.c_str());
  }
  return 0;
}
