// Fuzz target: the packed_contexts decoder (common/encoding/packed_contexts.h), which the
// server runs on every SampleBatch's packed_contexts bytes from the network.
//
// Input: the packed bytes as they arrive. Oracles besides the sanitizers: a buffer the
// decoder accepts means the same (target, leaf, ids) -> count multiset after re-encoding in
// every layout version and decoding again, and the encoder accepts whatever the decoder
// produced (zero counts aside, which only the decoder tolerates).
#include <cstdint>
#include <map>
#include <string_view>
#include <tuple>
#include <vector>

#include "common/encoding/packed_contexts.h"
#include "fuzz/fuzz_util.h"

namespace {

using strata::encoding::ContextRecord;
using Meaning = std::map<std::tuple<uint32_t, uint32_t, std::vector<uint64_t>>, uint64_t>;

Meaning Sum(const std::vector<ContextRecord>& records) {
  Meaning m;
  for (const auto& r : records) m[{r.target_id, r.context.leaf, r.context.ids}] += r.count;
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace enc = strata::encoding;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto decoded = enc::DecodePackedContexts(bytes);
  if (!decoded.ok()) return 0;

  for (const ContextRecord& r : *decoded) {
    STRATA_FUZZ_CHECK(!r.context.ids.empty() && r.context.ids.size() <= enc::kMaxPackedIds,
                      "decoded context with %zu ids", r.context.ids.size());
    if (r.count == 0) return 0;  // the encoder refuses zero counts
  }
  const Meaning meaning = Sum(*decoded);
  for (uint8_t version : {enc::kPackedContextsVersion3, enc::kPackedContextsVersion2,
                          enc::kPackedContextsVersion1}) {
    auto encoded = enc::EncodePackedContexts(*decoded, version);
    STRATA_FUZZ_CHECK(encoded.ok(), "re-encoding (v%d) what was decoded failed: %s", version,
                      encoded.status().ToString().c_str());
    auto again = enc::DecodePackedContexts(*encoded);
    STRATA_FUZZ_CHECK(again.ok(), "decoding the re-encoded buffer (v%d) failed: %s", version,
                      again.status().ToString().c_str());
    STRATA_FUZZ_CHECK(Sum(*again) == meaning, "v%d round trip changed the contexts", version);
  }
  return 0;
}
