// --sparse_allreduce=oktopk inside the engine (in-process nodes, tests/support/engine_cluster.h):
// every compressor that can use it (OkTopkCompressorNames) gives every trainer the same output,
// bit for bit, and every node the same residual norm as --sparse_allreduce=allgather over the
// same inputs, step after step (so the residual and the compressor's state, Update included,
// stay the same too); fp16 values as well. --sparse_allreduce=auto: the probe's alternation, the
// choice of the faster (each way, on links made slow for one of the two), every node alike. And
// the refusals: the flag's spellings, a compressor that cannot use it (at Start for
// --compressor, at registration for a bucket's own), nodes disagreeing on the flag.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine_options.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/forwarding_collective.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

// Roughly Gaussian per (node, trainer, step, position), with a per-position scale every node
// shares (a spike every 97th position, a slow drift), so the nodes' selections overlap in part
// as gradients' do.
float Value(int node, int trainer, uint64_t step, size_t i) {
  return Gradient({node, trainer, 0, step, i},
                  {GradientShape::kGaussian, 1e-3, 97, 4.0, /*drift=*/true});
}

// What one run of a cluster gave: per step, node and trainer the output; per step and node the
// record of trainer 0.
struct RunResult {
  std::vector<std::vector<float>> out;  // [(step * N + node) * L + trainer]
  std::vector<ExchangeRecord> rec;      // [step * N + node]
  std::vector<std::string> errors;
};

RunResult RunCluster(
    const std::string& compressor, int N, int L, size_t n, int steps, double density,
    SparseAllreduce mode, bool fp16, OkTopkSelect global = OkTopkSelect::kAll,
    int recompute_every = 32, int rebalance_every = 64,
    std::function<std::unique_ptr<Collective>(int, std::unique_ptr<Collective>)> wrap = nullptr,
    IndexEncoding index_encoding = IndexEncoding::kDelta) {
  EngineClusterOptions o;
  o.wrap = std::move(wrap);
  o.nodes = N;
  o.trainers = L;
  o.cpu_primitives = true;
  o.engine.shm_tag = "oktopktest";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.residual_norm_every = 1;
  o.engine.fp16_values = fp16;
  o.engine.sparse_allreduce = mode;
  o.engine.oktopk_global = global;
  o.engine.oktopk_recompute_every = recompute_every;
  o.engine.oktopk_rebalance_every = rebalance_every;
  o.engine.compressor = compressor;
  o.engine.index_encoding = index_encoding;
  RunResult run;
  run.out.assign(steps * N * L, {});
  run.rec.assign(steps * N, {});
  run.errors.assign(N * L, "");
  EngineCluster cluster(o);
  if (!cluster.status().ok()) {
    run.errors[0] = cluster.status().ToString();
    return run;
  }
  // sage starts at the threshold 1 / (2 sqrt(k)): inputs of that size make it select at once.
  const float gain = compressor == "sage" ? 100.0f : 1.0f;
  cluster.ForEachTrainer([&](int r, int t) {
    std::string& err = run.errors[r * L + t];
    auto tr = Trainer::Open(&cluster.engine(r), t, L);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(3, n, compressor, density);
    if (!g.ok()) return void(err = g.status().ToString());
    for (int s = 0; s < steps; ++s) {
      tr->Fill(3, [&](size_t i) { return gain * Value(r, t, s, i); });
      auto rec = tr->Exchange(3, s, absl::Seconds(30));
      if (!rec.ok()) return void(err = rec.status().ToString());
      const float* out = tr->output(3);
      run.out[(s * N + r) * L + t].assign(out, out + n);
      if (t == 0) run.rec[s * N + r] = *rec;
    }
  });
  return run;
}

struct Case {
  std::string compressor;
  int nodes;
  int trainers;
  bool fp16;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(c.compressor, "_", c.nodes, "nodes_", c.trainers, "trainers",
                      c.fp16 ? "_fp16" : "");
}

class OkTopkEngineTest : public ::testing::TestWithParam<Case> {};

