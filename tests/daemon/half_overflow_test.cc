// Half buckets whose node sums do not fit the bucket's type
// (docs/dtypes.md#values-past-the-types-range): 2 nodes x 2 trainers, every sparse compressor,
// float16 and bfloat16, patterns A and B and Ok-Topk. A float16 input of 40,000 (or 65,504, the
// type's largest) is finite and so is the average, but a node's sum of two is past float16's range;
// a bfloat16 pair next to its largest value sums past bfloat16's. The wire must not narrow such a
// sum into an infinity: the step's output is the average (finite), the residual keeps nothing
// non-finite, and the clean steps after it give finite outputs equal to the float32 path's within
// the wire's rounding. The same under --nonfinite=error (the step succeeds: nothing sent is
// non-finite), and for a sparse bucket's dense probe step, whose residual is exchanged through the
// half dense exchange.
#include <atomic>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/half.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

constexpr int kNodes = 2, kTrainers = 2, kSteps = 4;
constexpr size_t kN = 4099;
constexpr double kDensity = 0.01;

// Small, deterministic values for the clean steps (|x| < 0.05).
float Clean(int node, int trainer, uint64_t step, size_t i) {
  return Gradient({node, trainer, 0, step, i}, {GradientShape::kUniform, 0.08, 0, 0.0});
}

// The input of trainer k at position i for bucket kind `which` (0 or 1) at step 0, as half
// bits: large values, spread over positions (a compressor that estimates a threshold needs some
// spread), at every hundredth position, smaller ones elsewhere (below). float16: 33,000 to 39,720
// (the 40,000) and 62,400 to 65,504 (float16's largest): every large node sum is past
// 65,504. bfloat16: its largest value (2^128 - 2^120) on one trainer and 2^119 to 1.75 x 2^119 on
// the other: the sum is float32-finite but rounds to bfloat16 +Inf (its only window: any larger sum
// is past float32 too, which the local reduce's check refuses).
uint16_t Big(DType t, int which, int trainer, size_t i) {
  const int j = static_cast<int>(i % 97);
  if (i % 100 != 0 && t == DType::kFloat16) {
    // Exponential-like, multiples of 32 up to 29,984: every node sum (<= 59,968) is exact in
    // float16 and fits, and a compressor fitting a distribution finds the large values in its tail.
    const double u = (static_cast<double>((i * 2654435761u) % 65521) + 0.5) / 65521.0;
    return FloatToF16(32.0f *
                      static_cast<float>(std::min(937.0, std::floor(-160.0 * std::log(u)))));
  }
  if (i % 100 != 0) return FloatToHalf(t, 10.0f * j);
  if (t == DType::kFloat16) {
    return FloatToF16(which == 0 ? 33000.0f + 70.0f * j : 65504.0f - 32.0f * j);
  }
  if ((trainer + which) % 2 == 0) return uint16_t{0x7f7f};
  return FloatToBf16(std::ldexp(1.0f + j / 128.0f, 119));
}

// What every trainer gets at position i at step 0 where `m` nodes sent it: m shares of the
// average (each node's sum scaled first, as DDP divides before it sums), added in float32.
uint16_t BigAverage(DType t, int which, size_t i, int m) {
  const float local = HalfToFloat(t, Big(t, which, 0, i)) + HalfToFloat(t, Big(t, which, 1, i));
  const float share = local * (1.0f / (kNodes * kTrainers));
  float sum = 0.0f;
  for (int j = 0; j < m; ++j) sum += share;
  return FloatToHalf(t, sum);
}

// One ulp of type t at |x|.
float Ulp(DType t, float x) {
  const int mant = t == DType::kBFloat16 ? 7 : 10;
  const int emin = t == DType::kBFloat16 ? -126 : -14;
  int e;
  std::frexp(std::max(std::fabs(x), 1e-38f), &e);
  return std::ldexp(1.0f, std::max(e - 1, emin) - mant);
}

uint16_t* HalfAt(Trainer& tr, uint64_t bucket, uint64_t offset) {
  return reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(tr.header(bucket)) + offset);
}

bool Finite(DType t, uint16_t h) { return std::isfinite(HalfToFloat(t, h)); }

struct Case {
  std::string compressor;
  DType dtype;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.compressor + "_" + DTypeName(info.param.dtype);
}

