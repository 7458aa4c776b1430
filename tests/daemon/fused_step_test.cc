// The fused exchange (daemon/engine/fused_step.h) and the group agreement round
// (daemon/engine/group_round.h) over in-process nodes (issue 14; step level: the engine does
// not call them yet):
//  - ahead == unmerged: every member's output, residual, touched positions and record equal
//    DenseStep / SparseStep run per bucket on the same inputs, bit for bit, over several steps
//    (so the compressors' Update inputs agree too: a difference would change later selections),
//    for dense (dyadic and normal data), micro, thresh (A), topk, dgc (B) and mixed groups;
//  - a malformed peer message fails that sub-exchange's members on every node alike, and the
//    nodes stay in step;
//  - the round: the minimum offer, the maxed words, configuration / member / plan mismatches
//    refused on every node;
//  - the five skewed-readiness schedules: every node forms the same groups, nothing deadlocks,
//    and the outputs equal the unmerged run.
#include "daemon/engine/fused_step.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/fused_behind_step.h"
#include "daemon/engine/group_round.h"
#include "daemon/engine/step.h"
#include "daemon/merge/mergers.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "tests/support/collective_conformance.h"
#include "tests/support/forwarding_collective.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {

// The conformance suite comes with Spawn's library; this binary does not run it.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CollectiveConformance);

namespace {

using K = MergeKind;

// A bucket of the test: compressor "dense" for a dense-only bucket; kind D with a sparse
// compressor is a sparse bucket exchanged densely this step.
struct Spec {
  uint64_t id;
  size_t n;
  std::string compressor;
  K kind;
};

// One bucket's memory and state on one node.
struct NodeBucket {
  Spec spec;
  std::vector<float> in[2], out, acc, acc_next;
  BucketData data;
  std::unique_ptr<SparseState> sparse;
  ExchangeRecord rec;
};

constexpr double kDensity = 0.01;

std::unique_ptr<NodeBucket> MakeBucket(const Spec& spec, int rank, int nodes, Primitives* prims) {
  auto b = std::make_unique<NodeBucket>();
  b->spec = spec;
  for (auto& v : b->in) v.assign(spec.n, 0.0f);
  b->out.assign(spec.n, 0.0f);
  b->acc.assign(spec.n, 0.0f);
  b->acc_next.assign(spec.n, 0.0f);
  b->data.id = spec.id;
  b->data.elements = spec.n;
  b->data.input[0] = b->in[0].data();
  b->data.input[1] = b->in[1].data();
  b->data.output = b->out.data();
  b->data.acc = b->acc.data();
  if (spec.compressor != "dense") {
    CompressorSpec cs;
    cs.name = spec.compressor;
    cs.density = kDensity;
    cs.node_rank = rank;
    cs.node_count = nodes;
    cs.elements = spec.n;
    auto c = MakeCompressor(cs, prims);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) {
      b->sparse = std::make_unique<SparseState>();
      b->sparse->compressor = std::move(*c);
    }
  }
  return b;
}

// The trainers' inputs of a bucket at a step: a function of (node, bucket, step, trainer) only
// (tests/support/synthetic_gradient.h). Dyadic: integers in [-1000, 1000] times 2^-8, so every
// sum is exact; else standard normal.
void WriteInputs(NodeBucket* b, int rank, uint64_t step, int trainers, bool dyadic) {
  for (int t = 0; t < trainers; ++t) {
    for (size_t i = 0; i < b->in[t].size(); ++i) {
      const GradientAt at{rank, t, b->spec.id, step, i};
      b->in[t][i] = dyadic ? std::ldexp(IntegerGradient(at), -8)
                           : Gradient(at, {GradientShape::kGaussian, 1.0, 0, 0.0});
    }
  }
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const Lap kNoLap = [](Phase) {};

StepEnv Env(Collective* coll, Primitives* prims, int trainers, bool error_feedback) {
  StepEnv env;
  env.coll = coll;
  env.prims = prims;
  env.host_prims = prims;
  env.local_trainers = trainers;
  env.error_feedback = error_feedback;
  env.residual_norm_every = 1;
  return env;
}

// The local reduce every step expects done (step.h), as the engine runs it before the round:
// ReduceLocalChecked, then CommitLocalSum, with acc_next for a sparse bucket with error feedback.
void EngineReduce(const StepEnv& env, NodeBucket* b) {
  const bool sparse = b->sparse != nullptr;
  b->data.acc_next = sparse && env.error_feedback
                         ? (b->data.acc == b->acc.data() ? b->acc_next.data() : b->acc.data())
                         : nullptr;
  size_t first_bad;
  EXPECT_TRUE(ReduceLocalChecked(env, b->data, sparse, /*check=*/false, &first_bad).ok());
  CommitLocalSum(&b->data);
}

StepItem Item(NodeBucket* b, uint64_t step) {
  StepItem item;
  item.data = &b->data;
  item.sparse = b->sparse.get();
  item.step = step;
  item.density = kDensity;
  item.rec = &b->rec;
  b->rec = ExchangeRecord();
  return item;
}

// The unmerged reference: one DenseStep / SparseStep per bucket, in group order.
void RunUnmerged(const StepEnv& env, const std::vector<NodeBucket*>& group, uint64_t step) {
  for (NodeBucket* b : group) {
    EngineReduce(env, b);
    StepItem item = Item(b, step);
    if (b->spec.kind == K::kDense) {
      DenseStep(env, absl::MakeSpan(&item, 1), kNoLap);
    } else {
      SparseStep(env, absl::MakeSpan(&item, 1), kNoLap);
    }
    EXPECT_TRUE(item.status.ok()) << "bucket " << b->spec.id << ": " << item.status;
  }
}

std::vector<absl::Status> RunFused(const StepEnv& env, const std::vector<NodeBucket*>& group,
                                   uint64_t step, FusedScratch* scratch) {
  std::vector<StepItem> items;
  std::vector<K> kinds;
  for (NodeBucket* b : group) {
    EngineReduce(env, b);
    items.push_back(Item(b, step));
    kinds.push_back(b->spec.kind);
  }
  FusedStep(env, absl::MakeSpan(items), kinds, scratch, kNoLap);
  std::vector<absl::Status> status;
  for (const StepItem& item : items) status.push_back(item.status);
  return status;
}

void ExpectSame(const NodeBucket& want, const NodeBucket& got, uint64_t step) {
  SCOPED_TRACE(absl::StrCat("bucket ", want.spec.id, " (", want.spec.compressor, ", kind ",
                            static_cast<int>(want.spec.kind), ") step ", step));
  EXPECT_TRUE(SameBits(want.out, got.out)) << "output differs";
  EXPECT_EQ(0, std::memcmp(want.data.acc, got.data.acc, want.spec.n * sizeof(float)))
      << "residual differs";
  if (want.sparse != nullptr && got.sparse != nullptr) {
    EXPECT_EQ(want.sparse->touched, got.sparse->touched);
    EXPECT_EQ(want.sparse->output_dense, got.sparse->output_dense);
    EXPECT_EQ(want.sparse->sel.idx, got.sparse->sel.idx);
  }
  EXPECT_EQ(want.rec.pattern, got.rec.pattern);
  EXPECT_EQ(want.rec.bytes_sent, got.rec.bytes_sent);
  EXPECT_EQ(want.rec.bytes_received, got.rec.bytes_received);
  EXPECT_EQ(want.rec.selected_elements, got.rec.selected_elements);
  EXPECT_EQ(want.rec.gathered_elements, got.rec.gathered_elements);
  EXPECT_EQ(want.rec.residual_norm, got.rec.residual_norm);
  EXPECT_GT(got.rec.gathered_elements, 0u);  // something was exchanged
}

struct EqualityCase {
  std::string name;
  std::vector<Spec> group;
  bool dyadic = false;
};

// N nodes with L trainers each: every node runs the group unmerged on one copy of its buckets
// and fused on another, `steps` times, and compares after every step.
void RunEquality(const EqualityCase& c, int nodes, int trainers, bool error_feedback, int steps,
                 bool fp16 = false) {
  SCOPED_TRACE(absl::StrCat(c.name, ": ", nodes, " nodes x ", trainers, " trainers",
                            error_feedback ? "" : ", no error feedback",
                            fp16 ? ", fp16 values" : ""));
  Spawn(nodes, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    StepEnv env = Env(coll, prims.get(), trainers, error_feedback);
    env.fp16_values = fp16;
    std::vector<std::unique_ptr<NodeBucket>> ref, fused;
    std::vector<NodeBucket*> ref_group, fused_group;
    for (const Spec& s : c.group) {
      ref.push_back(MakeBucket(s, coll->rank(), nodes, prims.get()));
      fused.push_back(MakeBucket(s, coll->rank(), nodes, prims.get()));
      ref_group.push_back(ref.back().get());
      fused_group.push_back(fused.back().get());
    }
    FusedScratch scratch;
    for (int step = 0; step < steps; ++step) {
      for (size_t i = 0; i < ref.size(); ++i) {
        WriteInputs(ref[i].get(), coll->rank(), step, trainers, c.dyadic);
        WriteInputs(fused[i].get(), coll->rank(), step, trainers, c.dyadic);
      }
      RunUnmerged(env, ref_group, step);
      const std::vector<absl::Status> status = RunFused(env, fused_group, step, &scratch);
      for (size_t i = 0; i < ref.size(); ++i) {
        EXPECT_TRUE(status[i].ok()) << "bucket " << c.group[i].id << ": " << status[i];
        ExpectSame(*ref[i], *fused[i], step);
      }
    }
  });
}

