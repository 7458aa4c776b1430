// A registered bucket of one node (EngineBucket; the client library has its own spex::Bucket)
// and the states it moves through. Its fields fall under three
// rules, one struct each, so a reader sees which rule applies where:
//  - Memory: fixed after registration (the shared segment, the device buffer, acc).
//  - Exchange: the engine thread's alone (compressor, probe timings, next step).
//  - Outcome: shared with the RPC threads, guarded by the engine's mutex (registration, state,
//    published steps, the error, stats).
//
// States (BucketState; the engine moves a bucket along, under its mutex):
//   kRegistering -> kWaiting        every local trainer registered it (and back if one leaves)
//   kWaiting -> kExchanging         the engine took its next step (inputs ready)
//   kExchanging -> kWaiting         the step was published (OK, or an error every node agreed
//                                   on before touching any state: the bucket goes on); to
//                                   kRegistering if a trainer unregistered it meanwhile
//   kExchanging -> kFailed          the step failed after the control round: state may be
//                                   half-updated on some node, so the bucket is dead. kFailed is
//                                   terminal and sticky: every later step of it gets the error.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/exchange_record.h"
#include "daemon/engine/step.h"
#include "daemon/memory/device_memory.h"
#include "daemon/memory/shm_buffer.h"
#include "daemon/memory/trainer_memory.h"

namespace spex {

enum class BucketState { kRegistering, kWaiting, kExchanging, kFailed };
const char* BucketStateName(BucketState s);
bool IsLegalTransition(BucketState from, BucketState to);

struct BucketMemory {
  std::unique_ptr<ShmBuffer> shm;      // the BucketHeader; on the CPU path also the data
  std::unique_ptr<SharedBuffer> data;  // device path: input slots and output
  BucketHeader* header = nullptr;
  std::vector<float> acc_host;       // CPU path: acc's storage
  std::vector<float> acc_next_host;  // CPU path, sparse with error feedback: acc_next's
  std::vector<float> output_host;    // CPU path, half bucket: the float32 output before rounding
  std::unique_ptr<DeviceArray> acc_device;
  std::unique_ptr<DeviceArray> acc_next_device;  // device path, sparse with error feedback
  std::unique_ptr<DeviceArray> output_device;    // device path, half bucket: the float32 output
  std::unique_ptr<Scratch> scratch;              // device path
  BucketData view;                               // what the steps see
  // Several GPUs (docs/design.md#multi-gpu): local trainer r's buffer on its own GPU
  // remote_device[r] (its input slot, then a copy of the output) when that is not the home
  // GPU; null: trainer r's slot is in `data`. Set while trainer r is not registered and no
  // exchange of the bucket runs; its slot in `data` is then staging for the gathered input.
  std::unique_ptr<SharedBuffer> remote[kMaxLocalTrainers];
  int remote_device[kMaxLocalTrainers] = {};
  // Zero-copy input (CPU path, trainer_memory.h): local trainer r's own memory, mapped read-only,
  // which view.input[r] (or half_input[r]) then points into instead of r's slot in `shm`. Set
  // and cleared when trainer r registers, while no exchange of the bucket runs.
  std::unique_ptr<TrainerMemory> own_input[kMaxLocalTrainers];
};

struct BucketExchange {
  std::unique_ptr<SparseState> sparse;  // null: the bucket always exchanges dense
  enum class Mode { kProbe, kSparse, kDense } mode = Mode::kProbe;
  uint64_t probe_sparse_ns = 0, probe_dense_ns = 0;
  // --sparse_allreduce=auto on a bucket whose compressor can use Ok-Topk: true while the choice
  // is open; its sparse exchanges so far and their summed times per exchange.
  bool allreduce_probe = false;
  uint64_t allreduce_probed = 0;
  uint64_t probe_allgather_ns = 0, probe_oktopk_ns = 0;
  // --auto_decide=model: the cost model decides at the bucket's next exchange
  // (exchange_choice.h: DecideByModel); probe_note says why it probes instead, for the stats.
  bool model_pending = false;
  std::string probe_note;
  uint64_t next_step = 0;
  // Added to next_step for the step the compressor and the step-dependent policies see (the
  // dense-fallback probe): 0, or the step a restored checkpoint was saved at (checkpoint.h),
  // so a resumed run continues where it stopped while its trainers count from 0 again.
  uint64_t step_base = 0;
  uint64_t compute_step() const { return next_step + step_base; }
  // A merge group's local reduce (ReduceLocalChecked) already ran for step `reduced_step` and
  // its sum is in place, not yet committed: a member an agreement round left for a later group
  // keeps it, so that round's reduce is not done again (engine_group_exchange.cc, ReduceMember).
  // Its finite check's first non-finite index (elements: none). UINT64_MAX: no such sum.
  uint64_t reduced_step = UINT64_MAX;
  uint64_t reduced_registrations = 0;  // BucketOutcome::registrations when it was made
  size_t reduced_first_bad = 0;
};

struct BucketOutcome {
  BucketState state = BucketState::kRegistering;
  uint64_t registered_mask = 0;  // bit r: local trainer r registered it
  uint64_t completed = 0;        // steps published
  uint64_t error_step = UINT64_MAX;
  absl::Status error;  // of error_step; for kFailed, of every step from error_step on
  uint64_t exchanges = 0;
  // Counts every change of registered_mask (a trainer registering or unregistering): a local
  // sum the engine kept for a later merge group is of the registration it was made under.
  uint64_t registrations = 0;
  uint64_t bytes_sent_total = 0;
  uint64_t bytes_received_total = 0;
  ExchangeRecord last;
  // How the bucket's exchange was chosen and why (the cost model's times, or the probes'); empty
  // while nothing was decided or nothing is open (spexctl stats).
  std::string exchange_choice;
  double phase_sum[kPhaseCount] = {};
  double phase_cpu_sum[kPhaseCount] = {};
  // The target density in effect: written by the engine thread under the engine's mutex, so
  // the engine thread may read it without the mutex.
  double density = 0;

  // Counts one published exchange: `last`, the exchange count, the byte totals, the phase sums.
  void Count(const ExchangeRecord& rec);
};

struct EngineBucket {
  // Fixed after registration.
  uint64_t id = 0;
  uint64_t elements = 0;
  std::string compressor;
  std::map<std::string, std::string> params;  // the compressor's
  BucketPolicy policy;  // per-bucket engine options (RegisterBucket's nonfinite=...)
  BucketMemory mem;
  // Engine thread only.
  BucketExchange ex;
  // Guarded by the engine's mutex.
  BucketOutcome out;
  // The checkpoint records loaded into this bucket (checkpoint.h: RestoreBucket, AddResizedBucket),
  // so that a resized load adds each old node's residual once and never mixes with an exact one.
  struct Restored {
    bool exact = false;                 // RestoreBucket loaded a record of this world
    int nodes = 0, local_trainers = 0;  // the world of the records added (0: none)
    uint64_t step = 0;                  // the step they were saved at
    std::set<int> from;                 // their node ranks, added so far
  } restored;

  // Moves out.state to `to`; an illegal move is a bug: logged at ERROR, and refused.
  bool MoveTo(BucketState to);
  BucketSummary Summary() const;  // under the engine's mutex
  // The latest of the first `local_trainers` trainers' ready_ns stamps in the header
  // (CLOCK_MONOTONIC, docs/merging.md 2.6); 0 when none stamped. Any thread.
  int64_t ReadyStamp(int local_trainers) const;
};

}  // namespace spex
