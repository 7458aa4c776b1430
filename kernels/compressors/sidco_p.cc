// sidco_p (pattern B; docs/algorithms.md#sidco): multi-stage SIDCo with the generalised Pareto fit
// in every stage. Algorithm, choices and parameters: sidco.cc.
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/sidco.h"

namespace spex {

std::unique_ptr<Compressor> MakeSidcoP(const CompressorSpec& spec, Primitives* prims,
                                       ParamReader& r) {
  return MakeSidco(spec, prims, r, SidcoFit::kGPareto);
}

}  // namespace spex