std::vector<EqualityCase> EqualityCases() {
  return {
      {"dense, dyadic data",
       {{3, 1000, "dense", K::kDense}, {5, 37, "dense", K::kDense}, {9, 4096, "dense", K::kDense}},
       true},
      {"dense, normal data", {{3, 1000, "dense", K::kDense}, {5, 37, "dense", K::kDense}}, false},
      {"micro (A)",
       {{1, 3000, "micro", K::kPatternA},
        {2, 500, "micro", K::kPatternA},
        {4, 10, "micro", K::kPatternA}}},
      {"thresh and micro (A)",
       {{1, 2000, "thresh", K::kPatternA}, {2, 2000, "micro", K::kPatternA}}},
      {"topk (B)",
       {{1, 3000, "topk", K::kPatternB},
        {2, 700, "topk", K::kPatternB},
        {6, 10, "topk", K::kPatternB}}},
      {"dgc (B)", {{1, 5000, "dgc", K::kPatternB}, {2, 2500, "dgc", K::kPatternB}}},
      // Every kind in one group, interleaved: a dense-only bucket (pre-scaled when N*L is a power
      // of two) next to a sparse bucket exchanged densely (scaled after the all-reduce).
      {"mixed D + A + B",
       {{10, 1500, "topk", K::kPatternB},
        {11, 800, "dense", K::kDense},
        {12, 2000, "micro", K::kPatternA},
        {13, 600, "dgc", K::kDense},
        {14, 900, "dgc", K::kPatternB},
        {15, 1200, "thresh", K::kPatternA}}},
  };
}

TEST(FusedStepTest, AheadEqualsUnmergedOneToFourNodes) {
  for (const EqualityCase& c : EqualityCases()) {
    for (int nodes = 1; nodes <= 4; ++nodes) RunEquality(c, nodes, 1, true, 4);
  }
}

TEST(FusedStepTest, AheadEqualsUnmergedWithTwoTrainersAndWithoutErrorFeedback) {
  for (const EqualityCase& c : EqualityCases()) {
    RunEquality(c, 2, 2, true, 3);  // N * L = 4: the pre-scaled dense path
    RunEquality(c, 3, 2, true, 3);  // N * L = 6: scaled after the all-reduce
    RunEquality(c, 3, 1, false, 3);
  }
}

TEST(FusedStepTest, AheadEqualsUnmergedWithFp16Values) {
  // B chunks with float16 values: a chunk after one with an odd count starts 2 bytes off in the
  // fused message (sizes 10, 333 and 1001 at density 0.01 give counts 1, 3 and 10).
  const EqualityCase odd = {"topk, odd counts",
                            {{1, 10, "topk", K::kPatternB},
                             {2, 333, "topk", K::kPatternB},
                             {3, 1001, "dgc", K::kPatternB},
                             {4, 500, "micro", K::kPatternA}}};
  for (int nodes = 1; nodes <= 4; ++nodes) {
    RunEquality(odd, nodes, 1, true, 3, /*fp16=*/true);
  }
  for (const EqualityCase& c : EqualityCases()) RunEquality(c, 3, 2, true, 2, /*fp16=*/true);
}

