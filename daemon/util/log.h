// Minimal leveled logging to stderr (abseil 20220623 has no absl/log):
//   SPEX_LOG(INFO) << "bucket " << id << " registered";
// Lines carry a timestamp, the level and a process prefix such as "spexd[node 1/4]".
#pragma once

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace spex {

// --log_level: debug|info|warning|error (AbslParseFlag names the accepted spellings).
enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
bool AbslParseFlag(absl::string_view text, LogLevel* out, std::string* error);
std::string AbslUnparseFlag(LogLevel level);

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogPrefix(const std::string& prefix);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// SPEX_LOG(DEBUG|INFO|WARNING|ERROR) names these.
namespace log_internal {
constexpr LogLevel kLevelDEBUG = LogLevel::kDebug;
constexpr LogLevel kLevelINFO = LogLevel::kInfo;
constexpr LogLevel kLevelWARNING = LogLevel::kWarning;
constexpr LogLevel kLevelERROR = LogLevel::kError;
}  // namespace log_internal

}  // namespace spex

#define SPEX_LOG(level)                                                                   \
  for (bool spex_log_once = ::spex::log_internal::kLevel##level >= ::spex::GetLogLevel(); \
       spex_log_once; spex_log_once = false)                                              \
  ::spex::LogMessage(::spex::log_internal::kLevel##level, __FILE__, __LINE__).stream()
