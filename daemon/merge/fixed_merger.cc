// `fixed` (docs/merging.md 3): Horovod's tensor fusion as an agreed merger. Every cycle it offers
// the ready prefix, and Pack fills fusion buffers of at most the byte threshold. Grouping only:
// it neither measures nor plans.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/merge/mergers.h"
#include "daemon/merge/policy_util.h"

namespace spex {
namespace {

class FixedMerger : public Merger {
 public:
  explicit FixedMerger(const FixedOptions& o) : o_(o) {}
  const char* name() const override { return "fixed"; }
  bool agreed() const override { return true; }
  // The cycle time may differ between nodes (docs/merging.md 3), so it is not hashed.
  uint64_t ConfigHash() const override {
    return HashWords("fixed", {o_.threshold_bytes, o_.limits.window, o_.limits.max_group_elements});
  }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    return c.empty() ? 0 : 1;  // never used: agreed mergers go through Offer/Pack
  }
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t now_ns, int64_t* deadline_ns) override {
    const int64_t cycle_ns = o_.cycle_ms * 1000000;
    if (has_round_ && now_ns < last_round_ns_ + cycle_ns) {
      *deadline_ns = last_round_ns_ + cycle_ns;
      return 0;
    }
    const size_t r = ReadyPrefix(c, o_.limits.window);
    if (r == 0) return 0;
    // A round that starts late (engine busy past the deadline) starts at once, as Horovod's
    // next cycle does after a long one.
    has_round_ = true;
    last_round_ns_ = now_ns;
    return r;
  }
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    const uint64_t t = o_.threshold_bytes;
    return GreedyPack(agreed, o_.limits,
                      [t](uint64_t sum, uint64_t next) { return t != 0 && 4 * (sum + next) <= t; });
  }

 private:
  FixedOptions o_;
  bool has_round_ = false;
  int64_t last_round_ns_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Merger>> MakeFixedMerger(const FixedOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.cycle_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fixed_cycle_ms must be >= 0; got ", options.cycle_ms));
  }
  return std::unique_ptr<Merger>(new FixedMerger(options));
}

}  // namespace spex
