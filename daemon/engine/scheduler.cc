// The canonical exchange order and the merger's picks (scheduler.h): which buckets are ready
// on this node, which group goes next, which failed buckets to publish.
#include "daemon/engine/scheduler.h"

#include <algorithm>
#include <string_view>

#include "daemon/util/log.h"
#include "kernels/compressor.h"

namespace spex {
namespace {
constexpr size_t kMaxCandidates = 64;  // the group round's key capacity (kGroupRoundMaxWindow)
}  // namespace

Scheduler::Scheduler(int local_trainers, std::unique_ptr<Merger> merger)
    : local_trainers_(local_trainers), merger_(std::move(merger)) {}

bool Scheduler::LocallyReady(const EngineBucket& b) const {
  // A waiting bucket whose shared segment a process of this node shrank (segment_guard.h): its
  // header now reads as zeros here and its trainers' writes no longer reach this process, so no
  // ready word will ever rise. Its next step runs now and fails in the local reduce, which fails
  // it on every node at the commit vote (the bucket is failed after that, so this fires once).
  if (b.out.state == BucketState::kWaiting && b.mem.view.pulled != nullptr &&
      b.mem.view.pulled->load(std::memory_order_acquire)) {
    return true;
  }
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

bool PendingInputs::Computing() const {
  for (const Entry& e : entries_) {
    for (uint64_t m = e.watch_mask; m != 0; m &= m - 1) {
      const int r = __builtin_ctzll(m);
      if (e.header->ready[r].value.load(std::memory_order_acquire) <= e.step) return true;
    }
  }
  return false;
}

void Scheduler::PendingOfStep(const BucketTable& table, uint64_t step, PendingInputs* out) const {
  out->Clear();
  const uint64_t living = ((local_trainers_ >= 64 ? 0 : (1ull << local_trainers_)) - 1) & ~dead_;
  for (const auto& [id, b] : table.all()) {
    if (b->out.state != BucketState::kWaiting || b->ex.compute_step() != step) continue;
    if (!LocallyReady(*b)) out->Add(b->mem.header, b->ex.next_step, living);
  }
}

MergeKind Scheduler::KindOf(const EngineBucket& b) {
  if (b.ex.sparse == nullptr) return MergeKind::kDense;
  // Ok-Topk, and --sparse_allreduce=auto until it has chosen, exchange alone.
  if (b.ex.sparse->oktopk || b.ex.allreduce_probe) return MergeKind::kProbe;
  switch (b.ex.mode) {
    case BucketExchange::Mode::kProbe:
      return MergeKind::kProbe;
    case BucketExchange::Mode::kDense:
      return MergeKind::kDense;
    case BucketExchange::Mode::kSparse:
      break;
  }
  return b.ex.sparse->compressor->pattern() == Pattern::kIndexUnion ? MergeKind::kPatternA
                                                                    : MergeKind::kPatternB;
}

const std::vector<EngineBucket*>& Scheduler::NextGroup(const BucketTable& table, int64_t now_ns,
                                                       int64_t idle_since_ns) {
  group_.clear();
  order_.clear();
  group_candidates_.clear();
  pick_ = Pick();
  for (const auto& [id, b] : table.all()) {
    if (b->out.state == BucketState::kWaiting) order_.push_back(b.get());
  }
  if (order_.empty()) return group_;
  std::stable_sort(order_.begin(), order_.end(),  // the table iterates in id order
                   [](const EngineBucket* a, const EngineBucket* b) {
                     return a->ex.next_step < b->ex.next_step;
                   });
  const bool none = std::string_view(merger_->name()) == "none";
  const size_t window = none ? 1 : std::min(order_.size(), kMaxCandidates);
  candidates_.clear();
  for (size_t i = 0; i < window; ++i) {
    const EngineBucket* b = order_[i];
    const bool ready = LocallyReady(*b);
    // The compute step: a group never mixes a restored bucket with one that was not (step.h).
    candidates_.push_back({b->id, b->ex.compute_step(), b->elements, ready, KindOf(*b),
                           ready ? b->ReadyStamp(local_trainers_) : 0});
  }
  size_t n = 1;
  if (!none && candidates_.front().kind != MergeKind::kProbe) {
    pick_.alone = false;
    if (merger_->AgreedAt(candidates_.front().step)) {
      pick_.agreed = true;
      int64_t deadline = 0;
      if (MergeMeter* meter = merger_->meter(); meter != nullptr) {
        meter->ExchangeIdleSince(idle_since_ns);
      }
      n = merger_->Offer(candidates_, now_ns, &deadline);
      if (n == 0) {
        pick_.linger_until_ns = deadline;
        return group_;
      }
    } else {
      n = merger_->NextGroup(candidates_);
    }
    n = std::max<size_t>(1, std::min(n, candidates_.size()));
  }
  for (size_t i = 0; i < n; ++i) {
    group_.push_back(order_[i]);
    group_candidates_.push_back(candidates_[i]);
  }
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