// spexd --wire_index_encoding reaches the chunks (StepEnv::index_encoding: SparseStep's
// exchanges and FusedStep's own chunks, which it splits by ChunkLength): on 3 nodes the mixed
// group runs unmerged and fused, each with uint32 indices and in the delta form, on separate
// copies; outputs and residuals are the same bit for bit, dense members send the same bytes and
// the sparse members fewer in the delta form.
TEST(FusedStepTest, TheIndexFormChangesTheBytesNotTheResults) {
  const EqualityCase c = EqualityCases().back();  // mixed D + A + B
  Spawn(3, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    // [0] unmerged uint32, [1] unmerged delta, [2] fused uint32, [3] fused delta.
    std::vector<std::unique_ptr<NodeBucket>> b[4];
    std::vector<NodeBucket*> g[4];
    for (int v = 0; v < 4; ++v) {
      for (const Spec& s : c.group) {
        b[v].push_back(MakeBucket(s, coll->rank(), 3, prims.get()));
        g[v].push_back(b[v].back().get());
      }
    }
    FusedScratch scratch[2];
    for (int step = 0; step < 3; ++step) {
      for (int v = 0; v < 4; ++v) {
        StepEnv env = Env(coll, prims.get(), 1, true);
        env.index_encoding = v % 2 ? IndexEncoding::kDelta : IndexEncoding::kU32;
        for (auto& x : b[v]) WriteInputs(x.get(), coll->rank(), step, 1, false);
        if (v < 2) {
          RunUnmerged(env, g[v], step);
        } else {
          for (const absl::Status& st : RunFused(env, g[v], step, &scratch[v - 2])) {
            EXPECT_TRUE(st.ok()) << st;
          }
        }
      }
      for (int v : {0, 2}) {
        SCOPED_TRACE(absl::StrCat(v ? "fused" : "unmerged", ", step ", step));
        uint64_t sparse_u32 = 0, sparse_delta = 0;
        for (size_t i = 0; i < c.group.size(); ++i) {
          const NodeBucket& u = *b[v][i];
          const NodeBucket& d = *b[v + 1][i];
          EXPECT_TRUE(SameBits(u.out, d.out)) << "bucket " << c.group[i].id;
          EXPECT_EQ(0, std::memcmp(u.data.acc, d.data.acc, c.group[i].n * sizeof(float)));
          if (c.group[i].kind == K::kDense) {
            EXPECT_EQ(u.rec.bytes_sent, d.rec.bytes_sent) << "bucket " << c.group[i].id;
          } else {
            EXPECT_LE(d.rec.bytes_sent, u.rec.bytes_sent) << "bucket " << c.group[i].id;
            sparse_u32 += u.rec.bytes_sent;
            sparse_delta += d.rec.bytes_sent;
          }
        }
        EXPECT_LT(sparse_delta, sparse_u32);
      }
    }
  });
}

TEST(FusedStepTest, OneNodesLocalFailureFailsOnlyThatMemberThereAndKeepsTheNodesInStep) {
  // Node 1's topk member gets an invalid density: its SetDensity fails, so it contributes an
  // empty selection; every node still issues every sub-exchange, the other members complete
  // everywhere, and the next collective meets.
  Spawn(
      3,
      [&](Collective* coll) {
        const int r = coll->rank();
        auto prims = MakeCpuPrimitives(1);
        const StepEnv env = Env(coll, prims.get(), 1, true);
        std::vector<std::unique_ptr<NodeBucket>> owned;
        for (const Spec& s : std::vector<Spec>{{1, 500, "dense", K::kDense},
                                               {2, 900, "micro", K::kPatternA},
                                               {3, 700, "topk", K::kPatternB},
                                               {4, 800, "dgc", K::kPatternB}}) {
          owned.push_back(MakeBucket(s, r, 3, prims.get()));
          WriteInputs(owned.back().get(), r, 0, 1, false);
        }
        std::vector<StepItem> items;
        std::vector<K> kinds;
        for (auto& b : owned) {
          EngineReduce(env, b.get());
          items.push_back(Item(b.get(), 0));
          kinds.push_back(b->spec.kind);
        }
        if (r == 1) items[2].density = 5.0;
        FusedScratch scratch;
        FusedStep(env, absl::MakeSpan(items), kinds, &scratch, kNoLap);
        for (size_t i = 0; i < items.size(); ++i) {
          if (r == 1 && i == 2) {
            EXPECT_EQ(items[i].status.code(), absl::StatusCode::kInvalidArgument)
                << items[i].status;
          } else {
            EXPECT_TRUE(items[i].status.ok()) << "member " << i << ": " << items[i].status;
          }
        }
        // Node 1 sent nothing for bucket 3: the others gathered only their own two selections.
        if (r != 1) EXPECT_EQ(owned[2]->rec.gathered_elements, 2 * 7u);
        EXPECT_TRUE(coll->Barrier().ok());
      },
      absl::Seconds(5));
}

TEST(FusedStepTest, AMemberOfTenElementsStillSendsAtLeastOneEntry) {
  // Selection ahead: a 10-element bucket next to a large one keeps k = max(1, 0.01 * 10) = 1.
  Spawn(2, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    const StepEnv env = Env(coll, prims.get(), 1, true);
    auto small = MakeBucket({1, 10, "topk", K::kPatternB}, coll->rank(), 2, prims.get());
    auto large = MakeBucket({2, 100000, "topk", K::kPatternB}, coll->rank(), 2, prims.get());
    WriteInputs(small.get(), coll->rank(), 0, 1, false);
    WriteInputs(large.get(), coll->rank(), 0, 1, false);
    FusedScratch scratch;
    const auto status = RunFused(env, {large.get(), small.get()}, 0, &scratch);
    EXPECT_TRUE(status[0].ok() && status[1].ok());
    EXPECT_EQ(small->rec.selected_elements, 1u);
    EXPECT_EQ(large->rec.selected_elements, 1000u);
    EXPECT_GE(small->rec.gathered_elements, 2u);  // one from each node
  });
}

TEST(FusedStepTest, BadGroupsAreRefusedBeforeAnyCollective) {
  // One node: a refusal that issued a collective would still pass here, so the hub of 2 below
  // checks that both nodes return without waiting on each other (1 s timeout).
  Spawn(
      2,
      [&](Collective* coll) {
        auto prims = MakeCpuPrimitives(1);
        const StepEnv env = Env(coll, prims.get(), 1, true);
        auto b = MakeBucket({1, 100, "topk", K::kPatternB}, coll->rank(), 2, prims.get());
        auto d = MakeBucket({2, 100, "dense", K::kDense}, coll->rank(), 2, prims.get());
        FusedScratch scratch;
        b->spec.kind = K::kPatternA;  // topk is pattern B
        auto s = RunFused(env, {b.get(), d.get()}, 0, &scratch);
        EXPECT_EQ(s[0].code(), absl::StatusCode::kInvalidArgument);
        EXPECT_NE(s[0].message().find("topk (pattern B)"), std::string::npos) << s[0];
        EXPECT_EQ(s[1].code(), absl::StatusCode::kInvalidArgument);
        b->spec.kind = K::kProbe;
        s = RunFused(env, {b.get()}, 0, &scratch);
        EXPECT_NE(s[0].message().find("probing"), std::string::npos) << s[0];
        d->spec.kind = K::kPatternB;
        s = RunFused(env, {d.get()}, 0, &scratch);
        EXPECT_NE(s[0].message().find("dense bucket"), std::string::npos) << s[0];
        b->spec.kind = K::kPatternB;
        b->sparse->oktopk = true;
        s = RunFused(env, {b.get()}, 0, &scratch);
        EXPECT_NE(s[0].message().find("Ok-Topk"), std::string::npos) << s[0];
        b->sparse->oktopk = false;
        std::vector<StepItem> items = {Item(b.get(), 0), Item(d.get(), 1)};
        const K kinds[] = {K::kPatternB, K::kDense};
        FusedStep(env, absl::MakeSpan(items), kinds, &scratch, kNoLap);
        EXPECT_NE(items[1].status.message().find("never crosses a step"), std::string::npos)
            << items[1].status;
      },
      absl::Seconds(1));
}

