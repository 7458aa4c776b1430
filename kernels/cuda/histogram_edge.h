// The histogram threshold of micro and exdyna on the device (Primitives::AbsHistogramEdge):
// the |x| histogram's bins from a first bin on are counted in device memory and walked there, so
// 24 bytes come back per step instead of the 2^16 bins (256 KiB). The walk is two-level, as the
// top-k digit choice (device_math.h PickChunk/PickInChunk): one block sums kEdgeChunks chunks of
// kEdgeChunkBins bins, one thread finds the chunk where the running count from +Inf's bin down
// reaches the quota and scans its bins. EdgeFromBins is that walk, written once for host and
// device, so tests/cuda/histogram_edge_test checks it against Primitives::WalkHistogramEdge
// without a GPU.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_math.h"

namespace spex {
namespace gpu {

inline constexpr uint32_t kEdgeInfBin = 0xFF00;  // +-Inf's bin; the bins above hold only NaNs
inline constexpr uint32_t kEdgeChunks = 1024;
inline constexpr uint32_t kEdgeChunkBins = 65536 / kEdgeChunks;

// The result, laid out as spex::HistogramEdge (kernels/primitives.h).
struct EdgePick {
  uint32_t bin = 0;
  uint32_t reached = 0;
  uint64_t cum = 0;
  uint64_t in_edge = 0;
};

// The lowest bin walked: max(first_bin, 1), at most +Inf's bin.
SPEX_HD uint32_t EdgeLowBin(uint32_t first_bin) {
  const uint32_t lo = first_bin < 1 ? 1 : first_bin;
  return lo > kEdgeInfBin ? kEdgeInfBin : lo;
}

// Chunk c's count of the bins that are walked (lo .. kEdgeInfBin).
SPEX_HD uint64_t EdgeChunkSum(const uint32_t* bins, uint32_t c, uint32_t lo) {
  uint64_t s = 0;
  for (uint32_t d = c * kEdgeChunkBins; d < (c + 1) * kEdgeChunkBins; ++d) {
    if (d >= lo && d <= kEdgeInfBin) s += bins[d];
  }
  return s;
}

// The walk from kEdgeInfBin down to lo over `partial` (kEdgeChunks chunk sums, EdgeChunkSum):
// the highest bin b with at least `quota` entries in bins b..kEdgeInfBin (reached = 1), else
// bin = lo with every walked entry in cum. quota >= 1.
SPEX_HD EdgePick EdgeFromBins(const uint32_t* bins, const uint64_t* partial, uint32_t lo,
                              uint64_t quota) {
  EdgePick e;
  uint64_t seen = 0;
  for (uint32_t c = kEdgeInfBin / kEdgeChunkBins + 1; c-- > lo / kEdgeChunkBins;) {
    if (seen + partial[c] < quota) {
      seen += partial[c];
      continue;
    }
    // The edge is in chunk c: its bins from the top (kEdgeInfBin at most, lo at least).
    uint32_t top = (c + 1) * kEdgeChunkBins - 1;
    if (top > kEdgeInfBin) top = kEdgeInfBin;
    const uint32_t bottom = c * kEdgeChunkBins > lo ? c * kEdgeChunkBins : lo;
    for (uint32_t d = top + 1; d-- > bottom;) {
      seen += bins[d];
      if (seen >= quota) {
        e.bin = d;
        e.reached = 1;
        e.cum = seen;
        e.in_edge = bins[d];
        return e;
      }
    }
  }
  e.bin = lo;
  e.cum = seen;
  e.in_edge = bins[lo];
  return e;
}

}  // namespace gpu
}  // namespace spex

#if defined(__CUDACC__) || defined(SPEX_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include <cstddef>

namespace spex {
namespace gpu {

// Clears `bins` (65536 entries, device memory), counts |x[i]| for i in [begin, end) into the
// bins from first_bin on (entries below cost a compare, no increment), then walks them in one
// block and writes the EdgePick to `out` (device memory). Asynchronous on `stream`.
cudaError_t LaunchHistogramEdge(cudaStream_t stream, int max_blocks, const float* x, size_t begin,
                                size_t end, uint32_t first_bin, uint64_t quota, uint32_t* bins,
                                EdgePick* out);

}  // namespace gpu
}  // namespace spex
#endif
