// `omgs` (docs/merging.md 4): OMGS-SGD's fixed merge plan by size (threshold) or by count, a
// static plan of grouping only; and the factory of every omgs mode (mgs, which measures and
// plans first, is omgs_mgs_merger.cc).
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/strings/str_cat.h"
#include "daemon/merge/mergers.h"
#include "daemon/merge/policy_util.h"

namespace spex {
namespace {

class OmgsMerger : public Merger {
 public:
  explicit OmgsMerger(const OmgsOptions& o) : o_(o) {}
  const char* name() const override { return "omgs"; }
  uint64_t ConfigHash() const override {
    return HashWords(
        "omgs", {static_cast<uint64_t>(o_.mode), o_.threshold_elements, o_.count, o_.limits.window,
                 o_.limits.max_group_elements, o_.select_behind ? 1u : 0u});
  }
  bool behind() const override { return o_.select_behind; }
  // The plan group starting at the head: threshold closes WITH the bucket that brings the
  // running sum to >= T_el; count closes with the count-th bucket. Then the shared rules.
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    if (c.empty()) return 0;
    size_t want = 0;
    if (o_.mode == OmgsMode::kCount) {
      want = static_cast<size_t>(o_.count);
    } else {
      uint64_t sum = 0;
      while (want < c.size()) {
        sum += c[want].elements;
        ++want;
        if (sum >= o_.threshold_elements) break;
      }
    }
    return ClampGroup(c, want, o_.limits);
  }

 private:
  OmgsOptions o_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Merger>> MakeOmgsMerger(const OmgsOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.mode == OmgsMode::kMgs) {
    if (options.alpha_ns < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--merge_alpha_us must be >= 0 (0: measured); got ", options.alpha_ns / 1000));
    }
    if (options.plan_step == 0) {
      return absl::InvalidArgumentError(
          "--merge_plan_step must be >= 1 (the step whose first group agrees on the plan)");
    }
    return NewOmgsMgsMerger(options);
  }
  if (options.mode == OmgsMode::kThreshold && options.threshold_elements == 0) {
    return absl::InvalidArgumentError("--omgs_threshold_elements must be >= 1");
  }
  if (options.mode == OmgsMode::kCount && options.count == 0) {
    return absl::InvalidArgumentError("--omgs_count must be >= 1");
  }
  return std::unique_ptr<Merger>(new OmgsMerger(options));
}

}  // namespace spex
