// Host side of the CUDA primitives: argument checks, scratch memory, the stream, error
// reporting and the top-k control logic (radix_top_k.h); the passes are in kernels.h.
#include "kernels/cuda/cuda_primitives.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/histogram_edge.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/radix_top_k.h"

namespace spex {
namespace {

constexpr uint64_t kMaxElements = uint64_t{1} << 32;  // indices are uint32

absl::Status CudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e))));
}

#define SPEX_CUDA_RETURN_IF_ERROR(expr, what)                            \
  do {                                                                   \
    if (absl::Status s_ = CudaStatus((expr), what); !s_.ok()) return s_; \
  } while (0)

// Selects the object's GPU for the calling thread and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      if (cudaSetDevice(device) == cudaSuccess) restore_ = true;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Device memory that only grows; freed with the object.
class Scratch {
 public:
  ~Scratch() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    const size_t grown = std::max(bytes, bytes_ + bytes_ / 2);
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    SPEX_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr_, grown), "cudaMalloc(scratch)");
    bytes_ = grown;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // A device pointer `offset` bytes in (a field of a struct laid out in this memory).
  template <typename T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<char*>(ptr_) + offset);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Small results read back by the host, in one device block.
struct Readback {
  unsigned long long count;
  int64_t selected;
  unsigned long long first_bad;
  gpu::MomentsAcc moments;
};

class CudaPrimitives final : public Primitives {
 public:
  static absl::Status Create(int device, std::unique_ptr<Primitives>* out);
  ~CudaPrimitives() override;

  Device device() const override { return Device::kCuda; }

  void Accumulate(float* y, const float* x, size_t n) override;
  void Scale(float* x, float a, size_t n) override;
  absl::Status SumScaledCheckFinite(float* y, const float* const* xs, int count, float a, size_t n,
                                    size_t* first_bad) override;
  size_t CountAbove(const float* x, size_t n, float t) override;
  size_t SelectAbove(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx,
                     float* val, size_t capacity) override;
  size_t AddSelectAbove(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                        uint32_t* idx, float* val, size_t capacity) override;
  size_t TopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) override;
  absl::StatusOr<HistogramEdge> AbsHistogramEdge(const float* x, size_t begin, size_t end,
                                                 uint32_t first_bin, uint64_t quota) override;
  absl::StatusOr<std::unique_ptr<ScratchBuffer>> AllocHostStaging(size_t bytes) override;
  AbsMoments Moments(const float* x, size_t n, float lower_bound) override;
  void Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) override;
  absl::Status ScatterAdd(float* y, size_t n, const uint32_t* idx, const float* val,
                          size_t m) override;
  absl::Status Gather(const float* x, size_t n, const uint32_t* idx, size_t m, float* out) override;
  absl::Status ZeroAt(float* x, size_t n, const uint32_t* idx, size_t m) override;
  void AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) override;
  absl::Status Copy(float* dst, const float* src, size_t n) override;
  absl::Status Fill(float* x, float v, size_t n) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<ScratchBuffer>> AllocScratch(size_t bytes) override;
  absl::Status SumWidenHalf(DType t, float* y, const float* acc, const uint16_t* const* xs,
                            int count, float a, size_t n, size_t* first_bad) override;
  absl::Status NarrowHalf(DType t, const float* x, uint16_t* y, size_t n) override;
  absl::Status WidenHalf(DType t, const uint16_t* x, float* y, size_t n) override;
  absl::Status Health() const override { return error(); }

  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  friend class CudaTopKPasses;
  explicit CudaPrimitives(int device) : device_(device) {}

  // Waits for the stream; the first error of a call without a Status result is kept.
  absl::Status Finish(const char* what) {
    return CudaStatus(cudaStreamSynchronize(launch_.stream), what);
  }
  void Keep(const absl::Status& s) {
    if (s.ok() || !error_.ok()) return;
    error_ = s;
    std::fprintf(stderr, "spex CUDA primitives: %s\n", s.ToString().c_str());
  }
  template <typename T>
  T Keep(absl::StatusOr<T> result, T fallback) {
    if (result.ok()) return *std::move(result);
    Keep(result.status());
    return fallback;
  }
  // Runs a cub pass twice: once to size its temporary storage, once for real.
  template <typename Pass>
  absl::Status RunCub(const char* what, Pass pass) {
    size_t bytes = 0;
    SPEX_CUDA_RETURN_IF_ERROR(pass(nullptr, &bytes), what);
    if (absl::Status s = cub_temp_.Reserve(std::max<size_t>(bytes, 1)); !s.ok()) return s;
    SPEX_CUDA_RETURN_IF_ERROR(pass(cub_temp_.as<void>(), &bytes), what);
    return absl::OkStatus();
  }
  absl::StatusOr<Readback> ReadBack(const char* what) {
    Readback r;
    SPEX_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&r, readback_.as<Readback>(), sizeof(r),
                                              cudaMemcpyDeviceToHost, launch_.stream),
                              what);
    if (absl::Status s = Finish(what); !s.ok()) return s;
    return r;
  }
  absl::Status CheckIndices(const uint32_t* idx, size_t m, size_t n, const char* op);
  absl::StatusOr<size_t> SelectAboveLocked(float* x, size_t begin, size_t end, float t, bool zero,
                                           uint32_t* idx, float* val, size_t capacity);

  const int device_;
  gpu::Launch launch_;
  mutable absl::Mutex mu_;
  absl::Status error_;
  Scratch cub_temp_, indices_, ranks_, digit_counts_, readback_;
  Scratch edge_;  // AbsHistogramEdge: the 2^16 bins, then the EdgePick
};

