// The plain scalar Primitives, the oracle of the fast ones (reference_primitives.h).
#include "kernels/reference/reference_primitives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/splitmix.h"

namespace spex {
namespace {

absl::Status CheckIndices(const uint32_t* idx, size_t m, size_t n, const char* op) {
  for (size_t j = 0; j < m; ++j) {
    if (idx[j] >= n) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": index ", idx[j], " at position ", j,
                                                     " is out of range for ", n, " elements"));
    }
  }
  return absl::OkStatus();
}

class ReferencePrimitives final : public Primitives {
 public:
  Device device() const override { return Device::kCpu; }

  void Accumulate(float* y, const float* x, size_t n) override {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
  }
  void Scale(float* x, float a, size_t n) override {
    for (size_t i = 0; i < n; ++i) x[i] *= a;
  }
  size_t CountAbove(const float* x, size_t n, float t) override {
    size_t c = 0;
    for (size_t i = 0; i < n; ++i) c += std::fabs(x[i]) >= t;
    return c;
  }
  size_t SelectAbove(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx,
                     float* val, size_t capacity) override {
    size_t c = 0;
    for (size_t i = begin; i < end; ++i) {
      if (std::fabs(x[i]) >= t) {
        if (c < capacity) {
          idx[c] = static_cast<uint32_t>(i);
          val[c] = x[i];
          if (zero) x[i] = 0;
        }
        ++c;
      }
    }
    return c;
  }
  size_t AddSelectAbove(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                        uint32_t* idx, float* val, size_t capacity) override {
    for (size_t i = begin; i < end; ++i) acc[i] += add[i];
    return SelectAbove(acc, begin, end, t, zero, idx, val, capacity);
  }
  size_t TopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) override {
    k = std::min(k, n);
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    // NaN never wins: treat it as smaller than every number.
    auto mag = [&](uint32_t i) { return std::isnan(x[i]) ? -1.0f : std::fabs(x[i]); };
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return mag(a) > mag(b); });
    order.resize(k);
    std::sort(order.begin(), order.end());
    for (size_t j = 0; j < k; ++j) {
      idx[j] = order[j];
      val[j] = x[order[j]];
    }
    return k;
  }
  AbsMoments Moments(const float* x, size_t n, float lower_bound) override {
    AbsMoments m;
    for (size_t i = 0; i < n; ++i) {
      const float a = std::fabs(x[i]);
      if (!(a > lower_bound)) continue;  // also skips NaN
      m.count++;
      m.sum += a;
      m.sum_sq += static_cast<double>(a) * a;
      if (a > 0) {
        m.sum_log += std::log(static_cast<double>(a));
        m.log_count++;
      }
      m.max = std::max(m.max, a);
    }
    return m;
  }
  // Draw j takes the (j+1)-th splitmix64 output r of the seed and reads x[floor(r * n / 2^64)].
  void Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) override {
    uint64_t s = seed;
    for (size_t j = 0; j < m; ++j) {
      const unsigned __int128 r = SplitMix64(&s);
      out[j] = n ? x[static_cast<size_t>((r * n) >> 64)] : 0.0f;
    }
  }
  absl::Status ScatterAdd(float* y, size_t n, const uint32_t* idx, const float* val,
                          size_t m) override {
    if (absl::Status s = CheckIndices(idx, m, n, "ScatterAdd"); !s.ok()) return s;
    for (size_t j = 0; j < m; ++j) y[idx[j]] += val[j];
    return absl::OkStatus();
  }
  absl::Status Gather(const float* x, size_t n, const uint32_t* idx, size_t m,
                      float* out) override {
    if (absl::Status s = CheckIndices(idx, m, n, "Gather"); !s.ok()) return s;
    for (size_t j = 0; j < m; ++j) out[j] = x[idx[j]];
    return absl::OkStatus();
  }
  absl::Status ZeroAt(float* x, size_t n, const uint32_t* idx, size_t m) override {
    if (absl::Status s = CheckIndices(idx, m, n, "ZeroAt"); !s.ok()) return s;
    for (size_t j = 0; j < m; ++j) x[idx[j]] = 0;
    return absl::OkStatus();
  }
  void AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) override {
    for (size_t i = begin; i < end; ++i) {
      uint32_t b;
      std::memcpy(&b, &x[i], 4);
      bins[(b & 0x7fffffffu) >> 15]++;
    }
  }
};

}  // namespace

std::unique_ptr<Primitives> MakeReferencePrimitives() {
  return std::make_unique<ReferencePrimitives>();
}

}  // namespace spex
