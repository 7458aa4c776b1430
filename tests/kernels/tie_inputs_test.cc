// Inputs where magnitudes tie (issue 12 item 4b): a constant (both signs), all zeros, 2, 3 and 16
// distinct values, ramps and a huge entry over a constant rest. The exact top-k (the CPU TopK
// primitive on every one of its paths, and topk, gtopk, topk_union and cltk over it) must keep its
// tie rule there: the k largest magnitudes, ties at the k-th toward the lower index, checked
// against a stable sort. thresh must select exactly |acc| >= its threshold. Every registered
// compressor must give a valid selection on every kind (indices ascending, unique, < n, values
// read from acc).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_primitives.h"
#include "kernels/cpu/top_k.h"
#include "kernels/reference/reference_primitives.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

const char* const kKinds[] = {"constant",   "signs", "zero",     "distinct2", "distinct3",
                              "distinct16", "ramp",  "reversed", "spike"};

// Input of kind `kind`: values around `scale`.
std::vector<float> TieInput(const std::string& kind, size_t n, float scale = 1e-3f) {
  std::vector<float> x(n, scale);
  std::mt19937 gen(static_cast<uint32_t>(n));
  if (kind == "signs") {
    for (float& v : x) v = (gen() & 1) ? scale : -scale;
  } else if (kind == "zero") {
    std::fill(x.begin(), x.end(), 0.0f);
  } else if (kind.rfind("distinct", 0) == 0) {
    const uint32_t m = static_cast<uint32_t>(std::stoi(kind.substr(8)));
    for (float& v : x) v = scale * static_cast<float>(1 + gen() % m) * ((gen() & 1) ? 1 : -1);
  } else if (kind == "ramp" || kind == "reversed") {
    for (size_t i = 0; i < n; ++i) {
      const size_t j = kind == "ramp" ? i : n - 1 - i;
      x[i] = scale * static_cast<float>(j + 1) / static_cast<float>(n);
    }
  } else if (kind == "spike") {
    x[n / 2] = 1e6f * scale;  // one entry far above a constant rest
  }
  return x;
}

// The k largest |x| by a stable sort (equal magnitudes keep index order), ascending.
std::vector<uint32_t> SortedTopK(const std::vector<float>& x, size_t k) {
  std::vector<uint32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
  order.resize(std::min(k, x.size()));
  std::sort(order.begin(), order.end());
  return order;
}

// Ascending, unique, < n, and val[j] == x[idx[j]] bit for bit.
void ExpectValid(const Selection& sel, const std::vector<float>& x, const std::string& what) {
  ASSERT_EQ(sel.idx.size(), sel.val.size()) << what;
  for (size_t j = 0; j < sel.idx.size(); ++j) {
    ASSERT_LT(sel.idx[j], x.size()) << what << " position " << j;
    if (j > 0) ASSERT_LT(sel.idx[j - 1], sel.idx[j]) << what << " position " << j;
    ASSERT_EQ(std::memcmp(&sel.val[j], &x[sel.idx[j]], 4), 0) << what << " position " << j;
  }
}

// n above the CPU top-k's small-input cutoff (64K), so its sampled, histogram and large-bin paths
// all run, and one below it.
constexpr size_t kLarge = 100003, kSmall = 5003;

TEST(TieInputsTest, CpuTopKKeepsTheTieRuleOnEveryPath) {
  auto ref = MakeReferencePrimitives();
  for (int threads : {1, 2}) {
    auto cpu = MakeCpuPrimitives(threads);
    for (const char* kind : kKinds) {
      for (size_t n : {kSmall, kLarge}) {
        const std::vector<float> x = TieInput(kind, n);
        for (size_t k : {size_t{1}, size_t{100}, n / 1000, n / 100, n / 16, n / 3, n - 1}) {
          const std::string what = absl::StrCat(kind, " n=", n, " k=", k, " threads=", threads);
          const std::vector<uint32_t> want = SortedTopK(x, k);
          std::vector<uint32_t> idx(k), ridx(k);
          std::vector<float> val(k), rval(k);
          ASSERT_EQ(cpu->TopK(x.data(), n, k, idx.data(), val.data()), k) << what;
          EXPECT_EQ(idx, want) << what;
          for (size_t j = 0; j < k; ++j) ASSERT_EQ(val[j], x[idx[j]]) << what;
          ASSERT_EQ(ref->TopK(x.data(), n, k, ridx.data(), rval.data()), k) << what;
          EXPECT_EQ(ridx, want) << "reference primitives: " << what;
          if (n < 64 * 1024) continue;
          ASSERT_EQ(HistogramTopK(*cpu, x.data(), n, k, idx.data(), val.data()), k) << what;
          EXPECT_EQ(idx, want) << "histogram path: " << what;
          size_t written = 0;
          if (SampledTopK(*cpu, x.data(), n, k, idx.data(), val.data(), &written)) {
            ASSERT_EQ(written, k) << what;
            EXPECT_EQ(idx, want) << "sampled path: " << what;
          }
        }
      }
    }
  }
}

