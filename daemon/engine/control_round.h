// The control round: one tiny all-reduce (MAX) before every exchange, in which all nodes check
// that they are about to exchange the same thing and share the run-time decisions that must take
// effect at the same step everywhere:
//  - the order check: (bucket, step, size, compressor) and the --nonfinite and
//    --sparse_allreduce settings equal on every node, or a clear
//    FAILED_PRECONDITION instead of a hang in mismatched collectives;
//  - the newest density change any node has seen (`spexctl set-density` on one node);
//  - the dense-fallback and --sparse_allreduce=auto probe timings (the slowest node's count);
//  - whether any node could not read its trainers' inputs (then every node skips the step), and
//    which trainer died if that is why.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "daemon/transport/collective.h"

namespace spex {

// What this node is about to exchange.
struct ExchangeKey {
  uint64_t bucket_id = 0;
  uint64_t step = 0;
  uint64_t elements = 0;
  absl::string_view compressor;  // borrowed for the call
  // The --nonfinite policy (its flag spelling; borrowed), with " dense_fallback=off" appended
  // for a bucket that does not probe: nodes that would decide differently on a non-finite step,
  // or one probing while another does not, must not start one.
  absl::string_view nonfinite = "propagate";
  // The --sparse_allreduce exchange (its flag spelling; borrowed): nodes running different ones
  // would issue mismatched collectives.
  absl::string_view sparse_allreduce = "allgather";
};

// What the round carries; each field is maxed over the nodes.
struct Control {
  uint64_t density_key = 0;   // (change number << 32) | float bits of the density
  uint64_t sparse_us = 0;     // dense-fallback probe: this bucket's summed sparse timings
  uint64_t dense_us = 0;      // ... and dense timings
  uint64_t allgather_us = 0;  // --sparse_allreduce=auto probe: the all-gather's summed timings
  uint64_t oktopk_us = 0;     // ... and Ok-Topk's
  bool inputs_failed = false;
  // A local trainer of this node died with this step half-done: DeadTrainerWord(node, rank,
  // pid), else 0. Maxed, so every node names the same one.
  uint64_t dead_trainer = 0;
  // A local trainer of this node handed in a NaN or +-Inf for this step (the non-finite policy,
  // issue 16 item 3): NonfiniteWord(node, rank, first bad index), else 0. Maxed, so every node
  // decides alike and names the same one.
  uint64_t nonfinite = 0;
};

uint64_t DeadTrainerWord(int node, uint32_t local_rank, uint32_t pid);
// "local trainer R (pid P) of node N" for a nonzero word.
std::string DeadTrainerName(uint64_t word);
// A local rank whose ready word went back (a write into the shared header no client makes)
// travels in the control round as a dead trainer with this bit set in the word's rank field
// (DeadTrainerWord; local ranks are < kMaxLocalTrainers).
inline constexpr uint32_t kBrokenRank = 0x8000;
// ABORTED: the exchange `what` ("bucket 3 step 7") cannot complete because of the dead or
// broken (kBrokenRank) trainer of `word`.
absl::Status DeadTrainerError(absl::string_view what, uint64_t word);

// The local rank of a word whose node's local sum overflowed at the index while every input
// there was finite (no single trainer to name).
inline constexpr uint32_t kNonfiniteSum = 0xffff;
uint64_t NonfiniteWord(int node, uint32_t local_rank, uint32_t index);
// "local trainer R of node N, first non-finite value at index I" for a nonzero word ("the sum
// of node N's local inputs overflowed at index I" for kNonfiniteSum).
std::string NonfiniteName(uint64_t word);
// INVALID_ARGUMENT: nonfinite=error skips `bucket`'s `step` on every node because of the
// non-finite input of `word`; `where` is added after its name (e.g. " in its merge group").
absl::Status NonfiniteSkipError(uint64_t bucket, uint64_t step, uint64_t word,
                                absl::string_view where);

// Runs the round over `coll` (no communication with one node). On return `*c` holds the maxed
// values. FAILED_PRECONDITION when the nodes disagree on the key (saying what differs); the
// collective's error when the all-reduce fails.
absl::Status RunControlRound(Collective* coll, const ExchangeKey& key, Control* c);

// Density keys: a change number and a density, ordered by change number.
uint64_t DensityKey(uint64_t change, float density);
float DensityOfKey(uint64_t key);

}  // namespace spex
