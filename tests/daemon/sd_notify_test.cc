// SdNotifier against a datagram socket the test owns (path and abstract names), as systemd
// would see it: READY=1, STATUS=, STOPPING=1, WATCHDOG=1 rate-limited to half of
// $WATCHDOG_USEC, $WATCHDOG_PID naming another process, and no-ops without $NOTIFY_SOCKET.
#include "daemon/util/sd_notify.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/support/run_tag.h"

namespace spex {
namespace {

// A SOCK_DGRAM socket bound to a path (or an abstract name) that collects what arrives.
class Listener {
 public:
  explicit Listener(bool abstract) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd_, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    socklen_t len;
    if (abstract) {
      name_ = absl::StrCat("spex-sd-notify-test-", test::RunTag(), "-", counter_++);
      addr.sun_path[0] = '\0';
      std::memcpy(addr.sun_path + 1, name_.data(), name_.size());
      len = offsetof(sockaddr_un, sun_path) + 1 + name_.size();
      env_ = "@" + name_;
    } else {
      // /tmp, not $TEST_TMPDIR: Bazel's is longer than a socket address (108 bytes).
      name_ = absl::StrCat("/tmp/spex-notify-test-", test::RunTag(), "-", counter_++);
      unlink(name_.c_str());
      std::memcpy(addr.sun_path, name_.data(), name_.size());
      len = offsetof(sockaddr_un, sun_path) + name_.size() + 1;
      env_ = name_;
      path_ = name_;
    }
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), len), 0) << strerror(errno);
  }
  ~Listener() {
    close(fd_);
    if (!path_.empty()) unlink(path_.c_str());
  }
  const std::string& env() const { return env_; }

  // The next datagram within `timeout_ms`, or "" when none came.
  std::string Next(int timeout_ms = 1000) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) <= 0) return "";
    char buf[4096];
    ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, n) : "";
  }
  std::vector<std::string> Drain() {
    std::vector<std::string> out;
    for (std::string m; !(m = Next(0)).empty();) out.push_back(m);
    return out;
  }

 private:
  static int counter_;
  int fd_ = -1;
  std::string name_, env_, path_;
};
int Listener::counter_ = 0;

class SdNotifyTest : public ::testing::Test {
 protected:
  void SetUp() override { Clear(); }
  void TearDown() override { Clear(); }
  static void Clear() {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
  }
};

TEST_F(SdNotifyTest, NoSocketIsANoOp) {
  SdNotifier n;
  EXPECT_FALSE(n.enabled());
  EXPECT_EQ(n.watchdog_interval(), absl::ZeroDuration());
  EXPECT_TRUE(n.Ready("serving").ok());
  EXPECT_TRUE(n.Status("x").ok());
  EXPECT_TRUE(n.Watchdog().ok());
  EXPECT_TRUE(n.Stopping().ok());
  EXPECT_EQ(n.sent(), 0u);
}

TEST_F(SdNotifyTest, ReadyStatusStoppingOnAPath) {
  Listener l(/*abstract=*/false);
  setenv("NOTIFY_SOCKET", l.env().c_str(), 1);
  SdNotifier n;
  ASSERT_TRUE(n.enabled());
  EXPECT_EQ(n.address(), l.env());
  ASSERT_TRUE(n.Ready().ok());
  EXPECT_EQ(l.Next(), "READY=1");
  ASSERT_TRUE(n.Ready("serving unix:/x.sock").ok());
  EXPECT_EQ(l.Next(), "READY=1\nSTATUS=serving unix:/x.sock");
  ASSERT_TRUE(n.Status("2 trainers\nstep 5").ok());
  EXPECT_EQ(l.Next(), "STATUS=2 trainers step 5");  // one line
  ASSERT_TRUE(n.Stopping("signal 15").ok());
  EXPECT_EQ(l.Next(), "STOPPING=1\nSTATUS=signal 15");
  ASSERT_TRUE(n.Send("EXTEND_TIMEOUT_USEC=1000000").ok());
  EXPECT_EQ(l.Next(), "EXTEND_TIMEOUT_USEC=1000000");
  EXPECT_EQ(n.sent(), 5u);
  // No watchdog interval: Watchdog() sends nothing.
  EXPECT_TRUE(n.Watchdog().ok());
  EXPECT_EQ(l.Next(100), "");
}

TEST_F(SdNotifyTest, AbstractName) {
  Listener l(/*abstract=*/true);
  setenv("NOTIFY_SOCKET", l.env().c_str(), 1);
  SdNotifier n;
  ASSERT_TRUE(n.enabled());
  ASSERT_TRUE(n.Ready("up").ok());
  EXPECT_EQ(l.Next(), "READY=1\nSTATUS=up");
}