TEST_P(OkTopkEngineTest, SameOutputsAndResidualsAsAllGather) {
  const Case& c = GetParam();
  const int N = c.nodes, L = c.trainers, steps = 5;
  const size_t n = 20011;
  const double density = 0.01;
  const RunResult want =
      RunCluster(c.compressor, N, L, n, steps, density, SparseAllreduce::kAllGather, c.fp16);
  const RunResult got =
      RunCluster(c.compressor, N, L, n, steps, density, SparseAllreduce::kOkTopk, c.fp16);
  for (int i = 0; i < N * L; ++i) {
    ASSERT_EQ(want.errors[i], "") << "allgather, node " << i / L << " trainer " << i % L;
    ASSERT_EQ(got.errors[i], "") << "oktopk, node " << i / L << " trainer " << i % L;
  }
  int differing = 0, first = -1;
  size_t nonzero = 0;
  for (size_t j = 0; j < want.out.size(); ++j) {
    ASSERT_EQ(got.out[j].size(), n);
    if (std::memcmp(got.out[j].data(), want.out[j].data(), n * sizeof(float)) != 0) {
      if (differing++ == 0) first = static_cast<int>(j);
    }
    for (float v : want.out[j]) nonzero += v != 0.0f;
  }
  EXPECT_EQ(differing, 0) << "outputs not bit-identical; first at step " << first / (N * L)
                          << ", node " << first / L % N << ", trainer " << first % L;
  EXPECT_GT(nonzero, 0u) << "every output was zero: the comparison proves nothing";
  uint64_t recv_allgather = 0, recv_oktopk = 0, selected = 0;
  for (int j = 0; j < steps * N; ++j) {
    SCOPED_TRACE(absl::StrCat("step ", j / N, ", node ", j % N));
    EXPECT_EQ(got.rec[j].residual_norm, want.rec[j].residual_norm);
    EXPECT_EQ(got.rec[j].selected_elements, want.rec[j].selected_elements);
    EXPECT_EQ(got.rec[j].pattern, "B");
    recv_allgather += want.rec[j].bytes_received;
    recv_oktopk += got.rec[j].bytes_received;
    selected += want.rec[j].selected_elements;
  }
  EXPECT_GT(selected, 0u);
  // Not a goal of this test (the in-process hub moves no bytes): what each node would receive.
  std::printf("%s, %d nodes: bytes received per node per step, oktopk / allgather = %.3f\n",
              c.compressor.c_str(), N, static_cast<double>(recv_oktopk) / recv_allgather);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int nodes = 1; nodes <= 4; ++nodes) {
    for (bool fp16 : {false, true}) cases.push_back({"topk", nodes, 2, fp16});
  }
  for (const std::string& name : OkTopkCompressorNames()) {
    if (name != "topk") cases.push_back({name, 3, 1, false});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(OkTopkCompressors, OkTopkEngineTest, ::testing::ValuesIn(Cases()),
                         CaseName);

// --oktopk_global=topk (Ok-Topk proper) against a model of the algorithm: with an exact global
// selection every exchange (--oktopk_recompute_every=1), each node selects its local top-k of
// residual + local sum, the selections are summed (scaled, in node order), the k largest |sum|
// are kept (k = floor(density x n)), every trainer gets them, and each node's residual keeps
// what it selected that was not kept. Regions are re-agreed every 2 exchanges. Float sums may
// differ from the model's in the last bit (the local reduce's order), so values are compared to
// 1e-5 and the kept set exactly (no near-ties in these inputs at the k-th magnitude).
TEST(OkTopkGlobalTopk, MatchesTheAlgorithmsModelStepAfterStep) {
  const int N = 4, L = 2, steps = 6;
  const size_t n = 20011;
  const double density = 0.01;
  const size_t k = static_cast<size_t>(std::floor(density * n));
  const RunResult got = RunCluster("topk", N, L, n, steps, density, SparseAllreduce::kOkTopk, false,
                                   OkTopkSelect::kTopk, /*recompute_every=*/1,
                                   /*rebalance_every=*/2);
  for (int i = 0; i < N * L; ++i) ASSERT_EQ(got.errors[i], "") << "node " << i / L;
  std::vector<std::vector<float>> res(N, std::vector<float>(n, 0.0f));
  const float scale = 1.0f / (N * L);
  size_t dropped_total = 0;
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    std::vector<std::vector<float>> acc(N, std::vector<float>(n));
    std::vector<std::vector<uint32_t>> sel(N);
    std::vector<float> sum(n, 0.0f);
    std::vector<char> touched(n, 0);
    for (int r = 0; r < N; ++r) {
      for (size_t i = 0; i < n; ++i) {
        float x = 0;
        for (int t = 0; t < L; ++t) x += Value(r, t, s, i);
        acc[r][i] = res[r][i] + x;
      }
      std::vector<uint32_t> idx(n);
      for (size_t i = 0; i < n; ++i) idx[i] = static_cast<uint32_t>(i);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](uint32_t a, uint32_t b) {
        const float fa = std::fabs(acc[r][a]), fb = std::fabs(acc[r][b]);
        return fa != fb ? fa > fb : a < b;
      });
      sel[r].assign(idx.begin(), idx.begin() + k);
    }
    for (int r = 0; r < N; ++r) {
      for (uint32_t j : sel[r]) {
        sum[j] += acc[r][j] * scale;
        touched[j] = 1;
      }
    }
    std::vector<uint32_t> cand;
    for (size_t j = 0; j < n; ++j) {
      if (touched[j]) cand.push_back(static_cast<uint32_t>(j));
    }
    ASSERT_GT(cand.size(), k) << "the nodes' selections coincide: the global top-k keeps all";
    std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [&](uint32_t a, uint32_t b) {
      const float fa = std::fabs(sum[a]), fb = std::fabs(sum[b]);
      return fa != fb ? fa > fb : a < b;
    });
    std::vector<char> kept(n, 0);
    for (size_t q = 0; q < k; ++q) kept[cand[q]] = 1;
    for (int r = 0; r < N; ++r) {
      for (int t = 0; t < L; ++t) {
        SCOPED_TRACE(absl::StrCat("node ", r, " trainer ", t));
        const std::vector<float>& out = got.out[(s * N + r) * L + t];
        ASSERT_EQ(out.size(), n);
        size_t wrong_support = 0, wrong_value = 0;
        for (size_t j = 0; j < n; ++j) {
          if (kept[j] != (out[j] != 0.0f)) ++wrong_support;
          if (kept[j] && std::fabs(out[j] - sum[j]) > 1e-5f * std::fabs(sum[j])) ++wrong_value;
        }
        EXPECT_EQ(wrong_support, 0u) << "positions kept differ from the model's global top-" << k;
        EXPECT_EQ(wrong_value, 0u);
      }
    }
    // Error feedback: zero where the node's selection was kept, everything else stays.
    for (int r = 0; r < N; ++r) {
      res[r] = acc[r];
      for (uint32_t j : sel[r]) {
        if (kept[j]) {
          res[r][j] = 0.0f;
        } else {
          ++dropped_total;
        }
      }
      double norm = 0;
      for (float v : res[r]) norm += static_cast<double>(v) * v;
      norm = std::sqrt(norm);
      const ExchangeRecord& rec = got.rec[s * N + r];
      EXPECT_NEAR(rec.residual_norm, norm, 1e-4 * norm) << "node " << r;
      EXPECT_EQ(rec.selected_elements, k);
      EXPECT_EQ(rec.gathered_elements, k) << "node " << r << ": the kept entries";
    }
  }
  EXPECT_GT(dropped_total, 0u)
      << "no selected entry was ever dropped: the residual path is untested";
}

