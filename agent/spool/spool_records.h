// agent/spool's file format: the records its segments and graph log hold (a u32 length, a
// u32 CRC32C of the type byte and payload, a u8 type, the payload), behind an 8-byte magic;
// how they are appended and parsed. Internal to the spool (spool.cc and its tests).
#ifndef STRATA_AGENT_SPOOL_SPOOL_RECORDS_H_
#define STRATA_AGENT_SPOOL_SPOOL_RECORDS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/crc32c.h"
#include "google/protobuf/message_lite.h"

namespace strata::agent::spool::records {

inline constexpr char kMagic[8] = {'S', 'T', 'R', 'S', 'P', 'L', '1', '\n'};
inline constexpr size_t kRecordHeader = 9;  // u32 length, u32 crc32c, u8 type
inline constexpr uint32_t kMaxRecordBytes = 64u << 20;

// An ack record (in a segment): the server has every batch up to its u64 sequence. A sequence
// record (in the graph log): batches may be numbered up to its u64 sequence.
enum RecordType : uint8_t {
  kHelloRecord = 1,
  kGraphRecord = 2,
  kBatchRecord = 3,
  kAckRecord = 4,
  kSequenceRecord = 5,
};

inline void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(v >> (8 * i));
}
inline uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}
// A batch sequence number as the acked file and ack records hold it: 8 bytes, little-endian.
inline std::string SequenceBytes(uint64_t sequence) {
  std::string out(8, '\0');
  PutU32(static_cast<uint32_t>(sequence), out.data());
  PutU32(static_cast<uint32_t>(sequence >> 32), out.data() + 4);
  return out;
}
inline uint64_t SequenceOf(const char* bytes) {
  return uint64_t{GetU32(bytes)} | uint64_t{GetU32(bytes + 4)} << 32;
}

// The checksum covers the type byte and the payload.
inline uint32_t RecordCrc(uint8_t type, std::string_view payload) {
  const char t = static_cast<char>(type);
  return base::Crc32c(payload, base::Crc32c(std::string_view(&t, 1)));
}

// Appends one record to `out` (several records can go out in one write): room for its
// header, the payload `append_payload` appends behind it (a message serializes itself there,
// not into a string of its own first), then the header.
template <typename AppendPayload>
void AppendRecord(uint8_t type, std::string* out, AppendPayload append_payload) {
  const size_t start = out->size();
  out->resize(start + kRecordHeader);
  append_payload(*out);
  const std::string_view payload = std::string_view(*out).substr(start + kRecordHeader);
  char* header = out->data() + start;
  PutU32(static_cast<uint32_t>(payload.size()), header);
  PutU32(RecordCrc(type, payload), header + 4);
  header[8] = static_cast<char>(type);
}
inline void AppendRecord(uint8_t type, const google::protobuf::MessageLite& message,
                         std::string* out) {
  AppendRecord(type, out, [&](std::string& to) { message.AppendToString(&to); });
}

struct Record {
  uint8_t type = 0;
  uint64_t offset = 0;  // of the record's header in the file
  std::string_view payload;
};

// The whole records of a file's contents. `*corrupt` counts each record failing its
// checksum (skipped: its length leads to the next) and a torn tail or an impossible length
// (the rest of the file after it is not trusted); `*good_end` is where the last whole record
// ends.
std::vector<Record> ParseRecords(std::string_view data, uint64_t* corrupt, uint64_t* good_end);

}  // namespace strata::agent::spool::records

#endif  // STRATA_AGENT_SPOOL_SPOOL_RECORDS_H_
