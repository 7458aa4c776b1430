// The bucket checkpoint record (daemon/engine/checkpoint.h): saved from a host bucket mid-run and
// restored into a freshly registered one, the next step's selection and residual are
// bit-identical to the original's; a record of another world, bucket size, compressor or policy
// is refused naming both sides and changes nothing (another bucket id is accepted); truncated and
// corrupt records are refused, and so are records whose fields were rewritten and sealed again
// beyond what a run produces (the seal is a checksum, not a signature).
#include "daemon/engine/checkpoint.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/compressors/state_blob.h"
#include "kernels/error_feedback.h"
#include "kernels/primitives.h"

namespace spex {
namespace {

constexpr size_t kN = 4096;
const CheckpointWorld kWorld{2, 1, 3};

// A host sparse bucket the way the engine holds one: the compressor in ex.sparse and the
// residual in acc (mem.acc_host, seen through mem.view.acc).
std::unique_ptr<EngineBucket> MakeBucket(const std::string& compressor, Primitives* prims,
                                         uint64_t id = 7, size_t n = kN) {
  auto b = std::make_unique<EngineBucket>();
  b->id = id;
  b->elements = n;
  b->compressor = compressor;
  b->out.density = 0.01;
  b->mem.acc_host.assign(n, 0.0f);
  b->mem.view.acc = b->mem.acc_host.data();
  b->mem.view.elements = n;
  b->ex.sparse = std::make_unique<SparseState>();
  auto c = MakeCompressor({compressor, 0.01, {}, kWorld.node_rank, kWorld.nodes, n}, prims);
  EXPECT_TRUE(c.ok()) << c.status();
  b->ex.sparse->compressor = std::move(*c);
  return b;
}

std::vector<float> Input(uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0, 1);
  std::vector<float> x(kN);
  for (float& v : x) v = d(gen);
  return x;
}

// One step of the bucket with pattern B's residual update (sage and topk are pattern B).
Selection Step(EngineBucket& b, uint64_t step) {
  const std::vector<float> in = Input(static_cast<uint32_t>(step + 1));
  Selection sel;
  EXPECT_TRUE(b.ex.sparse->compressor->Select(step, b.mem.view.acc, in.data(), true, &sel).ok());
  const std::vector<uint64_t> counts = {sel.idx.size(), sel.idx.size()};
  std::vector<uint32_t> all = sel.idx;
  all.insert(all.end(), sel.idx.begin(), sel.idx.end());
  EXPECT_TRUE(b.ex.sparse->compressor->Update(step, {counts, all}).ok());
  return sel;
}

TEST(Checkpoint, RestoredBucketContinuesBitIdentically) {
  auto prims = MakeCpuPrimitives(1);
  auto original = MakeBucket("sage", prims.get());
  for (uint64_t s = 0; s < 5; ++s) Step(*original, s);
  original->out.density = 0.02;  // a density changed at run time travels too
  ASSERT_TRUE(original->ex.sparse->compressor->SetDensity(0.02).ok());
  absl::StatusOr<BucketCheckpoint> saved = SaveBucket(*original, kWorld);
  ASSERT_TRUE(saved.ok()) << saved.status();
  const std::string bytes = EncodeBucketCheckpoint(*saved);
  absl::StatusOr<BucketCheckpoint> decoded = DecodeBucketCheckpoint(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->next_step, 0u);  // the engine's step, not advanced by this test's steps

  auto restored = MakeBucket("sage", prims.get());
  auto control = MakeBucket("sage", prims.get());
  ASSERT_TRUE(RestoreBucket(*decoded, kWorld, restored.get()).ok());
  EXPECT_EQ(restored->out.density, 0.02);
  std::memcpy(control->mem.view.acc, original->mem.view.acc, kN * sizeof(float));
  bool control_differs = false;
  for (uint64_t s = 5; s < 12; ++s) {
    const Selection a = Step(*original, s), b = Step(*restored, s), c = Step(*control, s);
    ASSERT_EQ(a.idx, b.idx) << "step " << s;
    ASSERT_EQ(0, std::memcmp(a.val.data(), b.val.data(), a.val.size() * sizeof(float)));
    control_differs |= a.idx != c.idx;
  }
  EXPECT_EQ(0, std::memcmp(original->mem.view.acc, restored->mem.view.acc, kN * sizeof(float)));
  EXPECT_TRUE(control_differs) << "the residual alone reproduced sage: the state test is void";
}

TEST(Checkpoint, MismatchesAreRefusedAndChangeNothing) {
  auto prims = MakeCpuPrimitives(1);
  auto original = MakeBucket("sage", prims.get());
  Step(*original, 0);
  const BucketCheckpoint saved = *SaveBucket(*original, kWorld);

  auto target = MakeBucket("sage", prims.get());
  const std::string before = *target->ex.sparse->compressor->SaveState();
  struct Bad {
    CheckpointWorld world;
    std::unique_ptr<EngineBucket> bucket;
    std::string expect;
  };
  std::vector<Bad> bad;
  bad.push_back({{4, 1, 3},
                 nullptr,
                 "saved by node 1 of 2 with 3 local trainer(s), this daemon is node 1 of 4"});
  bad.push_back({{2, 1, 2}, nullptr, "this daemon is node 1 of 2 with 2 local trainer(s)"});
  auto other_policy = MakeBucket("sage", prims.get());
  other_policy->policy.nonfinite = NonfinitePolicy::kError;
  bad.push_back({kWorld, std::move(other_policy), "this bucket has nonfinite=error"});
  auto half = MakeBucket("sage", prims.get());
  half->mem.view.dtype = DType::kBFloat16;
  bad.push_back({kWorld, std::move(half), "is of a float32 bucket, this one is bfloat16"});
  bad.push_back({kWorld, MakeBucket("sage", prims.get(), 7, kN / 2), "(2048 elements)"});
  bad.push_back({kWorld, MakeBucket("topk", prims.get()),
                 "used compressor sage (none), this bucket uses topk (none)"});
  for (Bad& b : bad) {
    EngineBucket* into = b.bucket ? b.bucket.get() : target.get();
    const absl::Status s = RestoreBucket(saved, b.world, into);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(b.expect), std::string::npos) << s;
  }
  EXPECT_EQ(*target->ex.sparse->compressor->SaveState(), before);
  for (float v : target->mem.acc_host) ASSERT_EQ(v, 0.0f);
  // The bucket id is the caller's choice (a DDP hook's ids change with DDP's generations).
  auto renamed = MakeBucket("sage", prims.get(), 8);
  EXPECT_TRUE(RestoreBucket(saved, kWorld, renamed.get()).ok());
}