// The threshold steps (--oktopk_recompute_every=32: exact at exchange 0, then the threshold): every
// trainer of every node gets the same output, the first step keeps exactly k, and later steps
// keep a number near k (the threshold's band is [2k/3, 4k/3], approached by 0.8% per step).
TEST(OkTopkGlobalTopk, ThresholdStepsAgreeOnEveryNode) {
  const int N = 3, L = 1, steps = 8;
  const size_t n = 20011;
  const double density = 0.01;
  const size_t k = static_cast<size_t>(std::floor(density * n));
  const RunResult got = RunCluster("dgc", N, L, n, steps, density, SparseAllreduce::kOkTopk, false,
                                   OkTopkSelect::kTopk, 32, 64);
  for (int i = 0; i < N * L; ++i) ASSERT_EQ(got.errors[i], "") << "node " << i / L;
  for (int s = 0; s < steps; ++s) {
    const std::vector<float>& first = got.out[s * N * L];
    size_t nonzero = 0;
    for (float v : first) nonzero += v != 0.0f;
    if (s == 0) {
      EXPECT_EQ(nonzero, k);
    } else {
      EXPECT_GT(nonzero, k / 3) << "step " << s;
      EXPECT_LT(nonzero, 3 * k) << "step " << s;
    }
    for (int j = 1; j < N * L; ++j) {
      EXPECT_EQ(std::memcmp(got.out[s * N * L + j].data(), first.data(), n * sizeof(float)), 0)
          << "step " << s << ": node " << j / L << " differs from node 0";
    }
  }
}

