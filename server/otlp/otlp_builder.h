// Writes OTLP profiles requests: the dictionary's tables with their zero entries, each string,
// attribute, mapping, function, location and stack added once. Strata's OTLP export
// (server/query) writes with it, and the tests build senders' requests with it.
#ifndef STRATA_SERVER_OTLP_OTLP_BUILDER_H_
#define STRATA_SERVER_OTLP_OTLP_BUILDER_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.pb.h"

namespace strata::server::otlp {

class RequestBuilder {
 public:
  using Request = ::opentelemetry::proto::collector::profiles::v1development::
      ExportProfilesServiceRequest;
  using Profile = ::opentelemetry::proto::profiles::v1development::Profile;
  using ResourceProfiles = ::opentelemetry::proto::profiles::v1development::ResourceProfiles;
  using Attributes = std::vector<std::pair<std::string, std::string>>;
  // One line of a location: a function and where in its file.
  struct Line {
    std::string function;
    std::string file;
    int64_t line = 0;
  };

  RequestBuilder();

  int32_t String(absl::string_view s);
  // A string attribute of the dictionary's attribute table.
  int32_t Attribute(absl::string_view key, absl::string_view value);
  std::vector<int32_t> AttributeList(const Attributes& attributes);
  // A mapping of `file`, with the GNU build ID attribute when `build_id` is not empty.
  int32_t Mapping(absl::string_view file, absl::string_view build_id = "", uint64_t start = 0,
                  uint64_t limit = 0, uint64_t file_offset = 0);
  int32_t Function(absl::string_view name, absl::string_view file);
  // `lines` innermost first (inlined functions before the one they were inlined into);
  // `frame_type` the profile.frame.type attribute (none when empty).
  int32_t Location(int32_t mapping, uint64_t address, const std::vector<Line>& lines,
                   absl::string_view frame_type);
  // Locations leaf first.
  int32_t Stack(const std::vector<int32_t>& locations);

  // A resource with string attributes (service.name, host.name, ...).
  ResourceProfiles* AddResource(const Attributes& attributes);
  // A profile of sample type (type, unit) in the resource's only scope; a period type
  // (period_type, "nanoseconds") when period_ns > 0.
  Profile* AddProfile(ResourceProfiles* resource, absl::string_view type, absl::string_view unit,
                      uint64_t time_unix_nano, absl::string_view period_type = "",
                      int64_t period_ns = 0);
  // One sample: `value` at `timestamp_unix_nano` (no timestamp when 0).
  void AddSample(Profile* profile, int32_t stack, const std::vector<int32_t>& attributes,
                 int64_t value, uint64_t timestamp_unix_nano = 0);

  const Request& request() const { return request_; }
  Request Take() { return std::move(request_); }

 private:
  Request request_;
  absl::flat_hash_map<std::string, int32_t> strings_, attributes_, mappings_, functions_,
      locations_, stacks_;
};

}  // namespace strata::server::otlp

#endif  // STRATA_SERVER_OTLP_OTLP_BUILDER_H_
