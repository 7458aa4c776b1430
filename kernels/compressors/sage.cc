// sage (pattern B; Yoon, Jeong & Oh 2023; the flat-vector variant;
// docs/algorithms.md#sage): hard threshold with an on-the-fly correction th <- th alpha beta gamma,
// where alpha is the drift of the sampled mean |acc| (uniform sampling over the flat vector,
// Slovin sample size), beta a logistic correction on d_exam (the density the drift-corrected
// threshold th alpha would give) and gamma a coarse x0.95 / x1.05 for 10x misses; th0 =
// 1 / (2 sqrt(k)); select |acc| >= th.
// One pass instead of the reference's two: d_exam and the final selection both come from a
// single fused add+select at th alpha * min(beta gamma) (SageMinBetaGamma), which is at or below
// both thresholds, so the result is exactly the reference's (a second pass only if that
// candidate list overflows). The sample of acc + add is Sample(acc) + Sample(add) (same seed).
// Communication is pattern B (the kljp/sage form; residual = own selections zeroed).
// Parameters: seed (default 1).
// Scalars: [0] threshold used, [1] alpha, [2] beta * gamma, [3] passes over acc.
#include "kernels/compressors/sage.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_control.h"
#include "kernels/compressors/threshold_scanner.h"
#include "kernels/splitmix.h"

namespace spex {

SageFactors SageCorrection(double savg_cur, double savg_prev, double d_target, double d_exam) {
  SageFactors f;
  f.alpha = savg_prev > 0 && std::isfinite(savg_prev) && std::isfinite(savg_cur) && savg_cur > 0
                ? savg_cur / savg_prev
                : 1.0;
  f.beta = 2.0 / (1.0 + std::exp(d_target - d_exam));
  const double r = d_exam / d_target;
  f.gamma = r < 0.1 ? 0.95 : (r > 10 ? 1.05 : 1.0);
  return f;
}

size_t SlovinSampleSize(size_t n) {
  const double s = std::floor(static_cast<double>(n) / (1.0 + n * 0.05 * 0.05));
  return std::max<size_t>(1, static_cast<size_t>(s));
}

double SageMinBetaGamma(double d_target) { return 0.95 * 2.0 / (1.0 + std::exp(d_target)); }

namespace {

class Sage final : public Compressor {
 public:
  Sage(const CompressorSpec& spec, Primitives* prims, uint64_t seed)
      : Compressor(spec, prims), seed_(seed), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n;
    const double savg = SampledMeanAbs(ctx, acc, add);
    if (ctx.call == 0) {
      th_ = InitialThreshold(ctx.k);
      AppendAbove(prims_, acc, add, 0, n, th_, zero, 2 * ctx.k, out, &scratch_);
      out->scalars[0] = th_;
      out->scalars[1] = out->scalars[2] = 1;
      out->scalars[3] = 1;
      savg_prev_ = savg;
      return scratch_.TakeStatus();
    }
    const double alpha = SageCorrection(savg, savg_prev_, ctx.density, 0).alpha;
    const float exam = std::max(static_cast<float>(th_ * alpha), kMinThreshold);
    const float low = std::max(
        static_cast<float>(exam * SageMinBetaGamma(ctx.density) * (1 - 1e-6)), kMinThreshold);
    ThresholdScanner scan(prims_, acc, add, n, 4 * ctx.k, &scratch_);
    scan.Count(low);  // the one fused pass: everything below comes from its list
    const double d_exam = static_cast<double>(scan.Count(exam)) / n;
    const SageFactors f = SageCorrection(savg, savg_prev_, ctx.density, d_exam);
    th_ = std::max(static_cast<float>(th_ * f.alpha * f.beta * f.gamma), kMinThreshold);
    scan.Select(th_, zero, out);
    savg_prev_ = savg;
    out->scalars[0] = th_;
    out->scalars[1] = static_cast<float>(f.alpha);
    out->scalars[2] = static_cast<float>(f.beta * f.gamma);
    out->scalars[3] = static_cast<float>(scan.passes());
    return scratch_.TakeStatus();
  }

  bool SaveOwnState(StateWriter* w) const override {
    if (w) {
      w->Put(th_);
      w->Put(savg_prev_);
    }
    return true;
  }
  bool LoadOwnState(StateReader& r) override {
    float th;
    double savg;
    if (!r.Get(&th) || !r.Get(&savg) || !r.complete()) return false;
    th_ = th;
    savg_prev_ = savg;
    return true;
  }

 private:
  double SampledMeanAbs(const StepContext& ctx, const float* acc, const float* add) {
    const size_t m = SlovinSampleSize(ctx.n);
    const uint64_t seed = StepSeed(seed_, ctx.node_rank, ctx.step);
    sample_.resize(m);
    (void)SampleToHost(prims_, acc, ctx.n, m, seed, sample_.data(), &scratch_);
    if (add) {
      add_sample_.resize(m);
      (void)SampleToHost(prims_, add, ctx.n, m, seed, add_sample_.data(), &scratch_);
      for (size_t j = 0; j < m; ++j) sample_[j] += add_sample_[j];
    }
    double s = 0;
    for (float v : sample_) s += std::fabs(v);
    return s / m;
  }

  uint64_t seed_;
  float th_ = 0;
  double savg_prev_ = 0;
  std::vector<float> sample_, add_sample_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeSage(const CompressorSpec& spec, Primitives* prims,
                                     ParamReader& r) {
  const uint64_t seed = r.Seed();
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Sage>(spec, prims, seed);
}

}  // namespace spex
