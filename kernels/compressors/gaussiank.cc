// gaussiank (pattern B; Shi et al., SIDCo's GaussianKSGDCompressor EC form, ALGORITHMS.md 7.11 and
// decisions item 4): fit a Gaussian to the magnitudes, th = mu + sigma Phi^-1(1 - d/2), then up
// to 3 refinements (count < 2k/3: th x0.5; count > 4k/3: th x1.5; otherwise stop), then select
// |acc| > th (strict). Statistics are on |acc| / ||acc||; the normalisation cancels out of the
// threshold (mu and sigma scale with ||acc||), so they are taken on |acc| directly and no norm
// pass is needed. sigma is the sample standard deviation (n - 1). Scalars: [0] threshold,
// [1] refinements, [2] passes over acc.
#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/compressors/common.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/stat_math.h"

namespace spex {
namespace {

class GaussianK final : public Compressor {
 public:
  GaussianK(const CompressorSpec& spec, Primitives* prims) : Compressor(spec, prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n, k = ctx.k;
    if (add) prims_->Accumulate(acc, add, n);
    const AbsMoments m = prims_->Moments(acc, n, -1.0f);
    const double mean = m.sum / n;
    const double var = n > 1 ? std::max(0.0, (m.sum_sq - m.sum * mean) / (n - 1)) : 0.0;
    float th = static_cast<float>(mean + std::sqrt(var) * NormalQuantile(1 - ctx.density / 2));
    th = std::max(th, kMinThreshold);
    ThresholdScanner scan(prims_, acc, nullptr, n, 4 * k);
    int rounds = 0;
    for (; rounds < 3; ++rounds) {
      const double c = static_cast<double>(scan.Count(StrictAbove(th)));
      if (c < 2.0 * k / 3.0) {
        th = std::max(th * 0.5f, kMinThreshold);
      } else if (c > 4.0 * k / 3.0) {
        th *= 1.5f;
      } else {
        break;
      }
    }
    scan.Select(StrictAbove(th), zero, out);
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(rounds);
    out->scalars[2] = static_cast<float>(scan.passes() + 1);  // + the moments pass
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Compressor> MakeGaussianK(const CompressorSpec& spec, Primitives* prims,
                                          ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<GaussianK>(spec, prims);
}

}  // namespace spex
