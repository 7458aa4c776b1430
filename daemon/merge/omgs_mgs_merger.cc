// `omgs --omgs_mode=mgs` (docs/merging.md 4.3): one bucket per exchange (as `none`) while it
// measures, then OMGS-SGD's adaptive plan (mgs_plan.h) on the agreed inputs, a static plan. The
// one omgs mode that measures (MergeMeter) and agrees on a plan (MergePlanner).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/merge/merge_timing.h"
#include "daemon/merge/mergers.h"
#include "daemon/merge/mgs_plan.h"
#include "daemon/merge/plan_table.h"
#include "daemon/merge/policy_util.h"

namespace spex {
namespace {

class OmgsMgsMerger : public Merger, public MergeMeter, public MergePlanner {
 public:
  explicit OmgsMgsMerger(const OmgsOptions& o) : o_(o) {}

  // Grouping.
  const char* name() const override { return "omgs"; }
  uint64_t ConfigHash() const override {
    return HashWords(
        "omgs/mgs", {o_.limits.window, o_.limits.max_group_elements, o_.plan_step,
                     o_.select_behind ? 1u : 0u, static_cast<uint64_t>(o_.alpha_ns), plan_.hash()});
  }
  bool behind() const override { return o_.select_behind; }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    if (c.empty()) return 0;
    return plan_.Active(c[0].step) ? plan_.NextGroup(c, o_.limits) : 1;
  }
  MergeMeter* meter() override { return this; }
  MergePlanner* planner() override { return this; }

  // Measuring, only until the plan is agreed: later timings would never be used.
  bool measures() const override { return !plan_.done(); }
  void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                     int64_t select_ns) override {
    samples_.Member(bucket_id, step, ready_ns, select_ns);
  }
  void ObserveExchange(uint64_t bytes, int64_t ns) override { samples_.Exchange(bytes, ns); }

  // Plan agreement.
  bool PlanDue(uint64_t step) const override { return !plan_.done() && step >= o_.plan_step; }
  std::vector<uint64_t> PlanInputs(absl::Span<const PlanBucket> buckets) override;
  void InstallPlan(absl::Span<const PlanBucket> buckets, absl::Span<const uint64_t> agreed,
                   uint64_t step, const PlanContext& ctx) override;
  void AbandonPlan(const std::string& /*why*/) override { plan_.Abandon(); }
  std::string PlanSummary() const override;

 private:
  OmgsOptions o_;
  PlanSamples samples_;
  PlanTable plan_;
  MgsInputs inputs_;
};

// rgmerge's words, then s (fs per element * log2 element) fitted to this node's sigma_b and
// n_b log2 n_b, so every node agrees on one s.
std::vector<uint64_t> OmgsMgsMerger::PlanInputs(absl::Span<const PlanBucket> buckets) {
  std::vector<uint64_t> w = samples_.Inputs(buckets, o_.alpha_ns);
  const size_t num_buckets = buckets.size();
  std::vector<uint64_t> n(num_buckets);
  std::vector<int64_t> sigma(num_buckets);
  for (size_t b = 0; b < num_buckets; ++b) {
    n[b] = buckets[b].elements;
    sigma[b] = PlanNs(w[num_buckets + b]);
  }
  w.push_back(static_cast<uint64_t>(FitSelectFs(n, sigma, MgsInputs().select_fs)));
  return w;
}

void OmgsMgsMerger::InstallPlan(absl::Span<const PlanBucket> buckets,
                                absl::Span<const uint64_t> agreed, uint64_t step,
                                const PlanContext& ctx) {
  const size_t num_buckets = buckets.size();
  if (num_buckets == 0 || agreed.size() != 2 * num_buckets + 3) {
    AbandonPlan("the agreed inputs do not match the bucket list");
    return;
  }
  MgsInputs in;
  for (size_t b = 0; b < num_buckets; ++b) {
    in.elements.push_back(buckets[b].elements);
    in.gap_ns.push_back(PlanNs(agreed[b]));
    in.dense.push_back(buckets[b].kind == MergeKind::kDense);
  }
  in.alpha_ns = PlanNs(agreed[2 * num_buckets]);
  in.beta_ps_per_byte = static_cast<int64_t>(std::min(agreed[2 * num_buckets + 1], kMaxBetaPs));
  in.select_fs = static_cast<int64_t>(std::min(agreed[2 * num_buckets + 2], kMaxSelectFs));
  in.density = ctx.density;
  in.nodes = ctx.nodes;
  in.behind = o_.select_behind;
  plan_.Install(buckets, MgsPlan(in), agreed, step);
  inputs_ = std::move(in);
}

std::string OmgsMgsMerger::PlanSummary() const {
  if (!plan_.planned()) return "";
  int64_t gaps = 0;
  for (int64_t g : inputs_.gap_ns) gaps += g;
  return absl::StrCat(plan_.lengths().size(), " groups of [", Lengths(plan_.lengths()),
                      "] buckets; alpha ", inputs_.alpha_ns / 1000, " us, beta ",
                      inputs_.beta_ps_per_byte, " ps/B, s ", inputs_.select_fs,
                      " fs per element-log2, backward gaps ", gaps / 1000, " us in all");
}

}  // namespace

std::unique_ptr<Merger> NewOmgsMgsMerger(const OmgsOptions& options) {
  return std::unique_ptr<Merger>(new OmgsMgsMerger(options));
}

}  // namespace spex
