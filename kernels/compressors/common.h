// Building blocks shared by the compressors, written only over Primitives (plus scalar loops over
// selection-sized host arrays): threshold selection with capacity handling, exact top-k of a
// range, trimming a candidate list to an exact top-k, a threshold scanner that answers a sequence
// of count/select probes with as few passes over acc as possible, a magnitude histogram that
// bounds the count at any threshold, and seeded random numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

// Device support. The compressors keep what they read on the host (selections, histograms,
// samples, candidate lists) in host vectors. With host primitives (device() == kCpu) those
// vectors are the primitives' output buffers, exactly as before. With device primitives every
// helper below hands the primitives scratch in the device's memory instead and copies back only
// what it reads (the selected entries, the histogram bins in use, the samples); host arrays the
// primitives must read (indices to zero, values to trim) are uploaded first. The results are the
// primitives' own, so a selection is bit-identical across implementations that agree.
// A compressor that runs on device primitives owns one Scratch and passes it to every helper;
// the first failed allocation or copy is kept and reported by status() (the helper's outputs are
// then incomplete), so DoSelect returns it.
class Scratch {
 public:
  explicit Scratch(Primitives* p) : slots_(p) {}
  // Whether the primitives write host memory (no scratch, no copies).
  bool host() const { return slots_.prims()->device() == Device::kCpu; }
  // Slot `slot` of at least `bytes` in the primitives' memory; null after a failure (kept).
  void* Get(int slot, size_t bytes);
  // The same, holding `bytes` copied from host memory.
  void* Upload(int slot, const void* host, size_t bytes);
  // Device-to-host copy; false after a failure (kept).
  bool Fetch(void* host, const void* device, size_t bytes);
  void Fail(const absl::Status& s) {
    if (status_.ok()) status_ = s;
  }
  const absl::Status& status() const { return status_; }
  // The first failure since the last call (then cleared); also the primitives' Health.
  absl::Status TakeStatus();

 private:
  ScratchSlots slots_;
  absl::Status status_;
};

// splitmix64: the compressors' only random source (deterministic, cheap).
uint64_t SplitMix64(uint64_t* state);
// A per-(seed, node, step) stream seed, so nodes and steps draw independently.
uint64_t StepSeed(uint64_t seed, int rank, uint64_t step);

// Smallest float above t: |x| > t  <=>  |x| >= StrictAbove(t) (for the references' strict `>`).
float StrictAbove(float t);

// acc[begin, end) += add[begin, end) when add is non-null (in the same pass), then appends every
// i in [begin, end) with |acc[i]| >= t to out (ascending), zeroing acc there when `zero`.
// `expect` sizes the first attempt; an overflow is handled exactly (a second pass). Returns the
// number appended.
// `scratch`: see Scratch above (unused with host primitives; needed with device ones).
size_t AppendAbove(Primitives* p, float* acc, const float* add, size_t begin, size_t end, float t,
                   bool zero, size_t expect, Selection* out, Scratch* scratch = nullptr);

// Appends the exact top-k by |acc| of [begin, end) (ties toward the lower index), ascending;
// zeroes them in acc when `zero`. Returns the number appended (min(k, end - begin)).
size_t AppendTopK(Primitives* p, float* acc, size_t begin, size_t end, size_t k, bool zero,
                  Selection* out, Scratch* scratch = nullptr);

// acc[i] += add[i] for i in [0, n) outside [skip_begin, skip_end); nothing when add is null.
void AccumulateOutside(Primitives* p, float* acc, const float* add, size_t n, size_t skip_begin,
                       size_t skip_end);

// Keeps only the exact top-k by |val| of out's entries from position `from` on (ties toward the
// lower position, i.e. the lower index), keeping them ascending. Returns the kept count.
size_t TrimTopK(Primitives* p, Selection* out, size_t from, size_t k, Scratch* scratch = nullptr);

// acc[idx[j]] = 0 for the host indices idx[0..m) (uploaded first on a device).
absl::Status ZeroAtHost(Primitives* p, float* acc, size_t n, const uint32_t* idx, size_t m,
                        Scratch* scratch = nullptr);

// Primitives::Sample into host memory.
void SampleToHost(Primitives* p, const float* x, size_t n, size_t m, uint64_t seed, float* out,
                  Scratch* scratch = nullptr);

// Primitives::AbsHistogram16From (AbsHistogram16 for first_bin 0) into the host bins (added to,
// as the primitive does; on a device only bins from first_bin on are added to).
void HistogramToHost(Primitives* p, const float* x, size_t begin, size_t end, uint32_t first_bin,
                     uint32_t* bins, Scratch* scratch = nullptr);

// Answers count and select probes at several thresholds on one buffer with few passes: it keeps
// the complete list of entries at the lowest threshold scanned so far (while that fits in
// `capacity`) and answers every probe at or above it from that list. `add`, when non-null, is
// added into acc by the first pass over acc (so nothing else may read acc before the first probe).
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

// The 2^16-bin histogram of |acc| (one pass; Primitives::AbsHistogram16) with cumulative counts,
// so that the number of entries at or above any threshold is known to within the population of
// the one bin that holds the threshold (bins are 2^-7 of a magnitude wide).
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

namespace spex {
// The lowest threshold a threshold-based compressor uses: |x| >= it <=> x != 0, so exact zeros
// are never sent (and a zero estimate cannot select the whole buffer).
inline constexpr float kMinThreshold = 1.40129846e-45f;  // the smallest positive denormal
}  // namespace spex
