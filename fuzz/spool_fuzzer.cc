// Fuzz target: the agent's spool recovery (agent/spool/spool.h), which reads the segment
// files (batch and acknowledgement records), graph log and acknowledgement file a previous
// agent run left on the host's disk, restores the call graph from it (agent/core
// ContextGraph::Restore, as strata-agent does) and reads the recovered batches back.
//
// Input: files of one agent's spool directory, each: u8 tag, [u32 sequence for segments],
// u32 length, bytes. Tag bits 0-1: 0 graph.log, 1 acked, 2 and 3 a batches-<sequence>.log
// segment (named after its first batch that parses, as the agent names them, else after
// the u32); bit 7: the harness recomputes every record's CRC32C (and the acked file's) as an
// intact write would have left it, so mutations get past the checksums; without it the
// bytes are written as they are (torn and corrupt records). Little-endian framing.
//
// The harness then opens the spool (recovery), reads every recovered batch back, appends a
// batch, acknowledges half, removes one, closes and opens it again. Oracles besides the
// sanitizers: recovered entries are in increasing sequence order and each reads back as the
// batch of that sequence; a reopened spool holds exactly the batches that were neither
// acknowledged nor removed (a removed one may come back: Remove is not persistent).
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "agent/core/context_graph.h"
#include "agent/spool/spool.h"
#include "common/base/crc32c.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "strata/v1/ingest.pb.h"

namespace {

namespace agent = strata::agent;
namespace fs = std::filesystem;

constexpr std::string_view kMagic("STRSPL1\n", 8);

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}
void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

// [u32 length][u32 crc32c(type, payload)][u8 type][payload] records after the magic.
void FixRecordChecksums(std::string* file) {
  if (file->compare(0, kMagic.size(), kMagic) != 0) return;
  size_t pos = kMagic.size();
  while (file->size() - pos >= 9) {
    const uint32_t length = GetU32(file->data() + pos);
    if (length > file->size() - pos - 9) break;
    const char type = (*file)[pos + 8];
    const uint32_t crc = strata::base::Crc32c(std::string_view(file->data() + pos + 9, length),
                                              strata::base::Crc32c(std::string_view(&type, 1)));
    PutU32(file->data() + pos + 4, crc);
    pos += 9 + length;
  }
}

// The sequence of the first batch record that parses, if any: the agent names a segment
// after its first batch, and recovery orders segments by name. (A segment named out of
// order with its contents, which only renaming files by hand produces, makes a later
// recovery drop its batches as out of order: outside the spool's fault model.)
std::optional<uint64_t> FirstBatchSequence(const std::string& file) {
  if (file.compare(0, kMagic.size(), kMagic) != 0) return std::nullopt;
  size_t pos = kMagic.size();
  while (file.size() - pos >= 9) {
    const uint32_t length = GetU32(file.data() + pos);
    if (length > file.size() - pos - 9) break;
    strata::v1::SampleBatch batch;
    if (file[pos + 8] == 3 && batch.ParseFromArray(file.data() + pos + 9, length)) {
      return batch.sequence();
    }
    pos += 9 + length;
  }
  return std::nullopt;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  STRATA_FUZZ_CHECK(out.good(), "cannot write %s", path.c_str());
}

struct Opened {
  std::unique_ptr<agent::ContextGraph> graph;
  std::unique_ptr<agent::spool::Spool> spool;
  agent::spool::SpoolRecovery recovery;
};

Opened Open(const agent::spool::SpoolOptions& options, const agent::spool::SpoolIdentity& fresh) {
  Opened o;
  auto restore = [&o](const agent::spool::SpoolIdentity& resumed, const strata::v1::GraphDelta& delta) {
    if (o.graph == nullptr) o.graph = std::make_unique<agent::ContextGraph>(resumed.graph_id);
    return o.graph->Restore(delta);
  };
  auto spool = agent::spool::Spool::Open(options, fresh, restore, &o.recovery);
  if (spool.ok()) o.spool = std::move(*spool);
  return o;
}

std::vector<uint64_t> Sequences(const agent::spool::Spool& spool) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < spool.size(); ++i) out.push_back(spool.entry(i).sequence);
  return out;
}

}  // namespace

