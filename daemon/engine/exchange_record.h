// What the engine reports about its exchanges and sessions (GetStats, spexctl): one record per
// exchange of a bucket, a summary per bucket and per trainer session. Plain values, no locking.
#pragma once

#include <cstdint>
#include <string>

namespace spex {

// The phases of one exchange, in order; their times add up to the exchange's total.
enum class Phase { kWaitLocal, kReduceLocal, kCompress, kCollective, kDecode, kPublish, kCount };
inline constexpr int kPhaseCount = static_cast<int>(Phase::kCount);
const char* PhaseName(Phase p);

struct ExchangeRecord {
  uint64_t bucket_id = 0;
  uint64_t step = 0;
  std::string compressor;
  double target_density = 1.0;
  double achieved_density = 1.0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double residual_norm = 0;
  double phase_seconds[kPhaseCount] = {};
  // CPU time (user + system) of the thread that ran each phase, over the phase: near its
  // seconds while it computes or polls, near 0 while it sleeps (a passive MPI wait, a futex).
  double phase_cpu_seconds[kPhaseCount] = {};
  double total_seconds = 0;
  uint64_t gathered_elements = 0;
  uint64_t selected_elements = 0;
  std::string pattern = "D";
  // Pattern B: "allgather" or "oktopk", how this step summed the selections; else empty.
  std::string sparse_allreduce;
  bool fell_back_to_dense = false;
  uint64_t residual_norm_step = 0;
};

struct BucketSummary {
  uint64_t bucket_id = 0;
  uint64_t elements = 0;
  std::string compressor;
  std::string dtype;  // DTypeName of its data type
  std::string state;  // BucketStateName of its state
  uint64_t exchanges = 0;
  // Running totals over every exchange since the bucket was registered (they restart with a
  // new registration of its id): rates are deltas of these between two looks.
  uint64_t bytes_sent_total = 0;
  uint64_t bytes_received_total = 0;
  ExchangeRecord last;
  std::string exchange_choice;  // how auto chose the bucket's exchange, and why (or empty)
  double mean_phase_seconds[kPhaseCount] = {};
  double mean_phase_cpu_seconds[kPhaseCount] = {};
};

struct SessionSummary {
  uint64_t session_id = 0;
  uint32_t local_rank = 0;
  uint32_t pid = 0;
  std::string client;
  uint32_t buckets = 0;
  double age_seconds = 0;
  uint32_t uid = 0;
};

}  // namespace spex