TEST(Checkpoint, TruncatedAndCorruptRecordsAreRefused) {
  auto prims = MakeCpuPrimitives(1);
  auto original = MakeBucket("topk", prims.get(), 7, 64);
  Step(*original, 0);
  const std::string bytes = EncodeBucketCheckpoint(*SaveBucket(*original, kWorld));
  for (size_t len = 0; len < bytes.size(); ++len) {
    EXPECT_FALSE(DecodeBucketCheckpoint(bytes.substr(0, len)).ok()) << "cut to " << len;
  }
  for (size_t at = 0; at < bytes.size(); ++at) {
    std::string corrupt = bytes;
    corrupt[at] ^= 0x01;
    EXPECT_FALSE(DecodeBucketCheckpoint(corrupt).ok()) << "byte " << at << " flipped";
  }
  std::string version = bytes;
  version[4] = 3;
  EXPECT_NE(DecodeBucketCheckpoint(version).status().message().find("format version 3"),
            std::string::npos);
  EXPECT_TRUE(DecodeBucketCheckpoint(bytes).ok());
}

// The seal is a checksum: the daemon's own user can rewrite any field and seal the record again.
// Every field out of what a run can produce is refused at decoding (DATA_LOSS naming it); the
// bounds themselves are accepted.
TEST(Checkpoint, ForgedFieldsAreRefused) {
  auto prims = MakeCpuPrimitives(1);
  auto original = MakeBucket("sage", prims.get());
  Step(*original, 0);
  const BucketCheckpoint saved = *SaveBucket(*original, kWorld);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Forgery {
    std::function<void(BucketCheckpoint*)> forge;
    std::string expect;
  };
  const std::vector<Forgery> forgeries = {
      {[](BucketCheckpoint* c) { c->next_step = UINT64_MAX; }, "step 18446744073709551615"},
      {[](BucketCheckpoint* c) { c->next_step = kMaxCheckpointStep + 1; }, "beyond"},
      {[](BucketCheckpoint* c) {
         c->world = {0, 0, 3};
       },
       "is not a world"},
      {[](BucketCheckpoint* c) {
         c->world = {2, 2, 3};
       },
       "is not a world"},
      {[](BucketCheckpoint* c) {
         c->world = {2, 1, 0};
       },
       "is not a world"},
      {[](BucketCheckpoint* c) {
         c->world = {2, 1, 33};
       },
       "is not a world"},
      {[](BucketCheckpoint* c) { c->probe_dense_ns = UINT64_MAX; }, "probe timing"},
      {[](BucketCheckpoint* c) { c->probe_oktopk_ns = kMaxCheckpointProbeNs + 1; }, "probe timing"},
      {[](BucketCheckpoint* c) { c->oktopk_exchanges = c->next_step + 1; }, "exchange counts"},
      {[](BucketCheckpoint* c) { c->allreduce_probed = c->next_step + 1; }, "exchange counts"},
      {[nan](BucketCheckpoint* c) { c->oktopk_threshold = nan; }, "threshold"},
      {[inf](BucketCheckpoint* c) { c->oktopk_threshold = inf; }, "threshold"},
      {[](BucketCheckpoint* c) { c->oktopk_threshold = -1; }, "threshold"},
      {[](BucketCheckpoint* c) {
         c->oktopk_bounds = {0, 3000, 1000};
       },
       "regions"},
      {[](BucketCheckpoint* c) {
         c->oktopk_bounds = {0, 1000, kN - 1};
       },
       "regions"},
      {[](BucketCheckpoint* c) {
         c->oktopk_bounds = {1, 1000, kN};
       },
       "regions"},
      {[inf](BucketCheckpoint* c) { c->residual[17] = -inf; }, "at index 17 is not finite"},
      {[nan](BucketCheckpoint* c) { c->residual[kN - 1] = nan; }, "is not finite"},
  };
  for (size_t i = 0; i < forgeries.size(); ++i) {
    BucketCheckpoint forged = saved;
    forgeries[i].forge(&forged);
    const absl::StatusOr<BucketCheckpoint> d =
        DecodeBucketCheckpoint(EncodeBucketCheckpoint(forged));
    EXPECT_EQ(d.status().code(), absl::StatusCode::kDataLoss)
        << "forgery " << i << ": " << d.status();
    EXPECT_NE(d.status().message().find(forgeries[i].expect), std::string::npos)
        << "forgery " << i << ": " << d.status();
  }
  // At the bounds: accepted, and the step restored as the bucket's base.
  BucketCheckpoint edge = saved;
  edge.next_step = kMaxCheckpointStep;
  edge.probe_dense_ns = kMaxCheckpointProbeNs;
  edge.oktopk_exchanges = edge.allreduce_probed = kMaxCheckpointStep;
  edge.oktopk_bounds = {0, 0, kN};
  const absl::StatusOr<BucketCheckpoint> d = DecodeBucketCheckpoint(EncodeBucketCheckpoint(edge));
  ASSERT_TRUE(d.ok()) << d.status();
  auto target = MakeBucket("sage", prims.get());
  ASSERT_TRUE(RestoreBucket(*d, kWorld, target.get()).ok());
  EXPECT_EQ(target->ex.compute_step(), kMaxCheckpointStep);
}