// Per bucket: the sparse_allreduce parameter at registration overrides the daemon's flag. Two
// buckets with the same inputs on 3 nodes, one through Ok-Topk (global "all": the all-gather's
// result) and one through the all-gather: the same outputs bit for bit, different messages.
TEST(OkTopkPerBucket, TheParameterOverridesTheFlag) {
  const int N = 3;
  const size_t n = 20011;
  EngineClusterOptions o;
  o.nodes = N;
  o.cpu_primitives = true;
  o.engine.shm_tag = "oktopkpb";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.sparse_allreduce = SparseAllreduce::kAllGather;
  o.engine.oktopk_global = OkTopkSelect::kAll;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::vector<float>> out(2 * N);
  std::vector<ExchangeRecord> rec(2 * N);
  std::vector<std::string> errors(N);
  cluster.ForEachTrainer([&](int r, int t) {
    auto tr = Trainer::Open(&cluster.engine(r), t, 1);
    if (!tr.ok()) return void(errors[r] = tr.status().ToString());
    for (uint64_t id : {3, 4}) {
      std::map<std::string, std::string> params;
      if (id == 3) params["sparse_allreduce"] = "oktopk";
      auto g = tr->Register(id, n, "topk", 0.01, params);
      if (!g.ok()) return void(errors[r] = g.status().ToString());
    }
    for (int s = 0; s < 3; ++s) {
      for (uint64_t id : {3, 4}) {
        tr->Fill(id, [&](size_t i) { return Value(r, 0, s, i); });
        auto x = tr->Exchange(id, s, absl::Seconds(30));
        if (!x.ok()) return void(errors[r] = x.status().ToString());
        out[r * 2 + (id - 3)].assign(tr->output(id), tr->output(id) + n);
        rec[r * 2 + (id - 3)] = *x;
      }
    }
  });
  for (int r = 0; r < N; ++r) {
    ASSERT_EQ(errors[r], "") << "node " << r;
    EXPECT_EQ(std::memcmp(out[r * 2].data(), out[r * 2 + 1].data(), n * sizeof(float)), 0)
        << "node " << r << ": the Ok-Topk bucket's output differs from the all-gather one's";
    // The all-gather bucket gathers every node's selection; the Ok-Topk one writes their union.
    EXPECT_LT(rec[r * 2].gathered_elements, rec[r * 2 + 1].gathered_elements) << "node " << r;
    EXPECT_NE(rec[r * 2].bytes_received, rec[r * 2 + 1].bytes_received) << "node " << r;
  }
}

