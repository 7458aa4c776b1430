// The segment janitor (daemon/memory/segment_janitor.h) without MPI: a child process starts one,
// creates segments through ShmBuffer and dies without removing them; the janitor must remove
// exactly the names still linked. And a janitor that stops reading must not block its process.
#include "daemon/memory/segment_janitor.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/memory/shm_buffer.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

bool Exists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

// Waits up to 10 s for the child; -1 when it did not end (then SIGKILLed).
int WaitChild(pid_t child) {
  int status = 0;
  for (int i = 0; i < 1000; ++i) {
    if (waitpid(child, &status, WNOHANG) == child) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return -1;
}

TEST(SegmentJanitor, RemovesWhatADeadProcessLeftLinked) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    if (!SegmentJanitor::Start(0, nullptr).ok()) _exit(10);
    std::string names;
    std::vector<std::unique_ptr<ShmBuffer>> keep;
    for (int i = 0; i < 3; ++i) {
      auto b = ShmBuffer::Create(4096, "janitortest");
      if (!b.ok()) _exit(11);
      names += (*b)->name() + "\n";
      keep.push_back(std::move(*b));
    }
    if (!keep[1]->Unlink().ok()) _exit(12);  // removed by its owner: the janitor forgets it
    names += std::to_string(SegmentJanitor::pid()) + "\n";
    if (write(fds[1], names.data(), names.size()) != static_cast<ssize_t>(names.size())) _exit(13);
    _exit(0);  // no destructor runs: the two linked names stay behind
  }
  close(fds[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  close(fds[0]);
  ASSERT_EQ(WaitChild(child), 0);
  std::istringstream in(text);
  std::vector<std::string> names(3);
  pid_t janitor = -1;
  ASSERT_TRUE(in >> names[0] >> names[1] >> names[2] >> janitor) << text;
  // A name the janitor never heard of stays: the parent's own.
  auto mine = ShmBuffer::Create(4096, "janitortest");
  ASSERT_TRUE(mine.ok());
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = !Exists(names[0]) && !Exists(names[2]) && kill(janitor, 0) != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "the janitor " << janitor << " left " << names[0] << " or " << names[2]
                    << " in /dev/shm, or still runs";
  EXPECT_FALSE(Exists(names[1]));
  EXPECT_TRUE(Exists((*mine)->name()));
  for (const std::string& n : names) shm_unlink(n.c_str());
}

TEST(SegmentJanitor, ItsCommandLineAndSession) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The process's own argv (the kernel shows /proc/<pid>/cmdline from that memory): glibc's
    // program_invocation_name is argv[0]; the other strings follow it.
    std::ifstream self("/proc/self/cmdline");
    const std::string all((std::istreambuf_iterator<char>(self)), std::istreambuf_iterator<char>());
    std::vector<char*> argv;
    for (size_t at = 0; at < all.size(); at += std::strlen(program_invocation_name + at) + 1) {
      argv.push_back(program_invocation_name + at);
    }
    if (!SegmentJanitor::Start(static_cast<int>(argv.size()), argv.data()).ok()) _exit(10);
    const pid_t j = SegmentJanitor::pid();
    std::string cmdline, comm;
    for (int i = 0; i < 200; ++i) {  // the rename happens in the janitor, just after the fork
      std::ifstream c("/proc/" + std::to_string(j) + "/cmdline");
      std::getline(c, cmdline, '\0');
      std::ifstream m("/proc/" + std::to_string(j) + "/comm");
      std::getline(m, comm);
      if (cmdline == "spexd-janitor" && comm == "spexd-janitor") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (cmdline != "spexd-janitor" || comm != "spexd-janitor") _exit(11);
    if (getsid(j) != j) _exit(12);         // a session of its own
    if (kill(j, SIGTERM) != 0) _exit(13);  // ignored
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (kill(j, 0) != 0) _exit(14);
    if (SegmentJanitor::Start(0, nullptr).ok()) _exit(15);  // only once
    _exit(0);
  }
  EXPECT_EQ(WaitChild(child), 0) << "10: no janitor, 11: its name, 12: its session, 13/14: "
                                    "SIGTERM ended it, 15: a second Start";
}

TEST(SegmentJanitor, AStoppedJanitorDoesNotBlockItsProcess) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!SegmentJanitor::Start(0, nullptr).ok()) _exit(10);
    const pid_t j = SegmentJanitor::pid();
    if (kill(j, SIGSTOP) != 0) _exit(11);
    // Far more names than the socket's buffer holds: the first that does not fit waits a second,
    // the rest do not wait.
    for (int i = 0; i < 20000; ++i) SegmentJanitor::Track("/spex-janitortest-" + std::to_string(i));
    kill(j, SIGKILL);
    _exit(0);
  }
  EXPECT_EQ(WaitChild(child), 0) << "Track blocked on a stopped janitor (-1) or failed";
}

}  // namespace
}  // namespace spex
