// How the compressors' helpers use device memory. The compressors keep what they read on the
// host (selections, histograms, samples, candidate lists) in host vectors. With host primitives
// (device() == kCpu) those vectors are the primitives' output buffers. With device primitives
// every helper hands the primitives Scratch (primitives.h) in the device's memory instead and
// copies back only what it reads (the selected entries, the histogram bins in use, the samples);
// host arrays the primitives must read (indices to zero, values to trim) are uploaded first. The
// results are the primitives' own, so a selection is bit-identical across implementations that
// agree.
//
// Error convention (every helper of kernels/compressors): a compressor that runs on device
// primitives owns one Scratch and passes it to every helper; a failed allocation or copy is kept
// in it (the helper's outputs are then incomplete) and DoSelect returns scratch.TakeStatus(). The
// helpers below also return that failure. Without a Scratch a helper uses a call-local one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/primitives.h"

namespace spex {

// The Scratch slots of the helpers (each helper's use ends with it; none is kept across helpers).
inline constexpr int kIdxSlot = 0, kValSlot = 1, kHostInSlot = 2, kBinSlot = 3;

// acc[idx[j]] = 0 for the host indices idx[0..m) (uploaded first on a device).
absl::Status ZeroAtHost(Primitives* p, float* acc, size_t n, const uint32_t* idx, size_t m,
                        Scratch* scratch = nullptr);

// Primitives::Sample into host memory.
absl::Status SampleToHost(Primitives* p, const float* x, size_t n, size_t m, uint64_t seed,
                          float* out, Scratch* scratch = nullptr);

// Primitives::AbsHistogram16From (AbsHistogram16 for first_bin 0) into the host bins (added to,
// as the primitive does; on a device only bins from first_bin on are added to).
absl::Status HistogramToHost(Primitives* p, const float* x, size_t begin, size_t end,
                             uint32_t first_bin, uint32_t* bins, Scratch* scratch = nullptr);

}  // namespace spex
