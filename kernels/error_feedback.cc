// Error feedback implemented once for every compressor (error_feedback.h).
#include "kernels/error_feedback.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {

ErrorFeedback::ErrorFeedback(Primitives* prims, size_t n, bool enabled)
    : prims_(prims), enabled_(enabled), acc_(n, 0.0f) {}

absl::Status ErrorFeedback::Select(Compressor* c, uint64_t step, const float* grad,
                                   Selection* sel) {
  if (c->elements() != acc_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("error feedback holds ", acc_.size(),
                                                   " elements but compressor ", c->name(),
                                                   " was built for ", c->elements()));
  }
  // B and D remove what they send inside Select; A waits for the union.
  return c->Select(step, acc_.data(), grad, c->pattern() != Pattern::kIndexUnion, sel);
}

absl::Status ErrorFeedback::GatherAt(absl::Span<const uint32_t> indices, float* out) const {
  return prims_->Gather(acc_.data(), acc_.size(), indices.data(), indices.size(), out);
}

absl::Status ErrorFeedback::Complete(Compressor* c, uint64_t step, const Gathered& gathered) {
  if (c->pattern() == Pattern::kIndexUnion) {
    // Every node sent its acc at the whole union: none of it stays behind.
    if (absl::Status s = prims_->ZeroAt(acc_.data(), acc_.size(), gathered.indices.data(),
                                        gathered.indices.size());
        !s.ok()) {
      return s;
    }
  }
  if (!enabled_) Clear();
  return c->Update(step, gathered);
}

double ErrorFeedback::ResidualNorm() const {
  return std::sqrt(prims_->Moments(acc_.data(), acc_.size(), -1.0f).sum_sq);
}

void ErrorFeedback::Clear() { std::memset(acc_.data(), 0, acc_.size() * sizeof(float)); }

}  // namespace spex