// TopK's three passes on the GPU (see radix_top_k.h).
class CudaTopKPasses final : public gpu::RadixTopKPasses {
 public:
  CudaTopKPasses(CudaPrimitives* p, const float* x, size_t n, uint32_t* idx, float* val)
      : p_(p), x_(x), n_(n), idx_(idx), val_(val) {}

  absl::Status HighDigitHistogram(uint64_t* counts) override { return Histogram(false, 0, counts); }
  // The histogram and the digit choice both on the device: 40 bytes come back, not the 2^16
  // bins (512 KiB per pass, twice a TopK).
  absl::StatusOr<gpu::DigitChoice> ChooseDigitPass(bool low, uint32_t high, uint64_t above,
                                                   uint64_t k, uint64_t* total) override {
    unsigned long long* device_counts = p_->digit_counts_.as<unsigned long long>();
    auto* pick = reinterpret_cast<gpu::DigitPick*>(device_counts + gpu::kDigitBins);
    SPEX_CUDA_RETURN_IF_ERROR(
        gpu::LaunchKeyHistogram(p_->launch_, x_, n_, low, high, device_counts), "TopK histogram");
    SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchPickDigit(p_->launch_, device_counts, above, k, pick),
                              "TopK digit choice");
    gpu::DigitPick h;
    SPEX_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(&h, pick, sizeof(h), cudaMemcpyDeviceToHost, p_->launch_.stream),
        "TopK digit readback");
    if (absl::Status s = p_->Finish("TopK digit choice"); !s.ok()) return s;
    *total = h.total;
    if (h.ok == 0) {
      if (k <= above) {
        return absl::InternalError(absl::StrCat("radix top-k: k = ", k, " is not above the ", above,
                                                " entries already known to be larger"));
      }
      return absl::InternalError(absl::StrCat("radix top-k: the histogram holds ", h.total,
                                              " entries, fewer than the ", k - above, " needed"));
    }
    gpu::DigitChoice c;
    c.digit = h.digit;
    c.above = h.above;
    c.in_digit = h.in_digit;
    return c;
  }
  absl::Status LowDigitHistogram(uint32_t high, uint64_t* counts) override {
    return Histogram(true, high, counts);
  }
  absl::StatusOr<size_t> Collect(uint32_t threshold, uint64_t take, uint64_t ties) override {
    const uint32_t* rank = nullptr;
    if (take < ties) {  // only some ties: rank them by index with a prefix count
      if (absl::Status s = p_->ranks_.Reserve(n_ * sizeof(uint32_t)); !s.ok()) return s;
      uint32_t* ranks = p_->ranks_.as<uint32_t>();
      SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchTieFlags(p_->launch_, x_, n_, threshold, ranks),
                                "TopK tie flags");
      absl::Status s = p_->RunCub("TopK tie ranks", [&](void* temp, size_t* bytes) {
        return gpu::ExclusiveSum(temp, bytes, ranks, n_, p_->launch_.stream);
      });
      if (!s.ok()) return s;
      rank = ranks;
    }
    int64_t* selected = p_->readback_.at<int64_t>(offsetof(Readback, selected));
    absl::Status s = p_->RunCub("TopK select", [&](void* temp, size_t* bytes) {
      return gpu::SelectTopK(temp, bytes, x_, n_, threshold, rank, take, idx_, selected,
                             p_->launch_.stream);
    });
    if (!s.ok()) return s;
    absl::StatusOr<Readback> r = p_->ReadBack("TopK select");
    if (!r.ok()) return r.status();
    const size_t written = static_cast<size_t>(r->selected);
    SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchGather(p_->launch_, x_, idx_, written, val_),
                              "TopK values");
    if (absl::Status f = p_->Finish("TopK values"); !f.ok()) return f;
    return written;
  }

 private:
  absl::Status Histogram(bool low, uint32_t high, uint64_t* counts) {
    unsigned long long* device_counts = p_->digit_counts_.as<unsigned long long>();
    SPEX_CUDA_RETURN_IF_ERROR(
        gpu::LaunchKeyHistogram(p_->launch_, x_, n_, low, high, device_counts), "TopK histogram");
    static_assert(sizeof(unsigned long long) == sizeof(uint64_t));
    SPEX_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(counts, device_counts, gpu::kDigitBins * sizeof(uint64_t),
                        cudaMemcpyDeviceToHost, p_->launch_.stream),
        "TopK histogram readback");
    return p_->Finish("TopK histogram");
  }

  CudaPrimitives* p_;
  const float* x_;
  size_t n_;
  uint32_t* idx_;
  float* val_;
};