// The compressor's state blob inside the record: a call count no run reaches is refused by
// LoadState, and the bucket keeps its state.
TEST(Checkpoint, ForgedCompressorCallCountIsRefused) {
  auto prims = MakeCpuPrimitives(1);
  auto original = MakeBucket("sage", prims.get());
  Step(*original, 0);
  BucketCheckpoint forged = *SaveBucket(*original, kWorld);
  // The blob's fields (kernels/compressor.cc): magic, version, name, elements, node count and
  // rank, density, call count, the compressor's own fields; then the seal.
  StateReader r(SealedBody(forged.compressor_state));
  uint32_t magic = 0;
  uint16_t version = 0;
  std::string name, own;
  uint64_t n = 0, calls = 0;
  int32_t count = 0, rank = 0;
  double density = 0;
  r.Get(&magic);
  r.Get(&version);
  r.GetString(&name, 256);
  r.Get(&n);
  r.Get(&count);
  r.Get(&rank);
  r.Get(&density);
  r.Get(&calls);
  r.GetString(&own, forged.compressor_state.size());
  ASSERT_TRUE(r.complete());
  ASSERT_EQ(calls, 1u);
  auto with_calls = [&](uint64_t forged_calls) {
    StateWriter w;
    w.Put<uint32_t>(magic);
    w.Put<uint16_t>(version);
    w.PutString(name);
    w.Put<uint64_t>(n);
    w.Put<int32_t>(count);
    w.Put<int32_t>(rank);
    w.Put<double>(density);
    w.Put<uint64_t>(forged_calls);
    w.PutString(own);
    w.Seal();
    return w.bytes();
  };
  auto target = MakeBucket("sage", prims.get());
  const std::string before = *target->ex.sparse->compressor->SaveState();
  forged.compressor_state = with_calls(UINT64_MAX);
  const absl::StatusOr<BucketCheckpoint> d = DecodeBucketCheckpoint(EncodeBucketCheckpoint(forged));
  ASSERT_TRUE(d.ok()) << d.status();
  const absl::Status s = RestoreBucket(*d, kWorld, target.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find("call count 18446744073709551615"), std::string::npos) << s;
  EXPECT_EQ(*target->ex.sparse->compressor->SaveState(), before);
  forged.compressor_state = with_calls(uint64_t{1} << 48);
  EXPECT_TRUE(RestoreBucket(forged, kWorld, target.get()).ok());
}

