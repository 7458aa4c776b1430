#include "daemon/memory/segment_janitor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/util/log.h"

namespace spex {
namespace {

std::atomic<int> g_fd{-1};
std::atomic<pid_t> g_pid{-1};

constexpr size_t kMaxName = 255;  // NAME_MAX: a longer name is no /dev/shm name
constexpr int kSocketFd = 3;      // the janitor's end, after it closed everything else

// The janitor's command line becomes "spexd-janitor": argv's strings are contiguous, so the whole
// area is overwritten and zero-filled (the kernel shows /proc/<pid>/cmdline from it).
void RenameCommandLine(int argc, char** argv) {
  prctl(PR_SET_NAME, "spexd-janitor", 0, 0, 0);
  if (argc < 1 || argv == nullptr || argv[0] == nullptr) return;
  char* begin = argv[0];
  char* end = argv[argc - 1] + std::strlen(argv[argc - 1]);  // at its terminating NUL
  constexpr char kName[] = "spexd-janitor";
  const size_t area = static_cast<size_t>(end - begin);
  std::memset(begin, 0, area);
  std::memcpy(begin, kName, std::min(area, sizeof(kName) - 1));
}

void CloseAllBut(int keep_up_to) {
  if (close_range(static_cast<unsigned>(keep_up_to) + 1, ~0U, 0) == 0) return;
  for (int fd = keep_up_to + 1; fd < 65536; ++fd) close(fd);  // kernels before 5.9
}

[[noreturn]] void RunJanitor(int sock, pid_t daemon, int argc, char** argv) {
  setsid();  // its own session and process group: kill(-pgid) of spexd's group passes it by
  for (int sig : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGUSR1, SIGUSR2})
    signal(sig, SIG_IGN);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  RenameCommandLine(argc, argv);
  const int moved = chdir("/");  // holds no directory of the daemon's (failing is harmless)
  (void)moved;
  // Descriptors: /dev/null for stdin and stdout, stderr kept for the one message, the socket as
  // fd 3; nothing else (a socket or pipe of spexd's held here would outlive it).
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
  }
  if (sock != kSocketFd) {
    dup2(sock, kSocketFd);
  }
  CloseAllBut(kSocketFd);

  std::set<std::string> names;
  std::string socket_path;  // the daemon's socket, when it is still this file at the end
  struct stat socket_stat {};
  char buf[kMaxName + 2];
  for (;;) {
    const ssize_t n = recv(kSocketFd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of file: spexd is gone (or the socket failed: treated alike)
    if (n < 2) continue;
    std::string name(buf + 1, static_cast<size_t>(n - 1));
    if (buf[0] == '+') {
      names.insert(std::move(name));
    } else if (buf[0] == '-') {
      names.erase(name);
    } else if (buf[0] == 's') {
      struct stat st {};
      if (lstat(name.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
        socket_path = std::move(name);
        socket_stat = st;
      }
    }
  }
  int removed = 0;
  for (const std::string& name : names) {
    if (shm_unlink(name.c_str()) == 0) ++removed;
  }
  struct stat now {};
  if (!socket_path.empty() && lstat(socket_path.c_str(), &now) == 0 && S_ISSOCK(now.st_mode) &&
      now.st_dev == socket_stat.st_dev && now.st_ino == socket_stat.st_ino &&
      unlink(socket_path.c_str()) == 0) {
    dprintf(2, "spexd-janitor: spexd (pid %d) ended without removing its socket %s; removed it\n",
            static_cast<int>(daemon), socket_path.c_str());
  }
  if (removed > 0) {
    dprintf(2,
            "spexd-janitor: spexd (pid %d) ended without removing %d shared-memory name(s) "
            "(its buckets', its doorbell's, Open MPI's); removed them\n",
            static_cast<int>(daemon), removed);
  }
  _exit(0);
}

void Send(char op, const std::string& name) {
  const int fd = g_fd.load(std::memory_order_acquire);
  if (fd < 0 || name.empty() || name.size() > kMaxName) return;
  char buf[kMaxName + 1];
  buf[0] = op;
  std::memcpy(buf + 1, name.data(), name.size());
  // Never blocks the daemon for long: a janitor that stopped reading (SIGSTOPped, or starved of a
  // core while a burst of registrations fills the socket's buffer) gets one second, then names go
  // untold (left in /dev/shm only should spexd then be killed) without waiting again until one
  // gets through; said once in the log.
  static std::atomic<bool> stuck{false};
  for (int tries = 0;; ++tries) {
    if (send(fd, buf, name.size() + 1, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) {
      stuck.store(false, std::memory_order_relaxed);
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN || tries > 0 || stuck.load(std::memory_order_relaxed)) break;
    pollfd pfd{fd, POLLOUT, 0};
    if (poll(&pfd, 1, 1000) < 0 && errno != EINTR) break;
  }
  const int e = errno;
  if (e == EAGAIN) stuck.store(true, std::memory_order_relaxed);
  static std::atomic<bool> said{false};
  if (e != EPIPE && e != ECONNRESET && !said.exchange(true)) {
    SPEX_LOG(WARNING) << "segment janitor (pid " << g_pid.load() << ") does not take names ("
                      << strerror(e) << "): should spexd be killed, some of its segments' "
                      << "names may stay in /dev/shm";
  }
}

}  // namespace

absl::Status SegmentJanitor::Start(int argc, char** argv) {
  if (g_fd.load() >= 0) return absl::FailedPreconditionError("the segment janitor runs already");
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return absl::InternalError(absl::StrCat("segment janitor: socketpair: ", strerror(errno)));
  }
  const pid_t daemon = getpid();
  const pid_t child = fork();
  if (child < 0) {
    const int e = errno;
    close(sv[0]);
    close(sv[1]);
    return absl::InternalError(absl::StrCat("segment janitor: fork: ", strerror(e)));
  }
  if (child == 0) {
    close(sv[0]);
    RunJanitor(sv[1], daemon, argc, argv);
  }
  close(sv[1]);
  g_pid.store(child);
  g_fd.store(sv[0], std::memory_order_release);
  return absl::OkStatus();
}

void SegmentJanitor::Track(const std::string& name) { Send('+', name); }

void SegmentJanitor::Untrack(const std::string& name) { Send('-', name); }

void SegmentJanitor::TrackOpenMpiSegment(int local_rank) {
  if (g_fd.load() < 0) return;
  std::ifstream maps("/proc/self/maps");
  const std::string prefix = "/dev/shm/vader_segment.";
  const std::string suffix = absl::StrCat(".", local_rank);
  std::set<std::string> found;
  std::string line;
  while (std::getline(maps, line)) {
    const size_t at = line.find(prefix);
    if (at == std::string::npos) continue;
    const std::string path = line.substr(at);
    if (path.size() > prefix.size() + suffix.size() &&
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        path.find(' ') == std::string::npos) {
      found.insert(path.substr(std::string("/dev/shm").size()));  // "/vader_segment...."
    }
  }
  for (const std::string& name : found) Track(name);
}

void SegmentJanitor::TrackSocket(const std::string& path) {
  if (path.empty() || path[0] == '/') {
    Send('s', path);
    return;
  }
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) != nullptr) Send('s', absl::StrCat(cwd, "/", path));
}

pid_t SegmentJanitor::pid() { return g_pid.load(); }

}  // namespace spex
