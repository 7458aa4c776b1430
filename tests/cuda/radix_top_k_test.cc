// The top-k control logic the CUDA primitives run (kernels/cuda/radix_top_k.h), driven here by
// a plain CPU implementation of its three passes and compared with kernels/reference's TopK:
// random data, heavy ties, NaN/Inf/-0, every k from 0 past n. Also: miscounting passes are
// reported as errors, never as a wrong answer.
#include "kernels/cuda/radix_top_k.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_math.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/cuda/test_data.h"

namespace spex {
namespace {

using testdata::AddSpecials;
using testdata::Gradient;
using testdata::Quantized;
using testdata::SameBits;

// The passes as loops over host memory (what the CUDA kernels compute in parallel).
class HostPasses : public gpu::RadixTopKPasses {
 public:
  HostPasses(const std::vector<float>& x, uint32_t* idx, float* val)
      : x_(x), idx_(idx), val_(val) {}

  absl::Status HighDigitHistogram(uint64_t* counts) override {
    ++histograms;
    std::fill(counts, counts + gpu::kDigitBins, 0);
    for (float v : x_) counts[gpu::MagnitudeKey(v) >> 16]++;
    return absl::OkStatus();
  }
  absl::Status LowDigitHistogram(uint32_t high, uint64_t* counts) override {
    ++histograms;
    std::fill(counts, counts + gpu::kDigitBins, 0);
    for (float v : x_) {
      const uint32_t key = gpu::MagnitudeKey(v);
      if ((key >> 16) == high) counts[key & 0xffff] += 1 + miscount_low;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<size_t> Collect(uint32_t threshold, uint64_t take, uint64_t ties) override {
    uint64_t rank = 0;
    size_t written = 0;
    for (size_t i = 0; i < x_.size(); ++i) {
      const uint32_t key = gpu::MagnitudeKey(x_[i]);
      bool in = key > threshold;
      if (key == threshold) in = take >= ties || rank++ < take;
      if (in) {
        idx_[written] = static_cast<uint32_t>(i);
        val_[written] = x_[i];
        ++written;
      }
    }
    return written;
  }

  int histograms = 0;
  int miscount_low = 0;

 private:
  const std::vector<float>& x_;
  uint32_t* idx_;
  float* val_;
};

void ExpectSameTopK(const std::vector<float>& x, size_t k) {
  SCOPED_TRACE(::testing::Message() << "n=" << x.size() << " k=" << k);
  auto ref = MakeReferencePrimitives();
  const size_t room = std::min(k, x.size());
  std::vector<uint32_t> ie(room + 1, 7), io(room + 1, 7);
  std::vector<float> ve(room + 1, 7.0f), vo(room + 1, 7.0f);
  const size_t expected = ref->TopK(x.data(), x.size(), k, ie.data(), ve.data());
  HostPasses passes(x, io.data(), vo.data());
  absl::StatusOr<size_t> got = gpu::RadixTopK(x.size(), k, passes);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(*got, expected);
  EXPECT_EQ(io, ie);
  EXPECT_TRUE(SameBits(vo, ve));
  // k == n (and k == 0) need no histogram pass.
  if (room == x.size() || room == 0) {
    EXPECT_EQ(passes.histograms, 0);
  }
}

TEST(RadixTopK, MatchesReferenceOnGradients) {
  for (size_t n : {size_t{1}, size_t{2}, size_t{31}, size_t{1000}, size_t{70001}}) {
    const std::vector<float> x = Gradient(n, static_cast<uint32_t>(n));
    for (size_t k : {size_t{0}, size_t{1}, n / 1000, n / 7, n / 2, n - 1, n, n + 5}) {
      ExpectSameTopK(x, k);
    }
  }
}

TEST(RadixTopK, MatchesReferenceWithSpecials) {
  for (size_t n : {size_t{10}, size_t{999}, size_t{50000}}) {
    std::vector<float> x = Gradient(n, 11);
    AddSpecials(&x, 12);
    for (size_t k : {size_t{1}, size_t{3}, n / 100, n / 2, n - 3, n}) ExpectSameTopK(x, k);
  }
}

TEST(RadixTopK, TiesGoToTheLowerIndex) {
  // 9 magnitudes over 20000 entries: the k-th key is tied thousands of times.
  const std::vector<float> x = Quantized(20000, 5, 4);
  for (size_t k : {size_t{1}, size_t{100}, size_t{2222}, size_t{10000}, size_t{19999}}) {
    ExpectSameTopK(x, k);
  }
  ExpectSameTopK(std::vector<float>(5000, -1.5f), 1234);  // every entry tied
  std::vector<float> nans(300, testdata::kNaN);
  nans[17] = 0.0f;
  ExpectSameTopK(nans, 5);  // one number, then NaNs lowest index first
}

TEST(RadixTopK, ChooseDigitFindsTheBoundary) {
  std::vector<uint64_t> counts(gpu::kDigitBins, 0);
  counts[10] = 5;
  counts[7] = 3;
  counts[0] = 2;
  absl::StatusOr<gpu::DigitChoice> c = gpu::ChooseDigit(counts.data(), 0, 5);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->digit, 10u);
  EXPECT_EQ(c->above, 0u);
  c = gpu::ChooseDigit(counts.data(), 0, 6);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->digit, 7u);
  EXPECT_EQ(c->above, 5u);
  EXPECT_EQ(c->in_digit, 3u);
  c = gpu::ChooseDigit(counts.data(), 100, 110);  // 100 known above, 10 more needed: digit 0
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->digit, 0u);
  EXPECT_EQ(c->above, 108u);
  EXPECT_EQ(gpu::ChooseDigit(counts.data(), 0, 11).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(gpu::ChooseDigit(counts.data(), 5, 5).status().code(), absl::StatusCode::kInternal);
}

TEST(RadixTopK, InconsistentPassesAreAnError) {
  const std::vector<float> x = Gradient(5000, 21);
  std::vector<uint32_t> idx(100);
  std::vector<float> val(100);
  HostPasses passes(x, idx.data(), val.data());
  passes.miscount_low = 1;  // the second pass disagrees with the first
  absl::StatusOr<size_t> got = gpu::RadixTopK(x.size(), 100, passes);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(got.status().message().find("second"), std::string::npos) << got.status();
}

// The device's digit choice (device_math.h PickChunk + PickInChunk, what PickDigitKernel runs in
// one block) equals ChooseDigit on every histogram and k: sparse, dense, one full bin, empty
// chunks, k at every chunk edge, and the refusals (k <= above, too few entries).
TEST(RadixTopK, TheDeviceDigitChoiceMatchesChooseDigit) {
  uint64_t seed = 7;
  auto next = [&seed] { return SplitMix64(&seed); };
  for (int shape = 0; shape < 4; ++shape) {
    std::vector<unsigned long long> counts(gpu::kDigitBins, 0);
    for (size_t d = 0; d < counts.size(); ++d) {
      const uint64_t r = next();
      if (shape == 0) counts[d] = r % 97 == 0 ? r % 5 : 0;                    // sparse
      if (shape == 1) counts[d] = r % 3;                                      // dense
      if (shape == 3) counts[d] = (d / gpu::kPickBins) % 3 == 1 ? r % 4 : 0;  // empty chunks
    }
    if (shape == 2) counts[12345] = 1000;  // one full bin
    std::vector<uint64_t> as64(counts.begin(), counts.end());
    std::vector<unsigned long long> partial(gpu::kPickChunks, 0);
    uint64_t all = 0;
    for (size_t d = 0; d < counts.size(); ++d) {
      partial[d / gpu::kPickBins] += counts[d];
      all += counts[d];
    }
    std::vector<uint64_t> ks = {1, 2, all / 3, all / 2, all - 1, all, all + 1};
    uint64_t edge = 0;  // k just at and past each chunk's top
    for (uint32_t c = gpu::kPickChunks; c-- > 0 && ks.size() < 200;) {
      edge += partial[c];
      ks.push_back(edge);
      ks.push_back(edge + 1);
    }
    for (uint64_t above : {uint64_t{0}, uint64_t{17}}) {
      for (uint64_t k0 : ks) {
        const uint64_t k = k0 + above;
        SCOPED_TRACE(testing::Message() << "shape " << shape << " above " << above << " k " << k);
        absl::StatusOr<gpu::DigitChoice> want = gpu::ChooseDigit(as64.data(), above, k);
        uint64_t seen = 0, total = 0;
        const uint32_t c = gpu::PickChunk(partial.data(), above, k, &seen, &total);
        gpu::DigitPick got;
        if (c < gpu::kPickChunks) got = gpu::PickInChunk(counts.data(), c, seen, k, total);
        EXPECT_EQ(total, all);
        ASSERT_EQ(got.ok != 0, want.ok());
        if (!want.ok()) continue;
        EXPECT_EQ(got.digit, want->digit);
        EXPECT_EQ(got.above, want->above);
        EXPECT_EQ(got.in_digit, want->in_digit);
      }
      // k <= above: no digit.
      uint64_t seen = 0, total = 0;
      if (above > 0)
        EXPECT_EQ(gpu::PickChunk(partial.data(), above, above, &seen, &total), gpu::kPickChunks);
    }
  }
}

}  // namespace
}  // namespace spex
