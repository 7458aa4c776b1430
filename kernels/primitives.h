// The data-parallel operations every compressor is written against (the Primitives seam,
// docs/design.md#seams). One implementation per device: kernels/cpu (Highway, multi-threaded) and
// kernels/cuda. All pointers are to memory of the implementation's device. Indices are uint32
// offsets into the flat vector the caller passes; |x| means the magnitude of a float.
//
// NaN/Inf policy (every implementation): comparisons follow IEEE, so NaN is never selected or
// counted above a threshold and never wins top-k; +-Inf counts as a magnitude of +Inf.
// In detail: a NaN threshold selects/counts nothing; -0 and +0 are the same magnitude; Moments
// never counts NaN (not even with lower_bound < 0) and an Inf makes sum, sum_sq, sum_log and max
// Inf; TopK ranks NaN below every number (zeros included), so NaNs are written only when k
// exceeds the number of non-NaN entries, lowest indices first. Nothing crashes on NaN/Inf.
// Indices are uint32: every n, begin and end must be <= 2^32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/half.h"

namespace spex {

enum class Device { kCpu, kCuda };

// Moments of |x| over the entries with |x| > lower_bound (all entries when lower_bound < 0).
struct AbsMoments {
  uint64_t count = 0;
  double sum = 0;      // sum |x|
  double sum_sq = 0;   // sum x^2
  double sum_log = 0;  // sum log|x| (entries with |x| == 0 are skipped and not counted here)
  uint64_t log_count = 0;
  float max = 0;  // max |x| (0 for no entries)
};

// Where a quota of the largest magnitudes ends in the 2^16-bin |x| histogram
// (Primitives::AbsHistogramEdge; the histogram threshold of micro and exdyna).
struct HistogramEdge {
  uint32_t bin = 0;      // the edge bin (see AbsHistogramEdge)
  uint32_t reached = 0;  // 1: bins bin..0xFF00 hold at least the quota; 0: the counted bins fewer
  uint64_t cum = 0;      // entries in bins bin..0xFF00
  uint64_t in_edge = 0;  // entries in bin `bin`
};

// A range whose |x| histogram a sum counts as it writes x
// (Primitives::SumScaledCheckFiniteHistogram): AbsHistogram16From(x, begin, end, first_bin, bins).
struct HistogramRange {
  size_t begin = 0;
  size_t end = 0;
  uint32_t first_bin = 0;    // 0: every bin
  uint32_t* bins = nullptr;  // kHistogramBins host counters, added to
};

// A block of memory of a Primitives implementation's device (host memory for host
// implementations), freed with the object. Made by Primitives::AllocScratch.
class ScratchBuffer {
 public:
  ScratchBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  virtual ~ScratchBuffer() = default;
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

class Primitives {
 public:
  virtual ~Primitives() = default;
  virtual Device device() const = 0;

  // y[i] += x[i].
  virtual void Accumulate(float* y, const float* x, size_t n) = 0;
  // x[i] *= a.
  virtual void Scale(float* x, float a, size_t n) = 0;
  // y[i] = a * (((xs[0][i] + xs[1][i]) + xs[2][i]) + ...) for `count` >= 1 inputs: the rounding
  // of Copy(y, xs[0]), Accumulate of the others in order and Scale(y, a) (skipped for a == 1),
  // in one pass where the implementation fuses it. y must not overlap any input.
  virtual absl::Status SumScaled(float* y, const float* const* xs, int count, float a, size_t n);
  // SumScaled that also finds the non-finite gradients (issue 16 item 3) in the same pass: sets
  // *first_bad to the lowest i whose y[i] is NaN or +-Inf, n when every y[i] is finite. y[i] is
  // non-finite whenever some input xs[r][i] is (and also where a finite sum overflows, which a
  // dense all-reduce would show alike), so the hot path checks only its output; finding which
  // input holds it is the caller's cold path. The default runs SumScaled and a host scan of y,
  // right for host-memory implementations only: on another device it returns Unimplemented. The
  // CPU primitives fuse the check into the sum's pass; the CUDA primitives run SumScaled, then a
  // kernel that finds the first bad index, and read 8 bytes back.
  virtual absl::Status SumScaledCheckFinite(float* y, const float* const* xs, int count, float a,
                                            size_t n, size_t* first_bad);
  // SumScaledCheckFinite that also adds to h.bins the histogram of the sum over [h.begin, h.end)
  // as AbsHistogram16From(y, h.begin, h.end, h.first_bin, h.bins) would after it (the bins from
  // h.first_bin on exactly; below it maybe). A sparse step's selection then need not read its
  // range of y again (MiCRO counts the partition it owns). The default runs the two passes
  // (host-memory primitives only: FailedPrecondition on another device); the CPU primitives
  // count in the sum's pass when it runs on one thread. InvalidArgument, with nothing written,
  // when the range passes n or bins is null.
  virtual absl::Status SumScaledCheckFiniteHistogram(float* y, const float* const* xs, int count,
                                                     float a, size_t n, size_t* first_bad,
                                                     const HistogramRange& h);
  // Number of i with |x[i]| >= t.
  virtual size_t CountAbove(const float* x, size_t n, float t) = 0;

