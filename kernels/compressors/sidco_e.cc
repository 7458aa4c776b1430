// sidco_e (pattern B; docs/algorithms.md#sidco): multi-stage SIDCo with the exponential fit in
// every stage. Algorithm, choices and parameters: sidco.cc.
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/sidco.h"

namespace spex {

std::unique_ptr<Compressor> MakeSidcoE(const CompressorSpec& spec, Primitives* prims,
                                       ParamReader& r) {
  return MakeSidco(spec, prims, r, SidcoFit::kExponential);
}

}  // namespace spex