absl::Status CudaPrimitives::Create(int device, std::unique_ptr<Primitives>* out) {
  out->reset();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it, so later CUDA calls in this process are not blamed
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable GPU: ", ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e))));
  }
  if (count == 0) return absl::FailedPreconditionError("no usable GPU: no CUDA device found");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("GPU ordinal ", device, " does not exist (",
                                                   count, " device(s): 0..", count - 1, ")"));
  }
  DeviceGuard guard(device);
  if (e = gpu::CheckKernelImage(); e != cudaSuccess) {
    cudaGetLastError();
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", device, " (", prop.name, ", sm_", prop.major, prop.minor,
                     ") cannot run spex's kernels: ",
                     ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e))));
  }
  std::unique_ptr<CudaPrimitives> p(new CudaPrimitives(device));
  SPEX_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&p->launch_.stream, cudaStreamNonBlocking),
                            "cudaStreamCreate");
  int sms = 0;
  SPEX_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                            "cudaDeviceGetAttribute");
  p->launch_.max_blocks = std::max(1, sms) * 8;  // 8 x 256 threads per SM, then grid-stride
  if (absl::Status s = p->readback_.Reserve(sizeof(Readback)); !s.ok()) return s;
  // The bins, then the device's digit choice (CudaTopKPasses::ChooseDigitPass).
  if (absl::Status s =
          p->digit_counts_.Reserve(gpu::kDigitBins * sizeof(uint64_t) + sizeof(gpu::DigitPick));
      !s.ok()) {
    return s;
  }
  *out = std::move(p);
  return absl::OkStatus();
}

CudaPrimitives::~CudaPrimitives() {
  DeviceGuard guard(device_);
  if (launch_.stream != nullptr) cudaStreamDestroy(launch_.stream);
}

void CudaPrimitives::Accumulate(float* y, const float* x, size_t n) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  absl::Status s = CudaStatus(gpu::LaunchAccumulate(launch_, y, x, n), "Accumulate");
  if (s.ok()) s = Finish("Accumulate");
  Keep(s);
}

