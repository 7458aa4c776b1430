// bfloat16 and float16 buckets inside the engine (docs/dtypes.md), 2 nodes (threads over the
// in-process collective) x 2 trainers per node, every registered compressor:
//  - wire_values=float32: the half bucket's output must be, bit for bit, the float32 path's
//    result for the widened inputs rounded once to the bucket's type (a float32 bucket of the
//    same engines fed the widened inputs), and within one half ulp of the independent oracle
//    (kernels/reference_cluster.h) over the widened inputs, rounded once, at every step;
//  - native wire values (the default): within the half type's rounding of every node's
//    contribution of the oracle on the first step; the dense bucket bit-exactly equal to an
//    oracle computed here (local float32 sums, rounded for the wire, summed in float32 in rank
//    order, rounded once), and its wire bytes half the float32 bucket's;
//  - merge groups (--merger=fixed, omgs, rgmerge): the float32 path's result rounded once;
//  - bad input: a trainer registering another type, unknown types and wire_values, a NaN in a
//    half input (error policy names the trainer), the layout (2-byte slots).
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/half_exchange.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/half.h"
#include "kernels/reference/reference_primitives.h"
#include "kernels/reference_cluster.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

constexpr int kNodes = 2, kTrainers = 2, kSteps = 4;
constexpr size_t kN = 12007;
constexpr double kDensity = 0.01;

// Deterministic, roughly Gaussian values with a few larger positions (as compressor_engine_test).
float Value(int node, int trainer, uint64_t step, size_t i) {
  return Gradient({node, trainer, 0, step, i}, {GradientShape::kGaussian, 1e-2});
}

// The half input trainer t of node r hands in, and its float32 widening.
uint16_t HalfValue(DType t, int node, int trainer, uint64_t step, size_t i) {
  return FloatToHalf(t, Value(node, trainer, step, i));
}

// One ulp of type t at |x| (the spacing of t's values around x; the subnormal spacing near 0).
float Ulp(DType t, float x) {
  const int mant = t == DType::kBFloat16 ? 7 : 10;
  const int emin = t == DType::kBFloat16 ? -126 : -14;
  int e;
  std::frexp(std::max(std::fabs(x), 1e-38f), &e);  // |x| in [2^(e-1), 2^e)
  return std::ldexp(1.0f, std::max(e - 1, emin) - mant);
}

uint16_t* HalfAt(Trainer& tr, uint64_t bucket, uint64_t offset) {
  return reinterpret_cast<uint16_t*>(reinterpret_cast<uint8_t*>(tr.header(bucket)) + offset);
}

// 2 nodes x 2 trainers, every sparse bucket exchanged sparse from its first step.
EngineClusterOptions AlwaysSparse() { return AlwaysSparseCluster(kNodes, kTrainers, "halftest"); }

struct Case {
  std::string compressor;
  DType dtype;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.compressor + "_" + DTypeName(info.param.dtype);
}

class HalfEngineTest : public ::testing::TestWithParam<Case> {};