// Appends junk to this node's all-gather contributions (a peer not following the wire format).
class TamperingCollective : public ForwardingCollective {
 public:
  using ForwardingCollective::ForwardingCollective;
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    std::vector<uint8_t> bytes(static_cast<const uint8_t*>(send),
                               static_cast<const uint8_t*>(send) + send_bytes);
    bytes.resize(bytes.size() + 4, 0xab);
    return inner()->AllGatherV(bytes.data(), bytes.size(), counts, recv);
  }
};

// Counts the collectives issued through it.
class CountingCollective : public ForwardingCollective {
 public:
  using ForwardingCollective::ForwardingCollective;
  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    ++all_reduce;
    return inner()->AllReduce(data, count, type, op);
  }
  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    ++all_reduce_scaled;
    return inner()->AllReduceScaled(send, recv, count, scale);
  }
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    ++all_gather_v;
    return inner()->AllGatherV(send, send_bytes, counts, recv);
  }
  int all_reduce = 0, all_reduce_scaled = 0, all_gather_v = 0;
};

TEST(FusedStepTest, AGroupIssuesAtMostOneDenseOneAAndOneBSubExchange) {
  // The mixed group of six (2 D, 2 A, 2 B): unmerged, 2 dense all-reduces, 2 x (index
  // all-gather + value all-reduce) and 2 all-gathers, 8 collectives; fused, 1 + 2 + 1 = 4.
  const EqualityCase mixed = EqualityCases().back();
  ASSERT_EQ(mixed.name, "mixed D + A + B");
  Spawn(3, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    CountingCollective unmerged(coll), fused(coll);
    std::vector<std::unique_ptr<NodeBucket>> ref, mine;
    std::vector<NodeBucket*> ref_group, fused_group;
    for (const Spec& s : mixed.group) {
      ref.push_back(MakeBucket(s, coll->rank(), 3, prims.get()));
      mine.push_back(MakeBucket(s, coll->rank(), 3, prims.get()));
      WriteInputs(ref.back().get(), coll->rank(), 0, 1, false);
      WriteInputs(mine.back().get(), coll->rank(), 0, 1, false);
      ref_group.push_back(ref.back().get());
      fused_group.push_back(mine.back().get());
    }
    RunUnmerged(Env(&unmerged, prims.get(), 1, true), ref_group, 0);
    FusedScratch scratch;
    RunFused(Env(&fused, prims.get(), 1, true), fused_group, 0, &scratch);
    EXPECT_EQ(unmerged.all_reduce_scaled + unmerged.all_reduce + unmerged.all_gather_v, 8);
    EXPECT_EQ(fused.all_reduce_scaled, 1);
    EXPECT_EQ(fused.all_gather_v, 2);
    EXPECT_EQ(fused.all_reduce, 1);
    // A dense-only group: one all-reduce, no gathers.
    CountingCollective dense(coll);
    RunFused(Env(&dense, prims.get(), 1, true), {mine[1].get()}, 1, &scratch);
    EXPECT_EQ(dense.all_reduce_scaled, 1);
    EXPECT_EQ(dense.all_gather_v + dense.all_reduce, 0);
  });
}

TEST(FusedStepTest, AMalformedPeerMessageFailsItsSubExchangeOnEveryNode) {
  Spawn(
      3,
      [&](Collective* coll) {
        auto prims = MakeCpuPrimitives(1);
        TamperingCollective tampering(coll);
        Collective* mine = coll->rank() == 1 ? static_cast<Collective*>(&tampering) : coll;
        const StepEnv env = Env(mine, prims.get(), 1, true);
        std::vector<std::unique_ptr<NodeBucket>> owned;
        for (const Spec& s : std::vector<Spec>{{1, 500, "dense", K::kDense},
                                               {2, 900, "micro", K::kPatternA},
                                               {3, 700, "topk", K::kPatternB}}) {
          owned.push_back(MakeBucket(s, coll->rank(), 3, prims.get()));
          WriteInputs(owned.back().get(), coll->rank(), 0, 1, false);
        }
        FusedScratch scratch;
        const auto s = RunFused(env, {owned[0].get(), owned[1].get(), owned[2].get()}, 0, &scratch);
        EXPECT_TRUE(s[0].ok()) << s[0];  // D has no wire chunks
        for (int i : {1, 2}) {
          EXPECT_EQ(s[i].code(), absl::StatusCode::kDataLoss) << s[i];
          EXPECT_NE(s[i].message().find("from node 1"), std::string::npos) << s[i];
          EXPECT_NE(s[i].message().find("after the group's last chunk"), std::string::npos) << s[i];
        }
        // Every node stopped at the same point: the next collective meets.
        EXPECT_TRUE(coll->Barrier().ok());
      },
      absl::Seconds(5));
}

// --- Selection behind: the group is one bucket of the summed size ---

// Every member's output and the group's residual equal one bucket of sum(n) elements exchanged
// by SparseStep with the members' inputs concatenated (the reference for `behind`).
// The members are sparse buckets reduced before the step, as the engine runs behind groups.
void RunBehind(const std::string& compressor, K kind, const std::vector<size_t>& sizes, int nodes,
               int trainers, bool error_feedback, int steps) {
  SCOPED_TRACE(absl::StrCat("behind ", compressor, ": ", nodes, " nodes x ", trainers, " trainers",
                            error_feedback ? "" : ", no error feedback"));
  Spawn(nodes, [&](Collective* coll) {
    const int r = coll->rank();
    auto prims = MakeCpuPrimitives(1);
    const StepEnv env = Env(coll, prims.get(), trainers, error_feedback);
    std::vector<std::unique_ptr<NodeBucket>> members;
    std::vector<const BucketData*> data;
    size_t total = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      members.push_back(MakeBucket({20 + i, sizes[i], compressor, kind}, r, nodes, prims.get()));
      data.push_back(&members.back()->data);
      total += sizes[i];
    }
    auto ref = MakeBucket({77, total, compressor, kind}, r, nodes, prims.get());
    CompressorSpec spec;
    spec.name = compressor;
    spec.density = kDensity;
    spec.node_rank = r;
    spec.node_count = nodes;
    absl::StatusOr<std::unique_ptr<BehindGroup>> g = MakeBehindGroup(data, spec, prims.get());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ((*g)->group_id, (uint64_t{1} << 63) | 20);
    for (int step = 0; step < steps; ++step) {
      size_t at = 0;
      for (auto& m : members) {
        WriteInputs(m.get(), r, step, trainers, false);
        for (int t = 0; t < trainers; ++t) {
          std::copy(m->in[t].begin(), m->in[t].end(), ref->in[t].begin() + at);
        }
        at += m->spec.n;
      }
      RunUnmerged(env, {ref.get()}, step);
      std::vector<StepItem> items;
      for (auto& m : members) {
        EngineReduce(env, m.get());
        items.push_back(Item(m.get(), step));
      }
      FusedBehindStep(env, g->get(), absl::MakeSpan(items), kNoLap);
      size_t selected = 0;
      for (size_t i = 0; i < members.size(); ++i) {
        EXPECT_TRUE(items[i].status.ok()) << items[i].status;
        const size_t lo = (*g)->offsets[i];
        EXPECT_EQ(
            0, std::memcmp(members[i]->out.data(), ref->out.data() + lo, sizes[i] * sizeof(float)))
            << "member " << i << " output differs at step " << step;
        // The residual stays with the member.
        EXPECT_EQ(0,
                  std::memcmp(members[i]->data.acc, ref->data.acc + lo, sizes[i] * sizeof(float)))
            << "member " << i << " residual differs at step " << step;
        selected += members[i]->rec.selected_elements;
      }
      // ref's residual: where its reduce left acc (acc and acc_next swap every step).
      const std::vector<float> ref_acc(ref->data.acc, ref->data.acc + total);
      EXPECT_TRUE(SameBits((*g)->acc, ref_acc)) << "residual differs at step " << step;
      EXPECT_EQ(selected, ref->rec.selected_elements);
      EXPECT_EQ(members[0]->rec.bytes_sent, ref->rec.bytes_sent);
      EXPECT_GT(ref->rec.gathered_elements, 0u);
    }
  });
}

