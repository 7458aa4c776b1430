// Every primitive of the CUDA implementation against kernels/reference, through one suite that
// is parameterised by device: "cuda" (MakeCudaPrimitives, device memory) and "cpu" (the CPU
// primitives on host memory, which keeps the suite itself exercised on machines without a
// GPU). The cuda cases GTEST_SKIP with the reason where no GPU is usable or the build has no
// CUDA (plain `bazel test`); under --config=cuda on a GPU machine they run.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"
#include "kernels/primitives.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/cuda/test_data.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_primitives.h"
#endif

namespace spex {
namespace {

using testdata::AddSpecials;
using testdata::Gradient;
using testdata::kInf;
using testdata::kNaN;
using testdata::Quantized;
using testdata::SameBits;

constexpr size_t kSizes[] = {0, 1, 33, 4099, (1u << 18) + 3};

// Memory of the device under test: allocations live as long as the object.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual void* Alloc(size_t bytes) = 0;
  virtual void ToDevice(void* dst, const void* src, size_t bytes) = 0;
  virtual void ToHost(void* dst, const void* src, size_t bytes) = 0;

  template <typename T>
  T* Put(const std::vector<T>& v, size_t extra = 0) {
    T* p = static_cast<T*>(Alloc((v.size() + extra) * sizeof(T) + 1));
    if (!v.empty()) ToDevice(p, v.data(), v.size() * sizeof(T));
    return p;
  }
  template <typename T>
  std::vector<T> Get(const T* p, size_t n) {
    std::vector<T> v(n);
    if (n > 0) ToHost(v.data(), p, n * sizeof(T));
    return v;
  }
};

class HostMemory : public Memory {
 public:
  ~HostMemory() override {
    for (void* p : blocks_) std::free(p);
  }
  void* Alloc(size_t bytes) override { return blocks_.emplace_back(std::malloc(bytes)); }
  void ToDevice(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void ToHost(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

 private:
  std::vector<void*> blocks_;
};

#ifdef SPEX_HAVE_CUDA
class CudaMemory : public Memory {
 public:
  ~CudaMemory() override {
    for (void* p : blocks_) cudaFree(p);
  }
  void* Alloc(size_t bytes) override {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    return blocks_.emplace_back(p);
  }
  // cudaMemcpy from pageable memory may return before its DMA has landed, and it is ordered
  // only on the legacy default stream, while the primitives run on a non-blocking stream of
  // their own: without the synchronise, a kernel may read the buffer before it is written
  // (first seen on an H200: AbsHistogram16 counted zeros, AddSelectAbove missed hits at 2^18).
  void ToDevice(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void ToHost(void* dst, const void* src, size_t bytes) override {
    EXPECT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  std::vector<void*> blocks_;
};
#endif

class DevicePrimitivesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ref_ = MakeReferencePrimitives();
    if (GetParam() == "cpu") {
      p_ = MakeCpuPrimitives(2);
      mem_ = std::make_unique<HostMemory>();
      return;
    }
    absl::Status s = MakeCudaPrimitives(&p_);
    if (!s.ok()) {
      // Without --config=cuda: Unimplemented; without a usable GPU: FailedPrecondition naming
      // the CUDA error. Either way there is nothing to run the kernels on.
      EXPECT_TRUE(s.code() == absl::StatusCode::kUnimplemented ||
                  s.code() == absl::StatusCode::kFailedPrecondition)
          << s;
      GTEST_SKIP() << "CUDA primitives unavailable here: " << s.message();
    }
    ASSERT_EQ(p_->device(), Device::kCuda);
#ifdef SPEX_HAVE_CUDA
    mem_ = std::make_unique<CudaMemory>();
#endif
  }

  void TearDown() override {
#ifdef SPEX_HAVE_CUDA
    if (p_ != nullptr && p_->device() == Device::kCuda) {
      EXPECT_TRUE(CudaPrimitivesError(*p_).ok());
    }
#endif
  }

  // SelectAbove (add == nullptr) or AddSelectAbove on both; compares the count, the written
  // entries, the sentinel past the capacity and the buffer afterwards.
  void CheckSelect(const std::vector<float>& x0, const std::vector<float>* add, size_t begin,
                   size_t end, float t, bool zero, size_t capacity) {
    SCOPED_TRACE(::testing::Message()
                 << "n=" << x0.size() << " [" << begin << "," << end << ") t=" << t
                 << " zero=" << zero << " cap=" << capacity << " add=" << (add != nullptr));
    std::vector<float> xr = x0;
    std::vector<uint32_t> ir(capacity + 1, 7);
    std::vector<float> vr(capacity + 1, 7.0f);
    float* x = mem_->Put(x0);
    uint32_t* idx = mem_->Put(ir);
    float* val = mem_->Put(vr);
    size_t got, expected;
    if (add != nullptr) {
      got = p_->AddSelectAbove(x, mem_->Put(*add), begin, end, t, zero, idx, val, capacity);
      expected = ref_->AddSelectAbove(xr.data(), add->data(), begin, end, t, zero, ir.data(),
                                      vr.data(), capacity);
    } else {
      got = p_->SelectAbove(x, begin, end, t, zero, idx, val, capacity);
      expected = ref_->SelectAbove(xr.data(), begin, end, t, zero, ir.data(), vr.data(), capacity);
    }
    ASSERT_EQ(got, expected);
    const size_t written = std::min(expected, capacity);
    const std::vector<uint32_t> ig = mem_->Get(idx, capacity + 1);
    const std::vector<float> vg = mem_->Get(val, capacity + 1);
    EXPECT_TRUE(std::equal(ir.begin(), ir.begin() + written, ig.begin()));
    EXPECT_TRUE(SameBits(vg.data(), vr.data(), written));
    EXPECT_EQ(ig.back(), 7u) << "wrote past the capacity";
    EXPECT_EQ(vg.back(), 7.0f) << "wrote past the capacity";
    EXPECT_TRUE(SameBits(mem_->Get(x, x0.size()), xr));
  }

  std::unique_ptr<Primitives> p_, ref_;
  std::unique_ptr<Memory> mem_;
};

float Quantile(const std::vector<float>& x, double fraction) {
  std::vector<float> a;
  for (float v : x) {
    if (!std::isnan(v)) a.push_back(std::fabs(v));
  }
  if (a.empty()) return 1.0f;
  const size_t pos = std::min(a.size() - 1, static_cast<size_t>((1.0 - fraction) * a.size()));
  std::nth_element(a.begin(), a.begin() + pos, a.end());
  return a[pos];
}

TEST_P(DevicePrimitivesTest, AccumulateAndScale) {
  for (size_t n : kSizes) {
    std::vector<float> y = Gradient(n, 1), x = Gradient(n, 2);
    AddSpecials(&x, 3);
    float* dy = mem_->Put(y);
    float* dx = mem_->Put(x);
    ref_->Accumulate(y.data(), x.data(), n);
    p_->Accumulate(dy, dx, n);
    EXPECT_TRUE(SameBits(mem_->Get(dy, n), y)) << "Accumulate n=" << n;
    ref_->Scale(y.data(), -0.37f, n);
    p_->Scale(dy, -0.37f, n);
    EXPECT_TRUE(SameBits(mem_->Get(dy, n), y)) << "Scale n=" << n;
    if (n > 8) {  // unaligned start and odd length (the vector path's tail)
      p_->Accumulate(dy + 1, dx + 2, n - 5);
      ref_->Accumulate(y.data() + 1, x.data() + 2, n - 5);
      EXPECT_TRUE(SameBits(mem_->Get(dy, n), y)) << "unaligned Accumulate n=" << n;
    }
  }
}

// Copy, Fill and the staging copies the daemon's engine moves bucket data with; the reference
// (the interface's host-memory defaults) gives the same results.
TEST_P(DevicePrimitivesTest, CopyFillAndStaging) {
  for (size_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<float> x = Gradient(n, 11);
    AddSpecials(&x, 12);
    float* dx = mem_->Put(x);
    float* dy = mem_->Put(std::vector<float>(n + 1, 7.0f));
    ASSERT_TRUE(p_->Copy(dy, dx, n).ok());
    EXPECT_TRUE(SameBits(mem_->Get(dy, n), x));
    EXPECT_EQ(mem_->Get(dy, n + 1).back(), 7.0f) << "Copy wrote past n";
    for (float v : {0.0f, -0.0f, 2.5f, kInf}) {
      ASSERT_TRUE(p_->Fill(dy, v, n).ok());
      EXPECT_TRUE(SameBits(mem_->Get(dy, n), std::vector<float>(n, v))) << "Fill " << v;
      EXPECT_EQ(mem_->Get(dy, n + 1).back(), 7.0f) << "Fill wrote past n";
    }
    // Staging: device -> host and back, whole floats and an odd byte count.
    std::vector<float> host(n + 1, 3.0f);
    ASSERT_TRUE(p_->CopyToHost(host.data(), dx, n * sizeof(float)).ok());
    EXPECT_TRUE(SameBits(host.data(), x.data(), n));
    EXPECT_EQ(host[n], 3.0f);
    const std::vector<float> z = Gradient(n, 13);
    ASSERT_TRUE(p_->CopyFromHost(dy, z.data(), n * sizeof(float)).ok());
    EXPECT_TRUE(SameBits(mem_->Get(dy, n), z));
    if (n > 0) {
      std::vector<uint8_t> bytes(n * sizeof(float) - 1, 0);
      ASSERT_TRUE(p_->CopyToHost(bytes.data(), dy, bytes.size()).ok());
      EXPECT_EQ(std::memcmp(bytes.data(), z.data(), bytes.size()), 0);
    }
    // The reference uses the interface's defaults.
    std::vector<float> r(n, 1.0f);
    ASSERT_TRUE(ref_->Copy(r.data(), x.data(), n).ok());
    EXPECT_TRUE(SameBits(r, x));
    ASSERT_TRUE(ref_->Fill(r.data(), -1.5f, n).ok());
    EXPECT_TRUE(SameBits(r, std::vector<float>(n, -1.5f)));
    ASSERT_TRUE(ref_->CopyFromHost(r.data(), z.data(), n * sizeof(float)).ok());
    EXPECT_TRUE(SameBits(r, z));
  }
  EXPECT_TRUE(p_->Health().ok()) << p_->Health();
  EXPECT_TRUE(ref_->Health().ok());
}

TEST_P(DevicePrimitivesTest, CountAbove) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 4);
    AddSpecials(&x, 5);
    float* dx = mem_->Put(x);
    for (float t : {-1.0f, 0.0f, Quantile(x, 0.01), Quantile(x, 0.3), kInf, kNaN}) {
      EXPECT_EQ(p_->CountAbove(dx, n, t), ref_->CountAbove(x.data(), n, t))
          << "n=" << n << " t=" << t;
    }
  }
}

