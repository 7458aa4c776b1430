// The compressors' helpers that touch device memory (device_scratch.h): zeroing at host indices,
// and samples and histograms read back to the host.
#include "kernels/compressors/device_scratch.h"

#include <algorithm>
#include <vector>

#include "kernels/base/status_macros.h"

namespace spex {

absl::Status ZeroAtHost(Primitives* p, float* acc, size_t n, const uint32_t* idx, size_t m,
                        Scratch* scratch) {
  if (p->device() == Device::kCpu) {
    absl::Status st = p->ZeroAt(acc, n, idx, m);
    if (scratch != nullptr) scratch->Fail(st);
    return st;
  }
  if (m == 0) return absl::OkStatus();
  Scratch local(p);
  Scratch* s = scratch != nullptr ? scratch : &local;
  SPEX_ASSIGN_OR_RETURN(const void* d, s->Upload(kHostInSlot, idx, m * 4));
  absl::Status st = p->ZeroAt(acc, n, static_cast<const uint32_t*>(d), m);
  s->Fail(st);
  return st;
}

absl::Status SampleToHost(Primitives* p, const float* x, size_t n, size_t m, uint64_t seed,
                          float* out, Scratch* scratch) {
  if (p->device() == Device::kCpu) {
    p->Sample(x, n, m, seed, out);
    return absl::OkStatus();
  }
  Scratch local(p);
  Scratch* s = scratch != nullptr ? scratch : &local;
  SPEX_ASSIGN_OR_RETURN(void* d, s->Get(kHostInSlot, m * 4));
  p->Sample(x, n, m, seed, static_cast<float*>(d));
  return s->Fetch(out, d, m * 4);
}

absl::Status HistogramToHost(Primitives* p, const float* x, size_t begin, size_t end,
                             uint32_t first_bin, uint32_t* bins, Scratch* scratch) {
  if (p->device() == Device::kCpu) {
    if (first_bin == 0) {
      p->AbsHistogram16(x, begin, end, bins);
    } else {
      p->AbsHistogram16From(x, begin, end, first_bin, bins);
    }
    return absl::OkStatus();
  }
  Scratch local(p);
  Scratch* s = scratch != nullptr ? scratch : &local;
  constexpr size_t kBins = Primitives::kHistogramBins;
  first_bin = std::min<uint32_t>(first_bin, kBins);
  SPEX_ASSIGN_OR_RETURN(void* dv, s->Get(kBinSlot, kBins * 4));
  auto* d = static_cast<uint32_t*>(dv);
  // Zero bits are a zero count: Fill clears the device bins.
  if (absl::Status st = p->Fill(reinterpret_cast<float*>(d), 0.0f, kBins); !st.ok()) {
    s->Fail(st);
    return st;
  }
  if (first_bin == 0) {
    p->AbsHistogram16(x, begin, end, d);
  } else {
    p->AbsHistogram16From(x, begin, end, first_bin, d);
  }
  // Only the bins from first_bin on are read; they are added to the host bins.
  std::vector<uint32_t> h(kBins - first_bin);
  SPEX_RETURN_IF_ERROR(s->Fetch(h.data(), d + first_bin, h.size() * 4));
  for (size_t b = 0; b < h.size(); ++b) bins[first_bin + b] += h[b];
  return absl::OkStatus();
}

}  // namespace spex