  // For i in [begin, end) with |x[i]| >= t, in ascending i: writes i to idx and x[i] to val
  // (at most `capacity` of them) and, when `zero` is set, sets x[i] = 0 for those written.
  // Returns the number of qualifying entries (may exceed capacity; only `capacity` written).
  // idx/val slots between the number written and `capacity` may be overwritten (SIMD scratch);
  // nothing at or past `capacity` is touched.
  virtual size_t SelectAbove(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx,
                             float* val, size_t capacity) = 0;

  // Fused: acc[i] += add[i] over [begin, end), then as SelectAbove on acc. One pass.
  virtual size_t AddSelectAbove(float* acc, const float* add, size_t begin, size_t end, float t,
                                bool zero, uint32_t* idx, float* val, size_t capacity) = 0;

  // Exact top-k by |x| over x[0..n): writes k indices (ascending order) and their values.
  // k > n is clamped to n. Ties at the k-th magnitude are broken toward the lower index.
  // Returns the number written.
  virtual size_t TopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) = 0;

  virtual AbsMoments Moments(const float* x, size_t n, float lower_bound) = 0;

  // Fused: acc[i] += add[i] for i < n when add is non-null, then Moments(acc, n, lower_bound) of
  // the result, in one pass where the implementation fuses them. With `logs` false, sum_log and
  // log_count are 0 (the logarithms are most of a Moments pass's work); every other field is as
  // Moments returns it. The default runs Accumulate and Moments.
  virtual AbsMoments AccumulateMoments(float* acc, const float* add, size_t n, float lower_bound,
                                       bool logs);

  // m samples of x drawn uniformly with replacement, deterministic for a seed. Draw j reads
  // x[floor(r * n / 2^64)] where r = splitmix64 of (seed + (j + 1) * 0x9e3779b97f4a7c15), so
  // every implementation returns the same samples. n == 0 writes m zeros.
  virtual void Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) = 0;

  // y[idx[j]] += val[j] for j < m. Every index is validated against n before anything is
  // written: an index >= n returns InvalidArgument and leaves y unchanged.
  virtual absl::Status ScatterAdd(float* y, size_t n, const uint32_t* idx, const float* val,
                                  size_t m) = 0;
  // out[j] = x[idx[j]] (indices must be < n; checked as ScatterAdd).
  virtual absl::Status Gather(const float* x, size_t n, const uint32_t* idx, size_t m,
                              float* out) = 0;
  // x[idx[j]] = 0 (indices must be < n; checked as ScatterAdd).
  virtual absl::Status ZeroAt(float* x, size_t n, const uint32_t* idx, size_t m) = 0;