TEST_P(DevicePrimitivesTest, SelectAbove) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 6);
    const float t = Quantile(x, 0.05);
    const size_t count = ref_->CountAbove(x.data(), n, t);
    for (bool zero : {false, true}) CheckSelect(x, nullptr, 0, n, t, zero, n);
    CheckSelect(x, nullptr, 0, n, 0.0f, true, n);
    for (size_t cap : {size_t{0}, size_t{1}, count / 2, count > 0 ? count - 1 : 0}) {
      CheckSelect(x, nullptr, 0, n, t, true, cap);
    }
    if (n > 10) CheckSelect(x, nullptr, 3, n - 5, t, true, n);
    if (n > 10) CheckSelect(x, nullptr, n / 2, n / 2, t, true, n);  // empty range
    AddSpecials(&x, 7);
    for (float ts : {0.0f, t, kInf, kNaN}) CheckSelect(x, nullptr, 0, n, ts, true, n);
  }
}

TEST_P(DevicePrimitivesTest, AddSelectAbove) {
  for (size_t n : kSizes) {
    const std::vector<float> acc = Gradient(n, 8), add = Gradient(n, 9);
    const float t = Quantile(acc, 0.01);
    for (bool zero : {false, true}) CheckSelect(acc, &add, 0, n, t, zero, n);
    CheckSelect(acc, &add, 0, n, t, true, n / 4);
    if (n > 10) CheckSelect(acc, &add, 5, n - 3, t, true, n / 4);
  }
}

