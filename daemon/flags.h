// Every spexd flag, declared once (defined in flags.cc with help text and defaults). Only
// daemon/config.cc reads them; the enumerations are typed, so a bad value fails at parsing
// with the flag's name and the accepted values.
#pragma once

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"
#include "daemon/device.h"
#include "daemon/engine/engine_options.h"
#include "daemon/merge/merger.h"
#include "daemon/util/log.h"

ABSL_DECLARE_FLAG(std::string, socket);
ABSL_DECLARE_FLAG(std::string, socket_mode);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(int, local_trainers);
ABSL_DECLARE_FLAG(std::string, compressor);
ABSL_DECLARE_FLAG(double, density);
ABSL_DECLARE_FLAG(absl::Duration, register_timeout);
ABSL_DECLARE_FLAG(absl::Duration, shutdown_grace);
ABSL_DECLARE_FLAG(int, spin_us);
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(spex::DeviceChoice, device);
ABSL_DECLARE_FLAG(bool, error_feedback);
ABSL_DECLARE_FLAG(int64_t, min_sparse_elements);
ABSL_DECLARE_FLAG(spex::DenseFallback, dense_fallback);
ABSL_DECLARE_FLAG(int, probe_steps);
ABSL_DECLARE_FLAG(int64_t, mpi_wait_max_sleep_us);
ABSL_DECLARE_FLAG(spex::NonfinitePolicy, nonfinite);
ABSL_DECLARE_FLAG(int64_t, max_bucket_bytes);
ABSL_DECLARE_FLAG(int64_t, max_session_bytes);
ABSL_DECLARE_FLAG(int64_t, max_daemon_bytes);
ABSL_DECLARE_FLAG(int, max_buckets_per_session);
ABSL_DECLARE_FLAG(bool, fp16_values);
ABSL_DECLARE_FLAG(spex::SparseAllreduce, sparse_allreduce);
ABSL_DECLARE_FLAG(spex::OkTopkSelect, oktopk_global);
ABSL_DECLARE_FLAG(int, oktopk_recompute_every);
ABSL_DECLARE_FLAG(int, oktopk_rebalance_every);
ABSL_DECLARE_FLAG(int, residual_norm_every);
ABSL_DECLARE_FLAG(spex::MergerPolicy, merger);
ABSL_DECLARE_FLAG(uint64_t, merge_window);
ABSL_DECLARE_FLAG(uint64_t, max_group_elements);
ABSL_DECLARE_FLAG(uint64_t, fixed_threshold_bytes);
ABSL_DECLARE_FLAG(int64_t, fixed_cycle_ms);
ABSL_DECLARE_FLAG(uint64_t, omgs_threshold_elements);
ABSL_DECLARE_FLAG(uint64_t, omgs_count);
ABSL_DECLARE_FLAG(bool, merge_overlap);
ABSL_DECLARE_FLAG(std::string, rgmerge_plan);
ABSL_DECLARE_FLAG(std::string, omgs_select);
ABSL_DECLARE_FLAG(std::string, rgmerge_select);
ABSL_DECLARE_FLAG(uint64_t, merge_plan_step);
ABSL_DECLARE_FLAG(std::string, omgs_mode);
ABSL_DECLARE_FLAG(int64_t, rgmerge_slack_us);
ABSL_DECLARE_FLAG(int64_t, merge_alpha_us);
ABSL_DECLARE_FLAG(bool, rgmerge_equal_tail);
ABSL_DECLARE_FLAG(std::string, rgmerge_linger);
ABSL_DECLARE_FLAG(int64_t, rgmerge_linger_max_us);
ABSL_DECLARE_FLAG(std::string, rgmerge_bind);
ABSL_DECLARE_FLAG(spex::LogLevel, log_level);
ABSL_DECLARE_FLAG(std::string, metrics_address);
ABSL_DECLARE_FLAG(bool, metrics_allow_remote);
ABSL_DECLARE_FLAG(std::string, timeline);
