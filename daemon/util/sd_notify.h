// The systemd service notification protocol (sd_notify(3)), without libsystemd: newline-separated
// "KEY=VALUE" assignments sent as one datagram on the AF_UNIX SOCK_DGRAM socket named by
// $NOTIFY_SOCKET (a path, or an abstract name written with a leading '@'). Under a unit with
// Type=notify, systemd starts counting the service as started at READY=1; with WatchdogSec=
// it sets $WATCHDOG_USEC (and $WATCHDOG_PID, the process meant to ping) and restarts the
// service when no WATCHDOG=1 arrives within that interval.
//
// Without $NOTIFY_SOCKET (any start outside systemd) every call is a cheap no-op, so spexd
// always calls it. Thread-safe: the engine thread pings while the main thread reports status.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace spex {

// The watchdog interval systemd asks for: $WATCHDOG_USEC when set to a positive integer and
// $WATCHDOG_PID is unset or names `pid` (sd_watchdog_enabled(3)); otherwise zero (disabled).
absl::Duration WatchdogIntervalFromEnv(pid_t pid);

class SdNotifier {
 public:
  // Reads $NOTIFY_SOCKET, $WATCHDOG_USEC and $WATCHDOG_PID once. With `unset_environment`
  // the three are removed from the environment (like sd_notify's unset_environment), so that
  // children (mpirun's orted, a shell) do not notify in this process's name.
  explicit SdNotifier(bool unset_environment = false);
  ~SdNotifier();
  SdNotifier(const SdNotifier&) = delete;
  SdNotifier& operator=(const SdNotifier&) = delete;

  // True when $NOTIFY_SOCKET was set (messages are sent).
  bool enabled() const { return !address_.empty(); }
  // The watchdog interval; zero when systemd asked for none (Watchdog() then sends nothing).
  absl::Duration watchdog_interval() const { return watchdog_; }
  // Where messages go, as given in $NOTIFY_SOCKET ("" when disabled).
  const std::string& address() const { return address_; }

  // READY=1 (with the optional status line): the service is up (the socket serves).
  absl::Status Ready(absl::string_view status = "");
  // STATUS=<text>: a one-line status shown by `systemctl status` (newlines become spaces).
  absl::Status Status(absl::string_view text);
  // WATCHDOG=1, at most once per half interval (later calls within it return OK and send
  // nothing); nothing when no watchdog interval was set. Cheap: callable every few ms.
  absl::Status Watchdog();
  // STOPPING=1 (with the optional status line): the service began to shut down.
  absl::Status Stopping(absl::string_view status = "");
  // Sends `message` as it is (several "KEY=VALUE" lines); OK without doing anything when
  // disabled. Errors say what failed (e.g. the socket's path does not exist).
  absl::Status Send(absl::string_view message);

  // Messages sent and send errors, for tests and logs.
  uint64_t sent() const { return sent_.load(std::memory_order_relaxed); }

 private:
  std::string address_;
  absl::Duration watchdog_ = absl::ZeroDuration();
  std::mutex mu_;  // serialises sends and the socket's creation
  int fd_ = -1;
  std::atomic<int64_t> last_ping_ns_{0};  // monotonic time of the last WATCHDOG=1 (0: never)
  std::atomic<uint64_t> sent_{0};
};

}  // namespace spex
