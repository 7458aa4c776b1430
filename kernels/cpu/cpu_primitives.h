// The fast CPU implementation of Primitives: Highway SIMD loops dispatched at run time to the
// best target of the CPU, split across a small persistent thread pool for large buffers.
// Create it with MakeCpuPrimitives(threads) from kernels/primitives.h.
//
// Numerics: Moments sums in double lanes (|x|, x^2 exact per entry) but takes log in float, so
// sum_log carries about 2e-7 relative error per entry. Everything else is bit-identical to the
// reference (Accumulate, Scale, selects, TopK, histogram, Sample, scatter/gather). Moments adds
// per-task partial sums in task order: reproducible for a given thread count.
// Memory: a parallel select allocates a private buffer per task, up to ~1/32 of its range.
// Copy, Fill and the staging copies (CopyToHost/CopyFromHost: host memory is this device's) are
// plain copies and fills, split across the pool like the elementwise operations.
#pragma once

#include "kernels/primitives.h"

namespace spex {

// The Highway target the CPU primitives run on here ("AVX3", "AVX2", "SSE4", ...).
const char* CpuPrimitivesTarget();

// Buffers shorter than this (in elements) are processed on the calling thread alone.
inline constexpr size_t kCpuParallelMinElements = 256 * 1024;

}  // namespace spex