// Every old node's record into every new node's bucket (AddResizedBucket): each element's sum
// over the world divided by the world's trainers stays as it was, to float rounding, and lies on
// exactly one new node (i mod nodes); the compressor stays fresh and the step carries over.
TEST(Checkpoint, ResizedRecordsKeepEachElementsShareOfTheAverage) {
  auto prims = MakeCpuPrimitives(1);
  struct Resize {
    int old_nodes, old_local, new_nodes, new_local;
  };
  for (const Resize& z : {Resize{2, 2, 1, 2}, Resize{2, 2, 3, 1}, Resize{1, 4, 2, 2}}) {
    SCOPED_TRACE(testing::Message() << z.old_nodes << "x" << z.old_local << " -> " << z.new_nodes
                                    << "x" << z.new_local);
    std::vector<BucketCheckpoint> records;
    std::vector<double> want(kN, 0.0);
    for (int k = 0; k < z.old_nodes; ++k) {
      auto b = MakeBucket("micro", prims.get());
      b->ex.step_base = 5;  // saved at step 5
      const std::vector<float> r = Input(100 + static_cast<uint32_t>(k));
      std::memcpy(b->mem.view.acc, r.data(), kN * sizeof(float));
      absl::StatusOr<BucketCheckpoint> c = SaveBucket(*b, {z.old_nodes, k, z.old_local});
      ASSERT_TRUE(c.ok()) << c.status();
      absl::StatusOr<BucketCheckpoint> d = DecodeBucketCheckpoint(EncodeBucketCheckpoint(*c));
      ASSERT_TRUE(d.ok()) << d.status();
      records.push_back(*d);
      for (size_t i = 0; i < kN; ++i) want[i] += double{r[i]} / (z.old_nodes * z.old_local);
    }
    std::vector<double> got(kN, 0.0);
    std::vector<int> holders(kN, 0);
    for (int j = 0; j < z.new_nodes; ++j) {
      auto b = MakeBucket("micro", prims.get());
      const std::string fresh = *b->ex.sparse->compressor->SaveState();
      for (const BucketCheckpoint& c : records) {
        const absl::Status s = AddResizedBucket(c, {z.new_nodes, j, z.new_local}, b.get());
        ASSERT_TRUE(s.ok()) << s;
      }
      EXPECT_EQ(*b->ex.sparse->compressor->SaveState(), fresh) << "the compressor stays fresh";
      EXPECT_EQ(b->ex.step_base, 5u);
      for (size_t i = 0; i < kN; ++i) {
        got[i] += double{b->mem.acc_host[i]} / (z.new_nodes * z.new_local);
        if (b->mem.acc_host[i] != 0.0f) {
          ++holders[i];
          EXPECT_EQ(i % static_cast<size_t>(z.new_nodes), static_cast<size_t>(j)) << i;
        }
      }
    }
    for (size_t i = 0; i < kN; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + std::abs(want[i]))) << "element " << i;
      ASSERT_EQ(holders[i], 1) << "element " << i;
    }
  }
}

