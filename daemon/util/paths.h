// Where a node's spexd listens by default: a path unique per user, job and host, agreed on by
// the daemon and its trainers without configuration:
//   /tmp/spex-<uid>/<job>/<hostname>[.<i>].sock
// <job> is $SPEX_JOB, else $SLURM_JOB_ID, else "default"; ".<i>" is added when several
// daemons share a host (emulated nodes), i being the daemon's index on the host. Trainers
// take $SPEX_SOCKET first, then this default with i = $SPEX_LOCAL_DAEMON when set.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace spex {

std::string DefaultJob();
std::string Hostname();
// local_index < 0: no suffix.
std::string DefaultSocketPath(const std::string& job, int local_index);
// What a trainer connects to when given no explicit path.
std::string ClientSocketPath(const std::string& job);
// Refuses a path where a daemon answers; removes a stale socket file; creates parent
// directories with mode 0700.
absl::Status PrepareSocketPath(const std::string& path);

}  // namespace spex
