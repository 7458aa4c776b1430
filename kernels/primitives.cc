// The host-memory defaults of Primitives' memory movement (see primitives.h).
#include "kernels/primitives.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status_macros.h"

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

absl::Status Primitives::SumScaled(float* y, const float* const* xs, int count, float a, size_t n) {
  if (count < 1) return absl::InvalidArgumentError("SumScaled needs at least one input");
  if (absl::Status s = Copy(y, xs[0], n); !s.ok()) return s;
  for (int r = 1; r < count; ++r) Accumulate(y, xs[r], n);
  if (a != 1.0f) Scale(y, a, n);
  return Health();
}

absl::Status Primitives::SumScaledCheckFinite(float* y, const float* const* xs, int count, float a,
                                              size_t n, size_t* first_bad) {
  if (device() != Device::kCpu) {
    return absl::UnimplementedError(
        "SumScaledCheckFinite: only host-memory primitives have it; this device's primitives "
        "do not (use --nonfinite with --device=cpu)");
  }
  if (absl::Status s = SumScaled(y, xs, count, a, n); !s.ok()) return s;
  *first_bad = n;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(y[i])) {
      *first_bad = i;
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Primitives::SumScaledCheckFiniteHistogram(float* y, const float* const* xs, int count,
                                                       float a, size_t n, size_t* first_bad,
                                                       const HistogramRange& h) {
  if (h.bins == nullptr || h.begin > h.end || h.end > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("SumScaledCheckFiniteHistogram: the histogram's range [", h.begin, ", ", h.end,
                     ") must lie inside the sum's ", n, " elements, with its bins given"));
  }
  if (device() != Device::kCpu) {
    return absl::FailedPreconditionError(
        "SumScaledCheckFiniteHistogram: only host-memory primitives count a histogram of the "
        "sum; on a device, count it with AbsHistogramEdge");
  }
  if (absl::Status s = SumScaledCheckFinite(y, xs, count, a, n, first_bad); !s.ok()) return s;
  if (h.first_bin == 0) {
    AbsHistogram16(y, h.begin, h.end, h.bins);
  } else {
    AbsHistogram16From(y, h.begin, h.end, h.first_bin, h.bins);
  }
  return absl::OkStatus();
}

