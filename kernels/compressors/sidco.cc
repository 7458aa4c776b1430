// The SIDCo compressors sidco_e, sidco_p, sidco_gp (pattern B; Abdelmoniem et al., MLSys 2021; ALGORITHMS.md 4.3-4.5
// and decisions item 6): fit a sparsity-inducing distribution to |acc| and threshold it, in
// several stages: stage 1 keeps first_ratio = 0.25 of the mass; each later stage fits the
// exceedances over the previous threshold (peaks over threshold) with the per-stage ratio
// (d / 0.25)^(1 / (S - 1)); then select |acc| > threshold (strict).
//   sidco_e: exponential in every stage;  sidco_p: generalised Pareto in every stage;
//   sidco_gp: gamma in stage 1 (EC form, inverse incomplete gamma), generalised Pareto after.
// Adaptive stage count (mode -1): every 5 Selects, q = mean of (selected / (d n)) over them;
// q > 1.2: S - 1, q < 0.8: S + 1, clamped to [1, ceil(ln d / ln 0.5)].
// Choices where the reference is silent or differs:
//  - statistics are on |acc|, not |acc| / ||acc||: every fit is scale-equivariant, so the
//    normalisation cancels out of the selection (and a norm pass is saved);
//  - the exceedance location is the previous stage's threshold, not min(survivors) (the same in
//    the limit; there is no min primitive): z = y - eta, mean(z) = mean(y) - eta, var(z) = var(y);
//  - variances are sample variances (n - 1), as torch.var;
//  - the gamma stage is fitted to the non-zero magnitudes (log 0 is undefined; the reference adds
//    an epsilon) with its ratio raised to keep the same count of all n: ratio * n / nonzeros;
//  - the stage state is per compressor instance (the reference shares one across all buffers);
//  - the initial stage count is the `stages` parameter (default 2);
//  - once the survivors of a stage are expected to be few (1.5x the fit's target within n/16, or
//    4k), they are collected in one pass and the remaining stages and the final selection read
//    that list (same result, fewer passes over acc).
// Parameters: stages (initial S, default 2), adaptive (default true).
// Scalars: [0] threshold, [1] stages used, [2] passes over acc.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/compressors/common.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/sidco.h"
#include "kernels/compressors/stat_math.h"

