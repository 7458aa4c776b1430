// MiCRO's partition layout and cyclic exclusive ownership (docs/algorithms.md#micro), exposed for
// the compressor and its tests.
#pragma once

#include <cstddef>
#include <cstdint>

namespace spex {

struct Range {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// Partition j of n elements cut into `parts` contiguous pieces: q = n / parts elements each,
// the first n % parts get one more.
Range EqualPartition(size_t n, int parts, int j);

// The partition node `rank` owns at `step`: (step mod nodes + rank) mod nodes. Exclusive (a
// permutation of the partitions at every step) and cyclic (period `nodes`).
int OwnedPartition(uint64_t step, int rank, int nodes);

}  // namespace spex
