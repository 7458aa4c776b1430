// The 2^16-bin histogram of |acc| (one pass; Primitives::AbsHistogram16) with cumulative counts,
// so that the number of entries at or above any threshold is known to within the population of
// the one bin that holds the threshold (bins are 2^-7 of a magnitude wide). Used by gaussiank and
// redsync to bound their threshold searches. `scratch` and failures: see device_scratch.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/primitives.h"

namespace spex {

class MagnitudeHistogram {
 public:
  void Build(Primitives* p, const float* acc, size_t n, Scratch* scratch = nullptr);
  // The same from the entries in `floor`'s bin and above only (Primitives::AbsHistogram16From:
  // the pass skips the others). Bounds are then Build's at thresholds in floor's bin or above;
  // below it they are loose (entries above floor's bin .. n), and missed() says one was asked.
  void BuildFrom(Primitives* p, const float* acc, size_t n, float floor,
                 Scratch* scratch = nullptr);
  // *lo <= #{i : |acc[i]| >= t} <= *hi.
  void Bounds(float t, size_t* lo, size_t* hi) const;
  // Whether Bounds was asked below the floor's bin since the last build.
  bool missed() const { return missed_; }
  // The lower edge of the highest bin b such that at least k finite entries lie in bins b and
  // above: every entry with |acc| below it ranks below k others. 0 when there is none.
  float FloorOfTop(size_t k) const;

 private:
  std::vector<uint32_t> bins_;
  std::vector<uint64_t> from_;  // from_[b]: entries in the finite bins b and above (b >= first_)
  uint64_t inf_bin_ = 0;        // entries in +Inf's bin (NaNs with a short payload share it)
  size_t n_ = 0;
  uint32_t first_ = 0;  // the lowest bin counted
  mutable bool missed_ = false;
};

}  // namespace spex
