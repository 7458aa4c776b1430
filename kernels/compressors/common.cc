#include "kernels/compressors/common.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace spex {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t StepSeed(uint64_t seed, int rank, uint64_t step) {
  uint64_t s = seed;
  uint64_t a = SplitMix64(&s) ^ (static_cast<uint64_t>(rank) * 0xd1b54a32d192ed03ull);
  uint64_t b = SplitMix64(&a) ^ (step * 0x8cb92ba72f3d8dd7ull);
  return SplitMix64(&b);
}

float StrictAbove(float t) { return std::nextafter(t, std::numeric_limits<float>::infinity()); }

void* Scratch::Get(int slot, size_t bytes) {
  if (!status_.ok()) return nullptr;
  absl::StatusOr<void*> d = slots_.Get(slot, bytes);
  if (!d.ok()) {
    Fail(d.status());
    return nullptr;
  }
  return *d;
}

void* Scratch::Upload(int slot, const void* host, size_t bytes) {
  if (!status_.ok()) return nullptr;
  absl::StatusOr<void*> d = slots_.Upload(slot, host, bytes);
  if (!d.ok()) {
    Fail(d.status());
    return nullptr;
  }
  return *d;
}

bool Scratch::Fetch(void* host, const void* device, size_t bytes) {
  if (!status_.ok()) return false;
  if (bytes == 0) return true;
  if (absl::Status s = slots_.prims()->CopyToHost(host, device, bytes); !s.ok()) {
    Fail(s);
    return false;
  }
  return true;
}

absl::Status Scratch::TakeStatus() {
  absl::Status s = status_;
  status_ = absl::OkStatus();
  if (s.ok() && !host()) s = slots_.prims()->Health();
  return s;
}

namespace {

// Scratch slots of the helpers (each helper's use ends with it; none is kept across helpers).
constexpr int kIdxSlot = 0, kValSlot = 1, kHostInSlot = 2, kBinSlot = 3;

// AppendAbove on device primitives: the selection goes to scratch, then only the entries
// selected come back.
size_t AppendAboveDevice(Primitives* p, float* acc, const float* add, size_t begin, size_t end,
                         float t, bool zero, size_t cap, Selection* out, Scratch* s) {
  const size_t base = out->idx.size();
  auto* idx = static_cast<uint32_t*>(s->Get(kIdxSlot, cap * 4));
  auto* val = static_cast<float*>(s->Get(kValSlot, cap * 4));
  if (idx == nullptr || val == nullptr) return 0;
  size_t c = add ? p->AddSelectAbove(acc, add, begin, end, t, zero, idx, val, cap)
                 : p->SelectAbove(acc, begin, end, t, zero, idx, val, cap);
  if (c > cap) {  // as AppendAbove below
    if (zero) (void)p->ScatterAdd(acc, end, idx, val, cap);
    cap = c;
    idx = static_cast<uint32_t*>(s->Get(kIdxSlot, cap * 4));
    val = static_cast<float*>(s->Get(kValSlot, cap * 4));
    if (idx == nullptr || val == nullptr) return 0;
    c = p->SelectAbove(acc, begin, end, t, zero, idx, val, cap);
  }
  out->idx.resize(base + c);
  out->val.resize(base + c);
  if (!s->Fetch(out->idx.data() + base, idx, c * 4) ||
      !s->Fetch(out->val.data() + base, val, c * 4)) {
    out->idx.resize(base);
    out->val.resize(base);
    return 0;
  }
  return c;
}

}  // namespace

size_t AppendAbove(Primitives* p, float* acc, const float* add, size_t begin, size_t end, float t,
                   bool zero, size_t expect, Selection* out, Scratch* scratch) {
  const size_t base = out->idx.size();
  if (end <= begin) return 0;
  size_t cap = std::min(std::max<size_t>(expect, 1024), end - begin);
  if (p->device() != Device::kCpu) {
    Scratch local(p);
    return AppendAboveDevice(p, acc, add, begin, end, t, zero, cap, out,
                             scratch != nullptr ? scratch : &local);
  }
  out->idx.resize(base + cap);
  out->val.resize(base + cap);
  size_t c = add ? p->AddSelectAbove(acc, add, begin, end, t, zero, out->idx.data() + base,
                                     out->val.data() + base, cap)
                 : p->SelectAbove(acc, begin, end, t, zero, out->idx.data() + base,
                                  out->val.data() + base, cap);
  if (c > cap) {
    // Only the first `cap` were written (and zeroed): put those back, then take all of them.
    // acc there is +0 now; adding the values back restores it exactly.
    if (zero) (void)p->ScatterAdd(acc, end, out->idx.data() + base, out->val.data() + base, cap);
    cap = c;
    out->idx.resize(base + cap);
    out->val.resize(base + cap);
    c = p->SelectAbove(acc, begin, end, t, zero, out->idx.data() + base, out->val.data() + base,
                       cap);
  }
  out->idx.resize(base + c);
  out->val.resize(base + c);
  return c;
}