TEST(FusedBehindTest, EqualsOneBucketOfTheSummedSize) {
  const std::vector<size_t> sizes = {700, 10, 1300, 333};
  for (int nodes = 1; nodes <= 3; ++nodes) {
    RunBehind("topk", K::kPatternB, sizes, nodes, 1, true, 4);
    RunBehind("dgc", K::kPatternB, sizes, nodes, 2, true, 4);
    RunBehind("micro", K::kPatternA, sizes, nodes, 1, true, 4);
    RunBehind("thresh", K::kPatternA, sizes, nodes, 2, false, 3);
  }
}

TEST(FusedBehindTest, ASmallMemberMayGetNoEntryBehindButAlwaysOneAhead) {
  // The difference between the placements, shown: a 10-element bucket of small values next to a
  // 100000-element one at density 0.01. Ahead it keeps max(1, 0.1) = 1 entry per node; behind,
  // the group's top 1000 are all in the large one.
  Spawn(2, [&](Collective* coll) {
    const int r = coll->rank();
    auto prims = MakeCpuPrimitives(1);
    const StepEnv env = Env(coll, prims.get(), 1, true);
    auto small = MakeBucket({1, 10, "topk", K::kPatternB}, r, 2, prims.get());
    auto large = MakeBucket({2, 100000, "topk", K::kPatternB}, r, 2, prims.get());
    WriteInputs(small.get(), r, 0, 1, false);
    WriteInputs(large.get(), r, 0, 1, false);
    for (float& x : small->in[0]) x *= 1e-3f;
    FusedScratch scratch;
    EXPECT_TRUE(RunFused(env, {large.get(), small.get()}, 0, &scratch)[1].ok());
    EXPECT_EQ(small->rec.selected_elements, 1u);
    // The same inputs behind (the ahead step above left the residual in the members' own acc,
    // which a behind group does not use).
    CompressorSpec spec;
    spec.name = "topk";
    spec.density = kDensity;
    spec.node_rank = r;
    spec.node_count = 2;
    const BucketData* data[] = {&large->data, &small->data};
    auto g = MakeBehindGroup(data, spec, prims.get());
    ASSERT_TRUE(g.ok()) << g.status();
    EngineReduce(env, large.get());
    EngineReduce(env, small.get());
    std::vector<StepItem> items = {Item(large.get(), 0), Item(small.get(), 0)};
    FusedBehindStep(env, g->get(), absl::MakeSpan(items), kNoLap);
    EXPECT_TRUE(items[1].status.ok()) << items[1].status;
    EXPECT_EQ(large->rec.selected_elements, 1000u);
    EXPECT_EQ(small->rec.selected_elements, 0u);
  });
}

TEST(FusedBehindTest, BadGroupsAreRefused) {
  Spawn(1, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    const StepEnv env = Env(coll, prims.get(), 1, true);
    auto a = MakeBucket({1, 100, "dense", K::kDense}, 0, 1, prims.get());
    auto b = MakeBucket({2, 50, "dense", K::kDense}, 0, 1, prims.get());
    CompressorSpec spec;
    spec.name = "topk";
    const BucketData* data[] = {&a->data, &b->data};
    auto g = MakeBehindGroup(data, spec, prims.get());
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ((*g)->elements, 150u);
    std::vector<StepItem> items = {Item(b.get(), 0), Item(a.get(), 0)};  // out of plan order
    FusedBehindStep(env, g->get(), absl::MakeSpan(items), kNoLap);
    EXPECT_NE(items[0].status.message().find("plan never changes"), std::string::npos)
        << items[0].status;
    items = {Item(a.get(), 0), Item(b.get(), 0)};
    b->data.acc = nullptr;  // a dense-only bucket
    FusedBehindStep(env, g->get(), absl::MakeSpan(items), kNoLap);
    EXPECT_NE(items[0].status.message().find("no accumulator"), std::string::npos)
        << items[0].status;
    b->data.acc = b->acc.data();
    EXPECT_EQ(MakeBehindGroup({}, spec, prims.get()).status().code(),
              absl::StatusCode::kInvalidArgument);
    spec.name = "nope";
    EXPECT_EQ(MakeBehindGroup(data, spec, prims.get()).status().code(),
              absl::StatusCode::kInvalidArgument);
  });
}

// --- The agreement round ---

std::vector<GroupMemberKey> Keys(size_t r, uint64_t step = 7) {
  std::vector<GroupMemberKey> keys;
  for (size_t j = 0; j < r; ++j) {
    keys.push_back({100 + j, step, 1000 + j, j % 2 ? "topk" : "micro",
                    j % 2 ? K::kPatternB : K::kPatternA, false});
  }
  return keys;
}

MergeConfig Config(const Merger& m, const GroupLimits& limits) {
  return {m.name(), limits.window, limits.max_group_elements, m.ConfigHash()};
}

// Runs the round on `nodes` in-process nodes, node r with inputs prepare(r, &in) fills.
std::vector<std::pair<absl::Status, GroupRoundResult>> Round(
    int nodes,
    const std::function<void(int, GroupRoundInput*, std::vector<GroupMemberKey>*)>& prepare) {
  std::vector<std::pair<absl::Status, GroupRoundResult>> out(nodes);
  Spawn(
      nodes,
      [&](Collective* coll) {
        const int r = coll->rank();
        GroupRoundInput in;
        std::vector<GroupMemberKey> keys;
        prepare(r, &in, &keys);
        in.offer = keys;
        out[r].first = RunGroupRound(coll, in, &out[r].second);
      },
      absl::Seconds(5));
  return out;
}