TEST(OkTopkPerBucket, RefusalsNameTheParameter) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.engine.shm_tag = "oktopkpr";
  o.engine.min_sparse_elements = 0;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto tr = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(tr.ok()) << tr.status();
  auto bad = tr->Register(1, 5000, "micro", 0.01, {{"sparse_allreduce", "oktopk"}});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find(
                "compressor micro cannot use the bucket parameter sparse_allreduce=oktopk"),
            std::string::npos)
      << bad.status();
  auto spelled = tr->Register(2, 5000, "topk", 0.01, {{"sparse_allreduce", "okay"}});
  ASSERT_EQ(spelled.status().code(), absl::StatusCode::kInvalidArgument) << spelled.status();
  EXPECT_NE(spelled.status().message().find("accepted values allgather, oktopk, auto"),
            std::string::npos)
      << spelled.status();
  EXPECT_TRUE(tr->Register(3, 5000, "topk", 0.01, {{"sparse_allreduce", "oktopk"}}).ok());
  EXPECT_TRUE(tr->Register(4, 5000, "micro", 0.01, {{"sparse_allreduce", "allgather"}}).ok());
  // auto: a compressor that cannot use Ok-Topk keeps its own exchange.
  EXPECT_TRUE(tr->Register(5, 5000, "micro", 0.01, {{"sparse_allreduce", "auto"}}).ok());
  EXPECT_TRUE(tr->Register(6, 5000, "dgc", 0.01, {{"sparse_allreduce", "auto"}}).ok());
}

// Node 0 registers the bucket through Ok-Topk, node 1 through the all-gather: the control round
// refuses the exchange on both, naming the bucket, before any mismatched collective.
TEST(OkTopkPerBucket, NodesMustAgree) {
  EngineClusterOptions o;
  o.nodes = 2;
  o.engine.shm_tag = "oktopkpn";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> status(2);
  cluster.ForEachTrainer([&](int r, int t) {
    auto tr = Trainer::Open(&cluster.engine(r), t, 1);
    ASSERT_TRUE(tr.ok()) << tr.status();
    std::map<std::string, std::string> params;
    if (r == 0) params["sparse_allreduce"] = "oktopk";
    ASSERT_TRUE(tr->Register(5, 5000, "topk", 0.01, params).ok());
    tr->Fill(5, [&](size_t i) { return Value(r, 0, 0, i); });
    status[r] = tr->Exchange(5, 0, absl::Seconds(30)).status();
  });
  for (const absl::Status& s : status) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("bucket 5: this node runs --sparse_allreduce="), std::string::npos)
        << s;
  }
}

TEST(OkTopkGlobalTopk, FlagSpellings) {
  OkTopkSelect v = OkTopkSelect::kAll;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("topk", &v, &error));
  EXPECT_EQ(v, OkTopkSelect::kTopk);
  EXPECT_TRUE(AbslParseFlag("all", &v, &error));
  EXPECT_EQ(v, OkTopkSelect::kAll);
  EXPECT_FALSE(AbslParseFlag("some", &v, &error));
  EXPECT_NE(error.find("accepted: topk, all"), std::string::npos) << error;
  EngineOptions o;
  o.oktopk_recompute_every = 0;
  EXPECT_NE(ValidateEngineOptions(o).message().find("--oktopk_recompute_every must be >= 1"),
            std::string::npos);
}

const char kCanUse[] =
    "dgc, gaussiank, gtopk, randomk, redsync, redsync_trim, sage, sidco_e, sidco_gp, sidco_p, "
    "topk";

TEST(OkTopkEngineErrors, TheCapableCompressorsAreThePatternBOnes) {
  EXPECT_EQ(absl::StrJoin(OkTopkCompressorNames(), ", "), kCanUse);
  for (const std::string& name : CompressorNames()) {
    auto p = CompressorPattern(name);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(CompressorCanUseOkTopk(name), *p == Pattern::kSparseGather) << name;
  }
  EXPECT_FALSE(CompressorCanUseOkTopk("no_such"));
}

