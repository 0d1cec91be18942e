// Checks of the addresses people give the programs (--listen, --server, --advertise) before
// gRPC sees them: gRPC takes a port above 65535 modulo 65536, so a typo would listen on, or
// connect to, another port without a word.
#ifndef STRATA_COMMON_BASE_HOST_PORT_H_
#define STRATA_COMMON_BASE_HOST_PORT_H_

#include <string_view>

#include "absl/status/status.h"

namespace strata::base {

// InvalidArgument when `address` ends in ":DIGITS" with DIGITS above 65535; OK otherwise
// (whether the rest is a valid address is for the resolver or the listener to say).
absl::Status CheckPortInRange(std::string_view address);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_HOST_PORT_H_