TEST_P(HalfEngineTest, RoundedOnceFromTheFloat32PathAndTheOracle) {
  const Case& c = GetParam();
  const DType t = c.dtype;
  auto prims = MakeReferencePrimitives();
  auto pattern = CompressorPattern(c.compressor);
  ASSERT_TRUE(pattern.ok()) << pattern.status();

  // The independent oracle over the widened inputs.
  CompressorSpec spec;
  spec.name = c.compressor;
  spec.density = kDensity;
  spec.elements = kN;
  auto oracle = ReferenceCluster::Create(spec, kNodes, kTrainers, true, prims.get());
  ASSERT_TRUE(oracle.ok()) << oracle.status();
  std::vector<std::vector<float>> expected(kSteps, std::vector<float>(kN));
  std::vector<std::vector<std::vector<float>>> widened(
      kNodes, std::vector<std::vector<float>>(kTrainers, std::vector<float>(kN)));
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::vector<const float*>> ptrs(kNodes);
    for (int r = 0; r < kNodes; ++r) {
      for (int k = 0; k < kTrainers; ++k) {
        for (size_t i = 0; i < kN; ++i) widened[r][k][i] = HalfToFloat(t, HalfValue(t, r, k, s, i));
        ptrs[r].push_back(widened[r][k].data());
      }
    }
    ASSERT_TRUE((*oracle)->Step(s, ptrs, expected[s].data()).ok());
  }

  EngineClusterOptions o = AlwaysSparse();
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // Bucket 1: half, float32 on the wire. Bucket 2: float32 fed the widened inputs. Bucket 3:
  // half, native wire values.
  std::atomic<int> not_rounded_once{0}, off_oracle{0}, off_oracle_native{0}, bad_header{0};
  std::atomic<uint64_t> bytes_native{0}, bytes_f32{0};
  std::vector<std::string> errors(kNodes * kTrainers);
  const std::map<std::string, std::string> half_f32wire = {{"dtype", DTypeName(t)},
                                                           {"wire_values", "float32"}};
  const std::map<std::string, std::string> half_native = {{"dtype", DTypeName(t)}};
  cluster.ForEachTrainer([&](int r, int k) {
    std::string& err = errors[r * kTrainers + k];
    auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (auto [id, params] :
         {std::pair{1, half_f32wire}, std::pair{2, std::map<std::string, std::string>{}},
          std::pair{3, half_native}}) {
      auto g = tr->Register(id, kN, c.compressor, kDensity, params);
      if (!g.ok()) return void(err = g.status().ToString());
    }
    bad_header += tr->header(1)->dtype != static_cast<uint32_t>(t) ||
                  tr->header(1)->slot_stride != SlotStride(kN, 2) || tr->header(2)->dtype != 0;
    uint16_t* in1 = HalfAt(*tr, 1, tr->grant(1).input_offset);
    const uint16_t* out1 = HalfAt(*tr, 1, tr->grant(1).output_offset);
    uint16_t* in3 = HalfAt(*tr, 3, tr->grant(3).input_offset);
    const uint16_t* out3 = HalfAt(*tr, 3, tr->grant(3).output_offset);
    const float* out2 = tr->output(2);
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < kN; ++i) in1[i] = in3[i] = HalfValue(t, r, k, s, i);
      tr->Fill(2, [&](size_t i) { return HalfToFloat(t, HalfValue(t, r, k, s, i)); });
      auto rec1 = tr->Exchange(1, s, absl::Seconds(30));
      auto rec2 = tr->Exchange(2, s, absl::Seconds(30));
      auto rec3 = tr->Exchange(3, s, absl::Seconds(30));
      for (const auto* rec : {&rec1, &rec2, &rec3}) {
        if (!rec->ok()) return void(err = rec->status().ToString());
      }
      if (r == 0 && k == 0 && s == 0) {
        bytes_native = rec3->bytes_sent;
        bytes_f32 = rec2->bytes_sent;
      }
      for (size_t i = 0; i < kN; ++i) {
        not_rounded_once += out1[i] != FloatToHalf(t, out2[i]);
        const float want = expected[s][i];
        off_oracle += !(std::fabs(HalfToFloat(t, out1[i]) - want) <= Ulp(t, want));
        if (s == 0) {
          // Every node's value rounded to t on the wire, then the result once: within a few
          // ulps of the largest contribution.
          const float tol = 2 * Ulp(t, std::fabs(want)) + 2 * Ulp(t, 0.05f) / (kNodes * kTrainers);
          off_oracle_native += !(std::fabs(HalfToFloat(t, out3[i]) - want) <= tol);
        }
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(bad_header.load(), 0) << "headers not saying the bucket's type and 2-byte stride";
  EXPECT_EQ(not_rounded_once.load(), 0)
      << "half outputs differing from the float32 path's result rounded once";
  EXPECT_EQ(off_oracle.load(), 0) << "half outputs more than an ulp off the oracle's";
  EXPECT_EQ(off_oracle_native.load(), 0) << "native-wire outputs off the oracle (first step)";
  if (*pattern == Pattern::kDense) {
    EXPECT_EQ(bytes_native.load() * 2, bytes_f32.load()) << "a dense half bucket sends half";
  } else {
    EXPECT_LT(bytes_native.load(), bytes_f32.load()) << "half values on the wire";
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& name : CompressorNames()) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) cases.push_back({name, t});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, HalfEngineTest, ::testing::ValuesIn(AllCases()), CaseName);