// Nodes started with different --sparse_allreduce would issue mismatched collectives: the
// control round before every exchange stops them all with an error naming the flag.
TEST(OkTopkEngineErrors, NodesDisagreeingOnTheExchangeAreStoppedByTheControlRound) {
  InProcessHub hub(2, absl::Seconds(10));
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Collective> coll = hub.Connect(r);
      ExchangeKey key{1, 0, 20000, "topk"};
      key.sparse_allreduce = r == 0 ? "oktopk" : "allgather";
      Control control;
      status[r] = RunControlRound(coll.get(), key, &control);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kFailedPrecondition) << "node " << r;
    EXPECT_NE(status[r].message().find(absl::StrCat(
                  "this node runs --sparse_allreduce=", r == 0 ? "oktopk" : "allgather",
                  " but another node runs another exchange")),
              std::string::npos)
        << status[r];
  }
}

// What Update accepts from the Ok-Topk exchange: every node's selection size and the sorted,
// unique union written (Gathered::reduced), and nothing malformed.
TEST(OkTopkEngineErrors, UpdateTakesTheReducedUnion) {
  auto prims = MakeCpuPrimitives(1);
  CompressorSpec spec;
  spec.name = "topk";
  spec.density = 0.01;
  spec.node_count = 2;
  spec.elements = 1000;
  auto c = MakeCompressor(spec, prims.get());
  ASSERT_TRUE(c.ok()) << c.status();
  const std::vector<uint64_t> counts = {3, 2};
  const std::vector<uint32_t> union_idx = {4, 9, 700}, unsorted = {9, 4, 700},
                              too_many = {1, 2, 3, 4, 5, 6};
  Gathered g{counts, union_idx};
  EXPECT_EQ((*c)->Update(0, g).code(), absl::StatusCode::kInvalidArgument)
      << "3 indices for counts summing to 5 is not pattern B's all-gather";
  g.reduced = true;
  EXPECT_TRUE((*c)->Update(0, g).ok()) << (*c)->Update(0, g);
  g.indices = unsorted;
  EXPECT_EQ((*c)->Update(0, g).code(), absl::StatusCode::kInvalidArgument);
  g.indices = too_many;
  EXPECT_EQ((*c)->Update(0, g).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OkTopkEngineErrors, FlagSpellings) {
  SparseAllreduce v = SparseAllreduce::kOkTopk;
  std::string error;
  EXPECT_TRUE(AbslParseFlag("allgather", &v, &error));
  EXPECT_EQ(v, SparseAllreduce::kAllGather);
  EXPECT_TRUE(AbslParseFlag("oktopk", &v, &error));
  EXPECT_EQ(v, SparseAllreduce::kOkTopk);
  EXPECT_TRUE(AbslParseFlag("auto", &v, &error));
  EXPECT_EQ(v, SparseAllreduce::kAuto);
  EXPECT_EQ(AbslUnparseFlag(SparseAllreduce::kOkTopk), "oktopk");
  EXPECT_EQ(AbslUnparseFlag(SparseAllreduce::kAllGather), "allgather");
  EXPECT_EQ(AbslUnparseFlag(SparseAllreduce::kAuto), "auto");
  EXPECT_FALSE(AbslParseFlag("gather", &v, &error));
  EXPECT_NE(error.find("'gather' is not a sparse all-reduce; accepted: allgather, oktopk, auto"),
            std::string::npos)
      << error;
}

TEST(OkTopkEngineErrors, DefaultCompressorThatCannotUseItFailsAtStart) {
  EngineOptions o;
  o.sparse_allreduce = SparseAllreduce::kOkTopk;
  for (const char* ok : {"dense", "topk", "dgc", "sage"}) {
    o.compressor = ok;
    EXPECT_TRUE(ValidateEngineOptions(o).ok()) << ok << ": " << ValidateEngineOptions(o);
  }
  for (const char* bad : {"micro", "exdyna", "thresh", "cltk", "deft", "topk_union"}) {
    o.compressor = bad;
    const absl::Status s = ValidateEngineOptions(o);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(absl::StrCat("--compressor: compressor ", bad,
                                            " cannot use --sparse_allreduce=oktopk")),
              std::string::npos)
        << s;
    EXPECT_NE(s.message().find(absl::StrCat("the compressors that can: ", kCanUse)),
              std::string::npos)
        << s;
  }
  o.compressor = "micro";
  o.sparse_allreduce = SparseAllreduce::kAllGather;
  EXPECT_TRUE(ValidateEngineOptions(o).ok());
  o.sparse_allreduce = SparseAllreduce::kAuto;  // micro keeps its own exchange
  EXPECT_TRUE(ValidateEngineOptions(o).ok());
}

