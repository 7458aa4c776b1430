// splitmix64 (Steele, Lea and Flood, 2014), the one pseudo-random generator of spex: the
// primitives' Sample contract (primitives.h), the compressors' seeds and draws, and the synthetic
// trainer inputs. Written once for host and device: __host__ __device__ when compiled by nvcc,
// plain inline C++17 otherwise. Every caller gets the same bits on every device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define SPEX_SPLITMIX_HD __host__ __device__ __forceinline__
#else
#define SPEX_SPLITMIX_HD inline
#endif

namespace spex {

// splitmix64's increment (2^64 / golden ratio): state j of a stream is seed + j * this.
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ull;

// splitmix64's output function: the mixed value of one state.
SPEX_SPLITMIX_HD uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The next output of the stream in *state (advanced by the gamma first).
SPEX_SPLITMIX_HD uint64_t SplitMix64(uint64_t* state) {
  *state += kSplitMix64Gamma;
  return SplitMix64Mix(*state);
}

// A per-(seed, node, step) stream seed, so that the compressors' draws are independent across
// nodes and steps.
SPEX_SPLITMIX_HD uint64_t StepSeed(uint64_t seed, int rank, uint64_t step) {
  uint64_t s = seed;
  uint64_t a = SplitMix64(&s) ^ (static_cast<uint64_t>(rank) * 0xd1b54a32d192ed03ull);
  uint64_t b = SplitMix64(&a) ^ (step * 0x8cb92ba72f3d8dd7ull);
  return SplitMix64(&b);
}

}  // namespace spex
