#include "daemon/util/paths.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>

#include "gtest/gtest.h"

namespace spex {
namespace {

int Listen(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 1), 0);
  return fd;
}

TEST(Paths, LiveSocketIsRefusedStaleOneRemoved) {
  char tmpl[] = "/tmp/spex-paths-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/sub/d.sock";
  ASSERT_TRUE(PrepareSocketPath(path).ok());  // creates sub/
  int fd = Listen(path);
  absl::Status live = PrepareSocketPath(path);
  EXPECT_EQ(live.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(live.message().find("already serving"), std::string::npos);
  close(fd);  // the file stays, nobody listens: stale
  EXPECT_TRUE(PrepareSocketPath(path).ok());
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  std::ofstream(std::string(tmpl) + "/file") << "x";
  EXPECT_EQ(PrepareSocketPath(std::string(tmpl) + "/file").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(PrepareSocketPath(std::string(200, 'x')).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Paths, DefaultsAreUniquePerJobAndHost) {
  EXPECT_NE(DefaultSocketPath("a", -1), DefaultSocketPath("b", -1));
  EXPECT_NE(DefaultSocketPath("a", 0), DefaultSocketPath("a", 1));
  EXPECT_NE(DefaultSocketPath("a", -1).find(Hostname()), std::string::npos);
  setenv("SPEX_SOCKET", "/x/y.sock", 1);
  EXPECT_EQ(ClientSocketPath("a"), "/x/y.sock");
  unsetenv("SPEX_SOCKET");
  setenv("SPEX_LOCAL_DAEMON", "3", 1);
  EXPECT_EQ(ClientSocketPath("a"), DefaultSocketPath("a", 3));
  unsetenv("SPEX_LOCAL_DAEMON");
}

}  // namespace
}  // namespace spex
