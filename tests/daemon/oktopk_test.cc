// The Ok-Topk style exchange (daemon/engine/oktopk_exchange.h) over the in-process collective:
// global selection "all" against the all-gather exchange (bit for bit) and against a dense sum
// written here; global selection "topk" over many exchanges (threshold reuse between exact
// selections, rebalanced regions, error feedback) against a one-thread reference of the
// algorithm written here; skewed selections balanced after rebalancing, with the received volume
// bounded; malformed peer data refused by every node with nothing written.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "gtest/gtest.h"
#include "tests/support/collective_conformance.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {

// The conformance suite comes with Spawn's library; this binary does not run it.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CollectiveConformance);

namespace {

// Node r's selection: `k` distinct indices drawn from [lo, hi) and values with a seed of r.
void Select(int r, uint32_t lo, uint32_t hi, size_t k, std::vector<uint32_t>* idx,
            std::vector<float>* val) {
  std::mt19937 gen(1234 + r);
  std::vector<uint32_t> all;
  for (uint32_t i = lo; i < hi; ++i) all.push_back(i);
  std::shuffle(all.begin(), all.end(), gen);
  idx->assign(all.begin(), all.begin() + std::min(k, all.size()));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  val->clear();
  for (size_t j = 0; j < idx->size(); ++j) val->push_back(nd(gen));
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Case {
  int nodes;
  uint32_t elements;
  size_t k;
  bool skewed;  // every node selects inside the first region only
  bool fp16;
};

void RunAgainstGather(const Case& c) {
  SCOPED_TRACE(testing::Message() << c.nodes << " nodes, " << c.elements << " elements, k " << c.k
                                  << (c.skewed ? ", skewed" : "") << (c.fp16 ? ", fp16" : ""));
  Spawn(c.nodes, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    const int n = coll->size();
    SparseExchangeArgs args;
    args.group_id = 7;
    args.step = 3;
    args.elements = c.elements;
    args.scale = 1.0f / (n * 2);
    args.fp16 = c.fp16;
    const uint32_t hi = c.skewed ? EqualRegions(c.elements, n)[1] : c.elements;
    std::vector<uint32_t> idx;
    std::vector<float> val;
    Select(coll->rank(), 0, hi, c.k, &idx, &val);
    std::vector<float> want(c.elements, 0.0f), got(c.elements, 0.0f);
    SparseExchangeResult rb, ro;
    ASSERT_TRUE(ExchangeSparseGather(coll, prims.get(), args, idx, val, want.data(), &rb).ok());
    absl::Status s = ExchangeOkTopk(coll, prims.get(), args, {}, idx, val, got.data(), &ro);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(SameBits(want, got));
    EXPECT_EQ(rb.touched, ro.touched);
    // The oracle: every node's selection, rebuilt here from the seeds, summed densely in node
    // order with each value scaled first (fp32 only: fp16 rounding is the wire's business).
    if (!c.fp16) {
      std::vector<float> dense(c.elements, 0.0f);
      for (int r = 0; r < n; ++r) {
        std::vector<uint32_t> ri;
        std::vector<float> rv;
        Select(r, 0, hi, c.k, &ri, &rv);
        for (size_t j = 0; j < ri.size(); ++j) dense[ri[j]] += rv[j] * args.scale;
      }
      EXPECT_TRUE(SameBits(dense, got));
    }
    // Volume: a node receives its region's parts and the reduced entries, never more than
    // every other node's selection plus the union.
    if (!c.skewed) {
      EXPECT_LT(ro.bytes_received, rb.bytes_received + ro.touched.size() * 8 + 512);
    }
  });
}

TEST(OkTopk, GlobalAllEqualsAllGatherBitForBit) {
  for (int nodes : {1, 2, 3, 4, 5}) {
    for (bool fp16 : {false, true}) {
      RunAgainstGather({nodes, 1000, 40, false, fp16});
      RunAgainstGather({nodes, 7, 7, false, fp16});  // every index selected by every node
    }
  }
}

TEST(OkTopk, SkewedSelectionsAllInOneRegion) {
  for (int nodes : {2, 4}) RunAgainstGather({nodes, 4096, 200, true, false});
}

TEST(OkTopk, EqualRegionsCoverEveryPosition) {
  EXPECT_EQ(EqualRegions(10, 3), (std::vector<uint32_t>{0, 4, 7, 10}));
  EXPECT_EQ(EqualRegions(2, 4), (std::vector<uint32_t>{0, 1, 2, 2, 2}));
}

// Delegates to the in-process collective; rank `from` misbehaves in AllToAllV.
class Tampering : public Collective {
 public:
  // kTruncate, kWrongRegion: the reduce-scatter. kBadQuantiles: unsorted region boundaries
  // offered (4 nodes: the 12-byte all-gather). kLowKept: a kept entry's value zeroed in the
  // all-gather of kept entries. kHistogram: a count added in the second radix histogram.
  enum Kind { kTruncate, kWrongRegion, kBadQuantiles, kLowKept, kHistogram };
  Tampering(Collective* c, int from, Kind kind) : c_(c), from_(from), kind_(kind) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const char* name() const override { return "tampering"; }
  absl::Status AllReduce(void* d, size_t n, ElemType t, ReduceOp op) override {
    if (n == 256 && t == ElemType::kUint64 && ++histograms_ == 2 && kind_ == kHistogram &&
        rank() == from_) {
      static_cast<uint64_t*>(d)[0] += 5;
    }
    return c_->AllReduce(d, n, t, op);
  }
  absl::Status AllReduceScaled(const float* s, float* r, size_t n, float a) override {
    return c_->AllReduceScaled(s, r, n, a);
  }
  absl::Status AllGather(const void* s, size_t b, void* r) override {
    if (kind_ == kBadQuantiles && rank() == from_ && b == 12) {
      uint32_t q[3];
      std::memcpy(q, s, sizeof(q));
      q[0] = q[2] + 1;  // above the last: not sorted
      return c_->AllGather(q, b, r);
    }
    return c_->AllGather(s, b, r);
  }
  absl::Status AllGatherV(const void* s, size_t b, std::vector<size_t>* counts,
                          std::vector<uint8_t>* r) override {
    ++gathers_;
    if (kind_ == kLowKept && rank() == from_) {
      std::vector<uint8_t> bytes(static_cast<const uint8_t*>(s),
                                 static_cast<const uint8_t*>(s) + b);
      uint32_t count;
      std::memcpy(&count, bytes.data() + 24, sizeof(count));
      if (count > 0) std::memset(bytes.data() + 48 + 4 * count, 0, sizeof(float));
      return c_->AllGatherV(bytes.data(), b, counts, r);
    }
    return c_->AllGatherV(s, b, counts, r);
  }
  absl::Status AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                         std::vector<std::vector<uint8_t>>* recv) override {
    std::vector<std::vector<uint8_t>> s = send;
    if (rank() == from_) {
      // Truncate: node 0 gets a chunk cut short. WrongRegion: node 0 gets the part meant
      // for `from` itself (valid wire, indices outside node 0's region).
      if (kind_ == kTruncate) s[0].pop_back();
      if (kind_ == kWrongRegion) std::swap(s[0], s[from_]);
    }
    return c_->AllToAllV(s, recv);
  }
  absl::Status Broadcast(void* d, size_t b, int root) override { return c_->Broadcast(d, b, root); }
  absl::Status Barrier() override { return c_->Barrier(); }
  int gathers() const { return gathers_; }

