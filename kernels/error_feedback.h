// Error feedback (docs/algorithms.md#error-feedback), implemented once for every compressor: owns
// the node's accumulated buffer acc = residual + this step's local sum, runs the compressor on
// it and keeps what was not sent as the next step's residual, per pattern:
//   A: acc is zeroed at the whole gathered union (every node sent its acc there);
//   B: the compressor zeroes its own selection inside Select (zero_selected = true);
//   D: acc is cleared (everything was sent).
// With error feedback off, acc is cleared after every step (nothing carries over).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

class ErrorFeedback {
 public:
  ErrorFeedback(Primitives* prims, size_t n, bool enabled = true);

  bool enabled() const { return enabled_; }
  size_t size() const { return acc_.size(); }
  float* acc() { return acc_.data(); }
  const float* acc() const { return acc_.data(); }

  // acc += grad (grad may be null when acc already holds this step's sum, e.g. after the local
  // reduce), fused into the compressor's selection pass where it can, then selects into *sel.
  absl::Status Select(Compressor* c, uint64_t step, const float* grad, Selection* sel);

  // Pattern A: this node's acc at the union (what it contributes to the value all-reduce).
  absl::Status GatherAt(absl::Span<const uint32_t> indices, float* out) const;

  // After the exchange: the residual update for c's pattern (see above), then c->Update.
  absl::Status Complete(Compressor* c, uint64_t step, const Gathered& gathered);

  // ||acc||_2 (the residual's norm between steps).
  double ResidualNorm() const;

  // Drops the residual (e.g. when a bucket goes dense for a step and sends everything).
  void Clear();

 private:
  Primitives* prims_;
  bool enabled_;
  std::vector<float> acc_;
};

}  // namespace spex
