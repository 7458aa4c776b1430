// The control socket's listener (daemon/service/peer_listener.h): connections of users other than
// the daemon's, root and --allow_uids are closed at once; at most --max_connections are open, and a
// slot frees when its peer goes; every accepted connection is known by the kernel's credentials.
// Outside the sandbox (a child process takes another uid) and as root.
#include "daemon/service/peer_listener.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

constexpr uid_t kStranger = 54321;

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the daemon side closed `fd` within a second (a refused connection) rather than keeping it
// open (an accepted one: the gRPC server waits for the client's preface).
bool ClosedByServer(int fd) {
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char c;
  return recv(fd, &c, 1, 0) == 0;
}

template <typename Pred>
bool WaitFor(Pred pred) {
  for (int i = 0; i < 200; ++i) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

class PeerListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/spex-listener-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    grpc::ServerBuilder builder;
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (listener_ != nullptr) listener_->Stop();
    server_->Shutdown();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);  // the test's socket directory under /tmp
  }
  void Listen(ListenerOptions o) {
    o.path = dir_ + "/s.sock";
    absl::StatusOr<std::unique_ptr<PeerListener>> l = PeerListener::Listen(o);
    ASSERT_TRUE(l.ok()) << l.status();
    listener_ = std::move(*l);
    listener_->Serve(server_.get());
  }
  // Connects as uid `uid` in a child process; true when the server closed the connection.
  bool RefusedAs(uid_t uid) {
    chmod(dir_.c_str(), 0755);  // as if the operator opened the directory too
    const pid_t child = fork();
    if (child == 0) {
      if (setuid(uid) != 0) _exit(3);
      const int fd = Connect(dir_ + "/s.sock");
      if (fd < 0) _exit(4);
      _exit(ClosedByServer(fd) ? 0 : 1);
    }
    int status = 0;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) <= 1) << status;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<PeerListener> listener_;
};

TEST_F(PeerListenerTest, AnotherUsersConnectionIsClosedAtOnce) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  Listen({.mode = 0666});  // even a socket others may open serves only its own user
  EXPECT_TRUE(RefusedAs(kStranger));
  EXPECT_EQ(listener_->counts().refused_user, 1u);
  EXPECT_EQ(listener_->counts().accepted, 0u);
  const int own = Connect(dir_ + "/s.sock");  // root: accepted
  ASSERT_GE(own, 0);
  EXPECT_FALSE(ClosedByServer(own));
  EXPECT_EQ(listener_->counts().accepted, 1u);
  close(own);
}

TEST_F(PeerListenerTest, AllowedUidsMayConnect) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to connect as another uid";
  Listen({.mode = 0666, .allow_uids = {kStranger}});
  EXPECT_FALSE(RefusedAs(kStranger));
  EXPECT_EQ(listener_->counts().refused_user, 0u);
  EXPECT_FALSE(PeerListener::Owner(kStranger)) << "allowed to connect, not to own";
  EXPECT_TRUE(PeerListener::Owner(geteuid()));
}

TEST_F(PeerListenerTest, ConnectionsBeyondTheLimitAreClosedAndSlotsFree) {
  Listen({.mode = 0600, .max_connections = 2});
  const int a = Connect(dir_ + "/s.sock"), b = Connect(dir_ + "/s.sock");
  ASSERT_TRUE(WaitFor([&] { return listener_->counts().open == 2; }));
  const int c = Connect(dir_ + "/s.sock");
  ASSERT_GE(c, 0);
  EXPECT_TRUE(ClosedByServer(c));
  EXPECT_EQ(listener_->counts().refused_full, 1u);
  close(c);
  close(a);  // the peer goes: its slot frees
  ASSERT_TRUE(WaitFor([&] { return listener_->counts().open == 1; }));
  const int d = Connect(dir_ + "/s.sock");
  EXPECT_FALSE(ClosedByServer(d));
  EXPECT_EQ(listener_->counts().accepted, 3u);
  close(b);
  close(d);
}

TEST_F(PeerListenerTest, LookupKnowsOnlyNamesItHandedOut) {
  Listen({});
  EXPECT_FALSE(listener_->Lookup("unix:/x").has_value());
  EXPECT_FALSE(listener_->Lookup("fd:").has_value());
  EXPECT_FALSE(listener_->Lookup("fd:3").has_value());
  EXPECT_FALSE(listener_->Lookup("ipv4:127.0.0.1:1").has_value());
}

TEST_F(PeerListenerTest, SocketGetsItsModeBeforeAnyoneConnects) {
  Listen({.mode = 0600});
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/s.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace spex
