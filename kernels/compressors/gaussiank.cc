// gaussiank (pattern B; Shi et al., SIDCo's GaussianKSGDCompressor EC form;
// docs/algorithms.md#gaussiank): fit a Gaussian to the magnitudes, th = mu + sigma Phi^-1(1 - d/2),
// then up to 3 refinements (count < 2k/3: th x0.5; count > 4k/3: th x1.5; otherwise stop), then
// select |acc| > th (strict). Statistics are on |acc| / ||acc||; the normalisation cancels out of
// the threshold (mu and sigma scale with ||acc||), so they are taken on |acc| directly and no norm
// pass is needed. sigma is the sample standard deviation (n - 1).
// The fit misses real gradients' tails (with error feedback the count after the 3 published
// refinements lands anywhere between about k/3 and 8k), and x0.5 / x1.5 steps cannot converge
// (they overshoot back and forth). With refine=band (spex's default) the published refinements
// run first and, when their final threshold selects outside [2k/3, 4k/3], a geometric bisection
// between the closest thresholds seen on either side continues until the count is inside (at
// most 40 probes in all; see threshold_search.h), its probes counted on a magnitude histogram
// (one pass; same decisions as exact counts); refine=reference stops after the 3 steps.
// Parameters: refine=band|reference.
// Scalars: [0] threshold, [1] refinements (band: probes after the first), [2] passes over acc.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/magnitude_histogram.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/stat_math.h"
#include "kernels/compressors/threshold_scanner.h"
#include "kernels/compressors/threshold_search.h"

namespace spex {
namespace {

class GaussianK final : public StatelessCompressor {
 public:
  GaussianK(const CompressorSpec& spec, Primitives* prims, bool band)
      : StatelessCompressor(spec, prims), band_(band), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n, k = ctx.k;
    const AbsMoments m = prims_->AccumulateMoments(acc, add, n, -1.0f, false);  // acc += add
    const double mean = m.sum / n;
    const double var = n > 1 ? std::max(0.0, (m.sum_sq - m.sum * mean) / (n - 1)) : 0.0;
    float th = static_cast<float>(mean + std::sqrt(var) * NormalQuantile(1 - ctx.density / 2));
    th = std::max(th, kMinThreshold);
    int passes = 1;  // the moments
    ThresholdScanner scan(prims_, acc, nullptr, n, 4 * k, &scratch_);
    CountFn count = [&](float t) { return scan.Count(t); };
    if (band_) {
      // Up to 40 probes: answered from one histogram pass, exactly only where the bin holding a
      // probe straddles a count the refinement compares with. The histogram covers the
      // magnitudes from the lowest published probe (th / 8) up, where the probes lie unless
      // every published one selects too few; then it is built whole and the search runs again
      // (the same decisions, from the same bounds and exact counts).
      hist_.BuildFrom(prims_, acc, n, th * 0.125f, &scratch_);
      ++passes;
      count = CutCount([this](float t, size_t* lo, size_t* hi) { hist_.Bounds(t, lo, hi); },
                       GaussianKCuts(k), count);
    }
    auto probe = [&](float t) { return count(StrictAbove(std::max(t, kMinThreshold))); };
    int rounds = 0;
    const float th0 = th;
    th = band_ ? GaussianKBandRefine(th0, k, kMinThreshold, m.max, probe, &rounds)
               : GaussianKRefine(th0, k, probe, &rounds);
    if (band_ && hist_.missed()) {
      hist_.Build(prims_, acc, n, &scratch_);
      ++passes;
      th = GaussianKBandRefine(th0, k, kMinThreshold, m.max, probe, &rounds);
    }
    th = std::max(th, kMinThreshold);
    scan.Select(StrictAbove(th), zero, out);
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(rounds);
    out->scalars[2] = static_cast<float>(scan.passes() + passes);
    return scratch_.TakeStatus();
  }

 private:
  bool band_;
  MagnitudeHistogram hist_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeGaussianK(const CompressorSpec& spec, Primitives* prims,
                                          ParamReader& r) {
  const std::string refine =
      r.Choice("refine", "band", {"band", "reference"},
               "band: refine until 2k/3 <= count <= 4k/3; reference: stop after 3 steps");
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<GaussianK>(spec, prims, refine == "band");
}

}  // namespace spex
