// redsync and redsync_trim (pattern B; ALGORITHMS.md 7.10, SIDCo's RedSyncCompressor and
// RedSyncTrimCompressor): on |acc|, mean and max, then a coarse search for
// th = mean + r (max - mean) (see threshold_search.h for the exact rules), then select
// |acc| > th. The search stops after at most 3 probes (redsync) or 5 (redsync_trim), so the
// achieved density is only loosely controlled, as in the reference.
// Note: the documented redsync rule moves the lower bound up when k/2 <= count <= k as well (the
// threshold then rises although the count is already low); spex follows the documented rule.
// Scalars: [0] threshold, [1] probes, [2] passes over acc.
#include <algorithm>
#include <memory>

#include "kernels/compressors/common.h"
#include "kernels/compressors/factories.h"
#include "kernels/compressors/redsync.h"
#include "kernels/compressors/threshold_search.h"

namespace spex {
namespace {

class RedSync final : public Compressor {
 public:
  RedSync(const CompressorSpec& spec, Primitives* prims, bool trim)
      : Compressor(spec, prims), trim_(trim) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const size_t n = ctx.n, k = ctx.k;
    if (add) prims_->Accumulate(acc, add, n);
    const AbsMoments m = prims_->Moments(acc, n, -1.0f);
    const double mean = m.sum / n, max = m.max;
    ThresholdScanner scan(prims_, acc, nullptr, n, 2 * k);
    auto count = [&](float t) { return scan.Count(StrictAbove(std::max(t, kMinThreshold))); };
    int probes = 0;
    float th = trim_ ? RedSyncTrimSearch(mean, max, k, count, &probes)
                     : RedSyncSearch(mean, max, k, count, &probes);
    th = std::max(th, kMinThreshold);
    scan.Select(StrictAbove(th), zero, out);
    out->scalars[0] = th;
    out->scalars[1] = static_cast<float>(probes);
    out->scalars[2] = static_cast<float>(scan.passes() + 1);
    return absl::OkStatus();
  }

 private:
  bool trim_;
};

}  // namespace

std::unique_ptr<Compressor> NewRedSync(const CompressorSpec& spec, Primitives* prims, bool trim) {
  return std::make_unique<RedSync>(spec, prims, trim);
}

std::unique_ptr<Compressor> MakeRedSync(const CompressorSpec& spec, Primitives* prims,
                                        ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<RedSync>(spec, prims, false);
}

}  // namespace spex
