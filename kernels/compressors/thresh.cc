// thresh (pattern A, flat hard threshold; docs/algorithms.md#thresh, the kljp/micro form): select
// |acc| >= lambda with lambda = 1 / (2 sqrt(k)) recomputed every step from the current density
// and n, or a constant `threshold` (the sands-lab form). The achieved density is NOT controlled:
// it follows the gradient's scale. Indices are united across nodes (MiCRO-style communication).
// Parameters: threshold (> 0; default: 1 / (2 sqrt(k))).
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/selection.h"
#include "kernels/compressors/threshold_control.h"

namespace spex {
namespace {

class Thresh final : public Compressor {
 public:
  Thresh(const CompressorSpec& spec, Primitives* prims, double threshold)
      : Compressor(spec, prims), threshold_(threshold), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kIndexUnion; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const float t = threshold_ > 0 ? static_cast<float>(threshold_) : InitialThreshold(ctx.k);
    // Size the buffer from the last count: the density is not controlled but drifts slowly.
    AppendAbove(prims_, acc, add, 0, ctx.n, t, zero, last_count_ + last_count_ / 4 + ctx.k, out,
                &scratch_);
    last_count_ = out->idx.size();
    out->scalars[0] = t;
    return scratch_.TakeStatus();
  }

  bool SaveOwnState(StateWriter* w) const override {
    if (w) w->Put<uint64_t>(last_count_);
    return true;
  }
  bool LoadOwnState(StateReader& r) override {
    uint64_t last;
    if (!r.Get(&last) || !r.complete() || last > elements()) return false;
    last_count_ = last;
    return true;
  }

 private:
  double threshold_;
  size_t last_count_ = 0;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeThresh(const CompressorSpec& spec, Primitives* prims,
                                       ParamReader& r) {
  const double t = r.Double("threshold", 0, 0, 1e30,
                            "constant threshold on |acc|; 0 = 1 / (2 sqrt(k)) every step");
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Thresh>(spec, prims, t);
}

}  // namespace spex