  // 2^16-bin histogram of |x| over [begin, end): bin = top 16 bits of the float's bit pattern
  // below the sign bit (bits 30..15), so bins are ordered by magnitude. `bins` has 65536
  // entries and is added to (not cleared). NaNs land in bins above +Inf's bin (0xFF00), except
  // NaNs whose payload is below 2^15, which share bin 0xFF00 with +-Inf.
  static constexpr size_t kHistogramBins = 65536;
  virtual void AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) = 0;
  // AbsHistogram16 for the bins from `first_bin` on: those are added to exactly as
  // AbsHistogram16 adds to them; the bins below may or may not be (an implementation skips the
  // entries there where that is cheaper: they cost no increment). The default is AbsHistogram16.
  virtual void AbsHistogram16From(const float* x, size_t begin, size_t end, uint32_t first_bin,
                                  uint32_t* bins);
  // The AbsHistogram16From(x, begin, end, first_bin) bins walked from +Inf's bin (0xFF00) down
  // to lo = max(first_bin, 1) (bin 0, zeros, and the NaN-only bins above 0xFF00 never count):
  // the highest bin b in [lo, 0xFF00] such that bins b..0xFF00 hold at least `quota` (>= 1)
  // entries, with reached = 1; when the bins from lo hold fewer, bin = lo, reached = 0 and cum
  // their total. first_bin must be <= 0xFF00. Only the result leaves the device: a device
  // implementation keeps the bins in its memory (kernels/cuda reads back 24 bytes, not 256 KiB).
  // The default counts the bins (AbsHistogram16From) into a host array, or on a device into
  // AllocScratch memory copied back, and walks them there.
  virtual absl::StatusOr<HistogramEdge> AbsHistogramEdge(const float* x, size_t begin, size_t end,
                                                         uint32_t first_bin, uint64_t quota);
  // AbsHistogramEdge's walk over bins already counted (host memory), shared by every
  // implementation's host side and by tests.
  static HistogramEdge WalkHistogramEdge(const uint32_t* bins, uint32_t first_bin, uint64_t quota);
  // The magnitude bits of v (its bit pattern without the sign): for numbers their unsigned order
  // is the order of |v|, and the histogram's bin (AbsHistogram16) is MagnitudeBits(v) >> 15.
  static uint32_t MagnitudeBits(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    return u & 0x7fffffffu;
  }
  // The last stage of an exact top-k by magnitude over `count` host candidates (no NaN, index
  // order), once the boundary bin (MagnitudeBits >> 15) is known: `keys` holds MagnitudeBits of
  // the candidates in that bin, and `above` (< k) candidates lie in higher bins, with
  // 1 <= k - above <= keys->size(). Ranks the bin's keys (nth_element; `keys` is reordered),
  // then writes in index order the candidates above the k-th key and the first of those at it
  // (ties toward the lower index). idx/val may be cidx/cval (in place). Returns k. Shared by
  // the CPU top-k (kernels/cpu/top_k.cc) and the histogram selection's trim
  // (kernels/compressors/threshold_control.cc).
  static size_t TopKFromBoundaryBin(const uint32_t* cidx, const float* cval, size_t count, size_t k,
                                    size_t above, std::vector<uint32_t>* keys, uint32_t* idx,
                                    float* val);

  // Memory movement, so that code written against this interface (the daemon's engine) never
  // touches device data with a raw memcpy or fill. The defaults are right for implementations
  // whose memory is host memory (memcpy, std::fill_n); a device implementation overrides all
  // four (kernels/cuda does). Ranges must not overlap. An error is the device's copy failure.
  // dst[i] = src[i] for i < n, both in this device's memory.
  virtual absl::Status Copy(float* dst, const float* src, size_t n);
  // x[i] = v for i < n.
  virtual absl::Status Fill(float* x, float v, size_t n);
  // `bytes` bytes from this device's memory into host memory (a staging copy), and back.
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes);
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes);

  // `bytes` bytes (at least one) of host memory that this device copies to and from fastest
  // (kernels/cuda: page-locked, cudaMallocHost, so a copy is one DMA with no bounce through the
  // runtime's own staging), 64-byte aligned: where a device step stages its selected pairs. The
  // default is ordinary host memory.
  virtual absl::StatusOr<std::unique_ptr<ScratchBuffer>> AllocHostStaging(size_t bytes);

  // `bytes` bytes (at least one) of this device's memory, 64-byte aligned, contents undefined:
  // scratch for a caller that hands the primitives output buffers of its own (a compressor's
  // selection, histogram or samples on a device). The default is host memory; a device
  // implementation overrides it (kernels/cuda: cudaMalloc). An error is an allocation failure.
  virtual absl::StatusOr<std::unique_ptr<ScratchBuffer>> AllocScratch(size_t bytes);

  // Half-precision buckets (bfloat16, float16; kernels/half.h, docs/dtypes.md): `t` is a half
  // type and every uint16_t pointer holds its bit patterns in this device's memory. Each pass
  // is bit-identical to kernels/half.h's pass of the same name on every implementation (round
  // to nearest even, overflow to +-Inf, NaN kept quiet, widening exact). The defaults run
  // kernels/half.h's passes and are right for host-memory implementations only: on another
  // device they return Unimplemented (kernels/cuda overrides all three).
  // half::SumWidenScaled: y[i] = a * (acc[i] + float(xs[0][i]) + ... + float(xs[count-1][i])),
  // left to right in float32 (acc null: the sum starts at xs[0]; a == 1: no multiply); y may
  // equal acc. `xs` is a host array of `count` (>= 1) device pointers. first_bad non-null: set
  // to the lowest i whose y[i] is NaN or +-Inf, n when none (the local reduce's finite check).
  virtual absl::Status SumWidenHalf(DType t, float* y, const float* acc, const uint16_t* const* xs,
                                    int count, float a, size_t n, size_t* first_bad);
  // half::Narrow: y[i] = x[i] rounded to `t`.
  virtual absl::Status NarrowHalf(DType t, const float* x, uint16_t* y, size_t n);
  // half::Widen: y[i] = float(x[i]).
  virtual absl::Status WidenHalf(DType t, const uint16_t* x, float* y, size_t n);

  // The first failure of a call without a Status result (Accumulate, Scale, CountAbove, ...),
  // so a caller can refuse results computed after it: OK while there was none. Host
  // implementations never fail there; the CUDA one keeps its first CUDA error.
  virtual absl::Status Health() const;
};

