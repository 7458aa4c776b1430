// sidco_gp (pattern B; docs/algorithms.md#sidco): multi-stage SIDCo with the gamma fit in stage 1,
// generalised Pareto in the later stages. Algorithm, choices and parameters: sidco.cc.
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/sidco.h"

namespace spex {

std::unique_ptr<Compressor> MakeSidcoGP(const CompressorSpec& spec, Primitives* prims,
                                        ParamReader& r) {
  return MakeSidco(spec, prims, r, SidcoFit::kGammaGPareto);
}

}  // namespace spex
