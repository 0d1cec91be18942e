// Log calls for every library and program: leveled messages formatted with fmt and written by
// spdlog's default logger, which each program's set-up configures (level, sinks; only it
// includes spdlog). Each call formats through one compiled function: spdlog's own call
// templates, instantiated per call site and argument types, took seconds of compile time per
// file that logs.
#ifndef STRATA_COMMON_BASE_LOG_H_
#define STRATA_COMMON_BASE_LOG_H_

#include <fmt/core.h>

namespace strata {

enum class LogLevel { kDebug, kInfo, kWarn, kError };

// Whether messages at `level` are written.
bool LogEnabled(LogLevel level);

// Writes `format` formatted with `args` at `level`, if that level is enabled.
void LogFormatted(LogLevel level, fmt::string_view format, fmt::format_args args);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  LogFormatted(level, format, fmt::make_format_args(args...));
}
template <typename... Args>
void LogDebug(fmt::format_string<Args...> format, Args&&... args) {
  LogFormatted(LogLevel::kDebug, format, fmt::make_format_args(args...));
}
template <typename... Args>
void LogInfo(fmt::format_string<Args...> format, Args&&... args) {
  LogFormatted(LogLevel::kInfo, format, fmt::make_format_args(args...));
}
template <typename... Args>
void LogWarn(fmt::format_string<Args...> format, Args&&... args) {
  LogFormatted(LogLevel::kWarn, format, fmt::make_format_args(args...));
}
template <typename... Args>
void LogError(fmt::format_string<Args...> format, Args&&... args) {
  LogFormatted(LogLevel::kError, format, fmt::make_format_args(args...));
}

}  // namespace strata

#endif  // STRATA_COMMON_BASE_LOG_H_