// The large-bin path where the boundary bin holds several magnitudes (ties on two of them),
// with entries in higher bins before and after the ties that make it, and +-Inf and NaN about.
TEST(TieInputsTest, CpuTopKLargeBinWithSeveralMagnitudesAndSpecials) {
  auto cpu = MakeCpuPrimitives(2);
  const size_t n = kLarge;
  std::vector<float> x(n);
  std::mt19937 gen(5);
  const float a = 1.0f, b = std::nextafter(1.0f, 2.0f), c = std::nextafter(b, 2.0f);  // one bin
  for (float& v : x) {
    const uint32_t r = gen() % 100;
    v = r < 45 ? a : r < 90 ? -b : r < 97 ? c : r < 99 ? 3.0f : 0.5f;
  }
  for (size_t i = 7; i < n; i += 9973) x[i] = std::numeric_limits<float>::quiet_NaN();
  for (size_t i = 11; i < n; i += 20011) x[i] = -std::numeric_limits<float>::infinity();
  std::vector<float> ranked = x;  // NaN ranks below every number
  for (float& v : ranked) {
    if (std::isnan(v)) v = -0.0f;
  }
  for (size_t k : {size_t{3}, size_t{2000}, n / 20, n / 10, n / 2, n / 2 + 5000}) {
    std::vector<uint32_t> idx(k);
    std::vector<float> val(k);
    ASSERT_EQ(HistogramTopK(*cpu, x.data(), n, k, idx.data(), val.data()), k);
    EXPECT_EQ(idx, SortedTopK(ranked, k)) << "k=" << k;
    ASSERT_EQ(cpu->TopK(x.data(), n, k, idx.data(), val.data()), k);
    EXPECT_EQ(idx, SortedTopK(ranked, k)) << "k=" << k;
  }
}

TEST(TieInputsTest, ExactTopKCompressorsKeepTheTieRule) {
  for (int threads : {1, 2}) {
    auto cpu = MakeCpuPrimitives(threads);
    for (const char* name : {"topk", "gtopk", "topk_union", "cltk"}) {
      for (const char* kind : kKinds) {
        for (double d : {0.001, 0.01}) {
          const size_t n = kLarge;
          const std::vector<float> x = TieInput(kind, n);
          std::vector<float> acc = x;
          auto c = MustMake(name, d, n, cpu.get());
          ASSERT_NE(c, nullptr);
          Selection sel;
          // Pattern B zeroes what it selects; pattern A leaves that to the caller.
          const bool zero = c->pattern() == Pattern::kSparseGather;
          ASSERT_TRUE(c->Select(0, acc.data(), nullptr, zero, &sel).ok());
          const std::string what = absl::StrCat(name, " ", kind, " d=", d);
          ExpectValid(sel, x, what);
          const size_t k = static_cast<size_t>(std::floor(d * n));
          EXPECT_EQ(sel.idx, SortedTopK(x, k)) << what;
          float kth = INFINITY;
          for (uint32_t i : sel.idx) kth = std::min(kth, std::fabs(x[i]));
          EXPECT_EQ(sel.scalars[0], kth) << what;
          for (size_t i = 0, j = 0; i < n; ++i) {  // zeroed exactly where selected
            const bool selected = j < sel.idx.size() && sel.idx[j] == i;
            ASSERT_EQ(acc[i], selected && zero ? 0.0f : x[i]) << what << " i=" << i;
            j += selected;
          }
        }
      }
    }
  }
}