TEST(GroupRoundTest, AgreesOnTheMinimumOfferAndMaxesTheControlWords) {
  auto rg = MakeRgmergeReadyMerger({});
  ASSERT_TRUE(rg.ok());
  const MergeConfig cfg = Config(**rg, GroupLimits());
  const size_t offers[] = {5, 2, 9, 3};
  auto out = Round(4, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = cfg;
    *keys = Keys(offers[r]);
    in->density_key = r == 2 ? DensityKey(3, 0.05f) : DensityKey(1, 0.01f);
    in->inputs_failed = r == 3;
    in->dead_trainer = r == 1 ? DeadTrainerWord(1, 0, 42) : 0;
    in->nonfinite = r == 0 ? NonfiniteWord(0, 1, 5) : r == 2 ? NonfiniteWord(2, 0, 9) : 0;
    in->nonfinite_member = r == 0 ? 4 : 1;
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(out[r].first.ok()) << "node " << r << ": " << out[r].first;
    const GroupRoundResult& g = out[r].second;
    EXPECT_EQ(g.agreed, 2u);
    EXPECT_EQ(g.density_key, DensityKey(3, 0.05f));
    EXPECT_TRUE(g.inputs_failed);
    EXPECT_EQ(g.dead_trainer, DeadTrainerWord(1, 0, 42));
    EXPECT_EQ(g.nonfinite, NonfiniteWord(2, 0, 9));  // the highest node's, with its member
    EXPECT_EQ(g.nonfinite_member, 1u);
  }
  // One node: no collective, m = the offer.
  out = Round(1, [&](int, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = cfg;
    *keys = Keys(6);
  });
  ASSERT_TRUE(out[0].first.ok()) << out[0].first;
  EXPECT_EQ(out[0].second.agreed, 6u);
}

void ExpectRefusedEverywhere(const std::vector<std::pair<absl::Status, GroupRoundResult>>& out,
                             const std::vector<std::string>& phrases) {
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r].first.code(), absl::StatusCode::kFailedPrecondition)
        << "node " << r << ": " << out[r].first;
    for (const std::string& p : phrases) {
      EXPECT_NE(out[r].first.message().find(p), std::string::npos)
          << "node " << r << " lacks '" << p << "': " << out[r].first;
    }
  }
}

TEST(GroupRoundTest, AMergerConfigurationMismatchIsRefusedOnEveryNode) {
  // A different --fixed_threshold_bytes on one node.
  FixedOptions a, b;
  b.threshold_bytes = a.threshold_bytes / 2;
  auto fa = MakeFixedMerger(a), fb = MakeFixedMerger(b);
  ASSERT_TRUE(fa.ok() && fb.ok());
  auto out = Round(3, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = Config(r == 1 ? **fb : **fa, a.limits);
    *keys = Keys(3);
  });
  ExpectRefusedEverywhere(out, {"merger configuration differs between nodes",
                                "the merger's parameters", "fixed with configuration hash"});
  // A different merger on one node.
  auto rg = MakeRgmergeReadyMerger({});
  ASSERT_TRUE(rg.ok());
  out = Round(3, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = Config(r == 2 ? **rg : **fa, a.limits);
    *keys = Keys(2);
  });
  ExpectRefusedEverywhere(out, {"merger configuration differs", "the merger (--merger)"});
  // A different window (the message has the same size whatever W is) and max_group_elements.
  GroupLimits small;
  small.window = 8;
  out = Round(2, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = Config(**rg, r == 0 ? small : GroupLimits());
    *keys = Keys(2);
  });
  ExpectRefusedEverywhere(out, {"the merge window W"});
  GroupLimits capped;
  capped.max_group_elements = 1000;
  out = Round(2, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = Config(**rg, r == 1 ? capped : GroupLimits());
    *keys = Keys(2);
  });
  ExpectRefusedEverywhere(out, {"max_group_elements"});
}

TEST(GroupRoundTest, AMemberMismatchAmongTheAgreedIsRefusedOnEveryNode) {
  // One node has a different size, compressor or kind at member 1.
  auto rg = MakeRgmergeReadyMerger({});
  ASSERT_TRUE(rg.ok());
  const MergeConfig cfg = Config(**rg, GroupLimits());
  for (int what = 0; what < 4; ++what) {
    auto out = Round(3, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
      in->config = cfg;
      *keys = Keys(3);
      if (r != 2) return;
      if (what == 0) (*keys)[1].elements += 1;
      if (what == 1) (*keys)[1].compressor = "dgc";
      if (what == 2) (*keys)[1].kind = K::kDense;
      if (what == 3) (*keys)[1].fp16 = true;
    });
    ExpectRefusedEverywhere(out, {"bucket order differs between nodes", "member 1 of the group"});
  }
  // Beyond the agreed prefix, nothing is compared: node 1 offers 1, the others differ at 2.
  auto out = Round(3, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = cfg;
    *keys = Keys(r == 1 ? 1 : 3);
    if (r == 2) (*keys)[2].elements += 1;
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].first.ok()) << out[r].first;
    EXPECT_EQ(out[r].second.agreed, 1u);
  }
}

TEST(GroupRoundTest, AStaticPlanGroupOfADifferentLengthIsRefusedOnEveryNode) {
  OmgsOptions o;
  auto om = MakeOmgsMerger(o);
  ASSERT_TRUE(om.ok());
  auto out = Round(3, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = Config(**om, o.limits);
    in->exact = true;
    *keys = Keys(r == 0 ? 2 : 3);
  });
  ExpectRefusedEverywhere(out, {"merge plan differs between nodes", "omgs plan group"});
  out = Round(3, [&](int, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
    in->config = Config(**om, o.limits);
    in->exact = true;
    *keys = Keys(3);
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].first.ok()) << out[r].first;
    EXPECT_EQ(out[r].second.agreed, 3u);
  }
}

TEST(GroupRoundTest, APlanDueOnAnyNodeIsDueOnEvery) {
  auto rg = MakeRgmergeReadyMerger({});
  ASSERT_TRUE(rg.ok());
  const MergeConfig cfg = Config(**rg, GroupLimits());
  for (int due_on : {-1, 0, 2}) {
    auto out = Round(3, [&](int r, GroupRoundInput* in, std::vector<GroupMemberKey>* keys) {
      in->config = cfg;
      *keys = Keys(2);
      in->plan_due = r == due_on;
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(out[r].first.ok()) << out[r].first;
      EXPECT_EQ(out[r].second.plan_due, due_on >= 0) << "node " << r << ", due on " << due_on;
    }
  }
}

// The plan agreement (docs/merging.md 2.6): the maximum of every node's words, the same everywhere;
// a different bucket list refused on every node, before the words' all-reduce.
TEST(PlanAgreementTest, TakesTheMaximumOverNodesAndRefusesDifferentBucketLists) {
  const std::vector<PlanBucket> buckets = {{1, 100}, {2, 50}, {5, 7}};
  std::vector<std::pair<absl::Status, std::vector<uint64_t>>> out(4);
  Spawn(
      4,
      [&](Collective* coll) {
        const int r = coll->rank();
        std::vector<uint64_t> w = {uint64_t(r), uint64_t(10 - r), 7, uint64_t(r == 2 ? 99 : 1)};
        out[r].first = RunPlanAgreement(coll, buckets, &w);
        out[r].second = w;
      },
      absl::Seconds(5));
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(out[r].first.ok()) << out[r].first;
    EXPECT_EQ(out[r].second, (std::vector<uint64_t>{3, 10, 7, 99})) << "node " << r;
  }
  // Node 1 has another size for bucket 2; node 3 another number of words: refused everywhere.
  for (int variant = 0; variant < 2; ++variant) {
    Spawn(
        3,
        [&](Collective* coll) {
          const int r = coll->rank();
          std::vector<PlanBucket> mine = buckets;
          std::vector<uint64_t> w(4, 1);
          if (variant == 0 && r == 1) mine[1].elements = 51;
          if (variant == 1 && r == 2) w.push_back(1);
          out[r].first = RunPlanAgreement(coll, mine, &w);
        },
        absl::Seconds(5));
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(out[r].first.code(), absl::StatusCode::kFailedPrecondition)
          << "variant " << variant << " node " << r << ": " << out[r].first;
      EXPECT_NE(out[r].first.message().find("register the same buckets"), std::string::npos)
          << out[r].first;
    }
  }
  // One node: nothing to agree, the words stay.
  Spawn(
      1,
      [&](Collective* coll) {
        std::vector<uint64_t> w = {4, 5};
        out[0].first = RunPlanAgreement(coll, buckets, &w);
        out[0].second = w;
      },
      absl::Seconds(5));
  ASSERT_TRUE(out[0].first.ok());
  EXPECT_EQ(out[0].second, (std::vector<uint64_t>{4, 5}));
}

