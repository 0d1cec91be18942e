#include "common/base/log.h"

#include <fmt/format.h>

#include "spdlog/spdlog.h"

namespace strata {
namespace {

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::err;
}

}  // namespace

bool LogEnabled(LogLevel level) { return spdlog::should_log(SpdlogLevel(level)); }

void LogFormatted(LogLevel level, fmt::string_view format, fmt::format_args args) {
  const spdlog::level::level_enum to = SpdlogLevel(level);
  spdlog::logger* logger = spdlog::default_logger_raw();
  if (!logger->should_log(to)) return;
  fmt::memory_buffer message;
  fmt::vformat_to(fmt::appender(message), format, args);
  logger->log(to, spdlog::string_view_t(message.data(), message.size()));
}

}  // namespace strata