void CudaPrimitives::Scale(float* x, float a, size_t n) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  absl::Status s = CudaStatus(gpu::LaunchScale(launch_, x, a, n), "Scale");
  if (s.ok()) s = Finish("Scale");
  Keep(s);
}

// The sum as SumScaled computes it (Copy, Accumulate, Scale: the CPU path's rounding), then one
// read of y on the device for the lowest non-finite index and an 8-byte read-back. Not fused into
// the sum as on the CPU: one extra pass over y at device bandwidth.
absl::Status CudaPrimitives::SumScaledCheckFinite(float* y, const float* const* xs, int count,
                                                  float a, size_t n, size_t* first_bad) {
  *first_bad = n;
  if (absl::Status s = SumScaled(y, xs, count, a, n); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (n == 0) return absl::OkStatus();
  const char* op = "SumScaledCheckFinite";
  unsigned long long* first = readback_.at<unsigned long long>(offsetof(Readback, first_bad));
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchFirstNonfinite(launch_, y, n, first), op);
  absl::StatusOr<Readback> r = ReadBack(op);
  if (!r.ok()) return r.status();
  if (r->first_bad != ~0ull) *first_bad = static_cast<size_t>(r->first_bad);
  return absl::OkStatus();
}

// Half-precision buckets (half.cu). The widen-and-sum is one kernel; its finite check is the
// float32 path's second pass over y and 8-byte read-back.
absl::Status CudaPrimitives::SumWidenHalf(DType t, float* y, const float* acc,
                                          const uint16_t* const* xs, int count, float a, size_t n,
                                          size_t* first_bad) {
  if (first_bad != nullptr) *first_bad = n;
  if (!IsHalf(t)) return absl::InvalidArgumentError("SumWidenHalf on a float32 buffer (a bug)");
  if (count < 1 || count > gpu::kMaxHalfInputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("SumWidenHalf takes 1 to ", gpu::kMaxHalfInputs, " inputs, not ", count));
  }
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (n == 0) return absl::OkStatus();
  const char* op = "SumWidenHalf";
  gpu::HalfInputs in{};
  in.count = count;
  for (int r = 0; r < count; ++r) in.x[r] = xs[r];
  SPEX_CUDA_RETURN_IF_ERROR(
      gpu::LaunchSumWidenHalf(launch_, t == DType::kBFloat16, y, acc, in, a != 1.0f, a, n), op);
  if (first_bad == nullptr) return Finish(op);
  unsigned long long* first = readback_.at<unsigned long long>(offsetof(Readback, first_bad));
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchFirstNonfinite(launch_, y, n, first), op);
  absl::StatusOr<Readback> r = ReadBack(op);
  if (!r.ok()) return r.status();
  if (r->first_bad != ~0ull) *first_bad = static_cast<size_t>(r->first_bad);
  return absl::OkStatus();
}

absl::Status CudaPrimitives::NarrowHalf(DType t, const float* x, uint16_t* y, size_t n) {
  if (!IsHalf(t)) return absl::InvalidArgumentError("NarrowHalf to float32 (a bug)");
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchNarrowHalf(launch_, t == DType::kBFloat16, x, y, n),
                            "NarrowHalf");
  return Finish("NarrowHalf");
}

absl::Status CudaPrimitives::WidenHalf(DType t, const uint16_t* x, float* y, size_t n) {
  if (!IsHalf(t)) return absl::InvalidArgumentError("WidenHalf from float32 (a bug)");
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchWidenHalf(launch_, t == DType::kBFloat16, x, y, n),
                            "WidenHalf");
  return Finish("WidenHalf");
}

size_t CudaPrimitives::CountAbove(const float* x, size_t n, float t) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (n == 0) return 0;
  auto run = [&]() -> absl::StatusOr<size_t> {
    unsigned long long* out = readback_.at<unsigned long long>(offsetof(Readback, count));
    absl::Status s = RunCub("CountAbove", [&](void* temp, size_t* bytes) {
      return gpu::CountAbove(temp, bytes, x, n, t, out, launch_.stream);
    });
    if (!s.ok()) return s;
    absl::StatusOr<Readback> r = ReadBack("CountAbove");
    if (!r.ok()) return r.status();
    return static_cast<size_t>(r->count);
  };
  return Keep<size_t>(run(), 0);
}

