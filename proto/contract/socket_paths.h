// Where a node's spexd listens by default: a path unique per user, job and host, agreed on by
// the daemon and its trainers without configuration:
//   <base>/<job>/<hostname>[.<i>].sock
// <base> is $XDG_RUNTIME_DIR/spex when $XDG_RUNTIME_DIR is a directory this user owns that others
// cannot write (the per-user runtime directory of a login session), else /tmp/spex-<uid>.
// <job> is $SPEX_JOB, else $SLURM_JOB_ID, else "default"; ".<i>" is added when several
// daemons share a host (emulated nodes), i being the daemon's index on the host. Trainers
// take $SPEX_SOCKET first, then this default with i = $SPEX_LOCAL_DAEMON when set.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace spex {

std::string DefaultJob();
std::string Hostname();
// local_index < 0: no suffix.
std::string DefaultSocketPath(const std::string& job, int local_index);
// What a trainer connects to when given no explicit path.
std::string ClientSocketPath(const std::string& job);
// The directory the default paths live in (see above).
std::string DefaultSocketBase();
// Refuses a path where a daemon answers; removes a stale socket file; creates parent
// directories with mode 0700; refuses a socket directory that another user could have prepared
// or can change (CheckPrivateDirectory with this process's uid).
absl::Status PrepareSocketPath(const std::string& path);
// Whether only `trusted` (and root) can replace what `dir` holds: `dir` is a directory owned by
// `trusted` that group and others cannot write, every directory above it is owned by root or
// `trusted` and, when others may write it, sticky (as /tmp), and every symlink on the way is owned
// by root or `trusted`. PERMISSION_DENIED naming the directory, its owner and what to do; NOT_FOUND
// when a component is missing.
absl::Status CheckPrivateDirectory(const std::string& dir, uid_t trusted);
// A trainer's check before it hands gradients to the daemon at `socket`: the process listening
// there (SO_PEERCRED of a probe connection) runs as this user, root or one of `trusted` (plus
// $SPEX_TRUST_SERVER_UIDS, comma-separated uids), and the socket's directory is private to this
// user or to the server's (CheckPrivateDirectory), so the socket cannot be swapped between this
// check and the real connection. Returns the server's uid; UNAVAILABLE when nothing listens,
// PERMISSION_DENIED naming the server's user and what to do.
absl::StatusOr<uid_t> CheckServerSocket(const std::string& socket,
                                        const std::vector<uid_t>& trusted = {});

}  // namespace spex
