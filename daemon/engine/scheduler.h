// Which buckets the engine exchanges next. Every node must issue the same collectives in the
// same order whatever order its trainers' signals arrive in, so the order is canonical:
// ascending (next step, bucket id) over the buckets every local trainer registered (state
// kWaiting), the same on every node. The Merger (daemon/merge) picks how many buckets from the
// head of that order form the next group. Failed buckets are out of the order: their steps are
// answered locally with their sticky error. Not thread-safe: called under the engine's mutex.
#pragma once

#include <memory>
#include <vector>

#include "daemon/engine/bucket_table.h"
#include "daemon/merge/merger.h"

namespace spex {

class Scheduler {
 public:
  Scheduler(int local_trainers, std::unique_ptr<Merger> merger);

  // The next group in canonical order (empty when no bucket is schedulable). The engine runs
  // it once every member is LocallyReady.
  // The result is the scheduler's own vector (no allocation per pick), valid until the next call.
  const std::vector<EngineBucket*>& NextGroup(const BucketTable& table);
  // Every local trainer has signalled the bucket's next step. With dead trainers (set_dead):
  // every living trainer has, and some trainer (living or dead) got to that step, so the step
  // a dead trainer left half-done runs (and fails everywhere) instead of hanging the peers.
  bool LocallyReady(const EngineBucket& b) const;
  // Local ranks whose trainer died during this job (bit r).
  void set_dead(uint64_t mask) { dead_ = mask; }
  // Failed buckets some step of which every local trainer has signalled.
  // Also the scheduler's own vector, valid until the next call.
  const std::vector<EngineBucket*>& FailedAndReady(const BucketTable& table);

  const char* merger_name() const { return merger_->name(); }

 private:
  const int local_trainers_;
  uint64_t dead_ = 0;
  std::unique_ptr<Merger> merger_;
  std::vector<EngineBucket*> group_, failed_;  // reused
  std::vector<EngineBucket*> order_;           // reused
  std::vector<MergeCandidate> candidates_;     // reused
};

}  // namespace spex
