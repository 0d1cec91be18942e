// CRC-32C (Castagnoli), the checksum of the agent's spool records: table-driven, no
// dependency, the same value as RocksDB's and the SSE4.2 instruction's (unmasked).
#ifndef STRATA_COMMON_BASE_CRC32C_H_
#define STRATA_COMMON_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace strata::base {

// CRC-32C of `data`, continuing from `crc` (the value of the bytes before it; 0 to start).
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_CRC32C_H_
