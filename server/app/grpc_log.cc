#include "server/app/grpc_log.h"

#include <grpc/support/log.h>

#include <atomic>
#include <string>
#include <utility>

#include "common/base/log.h"

namespace strata::server::app {
namespace {

std::function<void(std::string_view)>& ListenerLostCallback() {
  static auto* callback = new std::function<void(std::string_view)>();
  return *callback;
}
std::atomic<bool> listener_lost{false};

void LogGrpcLine(gpr_log_func_args* args) {
  const std::string_view message = args->message != nullptr ? args->message : "";
  const LogLevel level = IsClientsDoing(message)                   ? LogLevel::kDebug
                         : args->severity == GPR_LOG_SEVERITY_ERROR ? LogLevel::kError
                         : args->severity == GPR_LOG_SEVERITY_INFO ? LogLevel::kInfo
                                                                   : LogLevel::kDebug;
  Log(level, "grpc: {} ({}:{})", message, args->file != nullptr ? args->file : "?", args->line);
  if (IsListenerLost(message) && !listener_lost.exchange(true) && ListenerLostCallback()) {
    ListenerLostCallback()(message);
  }
}

}  // namespace

bool IsListenerLost(std::string_view message) {
  return message.starts_with("Failed accept4");
}

bool IsClientsDoing(std::string_view message) {
  return message.starts_with("No match found for server name");
}

void RouteGrpcLog(std::function<void(std::string_view message)> on_listener_lost) {
  ListenerLostCallback() = std::move(on_listener_lost);
  gpr_set_log_function(&LogGrpcLine);
}

}  // namespace strata::server::app
