// Exact top-k as a two-digit radix select over MagnitudeKey (device_math.h), written against
// three data passes so the same control logic drives the CUDA kernels and, in tests, a plain
// CPU implementation of the passes that is checked against kernels/reference.
//   1. histogram of the key's high 16 bits -> the digit holding the k-th largest key;
//   2. histogram of the low 16 bits inside that digit -> the exact k-th key T;
//   3. collect every entry with key > T plus the lowest-indexed ones with key == T.
// The result has the TopK contract of kernels/primitives.h: ascending indices, ties toward the
// lower index, NaN below every number.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace spex {
namespace gpu {

inline constexpr size_t kDigitBins = 65536;

struct DigitChoice;

// The data passes over x[0..n). Counts are 64-bit: one digit can hold all 2^32 entries.
class RadixTopKPasses {
 public:
  virtual ~RadixTopKPasses() = default;
  // The digit of the high (`low` false) or low 16 bits (inside high digit `high`) holding the
  // k-th largest key, given `above` keys known to be larger, and in `total` the histogram's
  // entry count (left alone when the pass itself fails). Default: the histogram pass below, its
  // 2^16 counts on the host, ChooseDigit. The CUDA passes choose on the device and read back only
  // the choice (issue 33 item 3: no per-step copy of the bins).
  virtual absl::StatusOr<DigitChoice> ChooseDigitPass(bool low, uint32_t high, uint64_t above,
                                                      uint64_t k, uint64_t* total);
  // counts[d] = number of i with MagnitudeKey(x[i]) >> 16 == d (kDigitBins entries, overwritten).
  virtual absl::Status HighDigitHistogram(uint64_t* counts) = 0;
  // counts[d] = number of i with key >> 16 == high and (key & 0xffff) == d (overwritten).
  virtual absl::Status LowDigitHistogram(uint32_t high, uint64_t* counts) = 0;
  // Writes, in ascending i, every i with key > threshold and the `take` lowest i with
  // key == threshold (`ties` entries have that key; take == ties means all of them), together
  // with x[i]. Returns the number written. When k == n the call is Collect(0, max, max): all.
  virtual absl::StatusOr<size_t> Collect(uint32_t threshold, uint64_t take, uint64_t ties) = 0;
};

// Where the k-th largest key falls in one digit's histogram, given `above` keys already known
// to be larger (from higher digits): the digit d with
//   above + sum(counts[d+1..]) < k <= above + sum(counts[d..]).
struct DigitChoice {
  uint32_t digit = 0;
  uint64_t above = 0;     // above + entries in digits > d
  uint64_t in_digit = 0;  // counts[d]
};
// InternalError when the histogram holds fewer than k - above entries (a pass miscounted).
absl::StatusOr<DigitChoice> ChooseDigit(const uint64_t* counts, uint64_t above, uint64_t k);

// The threshold key and how many of its ties to take, from the two histogram passes.
struct TopKThreshold {
  uint32_t key = 0;
  uint64_t take = 0;  // entries with key == `key` to include (lowest indices first)
  uint64_t ties = 0;  // entries with key == `key`
};
absl::StatusOr<TopKThreshold> FindTopKThreshold(uint64_t k, RadixTopKPasses& passes);

// The whole TopK: clamps k to n, returns the number written (k); 0 writes nothing.
absl::StatusOr<size_t> RadixTopK(size_t n, size_t k, RadixTopKPasses& passes);

}  // namespace gpu
}  // namespace spex