// Protobuf logs every string field that is not UTF-8; fuzz inputs are full of them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string root = strata::fuzz::ScratchDir() + "/spool";
  std::error_code ec;
  fs::remove_all(root, ec);
  const agent::spool::SpoolIdentity fresh{"fuzz-agent", "fuzz-host", 0x1234};
  const std::string dir = root + "/given/" + fresh.agent_id;
  fs::create_directories(dir);

  strata::fuzz::InputReader in(data, size);
  for (int files = 0; files < 16 && !in.empty(); ++files) {
    const uint8_t tag = in.U8();
    std::string name;
    switch (tag & 3) {
      case 0: name = "graph.log"; break;
      case 1: name = "acked"; break;
      default: name = "segment"; break;
    }
    const uint32_t sequence = (tag & 3) >= 2 ? in.U32() : 0;
    std::string bytes(in.Chunk());
    if (tag & 0x80) {
      if ((tag & 3) == 1) {
        if (bytes.size() == 12) PutU32(bytes.data() + 8, strata::base::Crc32c(bytes.substr(0, 8)));
      } else {
        FixRecordChecksums(&bytes);
      }
    }
    if ((tag & 3) >= 2) {
      name = absl::StrFormat("batches-%020u.log", FirstBatchSequence(bytes).value_or(sequence));
    }
    WriteFile(dir + "/" + name, bytes);
  }

  agent::spool::SpoolOptions options;
  options.dir = root;
  options.segment_bytes = 4096;  // appends open new segments now and then
  std::vector<uint64_t> expected;
  uint64_t removed = 0;
  {
    Opened o = Open(options, fresh);
    if (o.spool == nullptr) return 0;
    agent::spool::Spool& spool = *o.spool;
    uint64_t last = o.recovery.last_sequence;
    for (size_t i = 0; i < spool.size(); ++i) {
      const uint64_t seq = spool.entry(i).sequence;
      if (i > 0) {
        STRATA_FUZZ_CHECK(seq > spool.entry(i - 1).sequence, "entries out of order at %zu", i);
      }
      auto batch = spool.Read(i);
      STRATA_FUZZ_CHECK(batch.ok(), "recovered entry %zu (batch %llu) does not read back: %s", i,
                        static_cast<unsigned long long>(seq), batch.status().ToString().c_str());
      STRATA_FUZZ_CHECK(batch->sequence() == seq, "entry %zu reads back as batch %llu", i,
                        static_cast<unsigned long long>(batch->sequence()));
      last = std::max(last, seq);
    }
    (void)spool.stats();
    // Keep going as an agent would: one more batch, an acknowledgement, a refusal.
    if (last < UINT64_MAX) {
      strata::v1::SampleBatch batch;
      batch.set_sequence(last + 1);
      batch.set_start_ms(1'700'000'000'000);
      batch.set_end_ms(1'700'000'010'000);
      (void)spool.Append(batch);
    }
    if (spool.size() > 1) spool.AckThrough(spool.entry(spool.size() / 2 - 1).sequence);
    if (spool.size() > 1) {
      removed = spool.entry(spool.size() - 2).sequence;
      spool.Remove(removed);
    }
    expected = Sequences(spool);
  }
  Opened again = Open(options, fresh);
  STRATA_FUZZ_CHECK(again.spool != nullptr, "the spool does not open again");
  const std::vector<uint64_t> recovered = Sequences(*again.spool);
  // Remove() forgets a refused batch in memory only (its record stays in a segment that
  // holds others), so a restarted agent may offer it once more.
  std::vector<uint64_t> with_removed = expected;
  if (removed != 0) {
    with_removed.insert(std::lower_bound(with_removed.begin(), with_removed.end(), removed),
                        removed);
  }
  // Batches the reopened spool skipped are counted: records whose segment is named after a
  // later sequence than it holds (a damaged directory) are read after that sequence and
  // dropped as corrupt. Nothing goes missing uncounted, and nothing appears from nowhere.
  const uint64_t counted_lost = again.recovery.corrupt_records + again.recovery.orphaned_batches;
  if (counted_lost == 0) {
    STRATA_FUZZ_CHECK(recovered == expected || recovered == with_removed,
                      "reopened with %zu batches, %zu were left", recovered.size(),
                      expected.size());
  } else {
    size_t missing = 0;
    for (uint64_t seq : expected) {
      if (!std::binary_search(recovered.begin(), recovered.end(), seq)) ++missing;
    }
    STRATA_FUZZ_CHECK(std::includes(with_removed.begin(), with_removed.end(), recovered.begin(),
                                    recovered.end()),
                      "reopened with a batch that was not left");
    STRATA_FUZZ_CHECK(missing <= counted_lost, "%zu batches missing, %llu counted", missing,
                      static_cast<unsigned long long>(counted_lost));
  }
  return 0;
}