// Bucket 1 of type t beside bucket 2, float32, both `compressor`, on a cluster of `o`: every
// trainer hands both the same values (HalfValue, widened for bucket 2) for kSteps steps and
// `check(out1, out2)` sees both outputs after each step (on every trainer's thread). The
// trainers' errors come back, one per trainer ("" when none).
std::vector<std::string> RunHalfBesideFloat32(
    const EngineClusterOptions& o, const std::string& compressor, DType t,
    const std::function<void(const uint16_t* out1, const float* out2)>& check) {
  EngineCluster cluster(o);
  if (!cluster.status().ok()) return {cluster.status().ToString()};
  std::vector<std::string> errors(o.nodes * o.trainers);
  cluster.ForEachTrainer([&](int r, int k) {
    std::string& err = errors[r * o.trainers + k];
    auto tr = Trainer::Open(&cluster.engine(r), k, o.trainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g1 = tr->Register(1, kN, compressor, kDensity, {{"dtype", DTypeName(t)}});
    if (!g1.ok()) return void(err = g1.status().ToString());
    auto g2 = tr->Register(2, kN, compressor, kDensity);
    if (!g2.ok()) return void(err = g2.status().ToString());
    uint16_t* in1 = HalfAt(*tr, 1, tr->grant(1).input_offset);
    const uint16_t* out1 = HalfAt(*tr, 1, tr->grant(1).output_offset);
    for (int s = 0; s < kSteps; ++s) {
      for (size_t i = 0; i < kN; ++i) in1[i] = HalfValue(t, r, k, s, i);
      tr->Fill(2, [&](size_t i) { return HalfToFloat(t, HalfValue(t, r, k, s, i)); });
      for (uint64_t id : {1, 2}) {
        auto rec = tr->Exchange(id, s, absl::Seconds(30));
        if (!rec.ok()) return void(err = rec.status().ToString());
      }
      check(out1, tr->output(2));
    }
  });
  return errors;
}

// A float32 bucket under --fp16_values sends its sparse values as float16 (pattern A's values at
// the union, B's chunks) and keeps what rounding took off in its residual, exactly as a float16
// bucket with native wire values does: fed the same (float16-exact) inputs, its output rounded
// to float16 must be the float16 bucket's at every step (a residual zeroed instead drifts apart
// from the second step), and pattern A's output is float16-exact (the average rounded once).
class Fp16ValuesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp16ValuesTest, AFloat32BucketSendsAndKeepsAsAFloat16Bucket) {
  const std::string compressor = GetParam();
  const DType t = DType::kFloat16;
  auto pattern = CompressorPattern(compressor);
  ASSERT_TRUE(pattern.ok()) << pattern.status();
  EngineClusterOptions o = AlwaysSparse();
  o.engine.fp16_values = true;
  std::atomic<int> differ{0}, not_half{0}, nonzero{0};
  const std::vector<std::string> errors =
      RunHalfBesideFloat32(o, compressor, t, [&](const uint16_t* out1, const float* out2) {
        for (size_t i = 0; i < kN; ++i) {
          differ += out1[i] != FloatToHalf(t, out2[i]);
          nonzero += out2[i] != 0.0f;
          if (*pattern == Pattern::kIndexUnion) {
            not_half += HalfToFloat(t, FloatToHalf(t, out2[i])) != out2[i];
          }
        }
      });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(differ.load(), 0) << "the float32 bucket's output differs from the float16 bucket's";
  EXPECT_EQ(not_half.load(), 0) << "pattern A's average did not travel as float16";
  EXPECT_GT(nonzero.load(), 0);
}

std::vector<std::string> SparseNames() {
  std::vector<std::string> names;
  for (const std::string& name : CompressorNames()) {
    auto p = CompressorPattern(name);
    if (p.ok() && *p != Pattern::kDense) names.push_back(name);
  }
  return names;
}

