// `rgmerge --rgmerge_plan=model` (docs/merging.md 5.2): runs as the ready merger while it
// measures, then every node agrees on the inputs (their maximum over nodes), computes
// RgmergeModelPlan from them and, from the next step on, runs that plan as a static one
// (ConfigHash() then covers the plan). Measures (MergeMeter) and agrees on a plan (MergePlanner);
// also the factory of either rgmerge plan.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/merge/merge_timing.h"
#include "daemon/merge/mergers.h"
#include "daemon/merge/plan_table.h"
#include "daemon/merge/policy_util.h"
#include "daemon/merge/rgmerge_model.h"

namespace spex {
namespace {

class RgmergeModelMerger : public Merger, public MergeMeter, public MergePlanner {
 public:
  RgmergeModelMerger(const RgmergeOptions& o, std::unique_ptr<Merger> ready)
      : m_(o), ready_(std::move(ready)), ready_meter_(ready_->meter()) {}

  // Grouping: the ready merger's offers and packs until the plan takes effect, then the plan.
  const char* name() const override { return "rgmerge"; }
  bool agreed() const override { return true; }
  bool AgreedAt(uint64_t step) const override { return !plan_.Active(step); }
  uint64_t ConfigHash() const override {
    return HashWords("rgmerge/model", {m_.limits.window, m_.limits.max_group_elements, m_.plan_step,
                                       static_cast<uint64_t>(m_.slack_ns), m_.equal_tail ? 1u : 0u,
                                       m_.select_behind ? 1u : 0u,
                                       static_cast<uint64_t>(m_.alpha_ns), plan_.hash()});
  }
  bool behind() const override { return m_.select_behind; }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    return plan_.NextGroup(c, m_.limits);
  }
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t now_ns, int64_t* deadline_ns) override {
    return ready_->Offer(c, now_ns, deadline_ns);
  }
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    return ready_->Pack(agreed);
  }
  MergeMeter* meter() override { return this; }
  MergePlanner* planner() override { return this; }

  // Measuring, only until the plan is agreed: later timings would never be used (the linger,
  // too, only runs while the merger is agreed). The ready merger's own timings (its linger, its
  // late binding) go on to it.
  bool measures() const override { return !plan_.done(); }
  void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                     int64_t select_ns) override {
    samples_.Member(bucket_id, step, ready_ns, select_ns);
    if (ready_meter_ != nullptr) ready_meter_->ObserveMember(bucket_id, step, ready_ns, select_ns);
  }
  void ObserveExchange(uint64_t bytes, int64_t ns) override {
    samples_.Exchange(bytes, ns);
    if (ready_meter_ != nullptr) ready_meter_->ObserveExchange(bytes, ns);
  }
  void ExchangeIdleSince(int64_t ns) override {
    if (ready_meter_ != nullptr) ready_meter_->ExchangeIdleSince(ns);
  }
  void PackHandedOff(uint64_t elements, int64_t local_ns, int64_t wire_start_ns) override {
    if (ready_meter_ != nullptr) ready_meter_->PackHandedOff(elements, local_ns, wire_start_ns);
  }
  void PackDone(uint64_t elements, int64_t wire_ns) override {
    if (ready_meter_ != nullptr) ready_meter_->PackDone(elements, wire_ns);
  }

  // Plan agreement.
  bool PlanDue(uint64_t step) const override { return !plan_.done() && step >= m_.plan_step; }
  std::vector<uint64_t> PlanInputs(absl::Span<const PlanBucket> buckets) override {
    return samples_.Inputs(buckets, m_.alpha_ns);
  }
  void InstallPlan(absl::Span<const PlanBucket> buckets, absl::Span<const uint64_t> agreed,
                   uint64_t step, const PlanContext& ctx) override;
  void AbandonPlan(const std::string& /*why*/) override { plan_.Abandon(); }
  std::string PlanSummary() const override;

 private:
  RgmergeOptions m_;
  std::unique_ptr<Merger> ready_;  // `ready` with the same options
  MergeMeter* const ready_meter_;  // its meter; null without linger or late binding
  PlanSamples samples_;
  PlanTable plan_;
  RgmergeModelInputs inputs_;
};

void RgmergeModelMerger::InstallPlan(absl::Span<const PlanBucket> buckets,
                                     absl::Span<const uint64_t> agreed, uint64_t step,
                                     const PlanContext& ctx) {
  const size_t num_buckets = buckets.size();
  if (num_buckets == 0 || agreed.size() != 2 * num_buckets + 2) {
    AbandonPlan("the agreed inputs do not match the bucket list");
    return;
  }
  RgmergeModelInputs in;
  in.elements.resize(num_buckets);
  in.gap_ns.resize(num_buckets);
  in.select_ns.resize(num_buckets);
  for (size_t b = 0; b < num_buckets; ++b) {
    in.elements[b] = buckets[b].elements;
    in.gap_ns[b] = PlanNs(agreed[b]);
    in.select_ns[b] = PlanNs(agreed[num_buckets + b]);
  }
  in.alpha_ns = PlanNs(agreed[2 * num_buckets]);
  in.beta_ps_per_byte = static_cast<int64_t>(std::min(agreed[2 * num_buckets + 1], kMaxBetaPs));
  in.density = ctx.density;
  in.nodes = ctx.nodes;
  in.slack_ns = m_.slack_ns;
  in.equal_tail = m_.equal_tail;
  plan_.Install(buckets, RgmergeModelPlan(in), agreed, step);
  inputs_ = std::move(in);
}

std::string RgmergeModelMerger::PlanSummary() const {
  if (!plan_.planned()) return "";
  int64_t gaps = 0, selects = 0;
  for (int64_t g : inputs_.gap_ns) gaps += g;
  for (int64_t c : inputs_.select_ns) selects += c;
  return absl::StrCat(plan_.lengths().size(), " groups of [", Lengths(plan_.lengths()),
                      "] buckets; alpha ", inputs_.alpha_ns / 1000, " us, beta ",
                      inputs_.beta_ps_per_byte, " ps/B, backward gaps ", gaps / 1000,
                      " us and selection ", selects / 1000, " us in all");
}

}  // namespace

std::unique_ptr<Merger> NewRgmergeModelMerger(const RgmergeOptions& options,
                                              std::unique_ptr<Merger> ready) {
  return std::unique_ptr<Merger>(new RgmergeModelMerger(options, std::move(ready)));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeMerger(const RgmergeOptions& options) {
  if (!options.model && options.select_behind) {
    return absl::InvalidArgumentError(
        "--rgmerge_select=behind needs --rgmerge_plan=model: the ready plan's groups change "
        "every step, and a group exchanged as one bucket needs the same members every step");
  }
  absl::StatusOr<std::unique_ptr<Merger>> ready = MakeRgmergeReadyMerger(options);
  if (!options.model || !ready.ok()) return ready;  // the limits, the linger, alpha
  if (options.plan_step == 0) {
    return absl::InvalidArgumentError(
        "--merge_plan_step must be >= 1 (the step whose first group agrees on the plan)");
  }
  if (options.slack_ns < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rgmerge_slack_us must be >= 0; got ", options.slack_ns / 1000));
  }
  return NewRgmergeModelMerger(options, std::move(*ready));
}

}  // namespace spex
