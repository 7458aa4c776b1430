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
#include "daemon/transport/collective.h"

namespace spex {

// The ready words of the buckets a node's trainers have still to hand in for the step being
// exchanged (Scheduler::PendingOfStep): Computing() while a living trainer has not signalled
// one of them, so a collective's wait knows whether polling would take the trainers' CPU. Read
// from the engine thread during its collectives; filled under the engine's mutex before.
class PendingInputs : public ComputeProbe {
 public:
  void Clear() { entries_.clear(); }
  void Add(const BucketHeader* header, uint64_t step, uint64_t watch_mask) {
    entries_.push_back({header, step, watch_mask});
  }
  bool Computing() const override;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    const BucketHeader* header;
    uint64_t step;        // signalled once ready[r] > step
    uint64_t watch_mask;  // the living trainers (bit r)
  };
  std::vector<Entry> entries_;
};

class Scheduler {
 public:
  Scheduler(int local_trainers, std::unique_ptr<Merger> merger);

  // How the engine runs the last NextGroup's pick.
  struct Pick {
    bool alone = true;    // one bucket on the per-bucket path (control round): `none`, a probing
                          // (P) head, a bucket exchanged through Ok-Topk
    bool agreed = false;  // the group is this node's offer; the group round's m cuts it
    int64_t linger_until_ns = 0;  // an agreed merger lingers (empty group) until then, or 0
  };
  // The next group in canonical order (empty when no bucket is schedulable, or while an agreed
  // merger lingers). The engine runs it once every member is LocallyReady (an offer is).
  // The result is the scheduler's own vector (no allocation per pick), valid until the next call.
  // `idle_since_ns`: when this node's last exchange ended (`now_ns` while one is on the wire),
  // for an agreed merger's linger.
  const std::vector<EngineBucket*>& NextGroup(const BucketTable& table, int64_t now_ns = 0,
                                              int64_t idle_since_ns = 0);
  const Pick& pick() const { return pick_; }
  // The candidates of the picked group, kinds filled in (canonical order, same length).
  const std::vector<MergeCandidate>& group_candidates() const { return group_candidates_; }
  Merger* merger() { return merger_.get(); }
  // A bucket's kind at its next step (identical on every node; docs/merging.md 2.1). P for a
  // probing bucket and for one exchanged through Ok-Topk (both go alone).
  static MergeKind KindOf(const EngineBucket& b);
  // Every local trainer has signalled the bucket's next step. With dead trainers (set_dead):
  // every living trainer has, and some trainer (living or dead) got to that step, so the step
  // a dead trainer left half-done runs (and fails everywhere) instead of hanging the peers.
  bool LocallyReady(const EngineBucket& b) const;
  // The waiting buckets of compute step `step` that this node's trainers have not all handed in
  // yet (their gradients are still being computed) into `out`, with the living trainers to
  // watch. A group about to run is locally ready, so none of its members is among them.
  void PendingOfStep(const BucketTable& table, uint64_t step, PendingInputs* out) const;
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
  std::vector<EngineBucket*> group_, failed_;     // reused
  std::vector<EngineBucket*> order_;              // reused
  std::vector<MergeCandidate> candidates_;        // reused
  std::vector<MergeCandidate> group_candidates_;  // reused
  Pick pick_;
};

}  // namespace spex