absl::StatusOr<size_t> CudaPrimitives::SelectAboveLocked(float* x, size_t begin, size_t end,
                                                         float t, bool zero, uint32_t* idx,
                                                         float* val, size_t capacity) {
  if (end <= begin) return size_t{0};
  if (end > kMaxElements) {
    return absl::InvalidArgumentError(
        absl::StrCat("SelectAbove: end ", end, " exceeds the uint32 index range"));
  }
  const size_t len = end - begin;
  // cub writes every selected index; when they may not all fit, select into scratch.
  uint32_t* selected = idx;
  if (capacity < len) {
    if (absl::Status s = indices_.Reserve(len * sizeof(uint32_t)); !s.ok()) return s;
    selected = indices_.as<uint32_t>();
  }
  int64_t* num = readback_.at<int64_t>(offsetof(Readback, selected));
  absl::Status s = RunCub("SelectAbove", [&](void* temp, size_t* bytes) {
    return gpu::SelectAbove(temp, bytes, x, begin, end, t, selected, num, launch_.stream);
  });
  if (!s.ok()) return s;
  absl::StatusOr<Readback> r = ReadBack("SelectAbove");
  if (!r.ok()) return r.status();
  const size_t count = static_cast<size_t>(r->selected);
  const size_t written = std::min(count, capacity);
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchEmitSelected(launch_, x, selected, written, zero, idx, val),
                            "SelectAbove emit");
  if (absl::Status f = Finish("SelectAbove"); !f.ok()) return f;
  return count;
}

size_t CudaPrimitives::SelectAbove(float* x, size_t begin, size_t end, float t, bool zero,
                                   uint32_t* idx, float* val, size_t capacity) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  return Keep<size_t>(SelectAboveLocked(x, begin, end, t, zero, idx, val, capacity), 0);
}

size_t CudaPrimitives::AddSelectAbove(float* acc, const float* add, size_t begin, size_t end,
                                      float t, bool zero, uint32_t* idx, float* val,
                                      size_t capacity) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (end <= begin) return 0;
  // Two passes (add, then select); the select re-reads acc from L2 for buckets that fit there.
  absl::Status s = CudaStatus(gpu::LaunchAccumulate(launch_, acc + begin, add + begin, end - begin),
                              "AddSelectAbove");
  if (!s.ok()) {
    Keep(s);
    return 0;
  }
  return Keep<size_t>(SelectAboveLocked(acc, begin, end, t, zero, idx, val, capacity), 0);
}

size_t CudaPrimitives::TopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (n > kMaxElements) {
    Keep(absl::InvalidArgumentError(
        absl::StrCat("TopK: n = ", n, " exceeds the uint32 index range")));
    return 0;
  }
  CudaTopKPasses passes(this, x, n, idx, val);
  return Keep<size_t>(gpu::RadixTopK(n, k, passes), 0);
}

AbsMoments CudaPrimitives::Moments(const float* x, size_t n, float lower_bound) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  AbsMoments m;
  if (n == 0) return m;
  auto run = [&]() -> absl::StatusOr<AbsMoments> {
    gpu::MomentsAcc* out = readback_.at<gpu::MomentsAcc>(offsetof(Readback, moments));
    absl::Status s = RunCub("Moments", [&](void* temp, size_t* bytes) {
      return gpu::ReduceMoments(temp, bytes, x, n, lower_bound, out, launch_.stream);
    });
    if (!s.ok()) return s;
    absl::StatusOr<Readback> r = ReadBack("Moments");
    if (!r.ok()) return r.status();
    AbsMoments result;
    result.count = r->moments.count;
    result.sum = r->moments.sum;
    result.sum_sq = r->moments.sum_sq;
    result.sum_log = r->moments.sum_log;
    result.log_count = r->moments.log_count;
    result.max = r->moments.max;
    return result;
  };
  return Keep<AbsMoments>(run(), m);
}

