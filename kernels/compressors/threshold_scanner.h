// Answers count and select probes at several thresholds on one buffer with few passes over it:
// the threshold searches of dgc, gaussiank, redsync and sage probe a sequence of thresholds and
// then select at the last one. `scratch` and failures: see device_scratch.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

// Keeps the complete list of entries at the lowest threshold scanned so far (while that fits in
// `capacity`) and answers every probe at or above it from that list. `add`, when non-null, is
// added into acc by the first pass over acc (so nothing else may read acc before the first probe).
// acc must not change while the scanner is in use; a Select that zeroes ends its use (the list
// still holds the zeroed entries).
class ThresholdScanner {
 public:
  ThresholdScanner(Primitives* p, float* acc, const float* add, size_t n, size_t capacity,
                   Scratch* scratch = nullptr);

  // Number of i with |acc[i]| >= t.
  size_t Count(float t);
  // out's idx/val := entries with |acc| >= t (ascending); zeroes acc there when `zero`.
  void Select(float t, bool zero, Selection* out);
  // Passes made over acc so far.
  int passes() const { return passes_; }

 private:
  bool FromList(float t) const { return have_list_ && t >= list_t_; }
  void Scan(float t);

  Primitives* p_;
  Scratch* scratch_;
  float* acc_;
  const float* add_;  // null once applied
  size_t n_;
  size_t cap_;
  std::vector<uint32_t> idx_, scan_idx_;
  std::vector<float> val_, scan_val_;
  float list_t_ = 0;
  bool have_list_ = false;
  std::vector<std::pair<float, size_t>> counts_;  // exact counts from passes
  int passes_ = 0;
};

}  // namespace spex
