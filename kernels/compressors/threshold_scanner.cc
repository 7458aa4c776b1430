// Count and select probes at several thresholds in few passes over one buffer
// (threshold_scanner.h).
#include "kernels/compressors/threshold_scanner.h"

#include <algorithm>
#include <cmath>

#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/selection.h"

namespace spex {

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
    auto* idx = static_cast<uint32_t*>(s->Get(kIdxSlot, cap_ * 4).value_or(nullptr));
    auto* val = static_cast<float*>(s->Get(kValSlot, cap_ * 4).value_or(nullptr));
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
      if (s->Fetch(scan_idx_.data(), idx, c * 4).ok() &&
          s->Fetch(scan_val_.data(), val, c * 4).ok()) {
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

}  // namespace spex
