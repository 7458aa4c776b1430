// topk_union (pattern A, docs/algorithms.md#topk_union): the same local top-k as topk, but the
// nodes' index sets are united and every node contributes its own acc at the whole union (shows
// gradient build-up: the union grows with the node count).
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/topk_common.h"

namespace spex {

std::unique_ptr<Compressor> MakeTopKUnion(const CompressorSpec& spec, Primitives* prims,
                                          ParamReader& r) {
  if (prims == nullptr || !r.ok()) return nullptr;
  return NewTopK(spec, prims, Pattern::kIndexUnion);
}

}  // namespace spex
