// The planning mergers' installed static plan (plan_table.h).
#include "daemon/merge/plan_table.h"

#include "absl/strings/str_cat.h"

namespace spex {

void PlanTable::Abandon() {
  done_ = true;
  planned_ = false;
}

void PlanTable::Install(absl::Span<const PlanBucket> buckets, const std::vector<size_t>& plan,
                        absl::Span<const uint64_t> agreed, uint64_t step) {
  done_ = true;
  planned_ = true;
  effective_ = step + 1;
  lengths_ = plan;
  groups_.clear();
  where_.clear();
  uint64_t h = kFnvOffset;
  size_t b = 0;
  for (size_t len : plan) {
    groups_.emplace_back();
    for (size_t i = 0; i < len; ++i, ++b) {
      where_[buckets[b].bucket_id] = {groups_.size() - 1, i};
      groups_.back().push_back(buckets[b].bucket_id);
      h = Fnv1a(h, &buckets[b].bucket_id, sizeof(uint64_t));
    }
    const uint64_t n = len;
    h = Fnv1a(h, &n, sizeof(n));
  }
  for (uint64_t word : agreed) h = Fnv1a(h, &word, sizeof(word));
  hash_ = h | 1;  // never 0, the hash before a plan
}

size_t PlanTable::NextGroup(absl::Span<const MergeCandidate> c, const GroupLimits& limits) const {
  if (c.empty()) return 0;
  auto it = where_.find(c[0].bucket_id);
  if (it == where_.end()) return 1;
  const size_t g = it->second.first, pos = it->second.second;
  const std::vector<uint64_t>& ids = groups_[g];
  size_t want = 1;
  while (pos + want < ids.size() && want < c.size() && c[want].bucket_id == ids[pos + want]) {
    ++want;
  }
  return ClampGroup(c, want, limits);
}

std::string Lengths(const std::vector<size_t>& plan) {
  std::string out;
  for (size_t len : plan) absl::StrAppend(&out, out.empty() ? "" : " ", len);
  return out;
}

}  // namespace spex
