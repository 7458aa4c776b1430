// The exchange cost model (daemon/engine/exchange_cost.h): its terms against the analytic costs
// of the collectives (latency 0: pure bandwidth; bandwidth infinite: pure latency), its choice on
// a table of cases whose winner follows from the volumes, and its refusal of bad inputs.
#include "daemon/engine/exchange_cost.h"

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "daemon/engine/wire.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

constexpr double kGbit = 1e9 / 8;

LinkModel Link(double gbps, double latency_us) {
  LinkModel l;
  l.bytes_per_s = gbps * kGbit;
  l.latency_s = latency_us * 1e-6;
  return l;
}

ExchangeShape Shape(int nodes, uint64_t n, double density, int value_bytes = 4) {
  ExchangeShape s;
  s.nodes = nodes;
  s.elements = n;
  s.k = static_cast<uint64_t>(density * n);
  s.value_bytes = value_bytes;
  return s;
}

TEST(ExchangeCost, BandwidthTermsAreTheAnalyticCosts) {
  const LinkModel link = Link(10, 0);
  for (int p : {2, 4, 8, 64, 1024}) {
    ExchangeShape s = Shape(p, 25557032, 0.01);
    s.control = false;
    const ExchangeCosts c = EstimateExchange(link, s);
    const double b = link.bytes_per_s, n = s.elements, k = s.k;
    // Ring / Rabenseifner all-reduce: 2 (P-1)/P x 4n / B.
    EXPECT_NEAR(c.dense_s, 2.0 * (p - 1) / p * 4 * n / b, 1e-12) << p;
    // Pattern B: (P-1) chunks of 48 + 8k bytes, and P-1 counts of 4 bytes.
    EXPECT_NEAR(c.allgather_s, (p - 1) * (48 + 8 * k + 4) / b, 1e-12) << p;
    EXPECT_EQ(c.control_s, 0);
    // Ok-Topk: about 2k (P-1)/P pairs received, whatever P (plus headers and small words).
    EXPECT_GT(c.oktopk_s, 2.0 * (p - 1) / p * 8 * k / b) << p;
    EXPECT_LT(c.oktopk_s, 2.0 * (p - 1) / p * 8 * k / b + (p - 1) * 200.0 / b + 3e-5) << p;
  }
}

TEST(ExchangeCost, HalfValuesHalveTheDenseWireAndShrinkThePairs) {
  const LinkModel link = Link(10, 0);
  ExchangeShape f = Shape(16, 1 << 24, 0.01, 4), h = Shape(16, 1 << 24, 0.01, 2);
  f.control = h.control = false;
  const ExchangeCosts cf = EstimateExchange(link, f), ch = EstimateExchange(link, h);
  EXPECT_NEAR(ch.dense_s / cf.dense_s, 0.5, 1e-6);
  EXPECT_NEAR(ch.allgather_s / cf.allgather_s, 6.0 / 8.0, 1e-3);  // (index 4 + value 2) / 8
}

TEST(ExchangeCost, ControlRoundAndVoteAreTwoSmallAllReducesInEveryTotal) {
  const LinkModel link = Link(1e9, 25);  // latency only
  for (int p : {2, 16, 1024}) {
    ExchangeShape with = Shape(p, 1 << 20, 0.01), without = with;
    without.control = false;
    const ExchangeCosts a = EstimateExchange(link, with), b = EstimateExchange(link, without);
    // Recursive doubling (log2 P rounds) below 32 nodes, reduce + broadcast (2 log2 P) from 128.
    const double rounds = std::ceil(std::log2(p)) * (p >= 128 ? 2 : 1);
    EXPECT_NEAR(a.control_s, 2 * rounds * 25e-6, 1e-9) << p;  // two small all-reduces
    EXPECT_NEAR(a.dense_s - b.dense_s, a.control_s, 1e-12);
    EXPECT_NEAR(a.allgather_s - b.allgather_s, a.control_s, 1e-12);
    EXPECT_NEAR(a.oktopk_s - b.oktopk_s, a.control_s, 1e-12);
  }
}

TEST(ExchangeCost, SkewSlowsOnlyOkTopk) {
  const LinkModel link = Link(10, 2);
  ExchangeShape u = Shape(64, 25557032, 0.01), s = u;
  s.skew = 4;
  const ExchangeCosts cu = EstimateExchange(link, u), cs = EstimateExchange(link, s);
  EXPECT_EQ(cu.dense_s, cs.dense_s);
  EXPECT_EQ(cu.allgather_s, cs.allgather_s);
  EXPECT_GT(cs.oktopk_s, 3.5 * (cu.oktopk_s - cu.control_s));
}

