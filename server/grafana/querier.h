// Grafana reads Strata through its Pyroscope data source, unchanged: this module serves the
// part of Pyroscope's query API (querier.v1.QuerierService, proto/third_party/pyroscope) that
// the data source calls, over the Connect protocol (unary POSTs of binary or JSON protobuf)
// on the HTTP listener, as a front door onto the query service: each call becomes the query
// service's own request (Top, FlameGraph, Series, Export, labels) and its answer is put in
// Pyroscope's shape. Nothing is stored here.
//
// Mapping: Pyroscope's `service_name` label is Strata's service; other labels are Strata's
// (selectors with '*' globs); profile type IDs name Strata's profile types
// (process_cpu:samples:count:cpu:nanoseconds, off_cpu:..., wall:...), values are samples.
#ifndef STRATA_SERVER_GRAFANA_QUERIER_H_
#define STRATA_SERVER_GRAFANA_QUERIER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "querier/v1/querier.pb.h"
#include "server/http/http_server.h"
#include "server/query/query_service.h"

namespace strata::server::grafana {

// The HTTP paths of the calls served ("/querier.v1.QuerierService/<method>").
std::vector<std::string> QuerierPaths();

// Answers one call: POST with Content-Type application/proto or application/json; errors as
// Connect's JSON error ({"code": "...", "message": "..."}) with the matching HTTP status.
http::HttpResponse ServeQuerierCall(query::QueryService* query, const http::HttpRequest& request);

// What a Pyroscope label selector asks of Strata.
struct Selection {
  std::string service;   // from service_name="..."; empty: not given
  std::string selector;  // Strata's label selector for the other labels (labels.h)
};
// Parses `{name="value", name!="value", name=~"regex", name!~"regex"}` (the braces optional,
// values in double or single quotes). Regexes may only be literals with `.*` (Strata's '*').
// InvalidArgument naming what Strata's selectors cannot express (service_name other than
// "=", regex alternation, a ',' in a value).
absl::StatusOr<Selection> ParseLabelSelector(std::string_view text);

// The Strata profile type a Pyroscope profile type ID names; InvalidArgument listing the
// known ones otherwise.
absl::StatusOr<v1::ProfileType> ProfileTypeOf(std::string_view id);

// A flame graph's node table as Pyroscope's flamebearer levels: per depth, four values per
// node (x offset from the previous node's end on that level, total, self, index of its name;
// names[0] is "total", the root), a node's self before its children.
querier::v1::FlameGraph ToFlameGraph(const v1::FlameGraphResponse& tree);

}  // namespace strata::server::grafana

#endif  // STRATA_SERVER_GRAFANA_QUERIER_H_
