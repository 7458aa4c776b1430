// dense (pattern D): no compression, the baseline every benchmark compares to
// (docs/algorithms.md#dense). Select marks everything as sent (sel.all) and copies acc into
// sel.val; the engine all-reduces acc itself. With zero_selected acc is cleared (nothing stays
// behind).
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/compressors/factories.h"

namespace spex {
namespace {

class Dense final : public StatelessCompressor {
 public:
  Dense(const CompressorSpec& spec, Primitives* prims) : StatelessCompressor(spec, prims) {}
  Pattern pattern() const override { return Pattern::kDense; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    if (prims_->device() != Device::kCpu) {
      return absl::UnimplementedError("dense: copying acc is implemented for host memory only");
    }
    if (add) prims_->Accumulate(acc, add, ctx.n);
    out->all = true;
    out->val.resize(ctx.n);
    std::memcpy(out->val.data(), acc, ctx.n * sizeof(float));
    if (zero) std::memset(acc, 0, ctx.n * sizeof(float));
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<Compressor> MakeDense(const CompressorSpec& spec, Primitives* prims,
                                      ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Dense>(spec, prims);
}

}  // namespace spex
