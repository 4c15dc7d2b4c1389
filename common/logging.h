// Leveled logging to stderr: `FLOG(INFO) << "message";`
// Thread-safe: each message is written with one write(2).
#ifndef FULCRUM_COMMON_LOGGING_H_
#define FULCRUM_COMMON_LOGGING_H_

#include <sstream>
#include <string>

#include "absl/status/status.h"

namespace fulcrum {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below `level` are dropped. Default: kInfo.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warning", "error".
absl::Status SetMinLogLevelFromString(const std::string& name);
// A short tag printed on every line, e.g. the process role and id.
void SetLogTag(const std::string& tag);

// Turns `stream << ...` into void so that FLOG can be a conditional
// expression (`&` binds looser than `<<`).
struct LogVoidify {
  void operator&(std::ostream&) {}
};

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace fulcrum

#define FULCRUM_LOG_LEVEL_DEBUG ::fulcrum::LogLevel::kDebug
#define FULCRUM_LOG_LEVEL_INFO ::fulcrum::LogLevel::kInfo
#define FULCRUM_LOG_LEVEL_WARNING ::fulcrum::LogLevel::kWarning
#define FULCRUM_LOG_LEVEL_ERROR ::fulcrum::LogLevel::kError

// A statement that is safe after an unbraced `if` (no dangling else). (Its
// replacement cannot be parenthesized: `<<` must follow the stream.)
// NOLINTBEGIN(bugprone-macro-parentheses)
#define FLOG(level)                                                                  \
  !(FULCRUM_LOG_LEVEL_##level >= ::fulcrum::MinLogLevel())                           \
      ? (void)0                                                                      \
      : ::fulcrum::LogVoidify() & ::fulcrum::LogMessage(FULCRUM_LOG_LEVEL_##level, __FILE__, __LINE__).stream()
// NOLINTEND(bugprone-macro-parentheses)

#endif  // FULCRUM_COMMON_LOGGING_H_
