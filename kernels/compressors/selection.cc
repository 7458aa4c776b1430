// Threshold and top-k selection into a Selection over Primitives (selection.h).
#include "kernels/compressors/selection.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/compressors/device_scratch.h"

namespace spex {

float StrictAbove(float t) { return std::nextafter(t, std::numeric_limits<float>::infinity()); }

namespace {

// Slot `slot` of `bytes` as a T*; null after a failure (kept in s).
template <typename T>
T* Slot(Scratch* s, int slot, size_t bytes) {
  return static_cast<T*>(s->Get(slot, bytes).value_or(nullptr));
}

// AppendAbove on device primitives: the selection goes to scratch, then only the entries
// selected come back.
size_t AppendAboveDevice(Primitives* p, float* acc, const float* add, size_t begin, size_t end,
                         float t, bool zero, size_t cap, Selection* out, Scratch* s) {
  const size_t base = out->idx.size();
  auto* idx = Slot<uint32_t>(s, kIdxSlot, cap * 4);
  auto* val = Slot<float>(s, kValSlot, cap * 4);
  if (idx == nullptr || val == nullptr) return 0;
  size_t c = add ? p->AddSelectAbove(acc, add, begin, end, t, zero, idx, val, cap)
                 : p->SelectAbove(acc, begin, end, t, zero, idx, val, cap);
  if (c > cap) {  // as AppendAbove below
    if (zero) (void)p->ScatterAdd(acc, end, idx, val, cap);
    cap = c;
    idx = Slot<uint32_t>(s, kIdxSlot, cap * 4);
    val = Slot<float>(s, kValSlot, cap * 4);
    if (idx == nullptr || val == nullptr) return 0;
    c = p->SelectAbove(acc, begin, end, t, zero, idx, val, cap);
  }
  out->idx.resize(base + c);
  out->val.resize(base + c);
  if (!s->Fetch(out->idx.data() + base, idx, c * 4).ok() ||
      !s->Fetch(out->val.data() + base, val, c * 4).ok()) {
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
    auto* idx = Slot<uint32_t>(s, kIdxSlot, k * 4);
    auto* val = Slot<float>(s, kValSlot, k * 4);
    if (idx == nullptr || val == nullptr) return 0;
    const size_t w = p->TopK(acc + begin, end - begin, k, idx, val);
    out->idx.resize(base + w);
    out->val.resize(base + w);
    if (!s->Fetch(out->idx.data() + base, idx, w * 4).ok() ||
        !s->Fetch(out->val.data() + base, val, w * 4).ok()) {
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
    const auto* dval = static_cast<const float*>(
        s->Upload(kHostInSlot, out->val.data() + from, m * 4).value_or(nullptr));
    auto* dpos = Slot<uint32_t>(s, kIdxSlot, k * 4);
    auto* dv = Slot<float>(s, kValSlot, k * 4);
    if (dval == nullptr || dpos == nullptr || dv == nullptr) return m;
    w = p->TopK(dval, m, k, dpos, dv);
    if (!s->Fetch(pos.data(), dpos, w * 4).ok() || !s->Fetch(v.data(), dv, w * 4).ok()) return m;
  }
  for (size_t j = 0; j < w; ++j) {  // pos is ascending, so j <= pos[j]: in place is safe
    out->idx[from + j] = out->idx[from + pos[j]];
    out->val[from + j] = v[j];
  }
  out->idx.resize(from + w);
  out->val.resize(from + w);
  return w;
}

void AccumulateOutside(Primitives* p, float* acc, const float* add, size_t n, size_t skip_begin,
                       size_t skip_end) {
  if (add == nullptr) return;
  skip_begin = std::min(skip_begin, n);
  skip_end = std::min(std::max(skip_end, skip_begin), n);
  if (skip_begin > 0) p->Accumulate(acc, add, skip_begin);
  if (skip_end < n) p->Accumulate(acc + skip_end, add + skip_end, n - skip_end);
}

}  // namespace spex
