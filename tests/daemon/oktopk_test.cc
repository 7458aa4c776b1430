// The Ok-Topk style exchange (daemon/engine/oktopk_exchange.h) over the in-process collective:
// global selection "all" against the all-gather exchange (bit for bit) and against a dense sum
// written here, skewed selections, and malformed peer data refused by every node with nothing
// written.
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "gtest/gtest.h"
#include "tests/support/collective_conformance.h"

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
  enum Kind { kTruncate, kWrongRegion };
  Tampering(Collective* c, int from, Kind kind) : c_(c), from_(from), kind_(kind) {}
  int rank() const override { return c_->rank(); }
  int size() const override { return c_->size(); }
  const char* name() const override { return "tampering"; }
  absl::Status AllReduce(void* d, size_t n, ElemType t, ReduceOp op) override {
    return c_->AllReduce(d, n, t, op);
  }
  absl::Status AllReduceScaled(const float* s, float* r, size_t n, float a) override {
    return c_->AllReduceScaled(s, r, n, a);
  }
  absl::Status AllGather(const void* s, size_t b, void* r) override {
    return c_->AllGather(s, b, r);
  }
  absl::Status AllGatherV(const void* s, size_t b, std::vector<size_t>* counts,
                          std::vector<uint8_t>* r) override {
    ++gathers_;
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

}  // namespace
}  // namespace spex::test
