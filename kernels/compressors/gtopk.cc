// gtopk (pattern B): the references' GlobalTopKReducer (docs/algorithms.md#gtopk): the exact top-k,
// k = max(1, floor(d n)), over the whole flattened vector the compressor is given (a bucket or a
// whole merge group), all-gathered with per-node counts and scatter-added.
//
// APPROXIMATION, stated plainly: Shi et al.'s gTop-k merges the nodes' top-k sets hierarchically
// (log2(nodes) extra rounds, keeping the top-k of each pairwise sum, and puts the local values
// that lose back into the residual). Those rounds cannot be expressed through Select/Update (one
// gather per step, no values in Update), so spex does not implement that merge: the result is the
// sum of all nodes' local top-k (up to nodes * k entries), as the reference repositories'
// "gtopk". On a single bucket its selection equals `topk`'s; it differs only where the merger
// hands it a merged group.
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/topk_common.h"

namespace spex {
namespace {

class GTopK final : public StatelessCompressor {
 public:
  GTopK(const CompressorSpec& spec, Primitives* prims)
      : StatelessCompressor(spec, prims), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    SelectTopK(prims_, ctx, acc, add, zero, out, &scratch_);
    return scratch_.TakeStatus();
  }

 private:
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeGTopK(const CompressorSpec& spec, Primitives* prims,
                                      ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<GTopK>(spec, prims);
}

}  // namespace spex