size_t AppendTopK(Primitives* p, float* acc, size_t begin, size_t end, size_t k, bool zero,
                  Selection* out, Scratch* scratch) {
  if (end <= begin || k == 0) return 0;
  const size_t base = out->idx.size();
  k = std::min(k, end - begin);
  if (p->device() != Device::kCpu) {
    Scratch local(p);
    Scratch* s = scratch != nullptr ? scratch : &local;
    auto* idx = static_cast<uint32_t*>(s->Get(kIdxSlot, k * 4));
    auto* val = static_cast<float*>(s->Get(kValSlot, k * 4));
    if (idx == nullptr || val == nullptr) return 0;
    const size_t w = p->TopK(acc + begin, end - begin, k, idx, val);
    out->idx.resize(base + w);
    out->val.resize(base + w);
    if (!s->Fetch(out->idx.data() + base, idx, w * 4) ||
        !s->Fetch(out->val.data() + base, val, w * 4)) {
      out->idx.resize(base);
      out->val.resize(base);
      return 0;
    }
    if (begin != 0) {
      for (size_t j = base; j < base + w; ++j) out->idx[j] += static_cast<uint32_t>(begin);
    }
    // The device indices are relative to begin.
    if (zero && w > 0) (void)p->ZeroAt(acc + begin, end - begin, idx, w);
    return w;
  }
  out->idx.resize(base + k);
  out->val.resize(base + k);
  const size_t w =
      p->TopK(acc + begin, end - begin, k, out->idx.data() + base, out->val.data() + base);
  out->idx.resize(base + w);
  out->val.resize(base + w);
  if (begin != 0) {
    for (size_t j = base; j < base + w; ++j) out->idx[j] += static_cast<uint32_t>(begin);
  }
  if (zero && w > 0) (void)p->ZeroAt(acc, end, out->idx.data() + base, w);
  return w;
}

absl::Status ZeroAtHost(Primitives* p, float* acc, size_t n, const uint32_t* idx, size_t m,
                        Scratch* scratch) {
  if (p->device() == Device::kCpu) return p->ZeroAt(acc, n, idx, m);
  if (m == 0) return absl::OkStatus();
  Scratch local(p);
  Scratch* s = scratch != nullptr ? scratch : &local;
  const auto* d = static_cast<const uint32_t*>(s->Upload(kHostInSlot, idx, m * 4));
  if (d == nullptr) return s->status();
  return p->ZeroAt(acc, n, d, m);
}

void SampleToHost(Primitives* p, const float* x, size_t n, size_t m, uint64_t seed, float* out,
                  Scratch* scratch) {
  if (p->device() == Device::kCpu) {
    p->Sample(x, n, m, seed, out);
    return;
  }
  Scratch local(p);
  Scratch* s = scratch != nullptr ? scratch : &local;
  auto* d = static_cast<float*>(s->Get(kHostInSlot, m * 4));
  if (d == nullptr) return;
  p->Sample(x, n, m, seed, d);
  s->Fetch(out, d, m * 4);
}

void HistogramToHost(Primitives* p, const float* x, size_t begin, size_t end, uint32_t first_bin,
                     uint32_t* bins, Scratch* scratch) {
  if (p->device() == Device::kCpu) {
    if (first_bin == 0) {
      p->AbsHistogram16(x, begin, end, bins);
    } else {
      p->AbsHistogram16From(x, begin, end, first_bin, bins);
    }
    return;
  }
  Scratch local(p);
  Scratch* s = scratch != nullptr ? scratch : &local;
  constexpr size_t kBins = Primitives::kHistogramBins;
  first_bin = std::min<uint32_t>(first_bin, kBins);
  auto* d = static_cast<uint32_t*>(s->Get(kBinSlot, kBins * 4));
  if (d == nullptr) return;
  // Zero bits are a zero count: Fill clears the device bins.
  if (absl::Status st = p->Fill(reinterpret_cast<float*>(d), 0.0f, kBins); !st.ok()) {
    s->Fail(st);
    return;
  }
  if (first_bin == 0) {
    p->AbsHistogram16(x, begin, end, d);
  } else {
    p->AbsHistogram16From(x, begin, end, first_bin, d);
  }
  // Only the bins from first_bin on are read; they are added to the host bins.
  std::vector<uint32_t> h(kBins - first_bin);
  if (!s->Fetch(h.data(), d + first_bin, h.size() * 4)) return;
  for (size_t b = 0; b < h.size(); ++b) bins[first_bin + b] += h[b];
}

