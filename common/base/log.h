// Log calls for every library and program: leveled messages formatted with fmt and written by
// spdlog's default logger, which each program's set-up configures (level, sinks; only it
// includes spdlog). Each call formats through one compiled function: spdlog's own call
// templates, instantiated per call site and argument types, took seconds of compile time per
// file that logs.
#ifndef STRATA_COMMON_BASE_LOG_H_
#define STRATA_COMMON_BASE_LOG_H_

#include <fmt/core.h>

#include <cstdint>
#include <mutex>

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

// Bounds a kind of message that many clients can cause at once (a fleet's agents refused
// again and again while the server's disk is full, whose log may share that disk): at most
// `lines` lines a period; the lines past them are counted, and the next line written says
// how many were left out. Thread-safe.
class LogBudget {
 public:
  LogBudget(uint32_t lines, int64_t period_ns) : lines_(lines), period_ns_(period_ns) {}
  // Whether a line may be written at `now_ns` (a monotonic clock); when it may, *left_out is
  // the number of lines not written since the last one that was.
  bool Take(int64_t now_ns, uint64_t* left_out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (now_ns - period_start_ns_ >= period_ns_) {
      period_start_ns_ = now_ns;
      written_ = 0;
    }
    if (written_ >= lines_) {
      ++left_out_;
      return false;
    }
    ++written_;
    *left_out = left_out_;
    left_out_ = 0;
    return true;
  }

 private:
  const uint32_t lines_;
  const int64_t period_ns_;
  std::mutex mu_;
  int64_t period_start_ns_ = INT64_MIN / 2;
  uint32_t written_ = 0;
  uint64_t left_out_ = 0;
};

}  // namespace strata

#endif  // STRATA_COMMON_BASE_LOG_H_
