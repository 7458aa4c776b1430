// LoadConfig (config.h): every spexd flag read once, checked with an error that names the flag, and
// turned into the typed Config the engine and the service are built from.
#include "daemon/config.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "daemon/flags.h"
#include "daemon/merge/merger.h"
#include "daemon/observe/metrics_address.h"
#include "proto/contract/socket_paths.h"

namespace spex {
namespace {

// Octal permission bits ("0600", "660"); false for anything else or above 0777.
bool ParseMode(const std::string& text, mode_t* mode) {
  if (text.empty() || text.size() > 4) return false;
  mode_t m = 0;
  for (char c : text) {
    if (c < '0' || c > '7') return false;
    m = m * 8 + static_cast<mode_t>(c - '0');
  }
  if (m > 0777) return false;
  *mode = m;
  return true;
}

// --allow_uids: uids or user names, comma-separated.
absl::Status ParseUids(const std::string& text, std::vector<uint32_t>* out) {
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    uint32_t uid = 0;
    if (absl::SimpleAtoi(part, &uid)) {
      out->push_back(uid);
      continue;
    }
    passwd pw;
    passwd* found = nullptr;
    char buf[1024];
    const std::string name(part.substr(0, 64));
    if (getpwnam_r(name.c_str(), &pw, buf, sizeof(buf), &found) != 0 || found == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--allow_uids: '", name, "' is neither a uid nor a user name known to this host"));
    }
    out->push_back(found->pw_uid);
  }
  return absl::OkStatus();
}

// The engine's own flags (LoadConfig's first stage): trainers, compressor, fallback, limits,
// the sparse all-reduce. Every bad value adds an error naming its flag to `errors`.
void ReadEngineFlags(EngineOptions& e, std::vector<std::string>* errors) {
  e.local_trainers = absl::GetFlag(FLAGS_local_trainers);
  e.job = absl::GetFlag(FLAGS_job);
  e.compressor = absl::GetFlag(FLAGS_compressor);
  e.density = absl::GetFlag(FLAGS_density);
  e.register_wait = absl::GetFlag(FLAGS_register_timeout);
  e.shm_tag = absl::StrCat(getpid());
  e.error_feedback = absl::GetFlag(FLAGS_error_feedback);
  const int64_t min_sparse = absl::GetFlag(FLAGS_min_sparse_elements);
  if (min_sparse < 0) {
    errors->push_back(absl::StrCat("--min_sparse_elements must be >= 0, got ", min_sparse));
  } else {
    e.min_sparse_elements = static_cast<uint64_t>(min_sparse);
  }
  e.dense_fallback = absl::GetFlag(FLAGS_dense_fallback);
  e.probe_steps = absl::GetFlag(FLAGS_probe_steps);
  e.auto_decide = absl::GetFlag(FLAGS_auto_decide);
  e.link_gbps = absl::GetFlag(FLAGS_link_gbps);
  e.link_latency_us = absl::GetFlag(FLAGS_link_latency_us);
  e.nonfinite = absl::GetFlag(FLAGS_nonfinite);
  for (const auto& [flag, value, out] :
       {std::make_tuple("--max_bucket_bytes", absl::GetFlag(FLAGS_max_bucket_bytes),
                        &e.max_bucket_bytes),
        std::make_tuple("--max_session_bytes", absl::GetFlag(FLAGS_max_session_bytes),
                        &e.max_session_bytes),
        std::make_tuple("--max_daemon_bytes", absl::GetFlag(FLAGS_max_daemon_bytes),
                        &e.max_daemon_bytes)}) {
    if (value < 0) {
      errors->push_back(
          absl::StrCat(flag, " must be >= 0 (0: derived from the machine), got ", value));
    } else {
      *out = static_cast<uint64_t>(value);
    }
  }
  e.max_buckets_per_session = absl::GetFlag(FLAGS_max_buckets_per_session);
  e.fp16_values = absl::GetFlag(FLAGS_fp16_values);
  e.index_encoding = absl::GetFlag(FLAGS_wire_index_encoding);
  e.sparse_allreduce = absl::GetFlag(FLAGS_sparse_allreduce);
  e.oktopk_global = absl::GetFlag(FLAGS_oktopk_global);
  e.oktopk_recompute_every = absl::GetFlag(FLAGS_oktopk_recompute_every);
  e.oktopk_rebalance_every = absl::GetFlag(FLAGS_oktopk_rebalance_every);
  e.residual_norm_every = absl::GetFlag(FLAGS_residual_norm_every);
}

// The merge groups' flags (--merger and what its policies read).
void ReadMergeFlags(EngineOptions& e, std::vector<std::string>* errors) {
  e.merger = absl::GetFlag(FLAGS_merger);
  e.merge.limits.window = static_cast<size_t>(absl::GetFlag(FLAGS_merge_window));
  e.merge.limits.max_group_elements = absl::GetFlag(FLAGS_max_group_elements);
  e.merge.fixed_threshold_bytes = absl::GetFlag(FLAGS_fixed_threshold_bytes);
  e.merge.fixed_cycle_ms = absl::GetFlag(FLAGS_fixed_cycle_ms);
  e.merge.omgs_threshold_elements = absl::GetFlag(FLAGS_omgs_threshold_elements);
  e.merge.omgs_count = absl::GetFlag(FLAGS_omgs_count);
  const std::string omgs_mode = absl::GetFlag(FLAGS_omgs_mode);
  if (omgs_mode == "threshold") {
    e.merge.omgs_mode = e.merge.omgs_count > 0 ? OmgsMode::kCount : OmgsMode::kThreshold;
  } else if (omgs_mode == "count") {
    e.merge.omgs_mode = OmgsMode::kCount;
  } else if (omgs_mode == "mgs") {
    e.merge.omgs_mode = OmgsMode::kMgs;
  } else {
    errors->push_back(absl::StrCat("--omgs_mode must be threshold, count or mgs, got '",
                                   omgs_mode.substr(0, 64), "'"));
  }
  e.merge_overlap = absl::GetFlag(FLAGS_merge_overlap);
  if (e.merge.omgs_count == 0) e.merge.omgs_count = 10;  // unused in threshold mode
  const std::string plan = absl::GetFlag(FLAGS_rgmerge_plan);
  if (plan != "ready" && plan != "model") {
    errors->push_back(
        absl::StrCat("--rgmerge_plan must be ready or model, got '", plan.substr(0, 64), "'"));
  }
  e.merge.rgmerge_model = plan == "model";
  for (const auto& [flag, value, out] :
       {std::tuple<const char*, std::string, bool*>{
            "--omgs_select", absl::GetFlag(FLAGS_omgs_select), &e.merge.omgs_select_behind},
        std::tuple<const char*, std::string, bool*>{"--rgmerge_select",
                                                    absl::GetFlag(FLAGS_rgmerge_select),
                                                    &e.merge.rgmerge_select_behind}}) {
    if (value != "ahead" && value != "behind") {
      errors->push_back(
          absl::StrCat(flag, " must be ahead or behind, got '", value.substr(0, 64), "'"));
    }
    *out = value == "behind";
  }
  e.merge.plan_step = absl::GetFlag(FLAGS_merge_plan_step);
  if (e.merge.plan_step == 0) {
    e.merge.plan_step = 2 * static_cast<uint64_t>(std::max(0, e.probe_steps)) + 16;
  }
  e.merge.rgmerge_slack_us = absl::GetFlag(FLAGS_rgmerge_slack_us);
  e.merge.merge_alpha_us = absl::GetFlag(FLAGS_merge_alpha_us);
  e.merge.rgmerge_equal_tail = absl::GetFlag(FLAGS_rgmerge_equal_tail);
  const std::string linger = absl::GetFlag(FLAGS_rgmerge_linger);
  if (linger != "off" && linger != "auto") {
    errors->push_back(
        absl::StrCat("--rgmerge_linger must be off or auto, got '", linger.substr(0, 64), "'"));
  }
  e.merge.rgmerge_linger_auto = linger == "auto";
  e.merge.rgmerge_linger_max_us = absl::GetFlag(FLAGS_rgmerge_linger_max_us);
  const std::string bind = absl::GetFlag(FLAGS_rgmerge_bind);
  if (bind != "early" && bind != "late") {
    errors->push_back(
        absl::StrCat("--rgmerge_bind must be early or late, got '", bind.substr(0, 64), "'"));
  }
  e.merge.rgmerge_bind_late = bind == "late";
}

// What only the whole engine configuration can tell: its own validation, the merger it builds,
// the registration timeout.
void CheckEngineOptions(const EngineOptions& e, std::vector<std::string>* errors) {
  if (absl::Status s = ValidateEngineOptions(e); !s.ok()) errors->emplace_back(s.message());
  if (absl::StatusOr<std::unique_ptr<Merger>> m = MakeMerger(e.merger, e.merge); !m.ok()) {
    errors->emplace_back(m.status().message());
  }
  if (e.register_wait <= absl::ZeroDuration()) {
    errors->push_back(
        absl::StrCat("--register_timeout must be a positive duration such as 30s, got ",
                     absl::FormatDuration(e.register_wait)));
  }
}

// The daemon's place and resources: socket, job, stop grace, threads, MPI waits, spinning,
// device.
void ReadServingFlags(DaemonConfig& c, std::vector<std::string>* errors) {
  const EngineOptions& e = c.engine;
  c.socket = absl::GetFlag(FLAGS_socket);
  c.job = e.job.empty() ? DefaultJob() : e.job;
  const std::string mode = absl::GetFlag(FLAGS_socket_mode);
  if (!ParseMode(mode, &c.socket_mode)) {
    errors->push_back(absl::StrCat(
        "--socket_mode must be octal permission bits such as 0600 (at most 0777), got '",
        mode.substr(0, 64), "'"));
  }
  c.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (c.shutdown_grace <= absl::ZeroDuration()) {
    errors->push_back(absl::StrCat("--shutdown_grace must be a positive duration such as 5s, got ",
                                   absl::FormatDuration(c.shutdown_grace)));
  }
  c.threads = absl::GetFlag(FLAGS_threads);
  if (c.threads < 0) {
    errors->push_back(absl::StrCat("--threads must be >= 0 (0: all cores), got ", c.threads));
  }
  c.mpi_wait_max_sleep_us = absl::GetFlag(FLAGS_mpi_wait_max_sleep_us);
  if (c.mpi_wait_max_sleep_us < 0 || c.mpi_wait_max_sleep_us > 1000000) {
    errors->push_back(
        absl::StrCat("--mpi_wait_max_sleep_us must be in [0, 1000000] (0: wait inside MPI), got ",
                     c.mpi_wait_max_sleep_us));
  }
  c.mpi_passive_wait_min_bytes = absl::GetFlag(FLAGS_mpi_passive_wait_min_bytes);
  if (c.mpi_passive_wait_min_bytes < 0) {
    errors->push_back(absl::StrCat(
        "--mpi_passive_wait_min_bytes must be >= 0 (0: every collective waits passively), got ",
        c.mpi_passive_wait_min_bytes));
  }
  const std::string sleep_beside = absl::GetFlag(FLAGS_mpi_sleep_beside_compute);
  if (sleep_beside == "auto") {
    c.mpi_sleep_beside_compute = DaemonConfig::Toggle::kAuto;
  } else if (sleep_beside == "on") {
    c.mpi_sleep_beside_compute = DaemonConfig::Toggle::kOn;
    if (c.mpi_wait_max_sleep_us == 0) {
      errors->push_back(
          "--mpi_sleep_beside_compute=on needs --mpi_wait_max_sleep_us > 0 (its longest sleep)");
    }
  } else if (sleep_beside == "off") {
    c.mpi_sleep_beside_compute = DaemonConfig::Toggle::kOff;
  } else {
    errors->push_back(absl::StrCat("--mpi_sleep_beside_compute must be auto, on or off, got '",
                                   sleep_beside, "'"));
  }
  c.spin_us = absl::GetFlag(FLAGS_spin_us);
  if (c.spin_us < -1) {
    errors->push_back(absl::StrCat("--spin_us must be >= 0, or -1 (automatic), got ", c.spin_us));
  }
  c.device = absl::GetFlag(FLAGS_device);
  if (absl::StatusOr<std::vector<int>> d = ParseDeviceList(absl::GetFlag(FLAGS_devices)); d.ok()) {
    c.devices = *d;
  } else {
    errors->emplace_back(d.status().message());
  }
}

// Logging, metrics and the timeline.
void ReadObserveFlags(DaemonConfig& c, std::vector<std::string>* errors) {
  c.log_level = absl::GetFlag(FLAGS_log_level);
  if (const std::string metrics = absl::GetFlag(FLAGS_metrics_address); !metrics.empty()) {
    absl::StatusOr<MetricsAddress> m =
        ParseMetricsAddress(metrics, absl::GetFlag(FLAGS_metrics_allow_remote));
    if (m.ok()) {
      c.metrics = *m;
    } else {
      errors->emplace_back(m.status().message());
    }
  }
  c.timeline = absl::GetFlag(FLAGS_timeline);
  c.timeline_dir = absl::GetFlag(FLAGS_timeline_dir);
  if (!c.timeline_dir.empty()) {
    if (absl::Status s = CheckPrivateDirectory(c.timeline_dir, geteuid()); !s.ok()) {
      errors->push_back(absl::StrCat("--timeline_dir: ", s.message()));
    }
  }
  const int64_t timeline_max = absl::GetFlag(FLAGS_timeline_max_bytes);
  if (timeline_max < 0) {
    errors->push_back(
        absl::StrCat("--timeline_max_bytes must be >= 0 (0: no limit), got ", timeline_max));
  } else {
    c.timeline_max_bytes = static_cast<uint64_t>(timeline_max);
  }
}

// Who may connect and how much a client may hold: uids, connections, RPC threads, streams,
// waits, checkpoint streams.
void ReadClientLimitFlags(DaemonConfig& c, std::vector<std::string>* errors) {
  if (absl::Status s = ParseUids(absl::GetFlag(FLAGS_allow_uids), &c.allow_uids); !s.ok()) {
    errors->emplace_back(s.message());
  }
  for (const auto& [flag, value, out] :
       {std::make_tuple("--max_connections", absl::GetFlag(FLAGS_max_connections),
                        &c.max_connections),
        std::make_tuple("--rpc_threads", absl::GetFlag(FLAGS_rpc_threads), &c.rpc_threads),
        std::make_tuple("--max_streams_per_connection",
                        absl::GetFlag(FLAGS_max_streams_per_connection),
                        &c.max_streams_per_connection)}) {
    if (value < 1 || value > 100000) {
      errors->push_back(absl::StrCat(flag, " must be in 1..100000, got ", value));
    } else {
      *out = value;
    }
  }
  // gRPC's sync server keeps a few threads polling; fewer than this could serve nothing.
  if (c.rpc_threads < 4) {
    errors->push_back(absl::StrCat("--rpc_threads must be >= 4, got ", c.rpc_threads));
  }
  c.max_exchange_wait = absl::GetFlag(FLAGS_max_exchange_wait);
  if (c.max_exchange_wait <= absl::ZeroDuration()) {
    errors->push_back(
        absl::StrCat("--max_exchange_wait must be a positive duration such as 10m, got ",
                     absl::FormatDuration(c.max_exchange_wait)));
  }
  const int streams = absl::GetFlag(FLAGS_max_checkpoint_streams);
  if (streams < 0 || streams > 100000) {
    errors->push_back(absl::StrCat(
        "--max_checkpoint_streams must be in 0..100000 (0: --local_trainers), got ", streams));
  } else {
    c.max_checkpoint_streams = streams;
  }
  c.checkpoint_stream_timeout = absl::GetFlag(FLAGS_checkpoint_stream_timeout);
  if (c.checkpoint_stream_timeout <= absl::ZeroDuration()) {
    errors->push_back(
        absl::StrCat("--checkpoint_stream_timeout must be a positive duration such as 1m, got ",
                     absl::FormatDuration(c.checkpoint_stream_timeout)));
  }
}

}  // namespace

