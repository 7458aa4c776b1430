// SPEX_LOG (log.h): leveled logging to stderr with the node's rank, since Debian's abseil has no
// absl/log.
#include "daemon/util/log.h"

#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_prefix_mu;
std::string g_prefix = "spex";  // guarded by g_prefix_mu
const char* const kNames[] = {"DEBUG", "INFO", "WARN", "ERROR"};
constexpr struct {
  const char* name;
  LogLevel level;
} kFlagNames[] = {{"debug", LogLevel::kDebug},
                  {"info", LogLevel::kInfo},
                  {"warning", LogLevel::kWarning},
                  {"error", LogLevel::kError}};
}  // namespace

bool AbslParseFlag(absl::string_view text, LogLevel* out, std::string* error) {
  for (const auto& e : kFlagNames) {
    if (text == e.name) {
      *out = e.level;
      return true;
    }
  }
  *error = absl::StrCat("--log_level must be one of debug, info, warning, error; got '",
                        text.substr(0, 64), "'");
  return false;
}

std::string AbslUnparseFlag(LogLevel level) {
  for (const auto& e : kFlagNames) {
    if (e.level == level) return e.name;
  }
  return "info";
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void SetLogPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(g_prefix_mu);
  g_prefix = prefix;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char when[32];
  strftime(when, sizeof(when), "%H:%M:%S", &t);
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(g_prefix_mu);
    prefix = g_prefix;
  }
  stream_ << when << "." << (tv.tv_usec / 1000 + 1000) % 1000 << " "
          << kNames[static_cast<int>(level)] << " " << prefix << " " << base << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  const std::string text = stream_.str();
  // One write() per line so lines of concurrent processes do not interleave.
  ssize_t ignored = write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
}

}  // namespace spex