// Scratch buffers of one Primitives' memory, numbered by slot, grown on demand and kept between
// calls (so a caller that runs every step allocates only while its sizes grow), and the copies
// in and out of them. Not thread-safe: one owner (a compressor, an engine bucket) uses it at a
// time. Error convention: every call returns its own result, and the first failure since the
// last TakeStatus() is also kept, so a caller that runs many helpers on one Scratch (a
// compressor's DoSelect) reports it once: `return scratch_.TakeStatus();`.
class Scratch {
 public:
  static constexpr int kSlots = 4;
  explicit Scratch(Primitives* p) : p_(p) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Primitives* prims() const { return p_; }
  // Whether the primitives write host memory (no scratch, no copies needed).
  bool host() const { return p_->device() == Device::kCpu; }
  // At least `bytes` of slot `slot` (0 .. kSlots - 1); earlier contents are lost when it grows.
  absl::StatusOr<void*> Get(int slot, size_t bytes);
  // Get(slot, bytes), then `bytes` from host memory into it (Primitives::CopyFromHost).
  absl::StatusOr<void*> Upload(int slot, const void* host, size_t bytes);
  // `bytes` from this device's memory into host memory (Primitives::CopyToHost).
  absl::Status Fetch(void* host, const void* device, size_t bytes);
  // Keeps `s` when it is the first failure since the last TakeStatus().
  void Fail(const absl::Status& s) {
    if (status_.ok()) status_ = s;
  }
  // The first failure kept (OK when there was none).
  const absl::Status& status() const { return status_; }
  // At least `bytes` of host staging memory (Primitives::AllocHostStaging: pinned on a GPU),
  // kept and grown like a slot: where a device selection is copied out to in one copy.
  absl::StatusOr<void*> HostStaging(size_t bytes);
  // The first failure since the last call (then cleared); on a device also the primitives'
  // Health, so a failed kernel launch is reported with the results computed after it.
  absl::Status TakeStatus();

 private:
  Primitives* p_;
  std::unique_ptr<ScratchBuffer> slots_[kSlots];
  std::unique_ptr<ScratchBuffer> staging_;
  absl::Status status_;
};

// The CPU implementation: Highway with dynamic dispatch, `threads` workers for large inputs
// (0 = UsableCpus()). Thread-safe for concurrent calls on disjoint data.
std::unique_ptr<Primitives> MakeCpuPrimitives(int threads = 0);

// The CPUs this process may run on: its affinity mask (what mpirun's or srun's binding, taskset
// or a cgroup cpuset left it), or the hardware concurrency where the mask cannot be read.
// At least 1.
int UsableCpus();

// The CUDA implementation; returns an error where CUDA is not compiled in or no GPU is usable.
// (Defined in kernels/cuda when built with --config=cuda, otherwise in kernels/cuda_stub.cc.)
absl::Status MakeCudaPrimitives(std::unique_ptr<Primitives>* out);
// The same on GPU `device` (the daemon's chosen ordinal); InvalidArgument for an ordinal that
// does not exist.
absl::Status MakeCudaPrimitivesOnDevice(int device, std::unique_ptr<Primitives>* out);

}  // namespace spex
