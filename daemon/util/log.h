// Minimal leveled logging to stderr (abseil 20220623 has no absl/log):
//   SPEX_LOG(INFO) << "bucket " << id << " registered";
// Lines carry a timestamp, the level and a process prefix such as "spexd[node 1/4]".
#pragma once

#include <sstream>
#include <string>

namespace spex {

enum class LogLevel { kDEBUG = 0, kINFO = 1, kWARNING = 2, kERROR = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogPrefix(const std::string& prefix);
// Parses "debug|info|warning|error"; false when unknown.
bool ParseLogLevel(const std::string& text, LogLevel* out);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace spex

#define SPEX_LOG(level)                                                                         \
  for (bool spex_log_once = ::spex::LogLevel::k##level >= ::spex::GetLogLevel(); spex_log_once; \
       spex_log_once = false)                                                                   \
  ::spex::LogMessage(::spex::LogLevel::k##level, __FILE__, __LINE__).stream()
