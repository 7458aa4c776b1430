// Socket paths: the defaults (unique per user, job and host) and the checks PrepareSocketPath
// makes before spexd binds: live sockets refused, stale ones removed, and directories another
// user made or can write refused (the squatting attack on /tmp/spex-<uid>).
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/contract/socket_paths.h"

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

// Directories under /tmp (socket paths must stay short), removed when the test program ends.
struct TempDirs {
  std::vector<std::string> made;
  ~TempDirs() {
    std::error_code ignored;
    for (const std::string& d : made) std::filesystem::remove_all(d, ignored);
  }
};

std::string TempDir() {
  static TempDirs dirs;
  char tmpl[] = "/tmp/spex-paths-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  dirs.made.push_back(tmpl);
  return tmpl;
}

TEST(Paths, LiveSocketIsRefusedStaleOneRemoved) {
  const std::string dir = TempDir();
  const char* tmpl = dir.c_str();
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

// A uid nobody on the test machine has: the test runs as root, who may chown to it.
constexpr uid_t kStranger = 54321;

TEST(Paths, DirectoryOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another uid needs root";
  const std::string dir = TempDir();
  const std::string squat = dir + "/squat";
  ASSERT_EQ(mkdir(squat.c_str(), 0777), 0);
  ASSERT_EQ(chmod(squat.c_str(), 0777), 0);
  ASSERT_EQ(chown(squat.c_str(), kStranger, kStranger), 0);
  // As the default /tmp/spex-<uid> made first by another user: refused, naming the owner.
  absl::Status s = PrepareSocketPath(squat + "/job/node.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("owned by uid 54321"), std::string::npos) << s;
  EXPECT_NE(access((squat + "/job").c_str(), F_OK), 0) << "nothing may be created inside it";
  // Owned by another user with a private mode: still refused (its owner can change it).
  ASSERT_EQ(chmod(squat.c_str(), 0700), 0);
  EXPECT_EQ(PrepareSocketPath(squat + "/node.sock").code(), absl::StatusCode::kPermissionDenied);
}

TEST(Paths, DirectoryOthersCanWriteIsRefused) {
  const std::string dir = TempDir();
  const std::string open_dir = dir + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  absl::Status s = PrepareSocketPath(open_dir + "/node.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("may be written by other users"), std::string::npos) << s;
  // Above the socket's directory a world-writable directory must be sticky, as /tmp is.
  EXPECT_EQ(PrepareSocketPath(open_dir + "/sub/node.sock").code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(chmod(open_dir.c_str(), 01777), 0);
  EXPECT_TRUE(PrepareSocketPath(open_dir + "/sub/node.sock").ok());
  // Group-writable is others too.
  ASSERT_EQ(chmod((open_dir + "/sub").c_str(), 0770), 0);
  EXPECT_EQ(PrepareSocketPath(open_dir + "/sub/node.sock").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Paths, SymlinkOfAnotherUserIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "lchown to another uid needs root";
  const std::string dir = TempDir();
  ASSERT_EQ(mkdir((dir + "/real").c_str(), 0700), 0);
  ASSERT_EQ(symlink((dir + "/real").c_str(), (dir + "/link").c_str()), 0);
  EXPECT_TRUE(PrepareSocketPath(dir + "/link/node.sock").ok());  // own symlink, own target
  ASSERT_EQ(lchown((dir + "/link").c_str(), kStranger, kStranger), 0);
  absl::Status s = PrepareSocketPath(dir + "/link/node.sock");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_NE(s.message().find("symlink"), std::string::npos) << s;
  // A symlink of our own to a directory of another user: the target is checked too.
  ASSERT_EQ(chown((dir + "/real").c_str(), kStranger, kStranger), 0);
  ASSERT_EQ(lchown((dir + "/link").c_str(), 0, 0), 0);
  EXPECT_EQ(PrepareSocketPath(dir + "/link/node.sock").code(), absl::StatusCode::kPermissionDenied);
}

TEST(Paths, RuntimeDirectoryIsPreferredWhenPrivate) {
  const std::string dir = TempDir();  // 0700, ours: a per-user runtime directory
  setenv("XDG_RUNTIME_DIR", dir.c_str(), 1);
  EXPECT_EQ(DefaultSocketBase(), dir + "/spex");
  EXPECT_EQ(DefaultSocketPath("j", -1).rfind(dir + "/spex/j/", 0), 0u);
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);  // others may write it: not used
  EXPECT_EQ(DefaultSocketBase(), absl::StrCat("/tmp/spex-", getuid()));
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DefaultSocketBase(), absl::StrCat("/tmp/spex-", getuid()));
}

// The trainer's check of a relative socket path: its directory is resolved from the working
// directory and checked like an absolute one (it was skipped before).
TEST(Paths, RelativeSocketPathIsChecked) {
  const std::string dir = TempDir();
  ASSERT_EQ(mkdir((dir + "/open").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((dir + "/mine").c_str(), 0700), 0);
  const int open_fd = Listen(dir + "/open/node.sock");
  const int mine_fd = Listen(dir + "/mine/node.sock");
  // Each check's probe connects and is never accepted: room for all of them in the backlog.
  ASSERT_EQ(listen(open_fd, 16), 0);
  ASSERT_EQ(listen(mine_fd, 16), 0);
  ASSERT_EQ(chmod((dir + "/open").c_str(), 0777), 0);  // anyone could swap the socket there
  char old_cwd[4096];
  ASSERT_NE(getcwd(old_cwd, sizeof(old_cwd)), nullptr);
  ASSERT_EQ(chdir(dir.c_str()), 0);
  absl::StatusOr<uid_t> open_rel = CheckServerSocket("open/node.sock");
  absl::StatusOr<uid_t> mine_rel = CheckServerSocket("mine/node.sock");
  absl::StatusOr<uid_t> dotdot = CheckServerSocket("mine/../open/node.sock");
  ASSERT_EQ(chdir((dir + "/open").c_str()), 0);
  absl::StatusOr<uid_t> here = CheckServerSocket("node.sock");  // the directory is "."
  ASSERT_EQ(chdir(old_cwd), 0);
  EXPECT_EQ(open_rel.status().code(), absl::StatusCode::kPermissionDenied) << open_rel.status();
  EXPECT_NE(open_rel.status().message().find(dir + "/open"), std::string::npos)
      << open_rel.status();
  EXPECT_EQ(dotdot.status().code(), absl::StatusCode::kPermissionDenied) << dotdot.status();
  EXPECT_EQ(here.status().code(), absl::StatusCode::kPermissionDenied) << here.status();
  ASSERT_TRUE(mine_rel.ok()) << mine_rel.status();
  EXPECT_EQ(*mine_rel, getuid());
  // The same directory given absolute: the same verdict.
  EXPECT_EQ(CheckServerSocket(dir + "/open/node.sock").status().code(),
            absl::StatusCode::kPermissionDenied);
  close(open_fd);
  close(mine_fd);
}

}  // namespace
}  // namespace spex
