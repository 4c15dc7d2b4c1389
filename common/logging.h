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

#define FLOG(level)                                                   \
  if (FULCRUM_LOG_LEVEL_##level < ::fulcrum::MinLogLevel()) {         \
  } else                                                              \
    ::fulcrum::LogMessage(FULCRUM_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#endif  // FULCRUM_COMMON_LOGGING_H_