TEST_F(SdNotifyTest, WatchdogIsRateLimitedToHalfTheInterval) {
  Listener l(/*abstract=*/false);
  setenv("NOTIFY_SOCKET", l.env().c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);  // 200 ms: a ping at most every 100 ms
  SdNotifier n;
  EXPECT_EQ(n.watchdog_interval(), absl::Milliseconds(200));
  // Called every 5 ms for 520 ms (as the engine's heartbeat would): 6 pings (t = 0, 100, ...,
  // 500 ms), give or take one for scheduling.
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Milliseconds(520)) {
    ASSERT_TRUE(n.Watchdog().ok());
    absl::SleepFor(absl::Milliseconds(5));
  }
  std::vector<std::string> got = l.Drain();
  for (const std::string& m : got) EXPECT_EQ(m, "WATCHDOG=1");
  EXPECT_GE(got.size(), 5u);
  EXPECT_LE(got.size(), 6u);
}

TEST_F(SdNotifyTest, WatchdogFromManyThreadsStillOncePerHalfInterval) {
  Listener l(/*abstract=*/false);
  setenv("NOTIFY_SOCKET", l.env().c_str(), 1);
  setenv("WATCHDOG_USEC", "400000", 1);
  SdNotifier n;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&n] {
      for (int i = 0; i < 1000; ++i) EXPECT_TRUE(n.Watchdog().ok());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(l.Drain().size(), 1u);  // all within the first 200 ms
}

TEST_F(SdNotifyTest, WatchdogPidNamingAnotherProcessDisablesPings) {
  Listener l(/*abstract=*/false);
  setenv("NOTIFY_SOCKET", l.env().c_str(), 1);
  setenv("WATCHDOG_USEC", "100000", 1);
  setenv("WATCHDOG_PID", absl::StrCat(getpid() + 1).c_str(), 1);
  EXPECT_EQ(WatchdogIntervalFromEnv(getpid()), absl::ZeroDuration());
  SdNotifier n;
  EXPECT_EQ(n.watchdog_interval(), absl::ZeroDuration());
  EXPECT_TRUE(n.Watchdog().ok());
  EXPECT_EQ(l.Next(100), "");
  setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
  EXPECT_EQ(WatchdogIntervalFromEnv(getpid()), absl::Milliseconds(100));
  SdNotifier mine;
  ASSERT_TRUE(mine.Watchdog().ok());
  EXPECT_EQ(l.Next(), "WATCHDOG=1");
}

TEST_F(SdNotifyTest, BadWatchdogUsecDisablesPings) {
  for (const char* bad : {"", "0", "-5", "12abc", "abc"}) {
    setenv("WATCHDOG_USEC", bad, 1);
    EXPECT_EQ(WatchdogIntervalFromEnv(getpid()), absl::ZeroDuration()) << "'" << bad << "'";
  }
}

TEST_F(SdNotifyTest, UnsetEnvironmentHidesItFromChildren) {
  Listener l(/*abstract=*/false);
  setenv("NOTIFY_SOCKET", l.env().c_str(), 1);
  setenv("WATCHDOG_USEC", "1000000", 1);
  setenv("WATCHDOG_PID", absl::StrCat(getpid()).c_str(), 1);
  SdNotifier n(/*unset_environment=*/true);
  EXPECT_EQ(std::getenv("NOTIFY_SOCKET"), nullptr);
  EXPECT_EQ(std::getenv("WATCHDOG_USEC"), nullptr);
  EXPECT_EQ(std::getenv("WATCHDOG_PID"), nullptr);
  ASSERT_TRUE(n.enabled());  // still sends itself
  EXPECT_EQ(n.watchdog_interval(), absl::Seconds(1));
  ASSERT_TRUE(n.Ready().ok());
  EXPECT_EQ(l.Next(), "READY=1");
}

TEST_F(SdNotifyTest, MissingSocketIsAnErrorNotACrash) {
  std::string path = absl::StrCat("/tmp/spex-no-such-notify-socket-", getpid());
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  SdNotifier n;
  absl::Status s = n.Ready();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(path), std::string::npos) << s;
}

TEST_F(SdNotifyTest, UnsupportedAddressKindIsDisabled) {
  setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
  SdNotifier n;
  EXPECT_FALSE(n.enabled());
  EXPECT_TRUE(n.Ready().ok());
}

}  // namespace
}  // namespace spex
