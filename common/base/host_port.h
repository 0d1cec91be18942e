// Checks of the addresses people give the programs (--listen, --http, --server, --advertise)
// before gRPC sees them. gRPC takes a port above 65535 modulo 65536, and an address without a
// port as port 443 (a listener) or the scheme's default, so a typo would listen on, or connect
// to, another port without a word.
#ifndef STRATA_COMMON_BASE_HOST_PORT_H_
#define STRATA_COMMON_BASE_HOST_PORT_H_

#include <string_view>

#include "absl/status/status.h"

namespace strata::base {

// InvalidArgument when `address` has no port ("host", "[::1]", "host:") or a numeric port
// above 65535; OK otherwise, and for an empty address or a Unix socket ("unix:PATH"). Whether
// the rest is a valid address is for the resolver or the listener to say.
absl::Status CheckAddressPort(std::string_view address);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_HOST_PORT_H_
