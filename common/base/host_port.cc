#include "common/base/host_port.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata::base {

absl::Status CheckAddressPort(std::string_view address) {
  if (address.empty() || address.starts_with("unix:") || address.starts_with("unix-abstract:")) {
    return absl::OkStatus();
  }
  // gRPC's target schemes before the host ("dns:///h:p", "ipv4:a:p", "ipv6:[a]:p").
  std::string_view host_port = address;
  for (std::string_view scheme : {"dns:///", "dns:", "ipv4:", "ipv6:"}) {
    if (host_port.starts_with(scheme)) {
      host_port.remove_prefix(scheme.size());
      break;
    }
  }
  const size_t colon = host_port.rfind(':');
  const bool bracketed = host_port.starts_with('[');
  if (colon == std::string_view::npos || colon + 1 == host_port.size() ||
      (bracketed && host_port.rfind(']') > colon)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", std::string(address), "' has no port (give host:port, e.g. 127.0.0.1:7070)"));
  }
  const std::string_view port = host_port.substr(colon + 1);
  uint64_t value = 0;
  for (char c : port) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return absl::OkStatus();
    value = value * 10 + static_cast<uint64_t>(c - '0');
    if (value > 65535) break;
  }
  if (value <= 65535) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("port ", std::string(port), " of '",
                                                 std::string(address),
                                                 "' is out of range (0 to 65535)"));
}

}  // namespace strata::base
