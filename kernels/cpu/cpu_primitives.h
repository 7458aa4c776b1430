// The fast CPU implementation of Primitives: Highway SIMD loops dispatched at run time to the
// best target of the CPU, split across a small persistent thread pool for large buffers.
// Create it with MakeCpuPrimitives(threads) from kernels/primitives.h.
#pragma once

#include "kernels/primitives.h"

namespace spex {

// The Highway target the CPU primitives run on here ("AVX3", "AVX2", "SSE4", ...).
const char* CpuPrimitivesTarget();

// Buffers shorter than this (in elements) are processed on the calling thread alone.
inline constexpr size_t kCpuParallelMinElements = 256 * 1024;

}  // namespace spex
