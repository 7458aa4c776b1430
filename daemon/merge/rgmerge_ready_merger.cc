// `rgmerge --rgmerge_plan=ready` (docs/merging.md 5.1), an agreed merger: offer the ready prefix
// (at once, after a short linger with --rgmerge_linger=auto, or bound late with
// --rgmerge_bind=late) and pack greedily under max_group_elements. It reads local timings
// (MergeMeter) only when the linger or late binding is on.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/merge/merge_timing.h"
#include "daemon/merge/mergers.h"
#include "daemon/merge/policy_util.h"

namespace spex {
namespace {

class RgmergeReadyMerger : public Merger, public MergeMeter {
 public:
  explicit RgmergeReadyMerger(const RgmergeOptions& o)
      : o_(o), linger_(o.linger_max_ns, o.alpha_ns) {}

  // Grouping.
  const char* name() const override { return "rgmerge"; }
  bool agreed() const override { return true; }
  // The linger settings may differ between nodes (docs/merging.md 2.7): not hashed.
  uint64_t ConfigHash() const override {
    return HashWords("rgmerge/ready", {o_.limits.window, o_.limits.max_group_elements});
  }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override { return c.empty() ? 0 : 1; }
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t now_ns, int64_t* deadline_ns) override;
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    return GreedyPack(agreed, o_.limits, [](uint64_t, uint64_t) { return true; });
  }
  MergeMeter* meter() override { return o_.linger_auto || o_.bind_late ? this : nullptr; }

  // Measuring: the linger's gaps and alpha; the late binding's stage times.
  bool measures() const override { return o_.linger_auto; }
  void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                     int64_t /*select_ns*/) override {
    if (o_.linger_auto) linger_.Member(bucket_id, step, ready_ns);
  }
  void ObserveExchange(uint64_t bytes, int64_t ns) override {
    if (o_.linger_auto) linger_.Exchange(bytes, ns);
  }
  void ExchangeIdleSince(int64_t ns) override { linger_.IdleSince(ns); }
  void PackHandedOff(uint64_t elements, int64_t local_ns, int64_t wire_start_ns) override {
    if (o_.bind_late) clock_.HandedOff(elements, local_ns, wire_start_ns);
  }
  void PackDone(uint64_t elements, int64_t wire_ns) override {
    if (o_.bind_late) clock_.Done(elements, wire_ns);
  }

 private:
  RgmergeOptions o_;
  Linger linger_;
  WireClock clock_;
};

// Linger off: the previous exchange's duration is the merge window. auto: see RgmergeOptions.
// bind late: see RgmergeOptions::bind_late.
size_t RgmergeReadyMerger::Offer(absl::Span<const MergeCandidate> c, int64_t now_ns,
                                 int64_t* deadline_ns) {
  const size_t r = ReadyPrefix(c, o_.limits.window);
  if (r == 0) return r;
  if (o_.bind_late) {
    uint64_t elements = 0;  // the first pack Pack would make of the ready prefix
    for (size_t i = 0; i < ClampGroup(c, r, o_.limits); ++i) elements += c[i].elements;
    // The scheduler passes `now` as the idle time while a pack is on the wire.
    const bool wire_busy = linger_.idle_since_ns() == now_ns;
    if (clock_.Wait(elements, now_ns, wire_busy, deadline_ns)) return 0;
  }
  if (!o_.linger_auto) return r;
  return linger_.Offer(c, r, o_.limits.window, now_ns, deadline_ns);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeReadyMerger(const RgmergeOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.linger_max_ns < 0 || options.linger_max_ns > kMaxLingerNs) {
    return absl::InvalidArgumentError(absl::StrCat("--rgmerge_linger_max_us must be in [0, ",
                                                   kMaxLingerNs / 1000, "]; got ",
                                                   options.linger_max_ns / 1000));
  }
  if (options.alpha_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--merge_alpha_us must be >= 0 (0: measured); got ", options.alpha_ns / 1000));
  }
  return std::unique_ptr<Merger>(new RgmergeReadyMerger(options));
}

}  // namespace spex
