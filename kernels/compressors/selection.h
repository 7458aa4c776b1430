// Threshold and top-k selection into a Selection, written only over Primitives (plus scalar loops
// over selection-sized host arrays): entries at or above a threshold with capacity handling, the
// exact top-k of a range, trimming a candidate list to an exact top-k. `scratch` and failures: see
// device_scratch.h (unused with host primitives; needed with device ones).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

// The lowest threshold a threshold-based compressor uses: |x| >= it <=> x != 0, so exact zeros
// are never sent (and a zero estimate cannot select the whole buffer).
inline constexpr float kMinThreshold = 1.40129846e-45f;  // the smallest positive denormal

// Smallest float above t: |x| > t  <=>  |x| >= StrictAbove(t) (for the references' strict `>`).
float StrictAbove(float t);

// acc[begin, end) += add[begin, end) when add is non-null (in the same pass), then appends every
// i in [begin, end) with |acc[i]| >= t to out (ascending), zeroing acc there when `zero`.
// `expect` sizes the first attempt; an overflow is handled exactly (a second pass). Returns the
// number appended.
size_t AppendAbove(Primitives* p, float* acc, const float* add, size_t begin, size_t end, float t,
                   bool zero, size_t expect, Selection* out, Scratch* scratch = nullptr);

// Appends the exact top-k by |acc| of [begin, end) (ties toward the lower index), ascending;
// zeroes them in acc when `zero`. Returns the number appended (min(k, end - begin)).
size_t AppendTopK(Primitives* p, float* acc, size_t begin, size_t end, size_t k, bool zero,
                  Selection* out, Scratch* scratch = nullptr);

// Keeps only the exact top-k by |val| of out's entries from position `from` on (ties toward the
// lower position, i.e. the lower index), keeping them ascending. Returns the kept count.
size_t TrimTopK(Primitives* p, Selection* out, size_t from, size_t k, Scratch* scratch = nullptr);

// Device primitives only (scratch required): the `count` entries of [begin, end) with
// |acc[i]| >= t (`count` is known beforehand, from a histogram), cut on the device to the exact
// top `keep` by |acc| when keep < count (ties toward the lower index, as TrimTopK), compacted
// into device scratch as [indices | values] and copied out in one copy into the Scratch's host
// staging (Primitives::AllocHostStaging: pinned memory on a GPU), then appended to out in
// ascending order. Nothing is zeroed. Returns how many were >= t (before the cut); a failure is
// kept in scratch and appends nothing. Bytes to the host: 8 per kept pair.
size_t AppendAboveTopDevice(Primitives* p, const float* acc, size_t begin, size_t end, float t,
                            size_t count, size_t keep, Selection* out, Scratch* scratch);

// Device primitives: the m pairs at device idx[0..m), val[0..m) appended to out through the
// Scratch's host staging (one copy when val == idx + m, as the helpers here lay them out).
absl::Status AppendPairsFromDevice(Scratch* s, const uint32_t* idx, const float* val, size_t m,
                                   Selection* out);

// acc[i] += add[i] for i in [0, n) outside [skip_begin, skip_end); nothing when add is null.
void AccumulateOutside(Primitives* p, float* acc, const float* add, size_t n, size_t skip_begin,
                       size_t skip_end);

}  // namespace spex