absl::StatusOr<DaemonConfig> LoadConfig() {
  DaemonConfig c;
  std::vector<std::string> errors;
  ReadEngineFlags(c.engine, &errors);
  ReadMergeFlags(c.engine, &errors);
  CheckEngineOptions(c.engine, &errors);
  ReadServingFlags(c, &errors);
  ReadObserveFlags(c, &errors);
  ReadClientLimitFlags(c, &errors);
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "; "));
  return c;
}

std::string SocketPath(const DaemonConfig& config, int rank, int host_index, int host_count) {
  const std::string path = config.socket.empty()
                               ? DefaultSocketPath(config.job, host_count > 1 ? host_index : -1)
                               : config.socket;
  return absl::StrReplaceAll(path, {{"{rank}", absl::StrCat(rank)}});
}

bool SharesCores(const DaemonConfig& config, int host_count, int cores) {
  return cores <= (config.engine.local_trainers + 1) * host_count;
}

int SpinUs(const DaemonConfig& config, int host_count, int cores) {
  if (config.spin_us >= 0) return config.spin_us;
  return SharesCores(config, host_count, cores) ? 0 : 50;
}

bool WantsSleepBesideCompute(const DaemonConfig& config, int host_count, int cores) {
  switch (config.mpi_sleep_beside_compute) {
    case DaemonConfig::Toggle::kOn:
      return true;
    case DaemonConfig::Toggle::kOff:
      return false;
    case DaemonConfig::Toggle::kAuto:
      break;
  }
  return config.mpi_wait_max_sleep_us > 0 && SharesCores(config, host_count, cores);
}

}  // namespace spex