void AccumulateOutside(Primitives* p, float* acc, const float* add, size_t n, size_t skip_begin,
                       size_t skip_end) {
  if (add == nullptr) return;
  skip_begin = std::min(skip_begin, n);
  skip_end = std::min(std::max(skip_end, skip_begin), n);
  if (skip_begin > 0) p->Accumulate(acc, add, skip_begin);
  if (skip_end < n) p->Accumulate(acc + skip_end, add + skip_end, n - skip_end);
}

size_t TrimTopK(Primitives* p, Selection* out, size_t from, size_t k, Scratch* scratch) {
  const size_t m = out->idx.size() - from;
  if (m <= k) return m;
  std::vector<uint32_t> pos(k);
  std::vector<float> v(k);
  size_t w;
  if (p->device() == Device::kCpu) {
    w = p->TopK(out->val.data() + from, m, k, pos.data(), v.data());
  } else {
    // The candidates' values go up, the top-k positions and values come back.
    Scratch local(p);
    Scratch* s = scratch != nullptr ? scratch : &local;
    const auto* dval =
        static_cast<const float*>(s->Upload(kHostInSlot, out->val.data() + from, m * 4));
    auto* dpos = static_cast<uint32_t*>(s->Get(kIdxSlot, k * 4));
    auto* dv = static_cast<float*>(s->Get(kValSlot, k * 4));
    if (dval == nullptr || dpos == nullptr || dv == nullptr) return m;
    w = p->TopK(dval, m, k, dpos, dv);
    if (!s->Fetch(pos.data(), dpos, w * 4) || !s->Fetch(v.data(), dv, w * 4)) return m;
  }
  for (size_t j = 0; j < w; ++j) {  // pos is ascending, so j <= pos[j]: in place is safe
    out->idx[from + j] = out->idx[from + pos[j]];
    out->val[from + j] = v[j];
  }
  out->idx.resize(from + w);
  out->val.resize(from + w);
  return w;
}

ThresholdScanner::ThresholdScanner(Primitives* p, float* acc, const float* add, size_t n,
                                   size_t capacity, Scratch* scratch)
    : p_(p),
      scratch_(scratch),
      acc_(acc),
      add_(add),
      n_(n),
      cap_(std::min(std::max<size_t>(capacity, 1024), n)) {}

void ThresholdScanner::Scan(float t) {
  if (p_->device() != Device::kCpu) {
    // The list goes to scratch; it comes back only when it is kept.
    Scratch local(p_);
    Scratch* s = scratch_ != nullptr ? scratch_ : &local;
    auto* idx = static_cast<uint32_t*>(s->Get(kIdxSlot, cap_ * 4));
    auto* val = static_cast<float*>(s->Get(kValSlot, cap_ * 4));
    size_t c = 0;  // after a failure: a count (status() says the results are void)
    if (idx != nullptr && val != nullptr) {
      c = add_ ? p_->AddSelectAbove(acc_, add_, 0, n_, t, false, idx, val, cap_)
               : p_->SelectAbove(acc_, 0, n_, t, false, idx, val, cap_);
    }
    add_ = nullptr;
    ++passes_;
    counts_.emplace_back(t, c);
    if (idx != nullptr && val != nullptr && c <= cap_ && (!have_list_ || t < list_t_)) {
      scan_idx_.resize(c);
      scan_val_.resize(c);
      if (s->Fetch(scan_idx_.data(), idx, c * 4) && s->Fetch(scan_val_.data(), val, c * 4)) {
        idx_.swap(scan_idx_);
        val_.swap(scan_val_);
        list_t_ = t;
        have_list_ = true;
      }
    }
    return;
  }
  scan_idx_.resize(cap_);
  scan_val_.resize(cap_);
  const size_t c =
      add_ ? p_->AddSelectAbove(acc_, add_, 0, n_, t, false, scan_idx_.data(), scan_val_.data(),
                                cap_)
           : p_->SelectAbove(acc_, 0, n_, t, false, scan_idx_.data(), scan_val_.data(), cap_);
  add_ = nullptr;
  ++passes_;
  counts_.emplace_back(t, c);
  if (c <= cap_ && (!have_list_ || t < list_t_)) {
    scan_idx_.resize(c);
    scan_val_.resize(c);
    idx_.swap(scan_idx_);
    val_.swap(scan_val_);
    list_t_ = t;
    have_list_ = true;
  }
}