void CudaPrimitives::Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  absl::Status s = CudaStatus(gpu::LaunchSample(launch_, x, n, m, seed, out), "Sample");
  if (s.ok()) s = Finish("Sample");
  Keep(s);
}

absl::Status CudaPrimitives::CheckIndices(const uint32_t* idx, size_t m, size_t n, const char* op) {
  if (m == 0) return absl::OkStatus();
  unsigned long long* first_bad = readback_.at<unsigned long long>(offsetof(Readback, first_bad));
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchFirstBadIndex(launch_, idx, m, n, first_bad), op);
  absl::StatusOr<Readback> r = ReadBack(op);
  if (!r.ok()) return r.status();
  if (r->first_bad == ~0ull) return absl::OkStatus();
  uint32_t bad = 0;
  SPEX_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(&bad, idx + r->first_bad, sizeof(bad), cudaMemcpyDeviceToHost), op);
  return absl::InvalidArgumentError(absl::StrCat(op, ": index ", bad, " at position ", r->first_bad,
                                                 " is out of range for ", n, " elements"));
}

absl::Status CudaPrimitives::ScatterAdd(float* y, size_t n, const uint32_t* idx, const float* val,
                                        size_t m) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (absl::Status s = CheckIndices(idx, m, n, "ScatterAdd"); !s.ok()) return s;
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchScatterAdd(launch_, y, idx, val, m), "ScatterAdd");
  return Finish("ScatterAdd");
}

absl::Status CudaPrimitives::Gather(const float* x, size_t n, const uint32_t* idx, size_t m,
                                    float* out) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (absl::Status s = CheckIndices(idx, m, n, "Gather"); !s.ok()) return s;
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchGather(launch_, x, idx, m, out), "Gather");
  return Finish("Gather");
}

absl::Status CudaPrimitives::ZeroAt(float* x, size_t n, const uint32_t* idx, size_t m) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (absl::Status s = CheckIndices(idx, m, n, "ZeroAt"); !s.ok()) return s;
  SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchZeroAt(launch_, x, idx, m), "ZeroAt");
  return Finish("ZeroAt");
}

void CudaPrimitives::AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  absl::Status s =
      CudaStatus(gpu::LaunchAbsHistogram16(launch_, x, begin, end, bins), "AbsHistogram16");
  if (s.ok()) s = Finish("AbsHistogram16");
  Keep(s);
}

absl::Status CudaPrimitives::Copy(float* dst, const float* src, size_t n) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (n == 0) return absl::OkStatus();
  SPEX_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, launch_.stream),
      "Copy");
  return Finish("Copy");
}

absl::Status CudaPrimitives::Fill(float* x, float v, size_t n) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (n == 0) return absl::OkStatus();
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  if (bits == 0) {  // +0.0f: every byte zero
    SPEX_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(x, 0, n * sizeof(float), launch_.stream), "Fill");
  } else {
    SPEX_CUDA_RETURN_IF_ERROR(gpu::LaunchFill(launch_, x, v, n), "Fill");
  }
  return Finish("Fill");
}

// Pageable host memory: the runtime stages through its own pinned buffers. Each copy completes
// before it returns, like every call of this object.
absl::Status CudaPrimitives::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (bytes == 0) return absl::OkStatus();
  SPEX_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, launch_.stream), "CopyToHost");
  return Finish("CopyToHost");
}

absl::Status CudaPrimitives::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  if (bytes == 0) return absl::OkStatus();
  SPEX_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, launch_.stream),
      "CopyFromHost");
  return Finish("CopyFromHost");
}

// cudaMalloc'ed scratch of one GPU, freed there (cudaFree waits for the work using it).
class CudaScratchBuffer final : public ScratchBuffer {
 public:
  CudaScratchBuffer(int device, void* data, size_t bytes)
      : ScratchBuffer(data, bytes), device_(device) {}
  ~CudaScratchBuffer() override {
    DeviceGuard guard(device_);
    cudaFree(data());
  }

 private:
  int device_;
};

