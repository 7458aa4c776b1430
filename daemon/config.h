// spexd's configuration: every flag of daemon/flags.cc read once, checked (each error names the
// flag and what it accepts) and turned into typed values. The two values that depend on the MPI
// world (the socket path and the automatic spin) are resolved by SocketPath and SpinUs once the
// world is known.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/device.h"
#include "daemon/engine/engine_options.h"
#include "daemon/observe/metrics_address.h"
#include "daemon/util/log.h"

namespace spex {

struct DaemonConfig {
  // The engine's options; spexd adds the spin (SpinUs) and the run-time hooks.
  EngineOptions engine;
  std::string socket;         // --socket; empty: the default path. '{rank}' not replaced yet
  std::string job;            // the job of the default path: --job, else DefaultJob()
  mode_t socket_mode = 0600;  // --socket_mode, parsed
  absl::Duration shutdown_grace = absl::Seconds(5);
  int threads = 0;   // CPU primitives' worker threads (0: all cores)
  int spin_us = -1;  // -1: automatic (SpinUs)
  // --mpi_wait_max_sleep_us: 0 = the engine's collectives wait inside MPI; > 0 = passive waits
  // with sleeps up to this (MpiWaitPolicy) for collectives of at least
  // --mpi_passive_wait_min_bytes (0: all of them).
  int64_t mpi_wait_max_sleep_us = 1000;
  int64_t mpi_passive_wait_min_bytes = 1 << 20;
  // --mpi_sleep_beside_compute (MpiWaitPolicy::sleep_only_beside_compute); auto: SharesCores.
  enum class Toggle { kAuto, kOn, kOff };
  Toggle mpi_sleep_beside_compute = Toggle::kOff;
  DeviceChoice device = DeviceChoice::kAuto;
  std::vector<int> devices;  // --devices, parsed; empty: every usable GPU
  LogLevel log_level = LogLevel::kInfo;
  // --metrics_address, checked (loopback unless --metrics_allow_remote); unset: metrics off.
  std::optional<MetricsAddress> metrics;
  std::string timeline;      // --timeline; empty: off. '{rank}' not replaced yet (TimelinePath)
  std::string timeline_dir;  // --timeline_dir; empty: no recording at run time
  uint64_t timeline_max_bytes = 0;  // --timeline_max_bytes; 0: no cap
  // The control socket's resources and who may use it.
  std::vector<uint32_t> allow_uids;  // --allow_uids, resolved
  int max_connections = 64;
  int rpc_threads = 64;
  int max_streams_per_connection = 16;
  absl::Duration max_exchange_wait = absl::Minutes(10);
  int max_checkpoint_streams = 0;  // 0: --local_trainers
  absl::Duration checkpoint_stream_timeout = absl::Minutes(1);
};

// Reads and checks every flag. InvalidArgument listing every bad flag, each with what it
// accepts (the enumerated flags already failed at parsing if misspelt).
absl::StatusOr<DaemonConfig> LoadConfig();

// The control socket of node `rank`, the `host_index`-th of the `host_count` daemons of its
// host: --socket with '{rank}' replaced, else the default path (proto/contract/socket_paths.h).
std::string SocketPath(const DaemonConfig& config, int rank, int host_index, int host_count);

// Whether the host's `host_count` daemons and their local trainers outnumber its `cores`
// (SpinUs, WantsSleepBesideCompute).
bool SharesCores(const DaemonConfig& config, int host_count, int cores);

// --spin_us, with -1 resolved: 50 us when the host's `cores` exceed its daemons x (local
// trainers + 1), so spinning never takes a core someone needs; else 0.
int SpinUs(const DaemonConfig& config, int host_count, int cores);

// This node's wish for --mpi_sleep_beside_compute: on / off as set; auto: when the daemons and
// trainers share cores (SharesCores) and --mpi_wait_max_sleep_us > 0. Every node then follows
// the wish of any (spexd agrees on it: a blocking collective never matches a non-blocking one).
bool WantsSleepBesideCompute(const DaemonConfig& config, int host_count, int cores);

}  // namespace spex
