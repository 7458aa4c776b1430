// The segment janitor: removes the /dev/shm names that spexd leaves behind when it dies without
// its own clean-up. spexd unlinks a segment's name once every trainer has attached, and every
// name when it stops on SIGTERM; but a daemon can end without either: SIGKILLed, or aborted by
// Open MPI when mpirun goes first (a second SIGTERM makes mpirun exit at once, as does `kill` of
// its whole process group by a supervisor such as runuser, and the daemon's PMIx client then
// calls _exit). Whatever names it held then stayed in /dev/shm until reboot.
//
// Start() forks a small process before any thread exists (before MPI_Init), the way PyTorch's
// torch_shm_manager outlives its clients: spexd tells it each name it creates ("+name") and each
// name it removes ("-name") over a socket pair; when the socket reaches end of file, which the
// kernel guarantees however spexd ended, the janitor unlinks the names still held (and the
// daemon's socket file, TrackSocket), says so on
// stderr when there were any, and exits. It runs in a session of its own (a signal to spexd's
// process group does not reach it), ignores the stop signals, keeps no other descriptor, and
// shows as "spexd-janitor" in ps (its command line too, so `pgrep -f 'spexd --socket=...'` finds
// only daemons).
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"

namespace spex {

class SegmentJanitor {
 public:
  // Forks the janitor. Call once, while the process has a single thread; argv is main()'s (the
  // janitor overwrites its copy of the command line). Errors (fork or socketpair failing) are
  // for the caller to log: spexd then runs without one, as before.
  static absl::Status Start(int argc, char** argv);

  // Names to remove should spexd end without doing so itself. No-ops without a janitor; a
  // janitor that died is not restarted (the names are then left, as without one). Safe from
  // any thread; a name is at most 255 bytes.
  static void Track(const std::string& name);
  static void Untrack(const std::string& name);

  // Also Open MPI's own shared-memory segment of this process (its vader BTL's
  // /dev/shm/vader_segment.<host>.<uid>.<job>.<local rank>, which a killed world leaves as well),
  // found among this process's mappings after MPI_Init.
  static void TrackOpenMpiSegment(int local_rank);

  // The daemon's unix socket: removed too if it is still the socket file that was there when
  // this was called (the same device and inode), so a daemon started at the path since keeps its
  // own. A relative path is taken from the working directory.
  static void TrackSocket(const std::string& path);

  // The janitor's pid, or -1 without one.
  static pid_t pid();
};

}  // namespace spex
