// An agreed static plan as the planning mergers run it (rgmerge --rgmerge_plan=model, omgs
// --omgs_mode=mgs): the plan's groups of bucket ids, where each bucket is, the step it takes
// effect and its hash (part of the merger's ConfigHash()). Shared by their policy files.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "daemon/merge/merger.h"

namespace spex {

// Engine thread only, except done().
class PlanTable {
 public:
  // Read by the wire thread too (MergeMeter::measures()): atomic.
  bool done() const { return done_.load(std::memory_order_relaxed); }
  bool planned() const { return planned_; }
  bool Active(uint64_t step) const { return planned_ && step >= effective_; }
  uint64_t hash() const { return hash_; }
  const std::vector<size_t>& lengths() const { return lengths_; }
  // The agreement failed: no plan, and none will come.
  void Abandon();
  // `plan`'s group lengths over `buckets` (in order), agreed from `agreed` at `step`: in effect
  // from step + 1.
  void Install(absl::Span<const PlanBucket> buckets, const std::vector<size_t>& plan,
               absl::Span<const uint64_t> agreed, uint64_t step);
  // The plan group that holds the head, from the head on, as far as the candidates follow the
  // plan's order (a bucket the plan does not know goes alone).
  size_t NextGroup(absl::Span<const MergeCandidate> c, const GroupLimits& limits) const;

 private:
  std::atomic<bool> done_{false};
  bool planned_ = false;
  uint64_t effective_ = 0, hash_ = 0;
  std::vector<size_t> lengths_;
  std::vector<std::vector<uint64_t>> groups_;
  std::map<uint64_t, std::pair<size_t, size_t>> where_;  // id -> (group, position)
};

// The group lengths of `plan`, space-separated (for PlanSummary).
std::string Lengths(const std::vector<size_t>& plan);

}  // namespace spex