TEST_P(DevicePrimitivesTest, TopK) {
  for (size_t n : kSizes) {
    for (int kind = 0; kind < 3; ++kind) {
      std::vector<float> x = kind == 1 ? Quantized(n, 10, 5) : Gradient(n, 11);
      if (kind == 2) AddSpecials(&x, 12);
      float* dx = mem_->Put(x);
      for (size_t k : {size_t{0}, size_t{1}, n / 1000, n / 3, n > 0 ? n - 1 : 0, n, n + 3}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " kind=" << kind << " k=" << k);
        const size_t room = std::min(k, n);
        std::vector<uint32_t> ir(room);
        std::vector<float> vr(room);
        const size_t expected = ref_->TopK(x.data(), n, k, ir.data(), vr.data());
        uint32_t* idx = mem_->Put(ir);
        float* val = mem_->Put(vr);
        ASSERT_EQ(p_->TopK(dx, n, k, idx, val), expected);
        EXPECT_EQ(mem_->Get(idx, room), ir);
        EXPECT_TRUE(SameBits(mem_->Get(val, room), vr));
      }
    }
  }
}

TEST_P(DevicePrimitivesTest, Moments) {
  for (size_t n : kSizes) {
    for (bool specials : {false, true}) {
      std::vector<float> x = Gradient(n, 13);
      if (specials) AddSpecials(&x, 14);
      float* dx = mem_->Put(x);
      for (float lb : {-1.0f, 0.0f, Quantile(x, 0.1), kNaN}) {
        SCOPED_TRACE(::testing::Message() << "n=" << n << " specials=" << specials << " lb=" << lb);
        const AbsMoments e = ref_->Moments(x.data(), n, lb);
        const AbsMoments g = p_->Moments(dx, n, lb);
        EXPECT_EQ(g.count, e.count);
        EXPECT_EQ(g.log_count, e.log_count);
        EXPECT_EQ(g.max, e.max);
        // The CUDA kernels take double logs (only the summation order differs from the
        // reference); the CPU primitives use a faster log good to about 1e-7.
        const double log_tolerance = GetParam() == "cpu" ? 1e-6 : 1e-9;
        for (auto [got, want, tolerance] :
             {std::tuple{g.sum, e.sum, 1e-9}, std::tuple{g.sum_sq, e.sum_sq, 1e-9},
              std::tuple{g.sum_log, e.sum_log, log_tolerance}}) {
          if (std::isfinite(want)) {
            EXPECT_NEAR(got, want, tolerance * std::max(1.0, std::fabs(want)));
          } else {
            EXPECT_EQ(got, want);
          }
        }
      }
    }
  }
}