namespace spex {
namespace {

inline constexpr double kFirstRatio = 0.25;
inline constexpr int kUpdateEvery = 5;
inline constexpr double kResDiff = 0.2;

int MaxStages(double density) {
  return std::max(1, static_cast<int>(std::ceil(std::log(density) / std::log(0.5))));
}

class Sidco final : public Compressor {
 public:
  Sidco(const CompressorSpec& spec, Primitives* prims, SidcoFit fit, int stages, bool adaptive)
      : Compressor(spec, prims), fit_(fit), stages_(stages), adaptive_(adaptive) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n;
    const double d = ctx.density;
    stages_ = std::min(std::max(stages_, 1), MaxStages(d));
    const bool single = stages_ == 1 || d >= kFirstRatio;
    const double r1 = single ? d : kFirstRatio;
    int passes = 1;
    double eta;
    if (fit_ == SidcoFit::kGammaGPareto) {
      // acc += add and the moments of the non-zero magnitudes, in one pass.
      const AbsMoments m = prims_->AccumulateMoments(acc, add, n, 0.0f, true);
      if (m.count == 0) {
        eta = 0;
      } else {
        const double ratio = std::min(1.0, r1 * n / m.count);
        eta = ratio >= 1 ? 0 : GammaThreshold(m.sum / m.count, m.sum_log / m.count, ratio);
      }
    } else {
      const AbsMoments m = prims_->AccumulateMoments(acc, add, n, -1.0f, false);  // acc += add
      const double mean = m.sum / n;
      const double var = n > 1 ? std::max(0.0, (m.sum_sq - m.sum * mean) / (n - 1)) : 0.0;
      eta = fit_ == SidcoFit::kExponential ? ExponentialThreshold(mean, r1)
                                           : GParetoThreshold(mean, var, r1);
    }
    int used = 1;
    bool have_list = false;  // list_idx_/list_val_ hold every entry with |acc| > list_eta
    float list_eta = 0;
    if (!single) {
      const double rho = std::pow(d / kFirstRatio, 1.0 / (stages_ - 1));
      const size_t cap = std::max<size_t>(4 * ctx.k, n / 16);
      double expected = kFirstRatio * n;  // survivors above eta, as the fits aim
      for (int s = 1; s < stages_; ++s) {
        const float lb = static_cast<float>(eta);
        if (!have_list && 1.5 * expected <= cap) {
          // Few survivors: collect them in one pass; this and the later stages and the final
          // selection then read the list instead of scanning acc again.
          list_idx_.resize(cap);
          list_val_.resize(cap);
          const size_t c = prims_->SelectAbove(acc, 0, n, StrictAbove(lb), false, list_idx_.data(),
                                               list_val_.data(), cap);
          ++passes;
          if (c <= cap) {
            list_idx_.resize(c);
            list_val_.resize(c);
            have_list = true;
            list_eta = lb;
          }
        }
        AbsMoments y;
        if (have_list) {
          for (float v : list_val_) {
            const float a = std::fabs(v);
            if (!(a > lb)) continue;
            y.count++;
            y.sum += a;
            y.sum_sq += static_cast<double>(a) * a;
          }
        } else {
          y = prims_->AccumulateMoments(acc, nullptr, n, lb, false);  // (no logs needed)
          ++passes;
        }
        if (y.count < 2) break;
        const double mean_y = y.sum / y.count;
        const double var = std::max(0.0, (y.sum_sq - y.sum * mean_y) / (y.count - 1));
        const double mean_z = std::max(0.0, mean_y - eta);
        eta += fit_ == SidcoFit::kExponential ? ExponentialThreshold(mean_z, rho)
                                              : GParetoThreshold(mean_z, var, rho);
        expected *= rho;
        ++used;
      }
    }
    const float th = std::max(static_cast<float>(eta), kMinThreshold);
    if (have_list && th >= list_eta) {
      for (size_t j = 0; j < list_idx_.size(); ++j) {
        if (std::fabs(list_val_[j]) > th) {
          out->idx.push_back(list_idx_[j]);
          out->val.push_back(list_val_[j]);
        }
      }
      if (zero && !out->idx.empty()) {
        if (absl::Status st = prims_->ZeroAt(acc, n, out->idx.data(), out->idx.size()); !st.ok()) {
          return st;
        }
      }
    } else {
      AppendAbove(prims_, acc, nullptr, 0, n, StrictAbove(th), zero, 2 * ctx.k, out);
      ++passes;
    }
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(used);
    out->scalars[2] = static_cast<float>(passes);
    if (adaptive_) Adapt(static_cast<double>(out->idx.size()) / (d * n), d);
    return absl::OkStatus();
  }

 private:
  void Adapt(double q, double d) {
    q_sum_ += q;
    if (++q_calls_ < kUpdateEvery) return;
    const double mean_q = q_sum_ / q_calls_;
    if (mean_q > 1 + kResDiff) --stages_;
    else if (mean_q < 1 - kResDiff) ++stages_;
    stages_ = std::min(std::max(stages_, 1), MaxStages(d));
    q_sum_ = 0;
    q_calls_ = 0;
  }

  SidcoFit fit_;
  std::vector<uint32_t> list_idx_;
  std::vector<float> list_val_;
  int stages_;
  bool adaptive_;
  double q_sum_ = 0;
  int q_calls_ = 0;
};

}  // namespace

std::unique_ptr<Compressor> MakeSidco(const CompressorSpec& spec, Primitives* prims,
                                      ParamReader& r, SidcoFit fit) {
  const int stages = static_cast<int>(
      r.Int("stages", 2, 1, 32, "initial number of stages (clamped to ceil(ln d / ln 0.5))"));
  const bool adaptive = r.Bool("adaptive", true,
                               "adapt the stage count every 5 steps (+-20% band)");
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Sidco>(spec, prims, fit, stages, adaptive);
}

}  // namespace spex
