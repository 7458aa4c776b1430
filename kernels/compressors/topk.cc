// topk (pattern B): exact top-k by |acc| over the bucket, k = max(1, floor(d n)); ties at the
// k-th magnitude go to the lower index (Primitives::TopK). The layer-wise top-k of the
// references (docs/algorithms.md#topk) is this applied per bucket. Scalars: [0] = the k-th
// magnitude.
#include <algorithm>
#include <cmath>
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/topk_common.h"

namespace spex {

float SelectTopK(Primitives* p, const StepContext& ctx, float* acc, const float* add, bool zero,
                 Selection* out, Scratch* scratch) {
  if (add) p->Accumulate(acc, add, ctx.n);
  AppendTopK(p, acc, 0, ctx.n, ctx.k, zero, out, scratch);
  float t = INFINITY;
  for (float v : out->val) t = std::min(t, std::fabs(v));
  out->scalars[0] = t;
  return t;
}

namespace {

class TopK final : public StatelessCompressor {
 public:
  TopK(const CompressorSpec& spec, Primitives* prims, Pattern pattern)
      : StatelessCompressor(spec, prims), pattern_(pattern), scratch_(prims) {}
  Pattern pattern() const override { return pattern_; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    SelectTopK(prims_, ctx, acc, add, zero, out, &scratch_);
    return scratch_.TakeStatus();
  }

 private:
  Pattern pattern_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> NewTopK(const CompressorSpec& spec, Primitives* prims,
                                    Pattern pattern) {
  return std::make_unique<TopK>(spec, prims, pattern);
}

std::unique_ptr<Compressor> MakeTopK(const CompressorSpec& spec, Primitives* prims,
                                     ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<TopK>(spec, prims, Pattern::kSparseGather);
}

}  // namespace spex