EngineClusterOptions Options() { return AlwaysSparseCluster(kNodes, kTrainers, "halfover"); }

class HalfOverflowTest : public ::testing::TestWithParam<Case> {};

// Buckets 1 and 2: the half bucket with big inputs of kind 0 and 1 at step 0 (through the
// all-gather or the union: the compressor's pattern); 3 and 4 the same through Ok-Topk (pattern
// B compressors); 5: a float32 bucket fed bucket 1's widened inputs (float16 only: bfloat16's
// big values overflow the float32 path's own unscaled all-reduce). Steps 1 to 3 are clean.
TEST_P(HalfOverflowTest, ANodeSumPastTheTypesRangeIsSentWiderAndLeavesNoInfinity) {
  const Case& c = GetParam();
  const DType t = c.dtype;
  auto pattern = CompressorPattern(c.compressor);
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  const bool oktopk = CompressorCanUseOkTopk(c.compressor);
  const bool compare_f32 = t == DType::kFloat16;
  EngineCluster cluster(Options());
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  const std::string type = DTypeName(t);
  std::map<uint64_t, std::map<std::string, std::string>> buckets = {{1, {{"dtype", type}}},
                                                                    {2, {{"dtype", type}}}};
  if (oktopk) {
    buckets[3] = {{"dtype", type}, {"sparse_allreduce", "oktopk"}};
    buckets[4] = {{"dtype", type}, {"sparse_allreduce", "oktopk"}};
  }
  if (compare_f32) buckets[5] = {};
  std::atomic<int> nonfinite{0}, wrong_average{0}, averaged{0}, off_f32{0}, too_large{0};
  std::vector<std::string> errors(kNodes * kTrainers);
  cluster.ForEachTrainer([&](int r, int k) {
    std::string& err = errors[r * kTrainers + k];
    auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (const auto& [id, p] : buckets) {
      auto g = tr->Register(id, kN, c.compressor, kDensity, p);
      if (!g.ok()) return void(err = absl::StrCat("bucket ", id, ": ", g.status().ToString()));
    }
    for (int s = 0; s < kSteps; ++s) {
      for (const auto& [id, p] : buckets) {
        if (id == 5) {
          tr->Fill(5, [&](size_t i) {
            return s == 0 ? HalfToFloat(t, Big(t, 0, k, i))
                          : HalfToFloat(t, FloatToHalf(t, Clean(r, k, s, i)));
          });
          continue;
        }
        const int which = (id - 1) % 2;
        uint16_t* in = HalfAt(*tr, id, tr->grant(id).input_offset);
        for (size_t i = 0; i < kN; ++i)
          in[i] = s == 0 ? Big(t, which, k, i) : FloatToHalf(t, Clean(r, k, s, i));
      }
      for (const auto& [id, p] : buckets) {
        auto rec = tr->Exchange(id, s, absl::Seconds(30));
        if (!rec.ok())
          return void(err =
                          absl::StrCat("bucket ", id, " step ", s, ": ", rec.status().ToString()));
      }
      for (const auto& [id, p] : buckets) {
        if (id == 5) continue;
        const int which = (id - 1) % 2;
        float bound = 0;  // the largest average of big values
        for (size_t i = 0; i < kN; ++i) {
          bound = std::max(bound, HalfToFloat(t, BigAverage(t, which, i, kNodes)));
        }
        bound += Ulp(t, bound);
        const uint16_t* out = HalfAt(*tr, id, tr->grant(id).output_offset);
        for (size_t i = 0; i < kN; ++i) {
          nonfinite += !Finite(t, out[i]);
          if (s == 0) {  // the average where every node sent, a share where one did, or 0
            wrong_average += out[i] != BigAverage(t, which, i, kNodes) &&
                             out[i] != BigAverage(t, which, i, 1) && (out[i] & 0x7fff) != 0;
          } else {
            too_large += !(std::fabs(HalfToFloat(t, out[i])) <= bound);
          }
          // A compressor may select none of the big values at step 0 and send them from the
          // residual later: a big value must come out at some step.
          averaged += i % 100 == 0 && std::fabs(HalfToFloat(t, out[i])) >=
                                          0.4f * HalfToFloat(t, BigAverage(t, which, i, kNodes));
        }
        if (id == 1 && compare_f32 && s <= 1) {
          // Step 0 went out as float32 everywhere (every value was big): the float32 path's
          // result rounded once, bit for bit. Step 1 starts from the same residual: the same
          // selection, within the wire's rounding of each clean contribution.
          const float* f32 = tr->output(5);
          for (size_t i = 0; i < kN; ++i) {
            const float got = HalfToFloat(t, out[i]), ref = f32[i];
            const float tol = s == 0 ? 0.0f : Ulp(t, ref) + 2 * Ulp(t, 0.05f);
            off_f32 += !(std::fabs(got - HalfToFloat(t, FloatToHalf(t, ref))) <= tol);
          }
        }
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(nonfinite.load(), 0) << "outputs that are NaN or infinite";
  EXPECT_EQ(wrong_average.load(), 0) << "step 0: nonzero outputs other than the average";
  // bfloat16's big values sit next to float32's largest, where the compressors that estimate a
  // threshold from moments (dgc, redsync, sidco) may select none of them in four steps.
  if (t == DType::kFloat16) EXPECT_GT(averaged.load(), 0) << "no step sent a big value";
  EXPECT_EQ(too_large.load(), 0) << "clean steps: outputs larger than the big average";
  EXPECT_EQ(off_f32.load(), 0) << "outputs off the float32 path's";
}

std::vector<Case> SparseCases() {
  std::vector<Case> cases;
  for (const std::string& name : CompressorNames()) {
    if (name == "dense") continue;
    for (DType t : {DType::kFloat16, DType::kBFloat16}) cases.push_back({name, t});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EverySparseCompressor, HalfOverflowTest,
                         ::testing::ValuesIn(SparseCases()), CaseName);

// --nonfinite=error: what is sent is checked, and nothing sent is non-finite, so the step of
// big inputs succeeds with the average (it was reported a success with infinities before, and
// every later step failed blaming the inputs); the clean steps after it succeed, finite.
TEST(HalfOverflowErrorPolicy, TheBigStepAndTheCleanStepsAfterItSucceedFinite) {
  EngineClusterOptions o = Options();
  o.engine.nonfinite = NonfinitePolicy::kError;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  const DType t = DType::kFloat16;
  // 1: pattern B, 2: pattern A, 3: pattern B through Ok-Topk.
  const std::map<uint64_t, std::pair<std::string, std::string>> buckets = {
      {1, {"topk", "allgather"}}, {2, {"micro", "allgather"}}, {3, {"topk", "oktopk"}}};
  std::atomic<int> nonfinite{0}, averaged{0};
  std::vector<std::string> errors(kNodes * kTrainers);
  cluster.ForEachTrainer([&](int r, int k) {
    std::string& err = errors[r * kTrainers + k];
    auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (const auto& [id, cp] : buckets) {
      auto g = tr->Register(id, kN, cp.first, kDensity,
                            {{"dtype", "float16"}, {"sparse_allreduce", cp.second}});
      if (!g.ok()) return void(err = g.status().ToString());
    }
    for (int s = 0; s < kSteps; ++s) {
      for (const auto& [id, cp] : buckets) {
        uint16_t* in = HalfAt(*tr, id, tr->grant(id).input_offset);
        for (size_t i = 0; i < kN; ++i)
          in[i] = s == 0 ? Big(t, 0, k, i) : FloatToHalf(t, Clean(r, k, s, i));
        auto rec = tr->Exchange(id, s, absl::Seconds(30));
        if (!rec.ok())
          return void(err =
                          absl::StrCat("bucket ", id, " step ", s, ": ", rec.status().ToString()));
        const uint16_t* out = HalfAt(*tr, id, tr->grant(id).output_offset);
        for (size_t i = 0; i < kN; ++i) {
          nonfinite += !Finite(t, out[i]);
          averaged += s == 0 && out[i] == BigAverage(t, 0, i, kNodes);
        }
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(nonfinite.load(), 0);
  EXPECT_GT(averaged.load(), 0);
}

// A sparse bucket's dense probe step (--dense_fallback=auto: step 1 is dense) sends its whole
// residual through the half dense exchange: 20,000 on every trainer at steps 0 and 1 leaves
// 80,000 in a node's sum where step 0 did not select, whose average (40,000) fits.
TEST(HalfOverflowDenseProbe, TheResidualPastTheRangeIsExchangedWithoutInfinity) {
  for (DType t : {DType::kFloat16}) {
    EngineClusterOptions o = Options();
    o.engine.dense_fallback = DenseFallback::kAuto;
    EngineCluster cluster(o);
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    std::atomic<int> wrong{0}, dense{0};
    std::vector<std::string> errors(kNodes * kTrainers);
    const uint16_t v = FloatToHalf(t, 20000.0f);
    cluster.ForEachTrainer([&](int r, int k) {
      std::string& err = errors[r * kTrainers + k];
      auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
      if (!tr.ok()) return void(err = tr.status().ToString());
      auto g = tr->Register(1, kN, "topk", kDensity, {{"dtype", DTypeName(t)}});
      if (!g.ok()) return void(err = g.status().ToString());
      uint16_t* in = HalfAt(*tr, 1, tr->grant(1).input_offset);
      const uint16_t* out = HalfAt(*tr, 1, tr->grant(1).output_offset);
      for (int s = 0; s < 3; ++s) {
        for (size_t i = 0; i < kN; ++i) in[i] = s < 2 ? v : FloatToHalf(t, Clean(r, k, s, i));
        auto rec = tr->Exchange(1, s, absl::Seconds(30));
        if (!rec.ok()) return void(err = absl::StrCat("step ", s, ": ", rec.status().ToString()));
        if (s != 1) {
          for (size_t i = 0; i < kN; ++i) wrong += !Finite(t, out[i]);
          continue;
        }
        dense += rec->pattern == "D";
        for (size_t i = 0; i < kN; ++i) {
          wrong += out[i] != FloatToHalf(t, 20000.0f) && out[i] != FloatToHalf(t, 40000.0f);
        }
      }
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(dense.load(), kNodes * kTrainers) << "step 1 was not the dense probe";
    EXPECT_EQ(wrong.load(), 0);
  }
}

// A float32 bucket under --fp16_values sends pattern B's values as float16: a chunk with a
// value past float16's range goes as float32 instead, on the per-bucket path and in a merge
// group's fused exchange (--merger=fixed); the output is the average, never an infinity.
TEST(Fp16ValuesOverflow, AChunkPastFloat16GoesAsFloat32) {
  // topk: pattern B's chunks; micro: pattern A's values at the union (the average past float16
  // goes again as float32, each value scaled first).
  for (const char* compressor : {"topk", "micro"}) {
    for (MergerPolicy merger : {MergerPolicy::kNone, MergerPolicy::kFixed}) {
      SCOPED_TRACE(absl::StrCat(
          compressor, merger == MergerPolicy::kNone ? ", merger none" : ", merger fixed"));
      EngineClusterOptions o = Options();
      o.engine.fp16_values = true;
      o.engine.merger = merger;
      EngineCluster cluster(o);
      ASSERT_TRUE(cluster.status().ok()) << cluster.status();
      std::atomic<int> wrong{0}, averaged{0};
      std::vector<std::string> errors(kNodes * kTrainers);
      cluster.ForEachTrainer([&](int r, int k) {
        std::string& err = errors[r * kTrainers + k];
        auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
        if (!tr.ok()) return void(err = tr.status().ToString());
        for (uint64_t id : {1, 2}) {
          auto g = tr->Register(id, kN, compressor, kDensity);
          if (!g.ok()) return void(err = g.status().ToString());
        }
        for (int s = 0; s < 2; ++s) {
          for (uint64_t id : {1, 2}) {
            tr->Fill(id, [&](size_t i) { return i % 100 == 0 ? 40000.0f : Clean(r, k, s, i); });
          }
          for (uint64_t id : {1, 2}) {
            auto rec = tr->Exchange(id, s, absl::Seconds(30));
            if (!rec.ok()) return void(err = rec.status().ToString());
            const float* out = tr->output(id);
            for (size_t i = 0; i < kN; ++i) {
              // 40,000 where sent at step 0; 80,000 where step 1 sent two steps' sums.
              wrong += !std::isfinite(out[i]) || std::fabs(out[i]) > 80000.0f;
              averaged += out[i] == 40000.0f;
            }
          }
        }
      });
      for (const std::string& e : errors) EXPECT_EQ(e, "");
      EXPECT_EQ(wrong.load(), 0);
      EXPECT_GT(averaged.load(), 0);
    }
  }
}

}  // namespace
}  // namespace spex::test