INSTANTIATE_TEST_SUITE_P(SparseCompressors, Fp16ValuesTest, ::testing::ValuesIn(SparseNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// The dense exchange with half values on the wire against an oracle computed here: each node's
// local sum in float32 (trainer 0 + trainer 1, times 1 / (nodes x trainers) when that is a power
// of two: exact), rounded to t for the wire, the nodes' values summed in float32 in rank order,
// scaled there otherwise, rounded once. Bit for bit, on 2 and 3 nodes (the scale before and
// after the wire), with n a multiple of the nodes (the exchange in place in the trainers'
// output) and not (padded chunks through scratch).
TEST(HalfDenseExchange, BitExactAgainstTheWireOracle) {
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    for (int nodes : {2, 3}) {
      for (size_t n : {kN, size_t{12006}}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(t), " nodes ", nodes, " n ", n));
        EngineClusterOptions o;
        o.nodes = nodes;
        o.trainers = kTrainers;
        o.engine.shm_tag = "halftest";
        EngineCluster cluster(o);
        ASSERT_TRUE(cluster.status().ok()) << cluster.status();
        const bool pow2 = nodes == 2;
        const float scale = 1.0f / static_cast<float>(nodes * kTrainers);
        std::atomic<int> wrong{0};
        cluster.ForEachTrainer([&](int r, int k) {
          auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
          ASSERT_TRUE(tr.ok()) << tr.status();
          ASSERT_TRUE(tr->Register(5, n, "dense", 0, {{"dtype", DTypeName(t)}}).ok());
          uint16_t* in = HalfAt(*tr, 5, tr->grant(5).input_offset);
          const uint16_t* out = HalfAt(*tr, 5, tr->grant(5).output_offset);
          for (int s = 0; s < 2; ++s) {
            for (size_t i = 0; i < n; ++i) in[i] = HalfValue(t, r, k, s, i);
            auto rec = tr->Exchange(5, s);
            ASSERT_TRUE(rec.ok()) << rec.status();
            EXPECT_EQ(rec->pattern, "D");
            EXPECT_EQ(rec->bytes_sent, DenseWireBytes(n, nodes, t));
            for (size_t i = 0; i < n; ++i) {
              float sum = 0;
              for (int node = 0; node < nodes; ++node) {
                float local = HalfToFloat(t, HalfValue(t, node, 0, s, i)) +
                              HalfToFloat(t, HalfValue(t, node, 1, s, i));
                if (pow2) local *= scale;
                const float wire = HalfToFloat(t, FloatToHalf(t, local));
                sum = node == 0 ? wire : sum + wire;
              }
              wrong += out[i] != FloatToHalf(t, pow2 ? sum : sum * scale);
            }
          }
        });
        EXPECT_EQ(wrong.load(), 0);
      }
    }
  }
}

// A dense half bucket under --nonfinite=error: the local sum rounded straight into the output
// still checks the float32 sum; a NaN of one trainer fails the step on every node, naming the
// trainer and the index, and the next step is exact again.
TEST(HalfDenseExchange, ANaNInADenseHalfInputFailsTheStepNamingTheTrainer) {
  EngineClusterOptions o;
  o.nodes = kNodes;
  o.trainers = kTrainers;
  o.engine.shm_tag = "halftest";
  o.engine.nonfinite = NonfinitePolicy::kError;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  const DType t = DType::kBFloat16;
  std::atomic<int> failed{0}, named{0}, wrong{0};
  cluster.ForEachTrainer([&](int r, int k) {
    auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
    ASSERT_TRUE(tr.ok()) << tr.status();
    ASSERT_TRUE(tr->Register(6, 1000, "dense", 0, {{"dtype", "bfloat16"}}).ok());
    uint16_t* in = HalfAt(*tr, 6, tr->grant(6).input_offset);
    const uint16_t* out = HalfAt(*tr, 6, tr->grant(6).output_offset);
    for (size_t i = 0; i < 1000; ++i) in[i] = FloatToHalf(t, 0.5f);
    if (r == 1 && k == 1) in[321] = FloatToHalf(t, NAN);
    auto bad = tr->Exchange(6, 0);
    failed += !bad.ok();
    named += !bad.ok() && bad.status().message().find("321") != std::string::npos &&
             bad.status().message().find("local trainer 1") != std::string::npos;
    for (size_t i = 0; i < 1000; ++i) in[i] = FloatToHalf(t, 0.25f * (r + 1));
    auto next = tr->Exchange(6, 1);
    ASSERT_TRUE(next.ok()) << next.status();
    for (size_t i = 0; i < 1000; ++i) wrong += out[i] != FloatToHalf(t, 0.375f);
  });
  EXPECT_EQ(failed.load(), kNodes * kTrainers);
  EXPECT_EQ(named.load(), kNodes * kTrainers);
  EXPECT_EQ(wrong.load(), 0);
}