absl::StatusOr<std::unique_ptr<ScratchBuffer>> CudaPrimitives::AllocScratch(size_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  SPEX_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "AllocScratch");
  return std::unique_ptr<ScratchBuffer>(std::make_unique<CudaScratchBuffer>(device_, p, bytes));
}

// The histogram threshold on the device (histogram_edge.h): the bins stay in edge_, 24 bytes of
// EdgePick come back.
absl::StatusOr<HistogramEdge> CudaPrimitives::AbsHistogramEdge(const float* x, size_t begin,
                                                               size_t end, uint32_t first_bin,
                                                               uint64_t quota) {
  if (quota == 0) return absl::InvalidArgumentError("AbsHistogramEdge: quota must be at least 1");
  if (first_bin > gpu::kEdgeInfBin) {
    return absl::InvalidArgumentError(
        absl::StrCat("AbsHistogramEdge: first_bin ", first_bin, " is above +Inf's bin 0xFF00"));
  }
  if (end > kMaxElements) {
    return absl::InvalidArgumentError("AbsHistogramEdge: more than 2^32 elements");
  }
  static_assert(sizeof(gpu::EdgePick) == sizeof(HistogramEdge), "EdgePick is HistogramEdge");
  absl::MutexLock lock(&mu_);
  DeviceGuard guard(device_);
  constexpr size_t kBinBytes = kHistogramBins * sizeof(uint32_t);
  if (absl::Status s = edge_.Reserve(kBinBytes + sizeof(gpu::EdgePick)); !s.ok()) return s;
  auto* pick = edge_.at<gpu::EdgePick>(kBinBytes);
  SPEX_CUDA_RETURN_IF_ERROR(
      gpu::LaunchHistogramEdge(launch_.stream, launch_.max_blocks, x, begin, end, first_bin, quota,
                               edge_.as<uint32_t>(), pick),
      "AbsHistogramEdge");
  gpu::EdgePick h;
  SPEX_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&h, pick, sizeof(h), cudaMemcpyDeviceToHost, launch_.stream),
      "AbsHistogramEdge readback");
  if (absl::Status s = Finish("AbsHistogramEdge"); !s.ok()) return s;
  HistogramEdge e;
  e.bin = h.bin;
  e.reached = h.reached;
  e.cum = h.cum;
  e.in_edge = h.in_edge;
  return e;
}

// Page-locked host memory (cudaMallocHost): a device-to-host copy into it is one DMA straight
// into the buffer, not a bounce through the runtime's own staging as for pageable memory.
class PinnedHostBuffer final : public ScratchBuffer {
 public:
  PinnedHostBuffer(void* data, size_t bytes) : ScratchBuffer(data, bytes) {}
  ~PinnedHostBuffer() override { cudaFreeHost(data()); }
};

absl::StatusOr<std::unique_ptr<ScratchBuffer>> CudaPrimitives::AllocHostStaging(size_t bytes) {
  DeviceGuard guard(device_);
  void* p = nullptr;
  SPEX_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, std::max<size_t>(bytes, 64)), "AllocHostStaging");
  return std::unique_ptr<ScratchBuffer>(std::make_unique<PinnedHostBuffer>(p, bytes));
}

}  // namespace

absl::Status MakeCudaPrimitivesOnDevice(int device, std::unique_ptr<Primitives>* out) {
  if (out == nullptr) return absl::InvalidArgumentError("MakeCudaPrimitives: out is null");
  return CudaPrimitives::Create(device, out);
}

absl::Status MakeCudaPrimitives(std::unique_ptr<Primitives>* out) {
  if (out == nullptr) return absl::InvalidArgumentError("MakeCudaPrimitives: out is null");
  out->reset();
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  int device = 0;
  if (e == cudaSuccess && count > 0) cudaGetDevice(&device);
  cudaGetLastError();
  return CudaPrimitives::Create(device, out);
}

absl::Status CudaPrimitivesError(const Primitives& p) {
  const auto* cuda = dynamic_cast<const CudaPrimitives*>(&p);
  if (cuda == nullptr) {
    return absl::InvalidArgumentError("CudaPrimitivesError: not a CUDA Primitives object");
  }
  return cuda->error();
}

}  // namespace spex
