#include "agent/spool/spool_records.h"

#include <cstring>

namespace strata::agent::spool::records {

std::vector<Record> ParseRecords(std::string_view data, uint64_t* corrupt, uint64_t* good_end) {
  std::vector<Record> records;
  *good_end = 0;
  if (data.size() < sizeof kMagic || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0) {
    if (!data.empty()) ++*corrupt;
    return records;
  }
  uint64_t pos = sizeof kMagic;
  *good_end = pos;
  while (pos < data.size()) {
    if (data.size() - pos < kRecordHeader) {
      ++*corrupt;
      break;
    }
    const uint32_t length = GetU32(data.data() + pos);
    const uint32_t crc = GetU32(data.data() + pos + 4);
    const uint8_t type = static_cast<uint8_t>(data[pos + 8]);
    if (length > kMaxRecordBytes || data.size() - pos - kRecordHeader < length) {
      ++*corrupt;
      break;
    }
    const std::string_view payload = data.substr(pos + kRecordHeader, length);
    if (RecordCrc(type, payload) != crc) {
      // A flipped bit in the payload (or the type): the length still finds the next record,
      // whose own checksum says whether it did. Records after it are not given up with it.
      ++*corrupt;
      pos += kRecordHeader + length;
      continue;
    }
    records.push_back({type, pos, payload});
    pos += kRecordHeader + length;
    *good_end = pos;
  }
  return records;
}

}  // namespace strata::agent::spool::records