// Ok-Topk (sparse_allreduce=oktopk) sends a half bucket's selections in its own type too: with
// the global selection "all" its result is, bit for bit, the sparse all-gather's, so a half
// bucket through Ok-Topk must give the same outputs at every step as one through the
// all-gather, both keeping the wire's rounding in the residual (a residual zeroed instead would
// drift apart from the second step); and it sends fewer bytes than with float32 values.
TEST(HalfOkTopk, HalfValuesOnTheWireAsTheSparseAllGather) {
  for (DType t : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(t));
    EngineClusterOptions o = AlwaysSparse();
    o.engine.oktopk_global = OkTopkSelect::kAll;
    EngineCluster cluster(o);
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    const std::string type = DTypeName(t);
    // 1: all-gather, 2: Ok-Topk, 3: Ok-Topk with float32 values on the wire.
    const std::map<uint64_t, std::map<std::string, std::string>> params = {
        {1, {{"dtype", type}, {"sparse_allreduce", "allgather"}}},
        {2, {{"dtype", type}, {"sparse_allreduce", "oktopk"}}},
        {3, {{"dtype", type}, {"sparse_allreduce", "oktopk"}, {"wire_values", "float32"}}}};
    std::atomic<int> differ{0}, nonzero{0};
    std::atomic<uint64_t> bytes_half{0}, bytes_f32{0};
    std::vector<std::string> errors(kNodes * kTrainers);
    cluster.ForEachTrainer([&](int r, int k) {
      std::string& err = errors[r * kTrainers + k];
      auto tr = Trainer::Open(&cluster.engine(r), k, kTrainers);
      if (!tr.ok()) return void(err = tr.status().ToString());
      for (const auto& [id, p] : params) {
        auto g = tr->Register(id, kN, "topk", kDensity, p);
        if (!g.ok()) return void(err = g.status().ToString());
      }
      for (int s = 0; s < kSteps; ++s) {
        for (uint64_t id : {1, 2, 3}) {
          uint16_t* in = HalfAt(*tr, id, tr->grant(id).input_offset);
          for (size_t i = 0; i < kN; ++i) in[i] = HalfValue(t, r, k, s, i);
        }
        for (uint64_t id : {1, 2, 3}) {
          auto rec = tr->Exchange(id, s, absl::Seconds(30));
          if (!rec.ok()) return void(err = rec.status().ToString());
          if (r == 0 && k == 0 && s == 1 && id == 2) bytes_half = rec->bytes_sent;
          if (r == 0 && k == 0 && s == 1 && id == 3) bytes_f32 = rec->bytes_sent;
        }
        const uint16_t* gather = HalfAt(*tr, 1, tr->grant(1).output_offset);
        const uint16_t* oktopk = HalfAt(*tr, 2, tr->grant(2).output_offset);
        for (size_t i = 0; i < kN; ++i) {
          differ += gather[i] != oktopk[i];
          nonzero += (oktopk[i] & 0x7fff) != 0;
        }
      }
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(differ.load(), 0) << "Ok-Topk's half bucket differs from the all-gather's";
    EXPECT_GT(nonzero.load(), 0);
    EXPECT_GT(bytes_half.load(), 0u);
    EXPECT_LT(bytes_half.load(), bytes_f32.load()) << "half values on Ok-Topk's wire";
  }
}

EngineClusterOptions OneNode(int trainers = 2) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = trainers;
  o.hub_timeout = absl::Seconds(5);
  o.engine.shm_tag = "halftest";
  return o;
}

TEST(HalfEngineErrors, TrainersRegisteringAnotherTypeAreRefusedNamingBoth) {
  EngineCluster cluster(OneNode());
  ASSERT_TRUE(cluster.status().ok());
  Engine& e = cluster.engine(0);
  auto a = e.Hello("", 0, 2, 0, "t");
  auto b = e.Hello("", 1, 2, 0, "t");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(e.RegisterBucket(a->session_id, 4, 1000, "dense", 0, {{"dtype", "bfloat16"}}).ok());
  auto f16 = e.RegisterBucket(b->session_id, 4, 1000, "dense", 0, {{"dtype", "float16"}});
  ASSERT_EQ(f16.status().code(), absl::StatusCode::kInvalidArgument) << f16.status();
  EXPECT_NE(f16.status().message().find("registered as bfloat16"), std::string::npos);
  EXPECT_NE(f16.status().message().find("says float16"), std::string::npos);
  auto f32 = e.RegisterBucket(b->session_id, 4, 1000, "dense", 0);
  ASSERT_EQ(f32.status().code(), absl::StatusCode::kInvalidArgument) << f32.status();
  EXPECT_NE(f32.status().message().find("says float32"), std::string::npos) << f32.status();
  // The engine keeps serving: the same type attaches.
  auto ok = e.RegisterBucket(b->session_id, 4, 1000, "dense", 0, {{"dtype", "bf16"}});
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->output_offset - ok->input_offset, SlotStride(1000, 2)) << "2-byte slots";
}