// The choice on cases whose winner follows from the volumes and the message counts.
struct Case {
  const char* what;
  int nodes;
  double gbps, latency_us;
  uint64_t n;
  double density;
  ExchangeChoice expect;
};

TEST(ExchangeCost, ChoiceTable) {
  const Case cases[] = {
      // A dense gradient: pairs cost twice a value; the ring all-reduce wins.
      {"density 0.9, 4 nodes", 4, 10, 2, 1 << 22, 0.9, ExchangeChoice::kDense},
      {"density 0.5, 64 nodes", 64, 100, 2, 1 << 22, 0.5, ExchangeChoice::kDense},
      // 2 nodes: the all-gather moves k pairs once, in one message; Ok-Topk moves about as much
      // in more messages.
      {"2 nodes, 1%", 2, 10, 5, 25557032, 0.01, ExchangeChoice::kAllGather},
      // A small bucket on a high-latency link: the all-reduce's 2 log2 P rounds beat the
      // all-gather's P - 1 and Ok-Topk's five collectives.
      {"8 nodes, 50 us, 100k elements", 8, 100, 50, 100000, 0.01, ExchangeChoice::kDense},
      // Few nodes on a high-latency link: the all-gather's two collectives beat Ok-Topk's five.
      {"4 nodes, 50 us, 1%", 4, 10, 50, 1 << 20, 0.01, ExchangeChoice::kAllGather},
      // Many nodes: the all-gather receives (P-1) k pairs, Ok-Topk about 2k.
      {"1024 nodes, 10 Gbit/s, 1%", 1024, 10, 4, 25557032, 0.01, ExchangeChoice::kOkTopk},
      {"256 nodes, 100 Gbit/s, 0.1%", 256, 100, 4, 25557032, 0.001, ExchangeChoice::kOkTopk},
      {"64 nodes, 25 Gbit/s, 1%", 64, 25, 4, 25557032, 0.01, ExchangeChoice::kOkTopk},
      // 1% on 1,024 nodes of the all-gather alone would be 10x the ring: never the pick there.
  };
  for (const Case& c : cases) {
    const ExchangeShape s = Shape(c.nodes, c.n, c.density);
    const LinkModel l = Link(c.gbps, c.latency_us);
    ASSERT_TRUE(CheckExchangeInputs(l, s).ok()) << c.what;
    const ExchangeCosts costs = EstimateExchange(l, s);
    EXPECT_EQ(ExchangeChoiceName(costs.best), std::string(ExchangeChoiceName(c.expect)))
        << c.what << ": dense " << costs.dense_s << " s, allgather " << costs.allgather_s
        << " s, oktopk " << costs.oktopk_s << " s";
    for (ExchangeChoice e :
         {ExchangeChoice::kDense, ExchangeChoice::kAllGather, ExchangeChoice::kOkTopk}) {
      EXPECT_LE(costs.Of(costs.best), costs.Of(e)) << c.what;
    }
  }
}

TEST(ExchangeCost, AllGatherGrowsWithNodesOkTopkDoesNot) {
  const LinkModel link = Link(10, 0);
  const ExchangeCosts c64 = EstimateExchange(link, Shape(64, 25557032, 0.01));
  const ExchangeCosts c1024 = EstimateExchange(link, Shape(1024, 25557032, 0.01));
  EXPECT_NEAR(c1024.allgather_s / c64.allgather_s, 1023.0 / 63.0, 0.01);
  // Ok-Topk's pairs stay about 2k a node; only its small words grow with P (the flags' P + 1
  // words, P chunk headers).
  EXPECT_LT(c1024.oktopk_s / c64.oktopk_s, 1.1);
  EXPECT_GT(c1024.allgather_s / c1024.dense_s, 9.0);  // the all-gather 10x the ring at 1,024
}

