#include "common/base/host_port.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace strata::base {

absl::Status CheckPortInRange(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return absl::OkStatus();
  const std::string_view port = address.substr(colon + 1);
  if (port.empty()) return absl::OkStatus();
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