TEST(GroupRoundTest, BadOffersAreInvalidArgument) {
  auto rg = MakeRgmergeReadyMerger({});
  ASSERT_TRUE(rg.ok());
  Spawn(1, [&](Collective* coll) {
    GroupRoundInput in;
    in.config = Config(**rg, GroupLimits());
    GroupRoundResult res;
    EXPECT_EQ(RunGroupRound(coll, in, &res).code(), absl::StatusCode::kInvalidArgument);
    const std::vector<GroupMemberKey> keys = Keys(3);
    in.offer = keys;
    in.config.window = 2;
    EXPECT_EQ(RunGroupRound(coll, in, &res).code(), absl::StatusCode::kInvalidArgument);
    in.config.window = 65;
    EXPECT_EQ(RunGroupRound(coll, in, &res).code(), absl::StatusCode::kInvalidArgument);
  });
}

// --- Skewed readiness ---
// Per node, a trainer thread writes each bucket's inputs and marks it ready on a schedule, and
// the node's thread plays the engine: candidates in canonical order, the merger's offer (agreed)
// or plan group (static), the group round, Pack, and FusedStep per group. Every node must form
// the same groups, nothing may hang (the hub's timeout turns a hang into errors), and every
// output must equal the unmerged run on the same inputs.

enum class Schedule { kAtOnce, kReverse, kLate, kJitter, kBlocking };

const char* ScheduleName(Schedule s) {
  switch (s) {
    case Schedule::kAtOnce:
      return "(a) all at once";
    case Schedule::kReverse:
      return "(b) node 1 in reverse order";
    case Schedule::kLate:
      return "(c) node 1 20 ms late per bucket";
    case Schedule::kJitter:
      return "(d) 0-5 ms jitter";
    case Schedule::kBlocking:
      return "(e) node 1 awaits each result";
  }
  return "?";
}

const std::vector<Spec>& SimBuckets() {
  static const std::vector<Spec> specs = {
      {0, 1200, "topk", K::kPatternB},  {1, 300, "dense", K::kDense},
      {2, 2000, "micro", K::kPatternA}, {3, 800, "topk", K::kPatternB},
      {4, 500, "dense", K::kDense},     {5, 1500, "micro", K::kPatternA}};
  return specs;
}
constexpr int kSimSteps = 3;

struct SimBucket {
  std::unique_ptr<NodeBucket> mem;
  std::atomic<uint64_t> ready{0};      // steps whose inputs are written
  std::atomic<uint64_t> published{0};  // steps exchanged
  uint64_t next_step = 0;              // engine thread only
  std::vector<std::vector<float>> outputs;
};

using GroupLog = std::vector<std::tuple<uint64_t, uint64_t, size_t>>;  // (step, first id, length)

void Trainer(int rank, Schedule schedule, std::vector<std::unique_ptr<SimBucket>>* buckets) {
  std::mt19937 gen(99 + rank);
  std::uniform_int_distribution<int> jitter_us(0, 5000);
  const auto until = [](const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done() && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  };
  const size_t nb = buckets->size();
  for (uint64_t step = 0; step < kSimSteps; ++step) {
    // The optimizer step: every result of the previous step first.
    until([&] {
      for (auto& b : *buckets) {
        if (b->published.load() < step) return false;
      }
      return true;
    });
    if (schedule == Schedule::kAtOnce) {
      for (auto& b : *buckets) WriteInputs(b->mem.get(), rank, step, 1, false);
      // Highest id first, so the head is the last to turn ready: all at once for the engine.
      for (size_t i = nb; i-- > 0;) (*buckets)[i]->ready.store(step + 1);
      continue;
    }
    for (size_t j = 0; j < nb; ++j) {
      const bool skewed = rank == 1;
      SimBucket& b = *(*buckets)[schedule == Schedule::kReverse && skewed ? nb - 1 - j : j];
      if (schedule == Schedule::kLate && skewed) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (schedule == Schedule::kJitter) {
        std::this_thread::sleep_for(std::chrono::microseconds(jitter_us(gen)));
      }
      WriteInputs(b.mem.get(), rank, step, 1, false);
      b.ready.store(step + 1);
      if (schedule == Schedule::kBlocking && skewed) {
        until([&] { return b.published.load() > step; });
      }
    }
  }
}

