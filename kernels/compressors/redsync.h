// The RedSync compressor class shared by redsync and redsync_trim (see redsync.cc).
#pragma once

#include <memory>

#include "kernels/compressor.h"

namespace spex {

std::unique_ptr<Compressor> NewRedSync(const CompressorSpec& spec, Primitives* prims, bool trim);

}  // namespace spex