// A bucket registering its own compressor: refused when it cannot use oktopk (nothing is
// registered), accepted when it can, and a small bucket (dense anyway) is not refused.
TEST(OkTopkEngineErrors, RegistrationRefusesABucketsCompressorThatCannotUseIt) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.engine.shm_tag = "oktopkerr";
  o.engine.min_sparse_elements = 1000;
  o.engine.sparse_allreduce = SparseAllreduce::kOkTopk;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto tr = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(tr.ok()) << tr.status();
  auto bad = tr->Register(1, 5000, "micro", 0.01);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bucket 1 (5000 elements): compressor micro cannot use "
                                        "--sparse_allreduce=oktopk"),
            std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find(absl::StrCat("the compressors that can: ", kCanUse)),
            std::string::npos)
      << bad.status();
  EXPECT_TRUE(tr->Register(2, 5000, "topk", 0.01).ok());
  EXPECT_TRUE(tr->Register(3, 500, "micro", 0.01).ok()) << "a small bucket goes dense anyway";
  // The refused bucket id is free: registering it with a capable compressor works.
  EXPECT_TRUE(tr->Register(1, 5000, "dgc", 0.01).ok());
  for (uint64_t bucket : {1, 2, 3}) {  // the engine's order: (step, bucket id)
    tr->Fill(bucket, [](size_t i) { return 0.001f * static_cast<float>(i % 17); });
    auto rec = tr->Exchange(bucket, 0);
    ASSERT_TRUE(rec.ok()) << "bucket " << bucket << ": " << rec.status();
    EXPECT_EQ(rec->pattern, bucket == 3 ? "D" : "B") << "bucket " << bucket;
  }
}

// Makes the links slow, for one of the two exchanges or by volume: sleeps `per_alltoall` in
// every AllToAllV (only Ok-Topk's reduce-scatter uses it), and `per_byte` for every byte
// received from other nodes through AllGatherV and AllToAllV.
class SlowLink : public ForwardingCollective {
 public:
  SlowLink(std::unique_ptr<Collective> inner, absl::Duration per_alltoall, absl::Duration per_byte)
      : ForwardingCollective(std::move(inner)), per_alltoall_(per_alltoall), per_byte_(per_byte) {}
  const char* name() const override { return "slow link"; }
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    absl::Status s = inner()->AllGatherV(send, send_bytes, counts, recv);
    size_t others = 0;
    for (size_t r = 0; r < counts->size(); ++r) others += r == size_t(rank()) ? 0 : (*counts)[r];
    absl::SleepFor(per_byte_ * static_cast<double>(others));
    return s;
  }
  absl::Status AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                         std::vector<std::vector<uint8_t>>* recv) override {
    absl::Status s = inner()->AllToAllV(send, recv);
    size_t others = 0;
    for (size_t r = 0; r < recv->size(); ++r) others += r == size_t(rank()) ? 0 : (*recv)[r].size();
    absl::SleepFor(per_alltoall_ + per_byte_ * static_cast<double>(others));
    return s;
  }

 private:
  const absl::Duration per_alltoall_, per_byte_;
};

// The sparse_allreduce of every record: the first 2 x probe_steps (3) alternate allgather and
// oktopk, then every node runs `want` at every step.
void ExpectProbeThenChoice(const RunResult& run, int N, int steps, const std::string& want) {
  for (int i = 0; i < N; ++i) ASSERT_EQ(run.errors[i], "") << "node " << i;
  for (int s = 0; s < steps; ++s) {
    const std::string expected = s < 6 ? (s % 2 == 0 ? "allgather" : "oktopk") : want;
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(run.rec[s * N + r].sparse_allreduce, expected) << "step " << s << " node " << r;
      EXPECT_EQ(run.rec[s * N + r].pattern, "B") << "step " << s << " node " << r;
    }
  }
}