// One node's engine loop; false after a failure (already reported).
bool EngineLoop(Collective* coll, Merger* merger, const GroupLimits& limits,
                std::vector<std::unique_ptr<SimBucket>>* buckets, GroupLog* log) {
  auto prims = MakeCpuPrimitives(1);
  const StepEnv env = Env(coll, prims.get(), 1, true);
  FusedScratch scratch;
  const MergeConfig cfg{merger->name(), limits.window, limits.max_group_elements,
                        merger->ConfigHash()};
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (true) {
    if (std::chrono::steady_clock::now() > give_up) {
      ADD_FAILURE() << "node " << coll->rank() << " gave up waiting for its trainer";
      return false;
    }
    std::vector<SimBucket*> order;
    std::vector<MergeCandidate> c;
    for (auto& b : *buckets) {
      if (b->next_step < kSimSteps) order.push_back(b.get());
    }
    if (order.empty()) return true;
    std::stable_sort(order.begin(), order.end(), [](const SimBucket* x, const SimBucket* y) {
      return x->next_step < y->next_step;
    });
    for (SimBucket* b : order) {
      MergeCandidate m;
      m.bucket_id = b->mem->spec.id;
      m.step = b->next_step;
      m.elements = b->mem->spec.n;
      m.ready = b->ready.load() > b->next_step;
      m.kind = b->mem->spec.kind;
      c.push_back(m);
    }
    const auto idle = [] { std::this_thread::sleep_for(std::chrono::microseconds(100)); };
    if (!c[0].ready) {
      idle();
      continue;
    }
    size_t r;
    if (merger->agreed()) {
      int64_t deadline = 0;
      const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::steady_clock::now().time_since_epoch())
                              .count();
      r = merger->Offer(c, now, &deadline);
      if (r == 0) {
        idle();
        continue;
      }
    } else {
      // A static plan waits until every member of its group is locally ready.
      r = merger->NextGroup(c);
      if (!std::all_of(c.begin(), c.begin() + r, [](const MergeCandidate& m) { return m.ready; })) {
        idle();
        continue;
      }
    }
    std::vector<GroupMemberKey> keys;
    for (size_t j = 0; j < r; ++j) {
      keys.push_back({c[j].bucket_id, c[j].step, c[j].elements, order[j]->mem->spec.compressor,
                      c[j].kind, false});
    }
    GroupRoundInput in;
    in.config = cfg;
    in.offer = keys;
    in.exact = !merger->agreed();
    GroupRoundResult agreed;
    if (absl::Status s = RunGroupRound(coll, in, &agreed); !s.ok()) {
      ADD_FAILURE() << "node " << coll->rank() << ": " << s;
      return false;
    }
    const size_t m = agreed.agreed;
    const std::vector<size_t> groups =
        merger->agreed() ? merger->Pack(absl::MakeConstSpan(c.data(), m)) : std::vector<size_t>{m};
    size_t at = 0;
    for (size_t len : groups) {
      std::vector<NodeBucket*> members;
      for (size_t j = at; j < at + len; ++j) members.push_back(order[j]->mem.get());
      const uint64_t step = c[at].step;
      const std::vector<absl::Status> status = RunFused(env, members, step, &scratch);
      log->emplace_back(step, c[at].bucket_id, len);
      for (size_t j = at; j < at + len; ++j) {
        SimBucket& b = *order[j];
        if (!status[j - at].ok()) {
          ADD_FAILURE() << "bucket " << c[j].bucket_id << ": " << status[j - at];
          return false;
        }
        b.outputs.push_back(b.mem->out);
        ++b.next_step;
        b.published.store(b.next_step);
      }
      at += len;
    }
  }
}

// Node-major, then bucket, then step: every output of the unmerged run.
std::vector<std::vector<std::vector<std::vector<float>>>> UnmergedOutputs(int nodes) {
  std::vector<std::vector<std::vector<std::vector<float>>>> out(nodes);
  Spawn(nodes, [&](Collective* coll) {
    auto prims = MakeCpuPrimitives(1);
    const StepEnv env = Env(coll, prims.get(), 1, true);
    std::vector<std::unique_ptr<NodeBucket>> owned;
    for (const Spec& s : SimBuckets())
      owned.push_back(MakeBucket(s, coll->rank(), nodes, prims.get()));
    auto& mine = out[coll->rank()];
    mine.resize(owned.size());
    for (uint64_t step = 0; step < kSimSteps; ++step) {
      for (size_t i = 0; i < owned.size(); ++i) {
        WriteInputs(owned[i].get(), coll->rank(), step, 1, false);
        RunUnmerged(env, {owned[i].get()}, step);
        mine[i].push_back(owned[i]->out);
      }
    }
  });
  return out;
}

struct SimMerger {
  std::string name;
  std::function<std::unique_ptr<Merger>()> make;
  GroupLimits limits;
};

std::vector<SimMerger> SimMergers() {
  std::vector<SimMerger> m;
  m.push_back({"rgmerge ready", [] { return *MakeRgmergeReadyMerger({}); }, GroupLimits()});
  m.push_back({"fixed 64 MiB / 5 ms", [] { return *MakeFixedMerger({}); }, GroupLimits()});
  m.push_back({"omgs count 2",
               [] {
                 OmgsOptions o;
                 o.mode = OmgsMode::kCount;
                 o.count = 2;
                 return *MakeOmgsMerger(o);
               },
               GroupLimits()});
  return m;
}

TEST(FusedScheduleTest, SkewedReadinessGivesTheSameGroupsOnEveryNodeAndTheUnmergedOutputs) {
  constexpr int kNodes = 3;
  const auto want = UnmergedOutputs(kNodes);
  for (const SimMerger& sm : SimMergers()) {
    for (Schedule schedule : {Schedule::kAtOnce, Schedule::kReverse, Schedule::kLate,
                              Schedule::kJitter, Schedule::kBlocking}) {
      std::unique_ptr<Merger> probe = sm.make();
      // A static plan cannot serve a trainer that awaits each result before the next bucket
      // (it stalls by design); the agreed mergers must.
      if (!probe->agreed() && schedule == Schedule::kBlocking) continue;
      SCOPED_TRACE(absl::StrCat(sm.name, ", ", ScheduleName(schedule)));
      std::vector<GroupLog> logs(kNodes);
      std::vector<std::unique_ptr<Primitives>> prims(kNodes);  // outlive the compressors
      std::vector<std::vector<std::unique_ptr<SimBucket>>> nodes(kNodes);
      Spawn(
          kNodes,
          [&](Collective* coll) {
            const int r = coll->rank();
            prims[r] = MakeCpuPrimitives(1);
            for (const Spec& s : SimBuckets()) {
              nodes[r].push_back(std::make_unique<SimBucket>());
              nodes[r].back()->mem = MakeBucket(s, r, kNodes, prims[r].get());
            }
            std::unique_ptr<Merger> merger = sm.make();
            std::thread trainer(Trainer, r, schedule, &nodes[r]);
            EngineLoop(coll, merger.get(), sm.limits, &nodes[r], &logs[r]);
            trainer.join();
          },
          absl::Seconds(10));
      for (int r = 1; r < kNodes; ++r) EXPECT_EQ(logs[r], logs[0]) << "node " << r;
      size_t exchanged = 0, longest = 0;
      for (const auto& [step, first, len] : logs[0]) {
        exchanged += len;
        longest = std::max(longest, len);
      }
      EXPECT_EQ(exchanged, SimBuckets().size() * kSimSteps);
      std::cout << sm.name << ", " << ScheduleName(schedule) << ": " << logs[0].size()
                << " fused exchanges for " << exchanged << " bucket steps, longest " << longest
                << "\n";
      if (schedule == Schedule::kAtOnce || !probe->agreed()) {
        // Everything ready at once: the agreed mergers take each step as one group (one round,
        // one fused exchange); omgs count 2 always pairs.
        EXPECT_EQ(longest, probe->agreed() ? SimBuckets().size() : 2u);
      }
      for (int r = 0; r < kNodes; ++r) {
        for (size_t i = 0; i < SimBuckets().size(); ++i) {
          ASSERT_EQ(nodes[r][i]->outputs.size(), static_cast<size_t>(kSimSteps));
          for (int step = 0; step < kSimSteps; ++step) {
            EXPECT_TRUE(SameBits(nodes[r][i]->outputs[step], want[r][i][step]))
                << "node " << r << " bucket " << i << " step " << step;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace spex::test
