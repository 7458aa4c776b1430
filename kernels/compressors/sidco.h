// The multi-stage SIDCo compressor shared by sidco_e, sidco_p and sidco_gp (see sidco.cc for
// the algorithm, its choices and parameters).
#pragma once

#include <memory>

#include "kernels/compressor.h"
#include "kernels/compressors/params.h"

namespace spex {

enum class SidcoFit { kExponential, kGPareto, kGammaGPareto };

// Reads stages/adaptive from r; null with prims == nullptr or a bad parameter.
std::unique_ptr<Compressor> MakeSidco(const CompressorSpec& spec, Primitives* prims, ParamReader& r,
                                      SidcoFit fit);

}  // namespace spex
