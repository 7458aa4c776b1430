// sd_notify without libsystemd (sd_notify.h): READY, WATCHDOG and STATUS datagrams to
// $NOTIFY_SOCKET, so the systemd unit can use Type=notify and a watchdog.
#include "daemon/util/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace spex {
namespace {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string OneLine(absl::string_view text) {
  return absl::StrReplaceAll(text, {{"\r", " "}, {"\n", " "}});
}

}  // namespace

absl::Duration WatchdogIntervalFromEnv(pid_t pid) {
  uint64_t usec = 0;
  if (!absl::SimpleAtoi(Env("WATCHDOG_USEC"), &usec) || usec == 0) return absl::ZeroDuration();
  const std::string for_pid = Env("WATCHDOG_PID");
  if (!for_pid.empty()) {
    int64_t p = 0;
    if (!absl::SimpleAtoi(for_pid, &p) || p != pid) return absl::ZeroDuration();
  }
  return absl::Microseconds(usec);
}

SdNotifier::SdNotifier(bool unset_environment) {
  address_ = Env("NOTIFY_SOCKET");
  // Only a path or an abstract name is a socket we can reach ("vsock:" etc. are not handled).
  if (!address_.empty() && address_[0] != '/' && address_[0] != '@') address_.clear();
  if (!address_.empty()) watchdog_ = WatchdogIntervalFromEnv(getpid());
  if (unset_environment) {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
  }
}

SdNotifier::~SdNotifier() {
  if (fd_ >= 0) close(fd_);
}

absl::Status SdNotifier::Send(absl::string_view message) {
  if (address_.empty()) return absl::OkStatus();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (address_.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("NOTIFY_SOCKET '", address_, "' is longer than a unix socket address"));
  }
  std::memcpy(addr.sun_path, address_.data(), address_.size());
  socklen_t len = offsetof(sockaddr_un, sun_path) + address_.size();
  if (addr.sun_path[0] == '@') {
    addr.sun_path[0] = '\0';  // abstract namespace: the name is not NUL-terminated
  } else {
    len += 1;  // the path's terminating NUL
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
      return absl::InternalError(absl::StrCat("sd_notify: socket(): ", strerror(errno)));
    }
  }
  ssize_t n;
  do {
    n = sendto(fd_, message.data(), message.size(), MSG_NOSIGNAL,
               reinterpret_cast<const sockaddr*>(&addr), len);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return absl::UnavailableError(
        absl::StrCat("sd_notify: sending to NOTIFY_SOCKET ", address_, ": ", strerror(errno)));
  }
  sent_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status SdNotifier::Ready(absl::string_view status) {
  if (status.empty()) return Send("READY=1");
  return Send(absl::StrCat("READY=1\nSTATUS=", OneLine(status)));
}

absl::Status SdNotifier::Status(absl::string_view text) {
  return Send(absl::StrCat("STATUS=", OneLine(text)));
}

absl::Status SdNotifier::Stopping(absl::string_view status) {
  if (status.empty()) return Send("STOPPING=1");
  return Send(absl::StrCat("STOPPING=1\nSTATUS=", OneLine(status)));
}

absl::Status SdNotifier::Watchdog() {
  if (address_.empty() || watchdog_ == absl::ZeroDuration()) return absl::OkStatus();
  const int64_t now = MonotonicNs();
  const int64_t half = absl::ToInt64Nanoseconds(watchdog_) / 2;
  int64_t last = last_ping_ns_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < half) return absl::OkStatus();
  // One caller wins the interval; the others return without sending.
  if (!last_ping_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  return Send("WATCHDOG=1");
}

}  // namespace spex