TEST(HalfEngineErrors, UnknownTypeAndWireValuesNameTheAcceptedOnes) {
  EngineCluster cluster(OneNode(1));
  ASSERT_TRUE(cluster.status().ok());
  Engine& e = cluster.engine(0);
  auto a = e.Hello("", 0, 1, 0, "t");
  ASSERT_TRUE(a.ok());
  auto bad = e.RegisterBucket(a->session_id, 4, 1000, "topk", 0.01, {{"dtype", "int8"}});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bfloat16"), std::string::npos) << bad.status();
  bad = e.RegisterBucket(a->session_id, 4, 1000, "topk", 0.01,
                         {{"dtype", "float16"}, {"wire_values", "int4"}});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("wire_values"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("float32"), std::string::npos) << bad.status();
  EXPECT_TRUE(e.RegisterBucket(a->session_id, 4, 1000, "topk", 0.01, {{"dtype", "float16"}}).ok());
}

// Half buckets in merge groups (--merger=fixed, omgs, rgmerge): a half member's values travel
// as float32 in the fused exchange, and its output is, bit for bit, the float32 path's result
// for the widened inputs rounded once: a float32 bucket of the same group fed the widened
// inputs, at every step, for a dense, a pattern B and a pattern A compressor.
TEST(HalfMerged, RoundedOnceFromTheFloat32PathUnderEveryMerger) {
  struct M {
    MergerPolicy policy;
    const char* name;
  };
  for (const M& merger : {M{MergerPolicy::kFixed, "fixed"}, M{MergerPolicy::kOmgs, "omgs"},
                          M{MergerPolicy::kRgmerge, "rgmerge"}}) {
    for (const char* compressor : {"dense", "topk", "micro"}) {
      for (DType t : {DType::kBFloat16, DType::kFloat16}) {
        SCOPED_TRACE(absl::StrCat(merger.name, " ", compressor, " ", DTypeName(t)));
        EngineClusterOptions o = AlwaysSparse();
        o.engine.merger = merger.policy;
        std::atomic<int> not_rounded_once{0}, nonzero{0};
        const std::vector<std::string> errors =
            RunHalfBesideFloat32(o, compressor, t, [&](const uint16_t* out1, const float* out2) {
              for (size_t i = 0; i < kN; ++i) {
                not_rounded_once += out1[i] != FloatToHalf(t, out2[i]);
                nonzero += out2[i] != 0;
              }
            });
        for (const std::string& e : errors) EXPECT_EQ(e, "");
        EXPECT_EQ(not_rounded_once.load(), 0)
            << "merged half outputs differing from the float32 path's result rounded once";
        EXPECT_GT(nonzero.load(), 0);
      }
    }
  }
}

TEST(HalfEngineErrors, ANaNInAHalfInputFailsTheStepNamingTheTrainer) {
  EngineClusterOptions o = OneNode();
  o.engine.nonfinite = NonfinitePolicy::kError;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok());
  std::vector<absl::Status> st(2);
  cluster.ForEachTrainer([&](int, int k) {
    auto tr = Trainer::Open(&cluster.engine(0), k, 2);
    ASSERT_TRUE(tr.ok());
    ASSERT_TRUE(tr->Register(9, 500, "topk", 0.1, {{"dtype", "float16"}}).ok());
    uint16_t* in = HalfAt(*tr, 9, tr->grant(9).input_offset);
    for (size_t i = 0; i < 500; ++i) in[i] = FloatToF16(0.5f);
    if (k == 1) in[123] = 0x7e00;  // NaN
    st[k] = tr->Exchange(9, 0).status();
    // The bucket goes on: the next step is clean.
    for (size_t i = 0; i < 500; ++i) in[i] = FloatToF16(0.25f);
    auto next = tr->Exchange(9, 1);
    EXPECT_TRUE(next.ok()) << next.status();
  });
  for (const absl::Status& s : st) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("123"), std::string::npos) << s;
    EXPECT_NE(s.message().find("local trainer 1"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace spex::test
