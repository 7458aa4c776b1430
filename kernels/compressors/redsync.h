// The RedSync compressor class shared by redsync and redsync_trim (see redsync.cc).
#pragma once

#include <memory>

#include "kernels/compressor.h"

namespace spex {

// trim: redsync_trim (else redsync); band: redsync's search to its band (else the published
// search), or redsync_trim's trim of the candidates to the exact top-k (else all candidates).
std::unique_ptr<Compressor> NewRedSync(const CompressorSpec& spec, Primitives* prims, bool trim,
                                       bool band);

}  // namespace spex
