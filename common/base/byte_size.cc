#include "common/base/byte_size.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace strata::base {

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  auto bad = [&] {
    // Bounded echo: flags come from operators, but also from config files of any size.
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(text.substr(0, 64)),
                     "' is not a byte size (examples: 4096, 64KiB, 512M, 2GiB)"));
  };
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(std::string(text.substr(0, digits)), &value)) return bad();
  std::string unit(text.substr(digits));
  if (unit.ends_with("iB")) {
    unit.resize(unit.size() - 2);
  } else if (unit.size() > 1 && unit.ends_with("B")) {
    unit.resize(unit.size() - 1);
  }
  int shift = 0;
  if (unit.empty() || unit == "B") {
    shift = 0;
  } else if (unit.size() == 1 && std::string_view("KMGT").find(unit[0]) != std::string_view::npos) {
    shift = 10 * (1 + static_cast<int>(std::string_view("KMGT").find(unit[0])));
  } else {
    return bad();
  }
  if (shift != 0 && value > (UINT64_MAX >> shift)) return bad();
  return value << shift;
}

}  // namespace strata::base
