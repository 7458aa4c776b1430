// cltk (docs/algorithms.md#cltk, CLT-k / ScaleCom-style cyclic local top-k): the leader of a step,
// node (step mod nodes), selects its exact local top-k; the other nodes select nothing. Pattern C
// of the references (leader broadcast of indices + value all-reduce) is pattern A here: the union
// of the gathered index sets is the leader's set, and every node contributes its own acc there.
// (The reference computes top-k on every node and discards all but the leader's; spex skips that.)
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/topk_common.h"

namespace spex {
namespace {

class Cltk final : public StatelessCompressor {
 public:
  Cltk(const CompressorSpec& spec, Primitives* prims)
      : StatelessCompressor(spec, prims), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kIndexUnion; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    const int leader = static_cast<int>(ctx.step % ctx.node_count);
    out->scalars[1] = static_cast<float>(leader);
    if (ctx.node_rank == leader) {
      SelectTopK(prims_, ctx, acc, add, zero, out, &scratch_);
    } else if (add) {
      prims_->Accumulate(acc, add, ctx.n);
    }
    return scratch_.TakeStatus();
  }

 private:
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeCltk(const CompressorSpec& spec, Primitives* prims,
                                     ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<Cltk>(spec, prims);
}

}  // namespace spex
