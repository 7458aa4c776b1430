// dgc (pattern B; Lin et al., ICLR 2018, in its canonical GRACE form;
// docs/algorithms.md#dgc): sample ceil(sample_ratio n) positions uniformly (with replacement,
// seeded), take the threshold from the sample's top-d fraction (the ceil(m d)-th largest sampled
// magnitude), correct it up to 10 times by x1.3 / x0.7 while the count is outside
// [0.7 k, 1.3 k], select |acc| >= th, and keep the exact top-k of the selected if more than 4k/3
// remain. Choices: `>=` (the primitives' comparison); the sample of acc + add is taken as
// Sample(acc) + Sample(add) with one seed (bit-identical), so the add fuses into the first pass.
// Parameters: seed (default 1), sample_ratio (default 0.01).
// Scalars: [0] threshold, [1] correction rounds, [2] passes over acc.
#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_scanner.h"
#include "kernels/compressors/threshold_search.h"
#include "kernels/splitmix.h"

namespace spex {
namespace {

class Dgc final : public StatelessCompressor {
 public:
  Dgc(const CompressorSpec& spec, Primitives* prims, uint64_t seed, double sample_ratio)
      : StatelessCompressor(spec, prims),
        seed_(seed),
        sample_ratio_(sample_ratio),
        scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n, k = ctx.k;
    const size_t m =
        std::min<size_t>(n, std::max<size_t>(1, static_cast<size_t>(std::ceil(sample_ratio_ * n))));
    const uint64_t seed = StepSeed(seed_, ctx.node_rank, ctx.step);
    sample_.resize(m);
    (void)SampleToHost(prims_, acc, n, m, seed, sample_.data(), &scratch_);
    if (add) {
      add_sample_.resize(m);
      (void)SampleToHost(prims_, add, n, m, seed, add_sample_.data(), &scratch_);
      for (size_t j = 0; j < m; ++j) sample_[j] += add_sample_[j];
    }
    for (float& v : sample_) v = std::fabs(v);
    const size_t top =
        std::min(m, std::max<size_t>(1, static_cast<size_t>(std::ceil(m * ctx.density))));
    std::nth_element(sample_.begin(), sample_.begin() + (top - 1), sample_.end(),
                     std::greater<float>());
    float th = std::max(sample_[top - 1], kMinThreshold);

    ThresholdScanner scan(prims_, acc, add, n, 2 * k, &scratch_);
    int rounds = 0;
    th = std::max(
        DgcCorrect(
            th, k, [&](float t) { return scan.Count(std::max(t, kMinThreshold)); }, &rounds),
        kMinThreshold);
    const bool trim = static_cast<double>(scan.Count(th)) > 4.0 * k / 3.0;
    scan.Select(th, zero && !trim, out);
    if (trim) {
      TrimTopK(prims_, out, 0, k, &scratch_);
      if (zero) {
        if (absl::Status s =
                ZeroAtHost(prims_, acc, n, out->idx.data(), out->idx.size(), &scratch_);
            !s.ok()) {
          return s;
        }
      }
    }
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(rounds);
    out->scalars[2] = static_cast<float>(scan.passes());
    return scratch_.TakeStatus();
  }

 private:
  uint64_t seed_;
  double sample_ratio_;
  std::vector<float> sample_, add_sample_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeDgc(const CompressorSpec& spec, Primitives* prims, ParamReader& r) {
  const uint64_t seed = r.Seed();
  const double ratio = r.Double("sample_ratio", 0.01, 1e-6, 1, "fraction of positions sampled");
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Dgc>(spec, prims, seed, ratio);
}

}  // namespace spex
