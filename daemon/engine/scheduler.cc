#include "daemon/engine/scheduler.h"

#include <algorithm>

#include "daemon/util/log.h"

namespace spex {

Scheduler::Scheduler(int local_trainers, std::unique_ptr<Merger> merger)
    : local_trainers_(local_trainers), merger_(std::move(merger)) {}

bool Scheduler::LocallyReady(const EngineBucket& b) const {
  bool someone = false;
  for (int r = 0; r < local_trainers_; ++r) {
    const bool signalled =
        b.mem.header->ready[r].value.load(std::memory_order_acquire) > b.ex.next_step;
    if (dead_ & (1ull << r)) {
      someone |= signalled;
    } else if (!signalled) {
      return false;
    } else {
      someone = true;
    }
  }
  return someone;
}

const std::vector<EngineBucket*>& Scheduler::NextGroup(const BucketTable& table) {
  group_.clear();
  order_.clear();
  for (const auto& [id, b] : table.all()) {
    if (b->out.state == BucketState::kWaiting) order_.push_back(b.get());
  }
  if (order_.empty()) return group_;
  std::stable_sort(order_.begin(), order_.end(),  // the table iterates in id order
                   [](const EngineBucket* a, const EngineBucket* b) {
                     return a->ex.next_step < b->ex.next_step;
                   });
  candidates_.clear();
  for (const EngineBucket* b : order_) {
    candidates_.push_back({b->id, b->ex.next_step, b->elements, LocallyReady(*b)});
  }
  const size_t group = merger_->NextGroup(candidates_);
  if (group != 1) {
    // Fused exchanges need the merging step; only `none` exists so far.
    SPEX_LOG(ERROR) << "merger " << merger_->name() << " returned a group of " << group
                    << " buckets; fused exchanges are not implemented, exchanging one";
  }
  group_.push_back(order_.front());
  return group_;
}

const std::vector<EngineBucket*>& Scheduler::FailedAndReady(const BucketTable& table) {
  std::vector<EngineBucket*>& out = failed_;
  out.clear();
  for (const auto& [id, b] : table.all()) {
    if (b->out.state == BucketState::kFailed && LocallyReady(*b)) out.push_back(b.get());
  }
  return out;
}

}  // namespace spex