TEST(Checkpoint, ResizedRecordsThatDoNotAddUpAreRefusedAndChangeNothing) {
  auto prims = MakeCpuPrimitives(1);
  auto old = MakeBucket("micro", prims.get());
  const std::vector<float> r = Input(7);
  std::memcpy(old->mem.view.acc, r.data(), kN * sizeof(float));
  const BucketCheckpoint node0 = *SaveBucket(*old, {2, 0, 2});
  BucketCheckpoint later = *SaveBucket(*old, {2, 1, 2});
  later.next_step = 9;
  const CheckpointWorld mine{1, 0, 2};
  auto b = MakeBucket("micro", prims.get());
  ASSERT_TRUE(AddResizedBucket(node0, mine, b.get()).ok());
  const std::vector<float> after_one = b->mem.acc_host;
  struct Bad {
    const BucketCheckpoint* record;
    std::string expect;
  };
  for (const Bad& bad :
       {Bad{&node0, "was added already"}, Bad{&later, "is not of the checkpoint added before"}}) {
    const absl::Status s = AddResizedBucket(*bad.record, mine, b.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(bad.expect), std::string::npos) << s;
  }
  // An exact restore and a resized one do not mix, either way round.
  absl::Status s = RestoreBucket(*SaveBucket(*old, mine), mine, b.get());
  EXPECT_NE(s.message().find("records of another world were added"), std::string::npos) << s;
  EXPECT_EQ(b->mem.acc_host, after_one);
  auto exact = MakeBucket("micro", prims.get());
  ASSERT_TRUE(RestoreBucket(*SaveBucket(*old, mine), mine, exact.get()).ok());
  s = AddResizedBucket(node0, mine, exact.get());
  EXPECT_NE(s.message().find("a checkpoint of this world was loaded"), std::string::npos) << s;
  // What RestoreBucket refuses, a resize refuses too; a device bucket is not implemented.
  auto other = MakeBucket("topk", prims.get());
  s = AddResizedBucket(node0, mine, other.get());
  EXPECT_NE(s.message().find("used compressor micro"), std::string::npos) << s;
  auto ran = MakeBucket("micro", prims.get());
  ran->ex.next_step = 1;
  s = AddResizedBucket(node0, mine, ran.get());
  EXPECT_NE(s.message().find("this bucket has run 1 step(s) already"), std::string::npos) << s;
  auto device = MakeBucket("micro", prims.get());
  device->mem.view.on_device = true;
  EXPECT_EQ(AddResizedBucket(node0, mine, device.get()).code(), absl::StatusCode::kUnimplemented);
  // A residual that this world's scale takes past float's range (only a rewritten record has
  // one) is refused, and nothing changes.
  BucketCheckpoint huge = *SaveBucket(*old, {1, 0, 1});
  huge.residual.assign(kN, 3e38f);
  auto scaled = MakeBucket("micro", prims.get());
  s = AddResizedBucket(huge, {2, 1, 2}, scaled.get());
  EXPECT_NE(s.message().find("past float's range"), std::string::npos) << s;
  EXPECT_TRUE(scaled->restored.from.empty());
  for (const auto* t : {other.get(), ran.get(), device.get(), scaled.get()}) {
    for (float v : t->mem.acc_host) ASSERT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace spex
