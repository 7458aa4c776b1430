// The bucket checkpoint record (daemon/engine/checkpoint.h): saved from a host bucket mid-run and
// restored into a freshly registered one, the next step's selection and residual are
// bit-identical to the original's; a record of another world, bucket size, compressor or policy
// is refused naming both sides and changes nothing (another bucket id is accepted); truncated and
// corrupt records are refused, and so are records whose fields were rewritten and sealed again
// beyond what a run produces (the seal is a checksum, not a signature).
#include "daemon/engine/checkpoint.h"

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

}  // namespace
}  // namespace spex
