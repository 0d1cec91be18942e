#include "cli/client.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/format.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"

namespace strata::cli {

void Fail(const std::string& message) {
  std::fprintf(stderr, "strata: %s\n", message.c_str());
  std::exit(1);
}

namespace {

// --type values and the profile each names.
constexpr std::pair<const char*, v1::ProfileType> kProfileTypes[] = {
    {"cpu", v1::PROFILE_CPU}, {"off-cpu", v1::PROFILE_OFF_CPU}, {"wall", v1::PROFILE_WALL}};

}  // namespace

void AddFilterFlags(CLI::App* cmd, FilterOptions* f, bool service_required) {
  auto* service = cmd->add_option("--service,-s", f->service, "service name");
  if (service_required) service->required();
  CLI::Option* since =
      cmd->add_option("--since", f->since, "look back this far (e.g. 30s, 10m, 1h, 7d)")
          ->capture_default_str();
  cmd->add_option("--from", f->from, "range start, RFC 3339 (instead of --since)")
      ->excludes(since);
  cmd->add_option("--to", f->to, "range end, RFC 3339, exclusive (default: now)");
  cmd->add_option("--host", f->host, "only samples from this host");
  cmd->add_option("--focus", f->focus, "keep stacks with a function matching this regex");
  cmd->add_option("--ignore", f->ignore, "drop stacks with a function matching this regex");
  cmd->add_option("--select", f->select,
                  "only targets whose labels match, e.g. 'version=1.4.2,region=eu-*,canary!=true'");
  std::vector<std::string> types;
  for (const auto& [name, type] : kProfileTypes) types.push_back(name);
  cmd->add_option("--type", f->type,
                  "profile: cpu (on-CPU samples), off-cpu (time blocked or waiting, in sampling "
                  "periods) or wall (both)")
      ->check(CLI::IsMember(types))
      ->capture_default_str();
  cmd->add_option("--limit,-n", f->limit, "rows to show")->capture_default_str();
}

v1::ProfileFilter BuildFilter(const FilterOptions& f, absl::string_view flags) {
  v1::ProfileFilter filter;
  filter.set_service(f.service);
  filter.set_host(f.host);
  filter.set_focus(f.focus);
  filter.set_ignore(f.ignore);
  filter.set_selector(f.select);
  for (const auto& [name, type] : kProfileTypes) {
    if (f.type == name) filter.set_type(type);
  }
  int64_t to = base::NowMs();
  if (!f.to.empty()) {
    auto t = ParseRfc3339(f.to);
    if (!t.ok()) Fail(absl::StrCat(flags, "to: ", t.status().message()));
    to = *t;
  }
  int64_t from;
  if (!f.from.empty()) {
    auto t = ParseRfc3339(f.from);
    if (!t.ok()) Fail(absl::StrCat(flags, "from: ", t.status().message()));
    from = *t;
  } else {
    auto d = ParseDuration(f.since);
    if (!d.ok()) Fail(absl::StrCat(flags, "since: ", d.status().message()));
    from = std::max<int64_t>(to - *d, 0);  // further back than 1970: everything
  }
  if (from >= to) {
    Fail(f.from.empty()    ? absl::StrCat(flags, "since must be longer than 0")
         : f.to.empty()    ? absl::StrCat(flags, "from must be in the past")
                           : absl::StrCat(flags, "from must be before ", flags, "to"));
  }
  filter.mutable_range()->set_from_ms(from);
  // An end given is exclusive, so that a range ending at T and one starting at T (before and
  // after a deploy) share no window; "now" takes in the window it falls in.
  filter.mutable_range()->set_to_ms(f.to.empty() ? to + 1 : to);
  return filter;
}

std::string RangeText(const FilterOptions& f) {
  const std::string type = f.type.empty() || f.type == "cpu" ? "" : absl::StrCat(", ", f.type);
  if (!f.from.empty()) {
    return absl::StrCat(f.from, " .. ", f.to.empty() ? "now" : f.to, type);
  }
  if (!f.to.empty()) return absl::StrCat(f.since, " before ", f.to, type);
  return absl::StrCat("last ", f.since, type);
}

void FailIfUnknownService(Client& client, const std::string& service) {
  if (service.empty()) return;
  auto r = client.Call(client.query(), &v1::Query::Stub::ListServices, v1::ListServicesRequest());
  std::vector<std::string> names;
  for (const auto& s : r.services()) {
    if (s.name() == service) return;
    names.push_back(s.name());
  }
  Fail(absl::StrCat("unknown service '", service, "'",
                    names.empty() ? " (no service has reported samples yet)"
                                  : absl::StrCat(" (known: ", absl::StrJoin(names, ", "), ")")));
}

void WarnUnreachable(const google::protobuf::RepeatedPtrField<std::string>& nodes) {
  for (const auto& n : nodes) {
    std::fprintf(stderr, "warning: incomplete answer: node %s not reached\n", n.c_str());
  }
}

void PrintJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  std::fputs(out.c_str(), stdout);
}

