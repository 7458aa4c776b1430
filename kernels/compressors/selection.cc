// Threshold and top-k selection into a Selection over Primitives (selection.h).
#include "kernels/compressors/selection.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/status_macros.h"
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
  // One slot as [indices (cap) | values (cap)]: when the count is the capacity (a count known
  // beforehand), the pairs come out in one copy.
  auto* idx = Slot<uint32_t>(s, kIdxSlot, cap * 8);
  if (idx == nullptr) return 0;
  auto* val = reinterpret_cast<float*>(idx + cap);
  size_t c = add ? p->AddSelectAbove(acc, add, begin, end, t, zero, idx, val, cap)
                 : p->SelectAbove(acc, begin, end, t, zero, idx, val, cap);
  if (c > cap) {  // as AppendAbove below
    if (zero) (void)p->ScatterAdd(acc, end, idx, val, cap);
    cap = c;
    idx = Slot<uint32_t>(s, kIdxSlot, cap * 8);
    if (idx == nullptr) return 0;
    val = reinterpret_cast<float*>(idx + cap);
    c = p->SelectAbove(acc, begin, end, t, zero, idx, val, cap);
  }
  return AppendPairsFromDevice(s, idx, val, c, out).ok() ? c : 0;
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
    // [indices | values] in one slot: TopK writes k of each, so one copy brings them out.
    auto* idx = Slot<uint32_t>(s, kIdxSlot, k * 8);
    if (idx == nullptr) return 0;
    auto* val = reinterpret_cast<float*>(idx + k);
    const size_t w = p->TopK(acc + begin, end - begin, k, idx, val);
    if (!AppendPairsFromDevice(s, idx, val, w, out).ok()) return 0;
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

absl::Status AppendPairsFromDevice(Scratch* s, const uint32_t* idx, const float* val, size_t m,
                                   Selection* out) {
  if (m == 0) return absl::OkStatus();
  absl::StatusOr<void*> h = s->HostStaging(m * 8);
  if (!h.ok()) return h.status();  // kept in s
  auto* hidx = static_cast<uint32_t*>(*h);
  auto* hval = reinterpret_cast<float*>(hidx + m);
  if (reinterpret_cast<const void*>(val) == reinterpret_cast<const void*>(idx + m)) {
    SPEX_RETURN_IF_ERROR(s->Fetch(hidx, idx, m * 8));
  } else {
    SPEX_RETURN_IF_ERROR(s->Fetch(hidx, idx, m * 4));
    SPEX_RETURN_IF_ERROR(s->Fetch(hval, val, m * 4));
  }
  out->idx.insert(out->idx.end(), hidx, hidx + m);
  out->val.insert(out->val.end(), hval, hval + m);
  return absl::OkStatus();
}

size_t AppendAboveTopDevice(Primitives* p, const float* acc, size_t begin, size_t end, float t,
                            size_t count, size_t keep, Selection* out, Scratch* s) {
  if (end <= begin || count == 0 || keep == 0) return 0;
  // Every entry >= t into [indices (count) | values (count)]; nothing is zeroed, so casting away
  // const is safe.
  auto* idx = Slot<uint32_t>(s, kIdxSlot, count * 8);
  if (idx == nullptr) return 0;
  auto* val = reinterpret_cast<float*>(idx + count);
  const size_t c = p->SelectAbove(const_cast<float*>(acc), begin, end, t, false, idx, val, count);
  if (c > count) {
    s->Fail(absl::InternalError(absl::StrCat("device selection: ", c, " entries at or above ",
                                             "the histogram's edge, which counted ", count,
                                             " (a bug)")));
    return 0;
  }
  const uint32_t* kidx = idx;
  const float* kval = val;
  size_t m = c;
  if (keep < c) {
    // The exact top `keep` of the candidates' values, their positions ascending; the indices at
    // those positions are gathered beside them ([indices | values] again, for one copy). Gather
    // moves 32-bit words, so it carries the uint32 indices unchanged.
    auto* pos = Slot<uint32_t>(s, kHostInSlot, keep * 4);
    auto* top = Slot<uint32_t>(s, kValSlot, keep * 8);
    if (pos == nullptr || top == nullptr) return 0;
    auto* top_val = reinterpret_cast<float*>(top + keep);
    m = p->TopK(val, c, keep, pos, top_val);
    absl::Status g =
        p->Gather(reinterpret_cast<const float*>(idx), c, pos, m, reinterpret_cast<float*>(top));
    if (!g.ok()) {
      s->Fail(g);
      return 0;
    }
    kidx = top;
    kval = m == keep ? top_val : nullptr;
    if (kval == nullptr) {  // TopK wrote fewer than asked (not expected: c > keep)
      s->Fail(absl::InternalError("device selection: TopK wrote fewer entries than asked"));
      return 0;
    }
  }
  if (!AppendPairsFromDevice(s, kidx, kval, m, out).ok()) return 0;
  return c;
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