 private:
  Collective* c_;
  int from_;
  Kind kind_;
  int gathers_ = 0;
  int histograms_ = 0;
};

TEST(OkTopk, MalformedPeerDataIsDataLossOnEveryNodeNothingWritten) {
  for (Tampering::Kind kind : {Tampering::kTruncate, Tampering::kWrongRegion}) {
    Spawn(3, [&](Collective* inner) {
      Tampering coll(inner, 2, kind);
      auto prims = MakeCpuPrimitives(1);
      SparseExchangeArgs args;
      args.elements = 300;
      args.scale = 1.0f / 3;
      std::vector<uint32_t> idx;
      std::vector<float> val;
      Select(coll.rank(), 0, 300, 60, &idx, &val);  // every node sends to every region
      std::vector<float> out(300, 0.0f);
      SparseExchangeResult res;
      absl::Status s = ExchangeOkTopk(&coll, prims.get(), args, {}, idx, val, out.data(), &res);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      if (coll.rank() == 0) {
        EXPECT_NE(s.message().find("node 2"), std::string::npos) << s;
      }
      EXPECT_EQ(coll.gathers(), 0);  // stopped before the all-gather of reduced entries
      EXPECT_TRUE(SameBits(out, std::vector<float>(300, 0.0f)));
    });
  }
}

