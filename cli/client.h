// Shared plumbing of the strata CLI commands: global options, the connection to
// strata-server, common profile filters (--service/--since/--from/--to/--host/--focus/
// --ignore/--select/--type/--limit) and output helpers. Each command group (query_commands.cc, ...)
// registers its subcommands on the CLI11 app with a CliContext it borrows.
#ifndef STRATA_CLI_CLIENT_H_
#define STRATA_CLI_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/rpc/client_security.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/query.grpc.pb.h"

namespace strata::cli {

struct GlobalOptions {
  std::string server;
  bool json = false;
  int timeout_s = 30;
  rpc::ClientSecurityOptions security;  // TLS, client certificate, token file
};

struct FilterOptions {
  std::string service;
  std::string since = "10m";
  std::string from, to;
  std::string host, focus, ignore;
  std::string select;  // label selector, e.g. "version=1.4.2,region=eu-*"
  std::string type = "cpu";  // profile type: cpu, off-cpu or wall
  uint32_t limit = 20;
};

// Prints "strata: <message>" to stderr and exits with status 1.
[[noreturn]] void Fail(const std::string& message);

// Adds the filter flags to `cmd`.
void AddFilterFlags(CLI::App* cmd, FilterOptions* f, bool service_required = true);
// Builds the proto filter; exits with a clear message on bad durations/times, naming the
// flags as `flags` begins them ("--base-" for a diff's base range).
v1::ProfileFilter BuildFilter(const FilterOptions& f, absl::string_view flags = "--");
// "last 10m", "10m before TO" or "FROM .. TO" for headers, with the profile type unless it is
// CPU.
std::string RangeText(const FilterOptions& f);

void PrintJson(const google::protobuf::Message& message);
// A cluster's answer without some nodes says so, on stderr (tables and JSON stay parsable).
void WarnUnreachable(const google::protobuf::RepeatedPtrField<std::string>& nodes);

// The function name, marked " [k]" for kernel code and " [j]" for JIT code.
std::string FrameText(const v1::Frame& frame);

// "a > b > c" (outermost first), with "[truncated]" first when unwinding stopped early.
// Any message with `truncated()` and `frames()` (HotPath, PathDelta).
template <typename PathMessage>
std::string PathText(const PathMessage& path) {
  std::string out = path.truncated() ? "[truncated]" : "";
  for (const auto& frame : path.frames()) {
    if (!out.empty()) out += " > ";
    out += FrameText(frame);
  }
  return out;
}

// The SAMPLES / % / PATH table of a hot-paths response.
void PrintHotPathsTable(const v1::HotPathsResponse& response);
// The SELF / SELF% / TOTAL / TOTAL% / FUNCTION / MODULE table of a top response.
void PrintTopTable(const v1::TopResponse& response);

// Writes `data` to `path`, or to stdout when `path` is empty or "-", as it is (not escaped);
// exits on a write error.
void WriteOutput(const std::string& path, const std::string& data);
// From now on, what is printed to stdout has its control characters escaped
// (AppendTerminalSafe): names from the server cannot drive the terminal.
void MakeStdoutTerminalSafe();

// The connection; stubs are created on first use.
class Client {
 public:
  explicit Client(const GlobalOptions& options);
  const GlobalOptions& options() const { return options_; }
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // A channel without gRPC's 4 MiB receive limit, for flame graphs and exports (the server
  // bounds flame graphs by node count).
  std::shared_ptr<grpc::Channel> large_channel();
  v1::Query::Stub* query();
  // The query service over large_channel(): flame graphs and exports.
  v1::Query::Stub* large_query();
  v1::Capture::Stub* capture();

  // Applies the global deadline and the credentials to `context`.
  void Prepare(grpc::ClientContext* context) const;
  // Applies the credentials only (calls with deadlines of their own).
  void Authorize(grpc::ClientContext* context) const { security_.Authorize(context); }
  // Exits with a clear message when `status` is not OK (unreachable server included).
  void Check(const grpc::Status& status) const;

  // Calls a unary method of `stub` with the global deadline; exits on error.
  template <typename Stub, typename Request, typename Response>
  Response Call(Stub* stub,
                grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                const Request& request) {
    grpc::ClientContext context;
    Prepare(&context);
    Response response;
    Check((stub->*method)(&context, request, &response));
    return response;
  }

 private:
  GlobalOptions options_;
  rpc::ClientSecurity security_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> large_channel_;
  std::unique_ptr<v1::Query::Stub> query_;
  std::unique_ptr<v1::Query::Stub> large_query_;
  std::unique_ptr<v1::Capture::Stub> capture_;
};

// For an answer that found nothing of `service`: fails as the profile queries do ("unknown
// service 'x' (known: ...)") when the server knows no such service, so that a mistyped name
// does not read as nothing to report.
void FailIfUnknownService(Client& client, const std::string& service);

// What command groups share: the global options (filled by parsing) and the client
// (created after parsing, on first use).
class CliContext {
 public:
  GlobalOptions& options() { return options_; }
  Client& client();

 private:
  GlobalOptions options_;
  std::unique_ptr<Client> client_;
};

// Command groups. Each adds its subcommands; a subcommand's callback runs the command and
// stores its exit status in `*exit_code`.
void AddQueryCommands(CLI::App* app, CliContext* context, int* exit_code);
void AddCompareCommand(CLI::App* app, CliContext* context, int* exit_code);
void AddPhaseCommands(CLI::App* app, CliContext* context, int* exit_code);
void AddRegressionCommands(CLI::App* app, CliContext* context, int* exit_code);
void AddClusterCommands(CLI::App* app, CliContext* context, int* exit_code);
void AddDebugInfoCommands(CLI::App* app, CliContext* context, int* exit_code);

}  // namespace strata::cli

#endif  // STRATA_CLI_CLIENT_H_
