// The exact top-k selection shared by topk, topk_union, gtopk and cltk.
#pragma once

#include <memory>

#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

// acc += add (if given), then the exact top-ctx.k of acc into out (zeroed in acc when `zero`);
// sets out->scalars[0] to the k-th magnitude and returns it. `scratch`: see device_scratch.h.
float SelectTopK(Primitives* p, const StepContext& ctx, float* acc, const float* add, bool zero,
                 Selection* out, Scratch* scratch = nullptr);

// The exact top-k compressor with the given pattern (B: topk, A: topk_union).
std::unique_ptr<Compressor> NewTopK(const CompressorSpec& spec, Primitives* prims, Pattern pattern);

}  // namespace spex