// thresh's contract: every |acc| >= its threshold (1 / (2 sqrt(k)) by default), whatever share
// of the bucket that is; here the inputs sit at the threshold, so ties decide everything.
TEST(TieInputsTest, ThreshSelectsExactlyAtOrAboveItsThreshold) {
  for (int threads : {1, 2}) {
    auto cpu = MakeCpuPrimitives(threads);
    const size_t n = kLarge;
    for (double d : {0.001, 0.01}) {
      const size_t k = static_cast<size_t>(std::floor(d * n));
      const float t = static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(k))));
      auto c = MustMake("thresh", d, n, cpu.get());
      ASSERT_NE(c, nullptr);
      uint64_t step = 0;
      for (const char* kind : kKinds) {
        const std::vector<float> x = TieInput(kind, n, t);
        std::vector<float> acc = x;
        Selection sel;
        // One compressor over all kinds: its buffer sizing from the last count must not matter.
        ASSERT_TRUE(c->Select(step++, acc.data(), nullptr, false, &sel).ok());
        const std::string what = absl::StrCat("thresh ", kind, " d=", d, " threads=", threads);
        ExpectValid(sel, x, what);
        EXPECT_EQ(sel.idx, Above(x, sel.scalars[0], /*strict=*/false)) << what;
        EXPECT_EQ(sel.scalars[0], t) << what;
        EXPECT_EQ(acc, x) << what << ": acc must be untouched (pattern A)";
      }
    }
  }
}

// Every registered compressor on every kind, two steps with error feedback's zeroing: a valid
// selection, never more entries than the bucket.
TEST(TieInputsTest, EveryCompressorGivesAValidSelection) {
  auto cpu = MakeCpuPrimitives(2);
  const size_t n = kLarge;
  for (const std::string& name : CompressorNames()) {
    for (const char* kind : kKinds) {
      const std::vector<float> x = TieInput(kind, n);
      std::vector<float> acc(n, 0.0f);
      auto c = MustMake(name, 0.01, n, cpu.get());
      ASSERT_NE(c, nullptr) << name;
      for (uint64_t step = 0; step < 2; ++step) {
        const std::vector<float> before = [&] {
          std::vector<float> s = acc;
          for (size_t i = 0; i < n; ++i) s[i] += x[i];
          return s;
        }();
        Selection sel;
        const bool union_pattern = c->pattern() == Pattern::kIndexUnion;
        ASSERT_TRUE(c->Select(step, acc.data(), x.data(), !union_pattern, &sel).ok())
            << name << " " << kind;
        const std::string what = absl::StrCat(name, " ", kind, " step ", step);
        if (sel.all) {
          EXPECT_EQ(sel.val.size(), n) << what;
        } else {
          ExpectValid(sel, before, what);
        }
        if (union_pattern) {  // the caller's residual update at the (single-node) union
          for (uint32_t i : sel.idx) acc[i] = 0.0f;
        }
        std::vector<uint64_t> counts = {sel.count()};
        ASSERT_TRUE(c->Update(step, {counts, sel.idx}).ok()) << what;
      }
    }
  }
}

// A tie-heavy input makes a threshold compressor's union a large share of the bucket: Update
// still finds and names a bad index anywhere in it (near the start, past 4096, the last), a
// duplicate as well as a descent, and a valid union of most of the bucket passes.
TEST(TieInputsTest, UpdateFindsABadIndexAnywhereInALargeUnion) {
  auto cpu = MakeCpuPrimitives(1);
  const size_t n = kLarge;
  auto c = MustMake("thresh", 0.01, n, cpu.get());
  ASSERT_NE(c, nullptr);
  std::vector<uint32_t> all(n - 10);
  std::iota(all.begin(), all.end(), 5u);
  const std::vector<uint64_t> counts = {all.size()};
  ASSERT_TRUE(c->Update(0, {counts, all}).ok());
  for (size_t at : {size_t{1}, size_t{4095}, size_t{4096}, size_t{70001}, all.size() - 1}) {
    std::vector<uint32_t> dup = all, low = all, out = all;
    dup[at] = dup[at - 1];
    low[at] = low[at - 1] - 1;
    out[at] = static_cast<uint32_t>(n);  // (still ascending when it is the last)
    const absl::Status d = c->Update(0, {counts, dup}), l = c->Update(0, {counts, low});
    EXPECT_FALSE(d.ok()) << "duplicate at " << at;
    EXPECT_NE(d.message().find(absl::StrCat("position ", at, ")")), std::string::npos) << d;
    EXPECT_FALSE(l.ok()) << "descent at " << at;
    EXPECT_NE(l.message().find(absl::StrCat("position ", at, ")")), std::string::npos) << l;
    if (at == all.size() - 1) {
      const absl::Status o = c->Update(0, {counts, out});
      EXPECT_FALSE(o.ok());
      EXPECT_NE(o.message().find("out of range"), std::string::npos) << o;
    }
  }
}

}  // namespace
}  // namespace spex