TEST_P(DevicePrimitivesTest, SampleIsTheSameEverywhere) {
  for (size_t n : kSizes) {
    const std::vector<float> x = Gradient(n, 15);
    float* dx = mem_->Put(x);
    for (uint64_t seed : {uint64_t{0}, uint64_t{99}, ~uint64_t{0}}) {
      std::vector<float> want(1001);
      ref_->Sample(x.data(), n, want.size(), seed, want.data());
      float* out = mem_->Put(std::vector<float>(want.size(), 5.0f));
      p_->Sample(dx, n, want.size(), seed, out);
      EXPECT_TRUE(SameBits(mem_->Get(out, want.size()), want)) << "n=" << n << " seed=" << seed;
    }
  }
}

TEST_P(DevicePrimitivesTest, IndexedOpsAndTheirValidation) {
  const size_t n = 100003;
  const std::vector<float> x = Gradient(n, 16);
  std::vector<uint32_t> idx;
  for (uint32_t i = 3; i < n; i += 7) idx.push_back(i);  // distinct: exact sums
  std::vector<float> val = Gradient(idx.size(), 17);
  float* dx = mem_->Put(x);
  uint32_t* di = mem_->Put(idx);
  float* dv = mem_->Put(val);

  std::vector<float> y = x;
  ASSERT_TRUE(ref_->ScatterAdd(y.data(), n, idx.data(), val.data(), idx.size()).ok());
  float* dy = mem_->Put(x);
  ASSERT_TRUE(p_->ScatterAdd(dy, n, di, dv, idx.size()).ok());
  EXPECT_TRUE(SameBits(mem_->Get(dy, n), y));

  std::vector<float> gathered(idx.size());
  ASSERT_TRUE(ref_->Gather(x.data(), n, idx.data(), idx.size(), gathered.data()).ok());
  float* dg = mem_->Put(std::vector<float>(idx.size()));
  ASSERT_TRUE(p_->Gather(dx, n, di, idx.size(), dg).ok());
  EXPECT_TRUE(SameBits(mem_->Get(dg, idx.size()), gathered));

  std::vector<float> z = x;
  ASSERT_TRUE(ref_->ZeroAt(z.data(), n, idx.data(), idx.size()).ok());
  float* dz = mem_->Put(x);
  ASSERT_TRUE(p_->ZeroAt(dz, n, di, idx.size()).ok());
  EXPECT_TRUE(SameBits(mem_->Get(dz, n), z));

  // One bad index (and a later one): nothing written, the same message as the reference.
  std::vector<uint32_t> bad = idx;
  bad[500] = static_cast<uint32_t>(n);
  bad[900] = 0xffffffffu;
  uint32_t* dbad = mem_->Put(bad);
  std::vector<float> yr = x;
  const absl::Status want = ref_->ScatterAdd(yr.data(), n, bad.data(), val.data(), bad.size());
  float* dy2 = mem_->Put(x);
  const absl::Status got = p_->ScatterAdd(dy2, n, dbad, dv, bad.size());
  EXPECT_EQ(got, want);
  EXPECT_TRUE(SameBits(mem_->Get(dy2, n), x));
  EXPECT_EQ(p_->Gather(dx, n, dbad, bad.size(), dg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p_->ZeroAt(dy2, n, dbad, bad.size()),
            ref_->ZeroAt(yr.data(), n, bad.data(), bad.size()));
  EXPECT_TRUE(SameBits(mem_->Get(dy2, n), x));
  EXPECT_TRUE(p_->ScatterAdd(dy2, n, dbad, dv, 0).ok());  // m == 0 checks nothing
}

TEST_P(DevicePrimitivesTest, ScatterAddWithRepeatedIndices) {
  const size_t n = 1000;
  std::vector<uint32_t> idx(50000);
  for (size_t j = 0; j < idx.size(); ++j) idx[j] = static_cast<uint32_t>((j * 7919) % n);
  const std::vector<float> val = Gradient(idx.size(), 18);
  std::vector<float> y(n, 1.0f);
  float* dy = mem_->Put(y);
  ASSERT_TRUE(ref_->ScatterAdd(y.data(), n, idx.data(), val.data(), idx.size()).ok());
  ASSERT_TRUE(p_->ScatterAdd(dy, n, mem_->Put(idx), mem_->Put(val), idx.size()).ok());
  const std::vector<float> got = mem_->Get(dy, n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(got[i], y[i], 1e-4) << i;  // float atomics' order
}

TEST_P(DevicePrimitivesTest, AbsHistogram16AddsToTheBins) {
  for (size_t n : kSizes) {
    std::vector<float> x = Gradient(n, 19);
    AddSpecials(&x, 20);
    std::vector<uint32_t> bins(Primitives::kHistogramBins);
    for (size_t b = 0; b < bins.size(); b += 97) bins[b] = 3;  // added to, not cleared
    uint32_t* dbins = mem_->Put(bins);
    const size_t begin = n / 5, end = n - n / 7;
    ref_->AbsHistogram16(x.data(), begin, end, bins.data());
    p_->AbsHistogram16(mem_->Put(x), begin, end, dbins);
    EXPECT_EQ(mem_->Get(dbins, bins.size()), bins) << "n=" << n;
  }
}

// The half-precision passes (bfloat16/float16 buckets, docs/dtypes.md) against kernels/half.h's
// host passes, bit for bit: every half pattern widened; narrowing at every rounding boundary of
// float32 (each top-16-bit pattern with low bits at and around the bfloat16 and float16
// rounding points) and of gradients with NaN/Inf; the fused widen-and-sum with and without the
// residual, scaled or not, in place, with the non-finite check.
TEST_P(DevicePrimitivesTest, HalfPassesEqualKernelsHalf) {
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    std::vector<uint16_t> all(65536);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
    std::vector<float> want(all.size());
    half::Widen(t, all.data(), want.data(), all.size());
    float* wide = mem_->Put(std::vector<float>(all.size(), 7.0f));
    ASSERT_TRUE(p_->WidenHalf(t, mem_->Put(all), wide, all.size()).ok());
    EXPECT_TRUE(SameBits(mem_->Get(wide, all.size()), want)) << "WidenHalf";

    std::vector<float> x = Gradient(4099, 21);
    AddSpecials(&x, 22);
    for (uint32_t hi = 0; hi < 65536; ++hi) {
      for (uint32_t lo : {0x0000u, 0x0fffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
        uint32_t u = (hi << 16) | lo;
        float f;
        std::memcpy(&f, &u, 4);
        x.push_back(f);
      }
    }
    std::vector<uint16_t> narrow_want(x.size());
    half::Narrow(t, x.data(), narrow_want.data(), x.size());
    uint16_t* narrow = mem_->Put(std::vector<uint16_t>(x.size(), 7));
    ASSERT_TRUE(p_->NarrowHalf(t, mem_->Put(x), narrow, x.size()).ok());
    EXPECT_EQ(mem_->Get(narrow, x.size()), narrow_want) << "NarrowHalf";

    for (size_t n : kSizes) {
      std::vector<std::vector<uint16_t>> in(3, std::vector<uint16_t>(n));
      for (int r = 0; r < 3; ++r) {
        std::vector<float> g = Gradient(n, 30 + r);
        if (r == 2) AddSpecials(&g, 33);
        half::Narrow(t, g.data(), in[r].data(), n);
      }
      const std::vector<float> acc0 = Gradient(n, 34);
      for (bool with_acc : {false, true}) {
        for (float a : {1.0f, 0.25f, 1.0f / 3}) {
          for (bool check : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << "n=" << n << " acc=" << with_acc << " a=" << a << " check=" << check);
            const int count = with_acc ? 2 : 3;  // with the residual: the first two inputs
            const uint16_t* host_xs[3] = {in[0].data(), in[1].data(), in[2].data()};
            std::vector<float> y_want = acc0;  // in place over acc when with_acc
            const size_t bad_want = half::SumWidenScaled(
                t, y_want.data(), with_acc ? y_want.data() : nullptr, host_xs, count, a, n, check);
            const uint16_t* dev_xs[3] = {mem_->Put(in[0]), mem_->Put(in[1]), mem_->Put(in[2])};
            float* y = mem_->Put(acc0);
            size_t bad = 12345;
            ASSERT_TRUE(p_->SumWidenHalf(t, y, with_acc ? y : nullptr, dev_xs, count, a, n,
                                         check ? &bad : nullptr)
                            .ok());
            EXPECT_TRUE(SameBits(mem_->Get(y, n), y_want)) << "SumWidenHalf";
            if (check) EXPECT_EQ(bad, bad_want) << "first non-finite index";
          }
        }
      }
    }
  }
  EXPECT_TRUE(p_->Health().ok()) << p_->Health();
}

INSTANTIATE_TEST_SUITE_P(Devices, DevicePrimitivesTest, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// What MakeCudaPrimitives says on this machine.
TEST(MakeCudaPrimitives, ExplainsWhyItCannotRun) {
  std::unique_ptr<Primitives> p;
  const absl::Status s = MakeCudaPrimitives(&p);
#ifdef SPEX_HAVE_CUDA
  if (s.ok()) {
    EXPECT_EQ(p->device(), Device::kCuda);
    return;
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("cudaError"), std::string::npos) << s;
  EXPECT_EQ(MakeCudaPrimitivesOnDevice(0, &p).code(), absl::StatusCode::kFailedPrecondition);
#else
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("--config=cuda"), std::string::npos) << s;
#endif
  EXPECT_EQ(p, nullptr);
}

}  // namespace
}  // namespace spex
