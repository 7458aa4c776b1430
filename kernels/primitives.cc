// The host-memory defaults of Primitives' memory movement (see primitives.h).
#include "kernels/primitives.h"

#include <algorithm>
#include <cstring>

namespace spex {

absl::Status Primitives::Copy(float* dst, const float* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n * sizeof(float));
  return absl::OkStatus();
}

absl::Status Primitives::Fill(float* x, float v, size_t n) {
  std::fill_n(x, n, v);
  return absl::OkStatus();
}

absl::Status Primitives::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(host_dst, src, bytes);
  return absl::OkStatus();
}

absl::Status Primitives::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, host_src, bytes);
  return absl::OkStatus();
}

absl::Status Primitives::SumScaled(float* y, const float* const* xs, int count, float a,
                                   size_t n) {
  if (count < 1) return absl::InvalidArgumentError("SumScaled needs at least one input");
  if (absl::Status s = Copy(y, xs[0], n); !s.ok()) return s;
  for (int r = 1; r < count; ++r) Accumulate(y, xs[r], n);
  if (a != 1.0f) Scale(y, a, n);
  return Health();
}

AbsMoments Primitives::AccumulateMoments(float* acc, const float* add, size_t n,
                                         float lower_bound, bool logs) {
  if (add != nullptr) Accumulate(acc, add, n);
  AbsMoments m = Moments(acc, n, lower_bound);
  if (!logs) {
    m.sum_log = 0;
    m.log_count = 0;
  }
  return m;
}

void Primitives::AbsHistogram16From(const float* x, size_t begin, size_t end, uint32_t first_bin,
                                    uint32_t* bins) {
  AbsHistogram16(x, begin, end, bins);
}

absl::Status Primitives::Health() const { return absl::OkStatus(); }

}  // namespace spex