TEST(OkTopk, BadRegionBoundsAreRefused) {
  Spawn(2, [](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    SparseExchangeArgs args;
    args.elements = 10;
    std::vector<float> out(10, 0.0f);
    SparseExchangeResult res;
    std::vector<uint32_t> bounds = {0, 5};  // 2 nodes need 3 bounds
    EXPECT_EQ(ExchangeOkTopk(coll, prims.get(), args, bounds, {}, {}, out.data(), &res).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

// ---- global selection "topk" ----

// Node r's gradient at step s: heavy-tailed per position (8 times as large at every 19th, by a
// hash of the position), optionally rounded to integers so that many sums tie in magnitude (the
// tie rule is then exercised across owners).
std::vector<float> Grad(int r, int s, uint32_t elements, bool quantize) {
  std::vector<float> g(elements);
  for (uint32_t i = 0; i < elements; ++i) {
    g[i] =
        Gradient({r, 0, 0, static_cast<uint64_t>(s), i}, {GradientShape::kGaussian, 1.0, 19, 7.0});
    if (quantize) g[i] = std::round(g[i]);
  }
  return g;
}

// The local selection of the tests: the kl largest |acc|, ties to the smaller index, ascending.
std::vector<uint32_t> LocalTopK(const std::vector<float>& acc, size_t kl) {
  std::vector<uint32_t> order(acc.size());
  for (uint32_t i = 0; i < acc.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(acc[a]) > std::fabs(acc[b]); });
  order.resize(std::min(kl, order.size()));
  std::sort(order.begin(), order.end());
  return order;
}

struct TopkCase {
  int nodes;
  uint32_t elements;
  size_t kl;  // per node selection
  OkTopkOptions opts;
  int steps;
  bool quantize;
};

// The algorithm in one thread, for every node: residuals, local top-kl, the dense sum of the
// selections in node order (each value scaled first), the global selection (exact: the k largest
// |sum| over the touched positions, ties to the smaller index, and the threshold set to the k-th;
// otherwise every touched |sum| above the threshold, then the threshold nudged), and the error
// feedback (each node's residual zeroed where it selected and the index was kept).
struct Reference {
  std::vector<std::vector<float>> out;                  // per step
  std::vector<std::vector<uint32_t>> kept;              // per step, sorted
  std::vector<float> threshold;                         // per step, after it
  std::vector<std::vector<std::vector<float>>> acc;     // per step, per node, after it
  std::vector<std::vector<std::vector<uint32_t>>> sel;  // per step, per node
  int split_ties = 0;  // exact steps where entries at the k-th magnitude were left out
};

Reference RunReference(const TopkCase& c, float scale) {
  Reference ref;
  std::vector<std::vector<float>> acc(c.nodes, std::vector<float>(c.elements, 0.0f));
  float theta = 0.0f;
  const uint64_t k = c.opts.k;
  for (int s = 0; s < c.steps; ++s) {
    std::vector<float> dense(c.elements, 0.0f);
    std::vector<uint8_t> touched(c.elements, 0);
    std::vector<std::vector<uint32_t>> sel(c.nodes);
    for (int r = 0; r < c.nodes; ++r) {
      const std::vector<float> g = Grad(r, s, c.elements, c.quantize);
      for (uint32_t i = 0; i < c.elements; ++i) acc[r][i] += g[i];
      sel[r] = LocalTopK(acc[r], c.kl);
    }
    for (int r = 0; r < c.nodes; ++r) {
      for (uint32_t i : sel[r]) {
        dense[i] += acc[r][i] * scale;
        touched[i] = 1;
      }
    }
    std::vector<uint32_t> cand;
    for (uint32_t i = 0; i < c.elements; ++i) {
      if (touched[i]) cand.push_back(i);
    }
    std::vector<uint32_t> kept;
    if (s % c.opts.recompute_every == 0) {
      std::stable_sort(cand.begin(), cand.end(), [&](uint32_t a, uint32_t b) {
        return std::fabs(dense[a]) > std::fabs(dense[b]);
      });
      kept.assign(cand.begin(), cand.begin() + std::min<size_t>(k, cand.size()));
      if (!kept.empty()) theta = std::fabs(dense[kept.back()]);
      if (kept.size() < cand.size() && std::fabs(dense[cand[kept.size()]]) == theta) {
        ++ref.split_ties;
      }
    } else {
      for (uint32_t i : cand) {
        if (std::fabs(dense[i]) > theta) kept.push_back(i);
      }
      if (3 * kept.size() < 2 * k) theta /= c.opts.global_factor;
      if (3 * kept.size() > 4 * k) theta *= c.opts.global_factor;
    }
    std::sort(kept.begin(), kept.end());
    std::vector<float> out(c.elements, 0.0f);
    for (uint32_t i : kept) out[i] = dense[i];
    for (int r = 0; r < c.nodes; ++r) {
      for (uint32_t i : sel[r]) {
        if (std::binary_search(kept.begin(), kept.end(), i)) acc[r][i] = 0.0f;
      }
    }
    ref.out.push_back(std::move(out));
    ref.kept.push_back(std::move(kept));
    ref.threshold.push_back(theta);
    ref.acc.push_back(acc);
    ref.sel.push_back(std::move(sel));
  }
  return ref;
}

void RunTopkAgainstReference(const TopkCase& c) {
  SCOPED_TRACE(testing::Message() << c.nodes << " nodes, " << c.elements << " elements, kl " << c.kl
                                  << ", k " << c.opts.k << ", recompute every "
                                  << c.opts.recompute_every << ", rebalance every "
                                  << c.opts.rebalance_every << (c.quantize ? ", ties" : ""));
  const float scale = 1.0f / static_cast<float>(c.nodes);
  const Reference ref = RunReference(c, scale);
  std::vector<std::vector<uint32_t>> final_bounds(c.nodes);
  int reused = 0;  // non-exact steps whose kept count differed from k: the threshold was reused
  for (int s = 0; s < c.steps; ++s) {
    if (s % c.opts.recompute_every != 0 && ref.kept[s].size() != c.opts.k) ++reused;
  }
  Spawn(c.nodes, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    const int me = coll->rank();
    OkTopkState state;
    std::vector<float> acc(c.elements, 0.0f), out(c.elements, 0.0f);
    for (int s = 0; s < c.steps; ++s) {
      SCOPED_TRACE(testing::Message() << "step " << s);
      const std::vector<float> g = Grad(me, s, c.elements, c.quantize);
      for (uint32_t i = 0; i < c.elements; ++i) acc[i] += g[i];
      const std::vector<uint32_t> idx = LocalTopK(acc, c.kl);
      ASSERT_EQ(idx, ref.sel[s][me]);
      std::vector<float> val;
      for (uint32_t i : idx) val.push_back(acc[i]);
      SparseExchangeArgs args;
      args.group_id = 5;
      args.step = s;
      args.elements = c.elements;
      args.scale = scale;
      std::fill(out.begin(), out.end(), 0.0f);
      OkTopkResult res;
      absl::Status st =
          ExchangeOkTopk(coll, prims.get(), args, c.opts, &state, idx, val, out.data(), &res);
      ASSERT_TRUE(st.ok()) << st;
      EXPECT_EQ(res.exact, s % c.opts.recompute_every == 0);
      EXPECT_EQ(res.touched, ref.kept[s]);
      EXPECT_TRUE(SameBits(out, ref.out[s]));
      EXPECT_EQ(state.threshold, ref.threshold[s]);
      EXPECT_EQ(state.exchanges, static_cast<uint64_t>(s + 1));
      EXPECT_EQ(res.counts, std::vector<uint64_t>(c.nodes, c.kl));
      uint64_t kept = 0;
      for (uint64_t o : res.owner_kept) kept += o;
      EXPECT_EQ(kept, ref.kept[s].size());
      // Error feedback: zero where my selection was kept; the rest stays.
      for (uint32_t i : res.my_kept) acc[i] = 0.0f;
      ASSERT_TRUE(SameBits(acc, ref.acc[s][me]));
    }
    final_bounds[me] = state.bounds;
  });
  for (int r = 1; r < c.nodes; ++r) EXPECT_EQ(final_bounds[r], final_bounds[0]);
  if (c.opts.rebalance_every > 0 && c.nodes > 1) {
    EXPECT_NE(final_bounds[0], EqualRegions(c.elements, c.nodes));
  }
  if (c.opts.recompute_every > 1) {
    EXPECT_GT(reused, 0);
  }
  if (c.quantize) {
    EXPECT_GT(ref.split_ties, 0);  // some exact step kept only part of the entries at the k-th
  }
}

OkTopkOptions Topk(uint64_t k, uint32_t recompute, uint32_t rebalance) {
  OkTopkOptions o;
  o.global = OkTopkGlobal::kTopk;
  o.k = k;
  o.recompute_every = recompute;
  o.rebalance_every = rebalance;
  return o;
}

TEST(OkTopk, GlobalTopkMatchesReferenceOverSteps) {
  for (int nodes : {1, 2, 3, 4}) {
    RunTopkAgainstReference({nodes, 1500, 40, Topk(50, 3, 4), 10, false});
  }
  // Every exchange exact, and k above the union (everything kept, threshold = the smallest).
  RunTopkAgainstReference({3, 600, 20, Topk(45, 1, 2), 4, false});
  RunTopkAgainstReference({2, 300, 10, Topk(100, 2, 1), 4, false});
}

TEST(OkTopk, GlobalTopkTiesGoToTheSmallerIndexAcrossOwners) {
  for (int nodes : {2, 4}) {
    RunTopkAgainstReference({nodes, 1200, 60, Topk(37, 2, 3), 6, true});
  }
}

// Every node selects inside the first eighth of the first equal region. Without rebalancing
// owner 0 reduces everything; after it every owner reduces about a 1/P share, and a node's
// received volume (its reduce-scatter share plus the kept entries) stays near
// (kl + k)(P-1)/P pairs instead of the all-gather's kl(P-1).
TEST(OkTopk, SkewedSelectionsAreBalancedAfterRebalancing) {
  // 200 selected on 16 nodes: the quantiles must not round every step down (S[j * floor(200/16)]
  // would leave 20 of each node's 200 in the last region, 1.6 shares).
  for (auto [nodes, kl] : {std::pair<int, size_t>{4, 400}, {8, 400}, {16, 200}}) {
    for (uint32_t rebalance : {0u, 1u}) {
      SCOPED_TRACE(testing::Message()
                   << nodes << " nodes, " << kl << " selected, rebalance every " << rebalance);
      const uint32_t elements = 64000;
      const size_t k = kl;
      Spawn(nodes, [&](Collective* coll) {
        auto prims = MakeCpuPrimitives(1);
        const int n = coll->size();
        OkTopkState state;
        std::vector<float> out(elements, 0.0f);
        for (int s = 0; s < 3; ++s) {
          std::vector<uint32_t> idx;
          std::vector<float> val;
          Select(coll->rank() + 10 * s, 0, EqualRegions(elements, n)[1] / 8, kl, &idx, &val);
          SparseExchangeArgs args;
          args.step = s;
          args.elements = elements;
          args.scale = 1.0f / n;
          std::fill(out.begin(), out.end(), 0.0f);
          OkTopkResult res;
          ASSERT_TRUE(ExchangeOkTopk(coll, prims.get(), args, Topk(k, 2, rebalance), &state, idx,
                                     val, out.data(), &res)
                          .ok());
          const double share = static_cast<double>(kl);  // pairs per owner if balanced
          if (rebalance == 0) {
            EXPECT_EQ(res.rs_pairs, coll->rank() == 0 ? kl * n : 0u);
          } else {
            EXPECT_GE(res.rs_pairs, 0.75 * share);
            EXPECT_LE(res.rs_pairs, 1.25 * share);
            const double bound = (kl + k) * (n - 1.0) / n;
            EXPECT_LE(res.rs_received + res.ag_received, 1.3 * bound);
          }
        }
      });
    }
  }
}

TEST(OkTopk, TamperedTopkPhasesAreDataLossOnEveryNodeNothingWritten) {
  struct Want {
    Tampering::Kind kind;
    bool names_node;  // a sum cannot name who lied
  };
  for (Want w : {Want{Tampering::kBadQuantiles, true}, Want{Tampering::kLowKept, true},
                 Want{Tampering::kHistogram, false}}) {
    SCOPED_TRACE(testing::Message() << "kind " << w.kind);
    Spawn(4, [&](Collective* inner) {
      Tampering coll(inner, 2, w.kind);
      auto prims = MakeCpuPrimitives(1);
      SparseExchangeArgs args;
      args.elements = 400;
      args.scale = 0.25f;
      std::vector<uint32_t> idx;
      std::vector<float> val;
      Select(coll.rank(), 0, 400, 60, &idx, &val);
      std::vector<float> out(400, 0.0f);
      OkTopkState state;
      OkTopkResult res;
      absl::Status s = ExchangeOkTopk(&coll, prims.get(), args, Topk(30, 4, 8), &state, idx, val,
                                      out.data(), &res);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      if (w.names_node) {
        EXPECT_NE(s.message().find("node 2"), std::string::npos) << s;
      }
      EXPECT_TRUE(SameBits(out, std::vector<float>(400, 0.0f)));
      EXPECT_EQ(state.exchanges, 0u);
      EXPECT_TRUE(state.bounds.empty());
    });
  }
}

TEST(OkTopk, BadTopkOptionsAreRefused) {
  Spawn(2, [](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    SparseExchangeArgs args;
    args.elements = 10;
    std::vector<float> out(10, 0.0f);
    OkTopkState state;
    OkTopkResult res;
    OkTopkOptions no_k = Topk(0, 4, 0), no_recompute = Topk(3, 0, 0), flat = Topk(3, 4, 0);
    flat.global_factor = 1.0f;
    for (const OkTopkOptions& o : {no_k, no_recompute, flat}) {
      absl::Status s = ExchangeOkTopk(coll, prims.get(), args, o, &state, {}, {}, out.data(), &res);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    }
    state.bounds = {0, 11, 10};  // not sorted, past the end
    EXPECT_EQ(
        ExchangeOkTopk(coll, prims.get(), args, Topk(3, 4, 0), &state, {}, {}, out.data(), &res)
            .code(),
        absl::StatusCode::kInvalidArgument);
  });
}

// With global "all" and rebalancing, still pattern B's result bit for bit, and every selected
// index is kept (the error feedback zeroes the whole selection, as today).
TEST(OkTopk, GlobalAllWithRebalancingEqualsAllGather) {
  for (int nodes : {2, 3, 5}) {
    Spawn(nodes, [&](Collective* coll) {
      auto prims = MakeCpuPrimitives(1);
      SparseExchangeArgs args;
      args.elements = 3000;
      args.scale = 1.0f / nodes;
      OkTopkOptions opts;
      opts.rebalance_every = 1;
      OkTopkState state;
      for (int s = 0; s < 2; ++s) {
        std::vector<uint32_t> idx;
        std::vector<float> val;
        Select(coll->rank() + 7 * s, 0, 500 + 1000 * s, 120, &idx, &val);
        args.step = s;
        std::vector<float> want(3000, 0.0f), got(3000, 0.0f);
        SparseExchangeResult rb;
        OkTopkResult ro;
        ASSERT_TRUE(ExchangeSparseGather(coll, prims.get(), args, idx, val, want.data(), &rb).ok());
        ASSERT_TRUE(
            ExchangeOkTopk(coll, prims.get(), args, opts, &state, idx, val, got.data(), &ro).ok());
        EXPECT_TRUE(SameBits(want, got));
        EXPECT_EQ(rb.touched, ro.touched);
        std::vector<uint32_t> sorted = idx;
        std::sort(sorted.begin(), sorted.end());
        EXPECT_EQ(ro.my_kept, sorted);
        EXPECT_TRUE(ro.rebalanced);
      }
    });
  }
}

}  // namespace
}  // namespace spex::test
