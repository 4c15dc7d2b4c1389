#include "common/logging.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <ctime>
#include <mutex>

#include "absl/strings/ascii.h"

namespace fulcrum {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_tag_mu;  // guards g_tag
std::string g_tag;

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "D";
    case LogLevel::kInfo: return "I";
    case LogLevel::kWarning: return "W";
    case LogLevel::kError: return "E";
  }
  return "?";
}

std::string Tag() {
  std::lock_guard<std::mutex> lock(g_tag_mu);
  return g_tag;
}

}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level = static_cast<int>(level); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

absl::Status SetMinLogLevelFromString(const std::string& name) {
  std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") SetMinLogLevel(LogLevel::kDebug);
  else if (lower == "info") SetMinLogLevel(LogLevel::kInfo);
  else if (lower == "warning") SetMinLogLevel(LogLevel::kWarning);
  else if (lower == "error") SetMinLogLevel(LogLevel::kError);
  else return absl::InvalidArgumentError("--log-level must be one of debug, info, warning, error (got \"" + name + "\")");
  return absl::OkStatus();
}

void SetLogTag(const std::string& tag) {
  std::lock_guard<std::mutex> lock(g_tag_mu);
  g_tag = tag;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm local;
  localtime_r(&tv.tv_sec, &local);
  char when[32];
  strftime(when, sizeof(when), "%m%d %H:%M:%S", &local);
  const char* base = strrchr(file, '/');
  stream_ << LevelName(level_) << when << "." << (tv.tv_usec / 1000) / 100
          << ((tv.tv_usec / 1000) / 10) % 10 << (tv.tv_usec / 1000) % 10 << " ";
  std::string tag = Tag();
  if (!tag.empty()) stream_ << tag << " ";
  stream_ << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  std::string text = stream_.str();
  ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace fulcrum