TEST(ExchangeCost, BadInputsNameTheField) {
  const LinkModel ok_link = Link(10, 2);
  const ExchangeShape ok = Shape(8, 1000, 0.01);
  ASSERT_TRUE(CheckExchangeInputs(ok_link, ok).ok());
  struct Bad {
    LinkModel link;
    ExchangeShape shape;
    const char* names;
  };
  std::vector<Bad> bad;
  {
    ExchangeShape s = ok;
    s.nodes = 0;
    bad.push_back({ok_link, s, "nodes"});
  }
  {
    LinkModel l = ok_link;
    l.bytes_per_s = 0;
    bad.push_back({l, ok, "rate"});
  }
  {
    LinkModel l = ok_link;
    l.latency_s = NAN;
    bad.push_back({l, ok, "latency"});
  }
  {
    ExchangeShape s = ok;
    s.k = 1001;
    bad.push_back({ok_link, s, "density"});
  }
  {
    ExchangeShape s = ok;
    s.elements = 0;
    bad.push_back({ok_link, s, "elements"});
  }
  {
    ExchangeShape s = ok;
    s.value_bytes = 8;
    bad.push_back({ok_link, s, "value_bytes"});
  }
  {
    ExchangeShape s = ok;
    s.skew = 0.5;
    bad.push_back({ok_link, s, "skew"});
  }
  for (double ib : {0.5, 4.5, static_cast<double>(NAN)}) {
    ExchangeShape s = ok;
    s.index_bytes = ib;
    bad.push_back({ok_link, s, "index_bytes"});
  }
  {
    ExchangeShape s = ok;
    s.recompute_every = 0;
    bad.push_back({ok_link, s, "recompute_every"});
  }
  for (const Bad& b : bad) {
    const absl::Status st = CheckExchangeInputs(b.link, b.shape);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << b.names;
    EXPECT_NE(st.message().find(b.names), absl::string_view::npos) << st.message();
  }
}

// DeltaIndexBytes against the real encoder (wire.h) on random ascending sets: the bytes an index
// takes in a delta chunk (less the uint32 chunk's header), within 4%, from density 0.5 to 1e-4;
// 4 at most. Fails if the model counts gaps in bits instead of 7-bit groups, or forgets a term.
TEST(ExchangeCost, DeltaIndexBytesIsWhatTheEncoderSends) {
  const uint32_t n = 1 << 22;
  std::mt19937 rng(3);
  for (double density : {0.5, 0.1, 0.01, 0.001, 0.0001}) {
    std::vector<uint32_t> idx;
    std::bernoulli_distribution pick(density);
    for (uint32_t i = 0; i < n; ++i) {
      if (pick(rng)) idx.push_back(i);
    }
    std::vector<uint8_t> delta, u32;
    const float scalars[4] = {};
    EncodeIndexChunk(1, 1, n, idx, scalars, &delta, IndexEncoding::kDelta);
    EncodeIndexChunk(1, 1, n, idx, scalars, &u32, IndexEncoding::kU32);
    const double header = static_cast<double>(u32.size()) - 4.0 * idx.size();
    const double measured = (static_cast<double>(delta.size()) - header) / idx.size();
    const double model = DeltaIndexBytes(n, idx.size());
    EXPECT_NEAR(model / measured, 1.0, 0.04)
        << "density " << density << ": model " << model << " bytes an index, encoder " << measured;
  }
  EXPECT_EQ(DeltaIndexBytes(n, 0), 4.0);
  EXPECT_EQ(DeltaIndexBytes(uint64_t{1} << 40, 1), 4.0);  // one index: its gap is huge
}

// The pairs' bytes follow index_bytes (pattern B at 1 byte an index and float16 values: 3 bytes
// a pair where uint32 indices take 6), and a half dense exchange on two nodes is one all-gather:
// one latency, where the all-to-all and all-gather of more nodes take one each.
TEST(ExchangeCost, DeltaIndicesShrinkThePairsAndTwoNodesHalfIsOneRound) {
  const LinkModel bw = Link(10, 0);
  ExchangeShape u = Shape(16, 1 << 24, 0.01, 2), d = u;
  u.control = d.control = false;
  d.index_bytes = 1;
  const ExchangeCosts cu = EstimateExchange(bw, u), cd = EstimateExchange(bw, d);
  EXPECT_NEAR(cd.allgather_s / cu.allgather_s, 3.0 / 6.0, 1e-3);
  EXPECT_LT(cd.oktopk_s, cu.oktopk_s);
  const LinkModel lat = Link(1e9, 25);  // latency only
  ExchangeShape two = Shape(2, 1 << 20, 0.01, 2), three = Shape(3, 1 << 20, 0.01, 2);
  two.control = three.control = false;
  EXPECT_NEAR(EstimateExchange(lat, two).dense_s, 25e-6, 1e-9);
  EXPECT_NEAR(EstimateExchange(lat, three).dense_s, 2 * 25e-6 + 2 * 25e-6, 1e-9);
}

}  // namespace
}  // namespace spex