std::string FrameText(const v1::Frame& frame) {
  switch (frame.kind()) {
    case v1::FRAME_KERNEL: return absl::StrCat(frame.function(), " [k]");
    case v1::FRAME_JIT:
    case v1::FRAME_JAVA: return absl::StrCat(frame.function(), " [j]");
    default: return frame.function();
  }
}

void PrintHotPathsTable(const v1::HotPathsResponse& r) {
  Table table({"SAMPLES", "%", "PATH"}, {0, 1});
  for (const auto& p : r.paths()) {
    table.AddRow({WithThousands(p.samples()), Percent(p.samples(), r.total_samples()),
                  PathText(p)});
  }
  std::fputs(table.ToString().c_str(), stdout);
}

void PrintTopTable(const v1::TopResponse& r) {
  Table table({"SELF", "SELF%", "TOTAL", "TOTAL%", "FUNCTION", "MODULE"}, {0, 1, 2, 3});
  for (const auto& fn : r.functions()) {
    table.AddRow({WithThousands(fn.self()), Percent(fn.self(), r.total_samples()),
                  WithThousands(fn.total()), Percent(fn.total(), r.total_samples()),
                  FrameText(fn.function()), fn.function().module()});
  }
  std::fputs(table.ToString().c_str(), stdout);
}

namespace {

// Writes all of `data` to descriptor 1; false on an error.
bool WriteToFd1(std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(1, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool stdout_terminal_safe = false;
bool held_c2 = false;  // AppendTerminalSafe's state

ssize_t WriteTerminalSafe(void*, const char* buffer, size_t size) {
  std::string safe;
  AppendTerminalSafe(std::string_view(buffer, size), &held_c2, &safe);
  return WriteToFd1(safe) ? static_cast<ssize_t>(size) : -1;
}

int CloseTerminalSafe(void*) {
  if (held_c2) WriteToFd1("\xc2");
  held_c2 = false;
  return 0;
}

}  // namespace

void MakeStdoutTerminalSafe() {
  if (stdout_terminal_safe) return;
  std::fflush(stdout);
  cookie_io_functions_t io{nullptr, WriteTerminalSafe, nullptr, CloseTerminalSafe};
  FILE* safe = fopencookie(nullptr, "w", io);
  if (safe == nullptr) return;
  // A terminal sees each line as it is printed; a pipe or file gets whole buffers.
  setvbuf(safe, nullptr, isatty(1) ? _IOLBF : _IOFBF, 0);
  stdout = safe;
  stdout_terminal_safe = true;
}

void WriteOutput(const std::string& path, const std::string& data) {
  if (path.empty() || path == "-") {
    // Files (pprof's gzip, a flame graph's page) go as they are, past the escaping.
    std::fflush(stdout);
    if (!WriteToFd1(data)) Fail("cannot write the output to stdout");
    return;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.close();
  if (!out) Fail(absl::StrCat("cannot write ", path));
}

Client::Client(const GlobalOptions& options) : options_(options) {
  if (absl::Status port = base::CheckAddressPort(options.server); !port.ok()) {
    Fail(absl::StrCat("--server: ", port.message()));
  }
  auto security = rpc::ClientSecurity::Load(options.security);
  if (!security.ok()) Fail(std::string(security.status().message()));
  security_ = std::move(*security);
  channel_ = security_.CreateChannel(options.server);
}

std::shared_ptr<grpc::Channel> Client::large_channel() {
  if (!large_channel_) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    large_channel_ = security_.CreateChannel(options_.server, args);
  }
  return large_channel_;
}

v1::Query::Stub* Client::query() {
  if (!query_) query_ = v1::Query::NewStub(channel_);
  return query_.get();
}

v1::Query::Stub* Client::large_query() {
  if (!large_query_) large_query_ = v1::Query::NewStub(large_channel());
  return large_query_.get();
}

v1::Capture::Stub* Client::capture() {
  if (!capture_) capture_ = v1::Capture::NewStub(channel_);
  return capture_.get();
}

void Client::Prepare(grpc::ClientContext* context) const {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(options_.timeout_s));
  security_.Authorize(context);
}

void Client::Check(const grpc::Status& status) const {
  if (status.ok()) return;
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
       channel_->GetState(false) != GRPC_CHANNEL_READY)) {
    Fail(absl::StrCat("cannot reach strata-server at ", options_.server, ": ",
                      status.error_message(),
                      security_.tls()
                          ? " (is the server running, and its certificate signed by --tls-ca "
                            "and valid for the --server name or --tls-server-name?)"
                          : " (is the server running? set --server or STRATA_SERVER; a server "
                            "with TLS needs --tls-ca)"));
  }
  if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED && status.error_message().empty()) {
    // gRPC's own answer for a service the server does not offer (Cluster without a cluster).
    Fail(absl::StrCat("strata-server at ", options_.server,
                      " does not offer this (a command for a cluster, or for a newer server)"));
  }
  if (status.error_message().empty()) {
    const auto code = static_cast<absl::StatusCode>(status.error_code());  // the same numbers
    Fail(absl::StrCat("strata-server answered ", absl::StatusCodeToString(code)));
  }
  Fail(status.error_message());
}

Client& CliContext::client() {
  if (!client_) client_ = std::make_unique<Client>(options_);
  return *client_;
}

}  // namespace strata::cli
