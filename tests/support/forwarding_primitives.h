// A Primitives that forwards every pure virtual call to another one: the base of the tests'
// primitives that claim another device, inject a fault or count copies, which override only the
// calls they change. The calls with a default in Primitives (SumScaled, Copy, CopyToHost, ...)
// keep that default unless a derived class overrides them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "kernels/primitives.h"

namespace spex::test {

class ForwardingPrimitives : public Primitives {
 public:
  // Forwards to `inner` and owns it.
  explicit ForwardingPrimitives(std::unique_ptr<Primitives> inner) : inner_(std::move(inner)) {}
  Primitives* inner() const { return inner_.get(); }

  Device device() const override { return inner_->device(); }
  void Accumulate(float* y, const float* x, size_t n) override { inner_->Accumulate(y, x, n); }
  void Scale(float* x, float a, size_t n) override { inner_->Scale(x, a, n); }
  size_t CountAbove(const float* x, size_t n, float t) override {
    return inner_->CountAbove(x, n, t);
  }
  size_t SelectAbove(float* x, size_t b, size_t e, float t, bool z, uint32_t* i, float* v,
                     size_t c) override {
    return inner_->SelectAbove(x, b, e, t, z, i, v, c);
  }
  size_t AddSelectAbove(float* acc, const float* add, size_t b, size_t e, float t, bool z,
                        uint32_t* i, float* v, size_t c) override {
    return inner_->AddSelectAbove(acc, add, b, e, t, z, i, v, c);
  }
  size_t TopK(const float* x, size_t n, size_t k, uint32_t* i, float* v) override {
    return inner_->TopK(x, n, k, i, v);
  }
  AbsMoments Moments(const float* x, size_t n, float lb) override {
    return inner_->Moments(x, n, lb);
  }
  void Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) override {
    inner_->Sample(x, n, m, seed, out);
  }
  absl::Status ScatterAdd(float* y, size_t n, const uint32_t* i, const float* v,
                          size_t m) override {
    return inner_->ScatterAdd(y, n, i, v, m);
  }
  absl::Status Gather(const float* x, size_t n, const uint32_t* i, size_t m, float* out) override {
    return inner_->Gather(x, n, i, m, out);
  }
  absl::Status ZeroAt(float* x, size_t n, const uint32_t* i, size_t m) override {
    return inner_->ZeroAt(x, n, i, m);
  }
  void AbsHistogram16(const float* x, size_t b, size_t e, uint32_t* bins) override {
    inner_->AbsHistogram16(x, b, e, bins);
  }

 private:
  std::unique_ptr<Primitives> inner_;
};

}  // namespace spex::test
