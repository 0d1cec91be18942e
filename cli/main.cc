// strata: the command-line client of strata-server.
//
//   strata [--server ADDR] [--json] <command> [flags]
// Commands are registered by command groups (see client.h); `strata --help` lists them.
#include <cstdio>
#include <cstdlib>

#include "CLI/CLI.hpp"
#include "cli/client.h"
#include "common/base/config_file.h"

namespace strata::cli {
// cli/capture_commands.cc
void AddCaptureCommands(CLI::App* app, CliContext* context, int* exit_code);
}  // namespace strata::cli

int main(int argc, char** argv) {
  using strata::cli::CliContext;
  strata::cli::MakeStdoutTerminalSafe();
  CLI::App app{"strata: query and control the Strata continuous profiler"};
  app.require_subcommand(1);
  CliContext context;
  auto& g = context.options();
  const char* env_server = std::getenv("STRATA_SERVER");
  g.server = env_server && *env_server ? env_server : "127.0.0.1:7070";
  app.add_option("--server", g.server, "strata-server address (env STRATA_SERVER)")
      ->capture_default_str();
  app.add_flag("--json", g.json, "print JSON instead of tables");
  app.add_option("--timeout", g.timeout_s, "seconds to wait for the server")
      ->check(CLI::Range(1, 24 * 3600))
      ->capture_default_str();
  strata::rpc::AddClientSecurityFlags(&app, &g.security);

  int exit_code = 0;
  strata::cli::AddQueryCommands(&app, &context, &exit_code);
  strata::cli::AddCompareCommand(&app, &context, &exit_code);
  strata::cli::AddPhaseCommands(&app, &context, &exit_code);
  strata::cli::AddRegressionCommands(&app, &context, &exit_code);
  strata::cli::AddCaptureCommands(&app, &context, &exit_code);
  strata::cli::AddDebugInfoCommands(&app, &context, &exit_code);
  strata::cli::AddClusterCommands(&app, &context, &exit_code);
  for (auto* sub : app.get_subcommands({})) sub->fallthrough();

  strata::base::AddConfigFile(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    // A mistyped command leaves the subcommand missing: name what was typed instead.
    if (app.get_subcommands().empty() && !app.remaining().empty()) {
      std::fprintf(stderr, "strata: unknown command '%s' (strata --help lists them)\n",
                   app.remaining().front().c_str());
      return 1;
    }
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return exit_code;
}