size_t ThresholdScanner::Count(float t) {
  for (const auto& [ct, c] : counts_) {
    if (ct == t) return c;
  }
  if (!FromList(t)) Scan(t);
  for (const auto& [ct, c] : counts_) {
    if (ct == t) return c;
  }
  if (!FromList(t)) return counts_.back().second;  // unreachable: Scan(t) recorded t
  size_t c = 0;
  for (float v : val_) c += std::fabs(v) >= t;
  return c;
}

void ThresholdScanner::Select(float t, bool zero, Selection* out) {
  out->idx.clear();
  out->val.clear();
  if (!FromList(t) && add_ == nullptr) {
    // One direct pass (zeroing in it) beats a scan plus a ZeroAt.
    size_t expect = cap_;
    for (const auto& [ct, c] : counts_) {
      if (ct == t) expect = c;
    }
    AppendAbove(p_, acc_, nullptr, 0, n_, t, zero, expect, out, scratch_);
    ++passes_;
    return;
  }
  if (!FromList(t)) Scan(t);
  if (!FromList(t)) {  // the list overflowed at t: select directly
    Select(t, zero, out);
    return;
  }
  for (size_t j = 0; j < idx_.size(); ++j) {
    if (std::fabs(val_[j]) >= t) {
      out->idx.push_back(idx_[j]);
      out->val.push_back(val_[j]);
    }
  }
  if (zero && !out->idx.empty()) {
    (void)ZeroAtHost(p_, acc_, n_, out->idx.data(), out->idx.size(), scratch_);
  }
}

namespace {
// Bin 0xFF00 holds +-Inf (and NaNs with a payload below 2^15); the bins above it only NaNs.
constexpr uint32_t kInfBin = 0xFF00;
}  // namespace

void MagnitudeHistogram::Build(Primitives* p, const float* acc, size_t n, Scratch* scratch) {
  BuildFrom(p, acc, n, 0.0f, scratch);
}

void MagnitudeHistogram::BuildFrom(Primitives* p, const float* acc, size_t n, float floor,
                                   Scratch* scratch) {
  uint32_t bits;
  std::memcpy(&bits, &floor, sizeof(bits));
  n_ = n;
  first_ = floor > 0 ? std::min(bits >> 15, kInfBin) : 0;  // NaN and <= 0: every bin
  missed_ = false;
  bins_.assign(Primitives::kHistogramBins, 0);
  HistogramToHost(p, acc, 0, n, first_, bins_.data(), scratch);
  from_.assign(kInfBin + 1, 0);
  for (uint32_t b = kInfBin; b-- > first_;) from_[b] = from_[b + 1] + bins_[b];
  inf_bin_ = bins_[kInfBin];
}

void MagnitudeHistogram::Bounds(float t, size_t* lo, size_t* hi) const {
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof(bits));
  const uint32_t b = bits >> 15;
  if (!(t > 0) || b >= kInfBin) {  // not a positive finite threshold: no bound worth having
    *lo = 0;
    *hi = n_;
    return;
  }
  if (b < first_) {  // below the counted bins: at least the entries in them
    missed_ = true;
    *lo = from_[first_];
    *hi = n_;
    return;
  }
  // Every entry in a higher finite bin is above t, none in a lower bin is; t's own bin and the
  // Inf bin (which may hold NaNs) are undecided.
  *lo = from_[b + 1];
  *hi = from_[b] + inf_bin_;
}

float MagnitudeHistogram::FloorOfTop(size_t k) const {
  if (k == 0 || from_[first_] < k) return 0;
  uint32_t b = kInfBin - 1;
  while (from_[b] < k) --b;  // stops at first_ at the latest
  const uint32_t bits = b << 15;
  float t;
  std::memcpy(&t, &bits, sizeof(t));
  return t;
}

}  // namespace spex