// auto chooses from the probe's measured times: on links where each of Ok-Topk's reduce-scatters
// costs 40 ms more, every node goes on with the all-gather; on links that charge by volume (4 us
// a byte received), every node goes on with Ok-Topk, which receives far less at 8 nodes than
// the all-gather's 7k pairs (about 2k in the steady state; more in the probe's first exchanges,
// a cold threshold). The in-process links are otherwise far faster than either delay.
TEST(OkTopkAuto, EveryNodeKeepsTheExchangeTheProbeFoundFaster) {
  const int N = 8, steps = 9;
  const size_t n = 50021;
  const auto slow = [](absl::Duration per_alltoall, absl::Duration per_byte) {
    return [=](int, std::unique_ptr<Collective> c) -> std::unique_ptr<Collective> {
      return std::make_unique<SlowLink>(std::move(c), per_alltoall, per_byte);
    };
  };
  const RunResult latency =
      RunCluster("topk", N, 1, n, steps, 0.01, SparseAllreduce::kAuto, false, OkTopkSelect::kTopk,
                 32, 64, slow(absl::Milliseconds(40), absl::ZeroDuration()));
  ExpectProbeThenChoice(latency, N, steps, "allgather");
  // uint32 indices: the all-gather's pairs at 8 bytes, the volume this case was sized for. With
  // the delta form both exchanges' pairs shrink to about 5 bytes, and on 2 loaded cores the
  // probe's margin (Ok-Topk's cold first exchanges receive more) fell into the noise.
  const RunResult volume =
      RunCluster("topk", N, 1, n, steps, 0.01, SparseAllreduce::kAuto, false, OkTopkSelect::kTopk,
                 32, 64, slow(absl::ZeroDuration(), absl::Microseconds(4)), IndexEncoding::kU32);
  ExpectProbeThenChoice(volume, N, steps, "oktopk");
  // What node 0 received in the probe: Ok-Topk less than the all-gather (why it won).
  uint64_t received[2] = {0, 0};  // all-gather, Ok-Topk
  for (int s = 0; s < 6; ++s) received[s % 2] += volume.rec[s * N].bytes_received;
  EXPECT_LT(received[1], received[0]);
}

// Under auto with the global selection "all", both exchanges give the all-gather's result: every
// output and residual norm equals --sparse_allreduce=allgather's, through the probe and after.
TEST(OkTopkAuto, ProbingChangesNoResult) {
  const int N = 3, L = 2, steps = 9;
  const size_t n = 20011;
  const RunResult want =
      RunCluster("dgc", N, L, n, steps, 0.01, SparseAllreduce::kAllGather, false);
  const RunResult got = RunCluster("dgc", N, L, n, steps, 0.01, SparseAllreduce::kAuto, false);
  for (int i = 0; i < N * L; ++i) {
    ASSERT_EQ(want.errors[i], "") << i;
    ASSERT_EQ(got.errors[i], "") << i;
  }
  for (size_t j = 0; j < want.out.size(); ++j) {
    ASSERT_EQ(std::memcmp(got.out[j].data(), want.out[j].data(), n * sizeof(float)), 0)
        << "step " << j / (N * L) << " node " << (j / L) % N << " trainer " << j % L;
  }
  for (size_t j = 0; j < want.rec.size(); ++j) {
    EXPECT_EQ(got.rec[j].residual_norm, want.rec[j].residual_norm) << "step " << j / N;
    if (j / N < 6) {
      EXPECT_EQ(got.rec[j].sparse_allreduce, (j / N) % 2 == 0 ? "allgather" : "oktopk");
    }
  }
}

}  // namespace
}  // namespace spex::test