AbsMoments Primitives::AccumulateMoments(float* acc, const float* add, size_t n, float lower_bound,
                                         bool logs) {
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

namespace {

absl::Status CheckHalfPass(const Primitives& p, DType t, const char* what) {
  if (p.device() != Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat(
        what,
        ": this device's primitives have no half-precision passes (a bug: the device path "
        "serves bfloat16/float16 buckets only with primitives that override them)"));
  }
  if (!IsHalf(t)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " on a ", DTypeName(t), " buffer (a bug)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Primitives::SumWidenHalf(DType t, float* y, const float* acc,
                                      const uint16_t* const* xs, int count, float a, size_t n,
                                      size_t* first_bad) {
  SPEX_RETURN_IF_ERROR(CheckHalfPass(*this, t, "SumWidenHalf"));
  if (count < 1) return absl::InvalidArgumentError("SumWidenHalf needs at least one input");
  const size_t bad = half::SumWidenScaled(t, y, acc, xs, count, a, n, first_bad != nullptr);
  if (first_bad != nullptr) *first_bad = bad;
  return absl::OkStatus();
}

absl::Status Primitives::NarrowHalf(DType t, const float* x, uint16_t* y, size_t n) {
  SPEX_RETURN_IF_ERROR(CheckHalfPass(*this, t, "NarrowHalf"));
  half::Narrow(t, x, y, n);
  return absl::OkStatus();
}

absl::Status Primitives::WidenHalf(DType t, const uint16_t* x, float* y, size_t n) {
  SPEX_RETURN_IF_ERROR(CheckHalfPass(*this, t, "WidenHalf"));
  half::Widen(t, x, y, n);
  return absl::OkStatus();
}

namespace {

// Host scratch: aligned heap memory.
class HostScratch final : public ScratchBuffer {
 public:
  HostScratch(void* data, size_t bytes) : ScratchBuffer(data, bytes) {}
  ~HostScratch() override { std::free(data()); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<ScratchBuffer>> Primitives::AllocScratch(size_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t rounded = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("scratch: cannot allocate ", bytes, " bytes"));
  }
  return std::unique_ptr<ScratchBuffer>(std::make_unique<HostScratch>(p, bytes));
}

absl::StatusOr<void*> Scratch::Get(int slot, size_t bytes) {
  if (slot < 0 || slot >= kSlots) {
    Fail(absl::InternalError(absl::StrCat("scratch slot ", slot, " out of range")));
    return status_;
  }
  std::unique_ptr<ScratchBuffer>& b = slots_[slot];
  if (b == nullptr || b->bytes() < bytes) {
    // Grow by half again, so a slowly growing size does not allocate every step.
    const size_t grown = b == nullptr ? bytes : std::max(bytes, b->bytes() + b->bytes() / 2);
    b.reset();
    absl::StatusOr<std::unique_ptr<ScratchBuffer>> fresh = p_->AllocScratch(grown);
    if (!fresh.ok()) {
      Fail(fresh.status());
      return fresh.status();
    }
    b = std::move(*fresh);
  }
  return b->data();
}

absl::StatusOr<void*> Scratch::Upload(int slot, const void* host, size_t bytes) {
  SPEX_ASSIGN_OR_RETURN(void* d, Get(slot, bytes));
  if (absl::Status s = p_->CopyFromHost(d, host, bytes); !s.ok()) {
    Fail(s);
    return s;
  }
  return d;
}

absl::Status Scratch::Fetch(void* host, const void* device, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  absl::Status s = p_->CopyToHost(host, device, bytes);
  Fail(s);
  return s;
}

absl::Status Scratch::TakeStatus() {
  absl::Status s = std::move(status_);
  status_ = absl::OkStatus();
  if (s.ok() && !host()) s = p_->Health();
  return s;
}

// The device-side histogram threshold's defaults (AbsHistogramEdge) and host staging.

size_t Primitives::TopKFromBoundaryBin(const uint32_t* cidx, const float* cval, size_t count,
                                       size_t k, size_t above, std::vector<uint32_t>* keys,
                                       uint32_t* idx, float* val) {
  const size_t need = k - above;  // 1 <= need <= keys->size()
  std::nth_element(keys->begin(), keys->begin() + static_cast<std::ptrdiff_t>(need - 1),
                   keys->end(), std::greater<uint32_t>());
  const uint32_t kth = (*keys)[need - 1];
  size_t ties_left = need;
  for (uint32_t u : *keys) ties_left -= u > kth;
  size_t w = 0;
  for (size_t j = 0; j < count; ++j) {
    const uint32_t u = MagnitudeBits(cval[j]);
    if (u < kth) continue;
    if (u == kth) {
      if (ties_left == 0) continue;
      --ties_left;
    }
    const uint32_t i = cidx[j];  // read before the write: w <= j, so in place is safe
    const float v = cval[j];
    idx[w] = i;
    val[w] = v;
    ++w;
  }
  return w;
}

HistogramEdge Primitives::WalkHistogramEdge(const uint32_t* bins, uint32_t first_bin,
                                            uint64_t quota) {
  constexpr uint32_t kInfBin = 0xFF00;
  const uint32_t lo = std::min(std::max<uint32_t>(first_bin, 1), kInfBin);
  HistogramEdge e;
  for (uint32_t b = kInfBin; b >= lo; --b) {
    e.cum += bins[b];
    if (e.cum >= quota) {
      e.bin = b;
      e.reached = 1;
      e.in_edge = bins[b];
      return e;
    }
  }
  e.bin = lo;
  e.in_edge = bins[lo];
  return e;
}

absl::StatusOr<HistogramEdge> Primitives::AbsHistogramEdge(const float* x, size_t begin, size_t end,
                                                           uint32_t first_bin, uint64_t quota) {
  if (quota == 0) return absl::InvalidArgumentError("AbsHistogramEdge: quota must be at least 1");
  if (first_bin > 0xFF00) {
    return absl::InvalidArgumentError(
        absl::StrCat("AbsHistogramEdge: first_bin ", first_bin, " is above +Inf's bin 0xFF00"));
  }
  std::vector<uint32_t> bins(kHistogramBins, 0);
  if (device() == Device::kCpu) {
    AbsHistogram16From(x, begin, end, first_bin, bins.data());
  } else {
    // A device without its own walk: the bins are counted in its memory and copied back whole.
    SPEX_ASSIGN_OR_RETURN(std::unique_ptr<ScratchBuffer> d, AllocScratch(kHistogramBins * 4));
    auto* dbins = static_cast<uint32_t*>(d->data());
    SPEX_RETURN_IF_ERROR(Fill(reinterpret_cast<float*>(dbins), 0.0f, kHistogramBins));
    AbsHistogram16From(x, begin, end, first_bin, dbins);
    SPEX_RETURN_IF_ERROR(
        CopyToHost(bins.data() + first_bin, dbins + first_bin, (kHistogramBins - first_bin) * 4));
  }
  SPEX_RETURN_IF_ERROR(Health());
  return WalkHistogramEdge(bins.data(), first_bin, quota);
}

absl::StatusOr<std::unique_ptr<ScratchBuffer>> Primitives::AllocHostStaging(size_t bytes) {
  constexpr size_t kAlign = 64;
  const size_t rounded = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host staging: cannot allocate ", bytes, " bytes"));
  }
  return std::unique_ptr<ScratchBuffer>(std::make_unique<HostScratch>(p, bytes));
}

absl::StatusOr<void*> Scratch::HostStaging(size_t bytes) {
  if (staging_ == nullptr || staging_->bytes() < bytes) {
    const size_t grown =
        staging_ == nullptr ? bytes : std::max(bytes, staging_->bytes() + staging_->bytes() / 2);
    staging_.reset();
    absl::StatusOr<std::unique_ptr<ScratchBuffer>> fresh = p_->AllocHostStaging(grown);
    if (!fresh.ok()) {
      Fail(fresh.status());
      return fresh.status();
    }
    staging_ = std::move(*fresh);
  }
  return staging_->data();
}

}  // namespace spex
