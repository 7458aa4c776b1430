// ExDyna's block partitioning and dynamic partition allocation (docs/algorithms.md#exdyna), as a
// deterministic object every node updates identically from gathered counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/compressors/micro.h"
#include "kernels/compressors/state_blob.h"

namespace spex {

inline constexpr size_t kExDynaBlocks = 1024;
inline constexpr double kExDynaHeavy = 1.05;
inline constexpr double kExDynaLight = 0.95238;

class ExDynaLayout {
 public:
  // n elements over `parts` partitions. Block size: floor(n / 1024) rounded down to a multiple of
  // 32 (the reference); for n < 32768 the plain floor(n / blocks) with blocks = min(1024, n), so
  // small buckets work. The leftover n - blk * blocks elements go to the last partition.
  // InvalidArgument when there are fewer blocks than partitions.
  static absl::StatusOr<ExDynaLayout> Make(size_t n, int parts);

  size_t block_size() const { return blk_; }
  size_t num_blocks() const { return num_blocks_; }
  double min_blocks() const { return min_blk_; }  // num_blocks / (4 parts)
  const std::vector<int64_t>& blocks() const { return blocks_; }
  Range Partition(int j) const;

  // One allocation sweep (3.3): `pc` are the partitions' counts of the previous step (by
  // partition), k_prev their sum. Adjacent pairs left to right; a heavy/light pair moves their
  // boundary by one block toward the heavy side unless that leaves a partition below
  // min_blocks(); the estimates move by floor(blk * k_prev / n) with it. No moves when
  // floor(k_prev / parts) == 0 (the reference divides by zero there). Returns the moves made.
  int Allocate(std::vector<int64_t> pc, uint64_t k_prev);

  // The moved boundaries (blocks and positions per partition) for a checkpoint. Load takes
  // them only when they tile this layout's blocks over its partitions (false otherwise, and
  // nothing changes).
  void Save(StateWriter* w) const;
  bool Load(StateReader& r);

 private:
  size_t n_ = 0, blk_ = 0, num_blocks_ = 0, rem_ = 0;
  int parts_ = 1;
  double min_blk_ = 0;
  std::vector<int64_t> blocks_, pos_;
};

}  // namespace spex
