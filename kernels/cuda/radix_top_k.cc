// The control logic of the two-digit radix top-k select (radix_top_k.h), shared by the CUDA
// kernels and the host model of the tests.
#include "kernels/cuda/radix_top_k.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace spex {
namespace gpu {

absl::StatusOr<DigitChoice> ChooseDigit(const uint64_t* counts, uint64_t above, uint64_t k) {
  if (k <= above) {
    return absl::InternalError(absl::StrCat("radix top-k: k = ", k, " is not above the ", above,
                                            " entries already known to be larger"));
  }
  uint64_t seen = above;
  for (size_t d = kDigitBins; d-- > 0;) {
    if (seen + counts[d] >= k) {
      DigitChoice c;
      c.digit = static_cast<uint32_t>(d);
      c.above = seen;
      c.in_digit = counts[d];
      return c;
    }
    seen += counts[d];
  }
  return absl::InternalError(absl::StrCat("radix top-k: the histogram holds ", seen - above,
                                          " entries, fewer than the ", k - above, " needed"));
}

absl::StatusOr<DigitChoice> RadixTopKPasses::ChooseDigitPass(bool low, uint32_t high,
                                                             uint64_t above, uint64_t k,
                                                             uint64_t* total) {
  std::vector<uint64_t> counts(kDigitBins);
  absl::Status s = low ? LowDigitHistogram(high, counts.data()) : HighDigitHistogram(counts.data());
  if (!s.ok()) return s;
  *total = 0;
  for (uint64_t c : counts) *total += c;
  return ChooseDigit(counts.data(), above, k);
}

absl::StatusOr<TopKThreshold> FindTopKThreshold(uint64_t k, RadixTopKPasses& passes) {
  uint64_t all = 0, in_high = UINT64_MAX;  // UINT64_MAX: the pass did not count
  absl::StatusOr<DigitChoice> high = passes.ChooseDigitPass(false, 0, 0, k, &all);
  if (!high.ok()) return high.status();
  absl::StatusOr<DigitChoice> low =
      passes.ChooseDigitPass(true, high->digit, high->above, k, &in_high);
  // The second pass must see exactly the first pass's count of the chosen digit (checked
  // before its choice's error, which a miscount would cause).
  if (in_high != UINT64_MAX && in_high != high->in_digit) {
    return absl::InternalError(absl::StrCat("radix top-k: digit ", high->digit, " held ",
                                            high->in_digit, " entries in the first pass and ",
                                            in_high, " in the second"));
  }
  if (!low.ok()) return low.status();

  TopKThreshold t;
  t.key = (high->digit << 16) | low->digit;
  t.ties = low->in_digit;
  t.take = k - low->above;
  return t;
}

absl::StatusOr<size_t> RadixTopK(size_t n, size_t k, RadixTopKPasses& passes) {
  k = std::min(k, n);
  if (k == 0) return size_t{0};
  uint32_t threshold = 0;
  uint64_t take = 0, ties = 0;
  if (k == n) {
    // Everything: every key is >= 0, so "key > 0 plus all ties of key 0" is the whole input
    // (no histogram passes; the tie count is not needed when all ties are taken).
    threshold = 0;
    take = ties = UINT64_MAX;
  } else {
    absl::StatusOr<TopKThreshold> t = FindTopKThreshold(k, passes);
    if (!t.ok()) return t.status();
    threshold = t->key;
    take = t->take;
    ties = t->ties;
  }
  absl::StatusOr<size_t> written = passes.Collect(threshold, take, ties);
  if (!written.ok()) return written.status();
  if (*written != k) {
    return absl::InternalError(
        absl::StrCat("radix top-k: collected ", *written, " entries instead of k = ", k));
  }
  return written;
}

}  // namespace gpu
}  // namespace spex
