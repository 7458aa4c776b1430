#include "tests/support/engine_conformance.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "kernels/compressor.h"
#include "kernels/half.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"
#include "tests/support/reference_oracle.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {

std::string EngineBackendName(EngineBackend backend) {
  switch (backend) {
    case EngineBackend::kCpu:
      return "Cpu";
    case EngineBackend::kFakeDevice:
      return "FakeDevice";
    case EngineBackend::kFakeNode:
      return "FakeNode";
  }
  return "Unknown";
}

std::string EngineConformanceName(const ::testing::TestParamInfo<EngineBackend>& info) {
  return EngineBackendName(info.param);
}

EngineBackendWorld::EngineBackendWorld(EngineBackend backend, int nodes)
    : backend_(backend), nodes_(nodes) {
  for (int n = 0; n < nodes; ++n) {
    if (backend == EngineBackend::kFakeDevice) {
      devices_.push_back(std::make_unique<fake::FakeDevice>(/*ordinal=*/0, /*cpu_threads=*/1));
    } else if (backend == EngineBackend::kFakeNode) {
      fake_nodes_.push_back(std::make_unique<fake::FakeNode>(std::vector<int>{0, 1},
                                                             /*peer_access=*/n % 2 == 0));
    }
  }
}

EngineClusterOptions EngineBackendWorld::Options(int trainers) {
  EngineClusterOptions o;
  o.nodes = nodes_;
  o.trainers = trainers;
  o.engine.shm_tag = "conformance";
  o.hub_timeout = absl::Seconds(20);
  switch (backend_) {
    case EngineBackend::kCpu:
      o.cpu_primitives = true;  // one thread, as the fakes' primitives
      break;
    case EngineBackend::kFakeDevice:
      o.parts = [this](int n) {
        return NodeParts{devices_[n]->device_prims(), devices_[n]->path()};
      };
      o.wrap = [this](int n, std::unique_ptr<Collective> c) {
        return fake::CheckedCollective(std::move(c), devices_[n].get());
      };
      break;
    case EngineBackend::kFakeNode:
      o.parts = [this](int n) {
        return NodeParts{fake_nodes_[n]->device_prims(), fake_nodes_[n]->path()};
      };
      o.wrap = [this](int n, std::unique_ptr<Collective> c) {
        return fake::CheckedCollective(std::move(c), fake_nodes_[n]->home());
      };
      break;
  }
  return o;
}

int EngineBackendWorld::DeviceOf(int trainer) const {
  return backend_ == EngineBackend::kFakeNode ? trainer % 2 : -1;
}

std::vector<std::string> EngineBackendWorld::Violations() const {
  std::vector<std::string> all;
  for (const auto& d : devices_) {
    for (std::string& v : d->violations()) all.push_back(std::move(v));
  }
  for (const auto& f : fake_nodes_) {
    for (std::string& v : f->violations()) all.push_back(std::move(v));
  }
  return all;
}

namespace {

void ExpectNoViolations(const EngineBackendWorld& world) {
  for (const std::string& v : world.Violations()) ADD_FAILURE() << v;
}

// Integer values: sums are exact in any order, so results compare bit for bit.
float IntegerValue(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  return IntegerGradient({node, trainer, bucket, step, i});
}

// The backend's cluster options with every bucket sparse however small: no dense fallback
// probe, no minimum size.
EngineClusterOptions AlwaysSparse(EngineBackendWorld& world, int trainers) {
  EngineClusterOptions o = world.Options(trainers);
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  return o;
}

// Roughly Gaussian, with a per-position scale every node shares, so that thresholds see
// structure that persists across steps (as compressor_engine_test).
float GaussianValue(int node, int trainer, uint64_t step, size_t i) {
  return Gradient({node, trainer, 0, step, i},
                  {GradientShape::kGaussian, 1e-3, 97, 4.0, /*drift=*/true});
}

// N x 2 trainers, buckets of 1, 31, 4099 and 70000 elements, 4 steps: even trainers exchange
// through the Exchange call in order, odd ones through the doorbell (odd nodes marking the
// buckets in reverse order). Every output is the exact average of every trainer's input.
TEST_P(EngineConformance, DenseBucketsAverageExactlyOverBothPaths) {
  for (int nodes : {2, 4}) {
    const int L = 2;
    EngineBackendWorld world(backend(), nodes);
    EngineCluster cluster(world.Options(L));
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    const std::vector<uint64_t> sizes = {1, 31, 4099, 70000};
    const int steps = 4;
    std::atomic<int> failures{0}, wrong_grants{0};
    cluster.ForEachTrainer([&](int n, int r) {
      auto t = Trainer::Open(&cluster.engine(n), r, L);
      ASSERT_TRUE(t.ok()) << t.status();
      for (size_t b = 0; b < sizes.size(); ++b) {
        auto g = t->Register(b, sizes[b], "", 0, {}, world.DeviceOf(r));
        ASSERT_TRUE(g.ok()) << g.status();
        wrong_grants += (g->device_buffer != nullptr) != world.on_device();
      }
      for (int s = 0; s < steps; ++s) {
        for (size_t b = 0; b < sizes.size(); ++b) {
          t->Fill(b, [&](size_t i) { return IntegerValue(n, r, b, s, i); });
        }
        if (r % 2 == 0) {
          for (size_t b = 0; b < sizes.size(); ++b) {
            auto rec = t->Exchange(b, s);
            ASSERT_TRUE(rec.ok()) << rec.status();
          }
        } else {
          for (size_t k = 0; k < sizes.size(); ++k) {
            size_t b = (n % 2) ? sizes.size() - 1 - k : k;
            t->MarkReady(b, s);
          }
          for (size_t b = 0; b < sizes.size(); ++b) EXPECT_TRUE(t->WaitPublished(b, s).ok());
        }
        for (size_t b = 0; b < sizes.size(); ++b) {
          const float* out = t->output(b);
          for (size_t i = 0; i < sizes[b]; ++i) {
            float sum = 0;
            for (int nn = 0; nn < nodes; ++nn)
              for (int rr = 0; rr < L; ++rr) sum += IntegerValue(nn, rr, b, s, i);
            if (out[i] != sum / (nodes * L)) failures++;
          }
        }
      }
      EXPECT_TRUE(t->Goodbye().ok());
    });
    EXPECT_EQ(failures.load(), 0) << nodes << " nodes";
    EXPECT_EQ(wrong_grants.load(), 0) << "grants not on the backend's memory";
    for (int n = 0; n < nodes; ++n)
      EXPECT_EQ(cluster.engine(n).total_exchanges(), sizes.size() * steps);
    ExpectNoViolations(world);
  }
}

// A sparse bucket, pattern B (topk) and pattern A (micro), 2 nodes x 2 trainers, 6 steps with
// error feedback: every trainer's output equals the oracle of kernels/reference_cluster.h fed
// the same inputs (on the same CPU primitives the backends compute with), and the residual norm
// each node reports equals the oracle's residual: exactly what was not sent.
TEST_P(EngineConformance, SparseBucketsMatchTheReferenceCluster) {
  for (const std::string compressor : {"topk", "micro"}) {
    SCOPED_TRACE(compressor);
    const int N = 2, L = 2, steps = 6;
    const size_t n = 30011;
    const double density = 0.01;
    auto pattern = CompressorPattern(compressor);
    ASSERT_TRUE(pattern.ok()) << pattern.status();
    auto prims = MakeCpuPrimitives(1);
    CompressorSpec spec;
    spec.name = compressor;
    spec.density = density;
    spec.elements = n;
    auto oracle = RunReferenceCluster(spec, N, L, steps, prims.get(), GaussianValue);
    ASSERT_TRUE(oracle.ok()) << oracle.status();

    EngineBackendWorld world(backend(), N);
    EngineClusterOptions o = AlwaysSparse(world, L);
    o.engine.residual_norm_every = 1;
    EngineCluster cluster(o);
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    ExpectJobMatchesOracle(
        cluster, L, compressor, density, *pattern, *oracle, GaussianValue,
        [&](int t) { return world.DeviceOf(t); }, [](int, int) { return true; });
    ExpectNoViolations(world);
  }
}

// Error feedback loses nothing: 3 steps of real inputs into a topk bucket (600 elements, 30 sent
// per node and step), then steps of zeros until every node's residual is drained. The residual
// norm ends at 0, and every position's outputs summed over the steps equal the average of every
// value handed in, so each unsent value was carried from step to step until it was sent.
TEST_P(EngineConformance, ErrorFeedbackDeliversEveryValueOnceTheResidualDrains) {
  const int N = 2, L = 2, input_steps = 3, steps = input_steps + 22;
  const size_t n = 600;
  EngineBackendWorld world(backend(), N);
  EngineClusterOptions o = AlwaysSparse(world, L);
  o.engine.residual_norm_every = 1;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::string> errors(N * L);
  std::vector<std::vector<double>> delivered(N * L, std::vector<double>(n, 0));
  std::vector<double> first_norm(N * L, 0), last_norm(N * L, -1);
  cluster.ForEachTrainer([&](int r, int t) {
    std::string& err = errors[r * L + t];
    auto tr = Trainer::Open(&cluster.engine(r), t, L);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(3, n, "topk", 0.05, {}, world.DeviceOf(t));
    if (!g.ok()) return void(err = g.status().ToString());
    for (int s = 0; s < steps; ++s) {
      tr->Fill(3, [&](size_t i) { return s < input_steps ? GaussianValue(r, t, s, i) : 0.0f; });
      auto rec = tr->Exchange(3, s);
      if (!rec.ok()) return void(err = rec.status().ToString());
      if (rec->pattern != "B") return void(err = "step " + std::to_string(s) + " not sparse");
      if (s == 0) first_norm[r * L + t] = rec->residual_norm;
      last_norm[r * L + t] = rec->residual_norm;
      for (size_t i = 0; i < n; ++i) delivered[r * L + t][i] += tr->output(3)[i];
    }
  });
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  int wrong = 0;
  for (size_t i = 0; i < n; ++i) {
    double want = 0, magnitude = 0;
    for (int r = 0; r < N; ++r) {
      for (int t = 0; t < L; ++t) {
        for (int s = 0; s < input_steps; ++s) {
          want += GaussianValue(r, t, s, i);
          magnitude += std::abs(GaussianValue(r, t, s, i));
        }
      }
    }
    want /= N * L;
    for (int k = 0; k < N * L; ++k) {
      wrong += !(std::abs(delivered[k][i] - want) <= 1e-5 * magnitude + 1e-12);
    }
  }
  EXPECT_EQ(wrong, 0) << "positions whose delivered sum differs from what was handed in";
  for (int k = 0; k < N * L; ++k) {
    EXPECT_GT(first_norm[k], 0) << "nothing kept back at step 0: not a sparse exchange";
    EXPECT_EQ(last_norm[k], 0) << "residual left after draining";
  }
  ExpectNoViolations(world);
}

// One node, two local trainers: a wrong local_size, a duplicate rank, an unknown compressor, a
// bucket registered again with another size, an unknown bucket, an exchange before every local
// trainer registered, a wrong step; each is a clear error, and the engine then completes a step.
TEST_P(EngineConformance, BadRequestsGetClearErrorsAndTheEngineKeepsServing) {
  EngineBackendWorld world(backend(), 1);
  EngineClusterOptions o = world.Options(2);
  o.engine.register_wait = absl::Milliseconds(300);
  o.hub_timeout = absl::Seconds(10);
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto s0 = e.Hello("", 0, 2, 0, "t0");
  ASSERT_TRUE(s0.ok());
  // Wrong local_size, duplicate local rank.
  EXPECT_EQ(e.Hello("", 1, 3, 0, "t").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e.Hello("", 0, 2, 0, "t").status().code(), absl::StatusCode::kAlreadyExists);
  // Unknown compressor names the accepted ones.
  auto bad = e.RegisterBucket(s0->session_id, 1, 10, "nosuch", 0, {}, world.DeviceOf(0));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("accepted"), std::string::npos);
  // Registered twice with another size.
  ASSERT_TRUE(e.RegisterBucket(s0->session_id, 1, 10, "", 0, {}, world.DeviceOf(0)).ok());
  auto twice = e.RegisterBucket(s0->session_id, 1, 11, "", 0, {}, world.DeviceOf(0));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("10 elements"), std::string::npos) << twice.status();
  // Exchange for an unknown bucket.
  EXPECT_EQ(e.Exchange(s0->session_id, 77, 0, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kNotFound);
  // Exchange before the second local trainer registered: times out with a clear status.
  auto early = e.Exchange(s0->session_id, 1, 0, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("only 1 of 2"), std::string::npos) << early.status();
  // Wrong step.
  EXPECT_EQ(e.Exchange(s0->session_id, 1, 5, absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Still serving: the second trainer arrives and step 0 completes for both.
  auto s1 = e.Hello("", 1, 2, 0, "t1");
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(e.RegisterBucket(s1->session_id, 1, 10, "", 0, {}, world.DeviceOf(1)).ok());
  std::thread other(
      [&] { EXPECT_TRUE(e.Exchange(s1->session_id, 1, 0, absl::Now() + absl::Seconds(5)).ok()); });
  EXPECT_TRUE(e.Exchange(s0->session_id, 1, 0, absl::Now() + absl::Seconds(5)).ok());
  other.join();
  ExpectNoViolations(world);
}

// --nonfinite=error: a NaN or +Inf at index 777 from local trainer 1 of node 1 at step 1 fails
// that step of a sparse (topk) and a dense bucket on every trainer of every node, naming the
// trainer and the index; the steps around it are exact (dense) and finite (sparse).
TEST_P(EngineConformance, ANonFiniteInputFailsTheStepEverywhereNamingTheTrainer) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    SCOPED_TRACE(bad);
    const int N = 2, L = 2, steps = 3, kBad = 1;
    const uint64_t ids[2] = {7, 9};
    const size_t sizes[2] = {20011, 4099};
    const std::string compressors[2] = {"topk", "dense"};
    EngineBackendWorld world(backend(), N);
    EngineClusterOptions o = AlwaysSparse(world, L);
    o.engine.nonfinite = NonfinitePolicy::kError;
    EngineCluster cluster(o);
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    std::vector<std::string> errors(N * L);
    std::atomic<int> failed{0}, named{0}, wrong_after{0};
    cluster.ForEachTrainer([&](int n, int t) {
      std::string& err = errors[n * L + t];
      auto tr = Trainer::Open(&cluster.engine(n), t, L);
      if (!tr.ok()) return void(err = tr.status().ToString());
      for (int b = 0; b < 2; ++b) {
        auto g = tr->Register(ids[b], sizes[b], compressors[b], 0.01, {}, world.DeviceOf(t));
        if (!g.ok()) return void(err = g.status().ToString());
      }
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < 2; ++b) {
          tr->Fill(ids[b], [&](size_t i) { return IntegerValue(n, t, ids[b], s, i); });
          if (s == kBad && n == 1 && t == 1) tr->input(ids[b])[777] = bad;
          auto rec = tr->Exchange(ids[b], s);
          if (s != kBad) {
            if (!rec.ok()) return void(err = rec.status().ToString());
          } else {
            failed += !rec.ok();
            named += !rec.ok() && rec.status().message().find(
                                      "local trainer 1 of node 1, first non-finite value at "
                                      "index 777") != std::string::npos;
            continue;
          }
          const float* out = tr->output(ids[b]);
          for (size_t i = 0; i < sizes[b]; ++i) {
            if (b == 1) {
              float sum = 0;
              for (int nn = 0; nn < N; ++nn)
                for (int tt = 0; tt < L; ++tt) sum += IntegerValue(nn, tt, ids[b], s, i);
              wrong_after += out[i] != sum / (N * L);
            } else {
              wrong_after += !std::isfinite(out[i]);
            }
          }
        }
      }
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(failed.load(), 2 * N * L) << "the bad step did not fail on every trainer";
    EXPECT_EQ(named.load(), 2 * N * L) << "errors not naming the trainer and the index";
    EXPECT_EQ(wrong_after.load(), 0) << "outputs wrong after the bad step";
    ExpectNoViolations(world);
  }
}

// bfloat16 and float16 dense buckets, 2 nodes x 2 trainers, 2 steps: quarter-integers in
// [-15.75, 15.75] sum and average without rounding in either type, so every output is the
// exact average, written in the bucket's type.
TEST_P(EngineConformance, HalfDenseBucketsAverageExactly) {
  for (DType type : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(type));
    const int N = 2, L = 2, steps = 2;
    const size_t n = 4099;
    auto value = [](int node, int trainer, uint64_t step, size_t i) {
      return static_cast<float>(static_cast<int>(GradientBits({node, trainer, 5, step, i}) % 127) -
                                63) *
             0.25f;
    };
    EngineBackendWorld world(backend(), N);
    EngineCluster cluster(world.Options(L));
    ASSERT_TRUE(cluster.status().ok()) << cluster.status();
    std::vector<std::string> errors(N * L);
    std::atomic<int> wrong{0}, bad_dtype{0};
    cluster.ForEachTrainer([&](int r, int t) {
      std::string& err = errors[r * L + t];
      auto tr = Trainer::Open(&cluster.engine(r), t, L);
      if (!tr.ok()) return void(err = tr.status().ToString());
      auto g = tr->Register(5, n, "dense", 0, {{"dtype", DTypeName(type)}}, world.DeviceOf(t));
      if (!g.ok()) return void(err = g.status().ToString());
      bad_dtype += tr->header(5)->dtype != static_cast<uint32_t>(type);
      uint16_t* in = reinterpret_cast<uint16_t*>(tr->input(5));
      const uint16_t* out = reinterpret_cast<const uint16_t*>(tr->output(5));
      for (int s = 0; s < steps; ++s) {
        for (size_t i = 0; i < n; ++i) in[i] = FloatToHalf(type, value(r, t, s, i));
        auto rec = tr->Exchange(5, s);
        if (!rec.ok()) return void(err = rec.status().ToString());
        for (size_t i = 0; i < n; ++i) {
          float sum = 0;
          for (int rr = 0; rr < N; ++rr)
            for (int tt = 0; tt < L; ++tt) sum += value(rr, tt, s, i);
          wrong += out[i] != FloatToHalf(type, sum / (N * L));
        }
      }
    });
    for (const std::string& e : errors) EXPECT_EQ(e, "");
    EXPECT_EQ(wrong.load(), 0) << "outputs differing from the exact average";
    EXPECT_EQ(bad_dtype.load(), 0);
    ExpectNoViolations(world);
  }
}

// Checkpoint and restore: a job of 6 steps on 2 nodes (one trainer each), its buckets saved
// after step 3 and loaded into fresh engines that run steps 3-5, continues bit for bit as the
// uninterrupted job; resumed without the records it differs (the residual matters). topk and
// micro, on dyadic values.
namespace checkpoint {

constexpr int kNodes = 2;
constexpr uint64_t kBucket = 5;
constexpr size_t kElements = 20011;
constexpr int kSteps = 6, kStop = 3;

float Value(int node, int step, size_t i) {
  const uint64_t x = (i * 2654435761u) ^ (node * 40503u) ^ (step * 7919u);
  return static_cast<float>(static_cast<int>(x % 33) - 16) * 0.125f;
}

struct Job {
  std::vector<std::vector<float>> out;  // [step * kNodes + node]
  std::vector<std::string> saved;       // per node
  std::vector<std::string> errors;
};

// Job steps [first, last) on fresh engines (and fakes); `load`: every node loads its record after
// registering; `save`: every node saves after the last step.
Job RunJob(EngineBackend backend, const std::string& compressor, int first, int last,
           const std::vector<std::string>* load, bool save) {
  Job job;
  job.out.assign(kSteps * kNodes, {});
  job.saved.assign(kNodes, "");
  job.errors.assign(kNodes, "");
  EngineBackendWorld world(backend, kNodes);
  EngineClusterOptions o = AlwaysSparse(world, 1);
  EngineCluster cluster(o);
  if (!cluster.status().ok()) {
    job.errors[0] = cluster.status().ToString();
    return job;
  }
  cluster.ForEachTrainer([&](int n, int) {
    std::string& err = job.errors[n];
    auto tr = Trainer::Open(&cluster.engine(n), 0, 1);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(kBucket, kElements, compressor, 0.01, {}, world.DeviceOf(0));
    if (!g.ok()) return void(err = g.status().ToString());
    if ((g->device_buffer != nullptr) != world.on_device())
      return void(err = "wrong kind of grant");
    if (load != nullptr) {
      absl::Status s = cluster.engine(n).LoadBucketState(tr->session_id(), kBucket, (*load)[n]);
      if (!s.ok()) return void(err = s.ToString());
    }
    for (int s = 0; s + first < last; ++s) {
      tr->Fill(kBucket, [&](size_t i) { return Value(n, s + first, i); });
      auto rec = tr->Exchange(kBucket, s);
      if (!rec.ok()) return void(err = rec.status().ToString());
      const float* out = tr->output(kBucket);
      job.out[(s + first) * kNodes + n].assign(out, out + kElements);
    }
    if (save) {
      auto rec = cluster.engine(n).SaveBucketState(tr->session_id(), kBucket);
      if (!rec.ok()) return void(err = rec.status().ToString());
      job.saved[n] = *rec;
    }
  });
  for (const std::string& v : world.Violations()) job.errors.push_back(v);
  return job;
}

bool SameFrom(const Job& a, const Job& b, int first) {
  for (int j = first * kNodes; j < kSteps * kNodes; ++j) {
    if (a.out[j].size() != b.out[j].size() ||
        std::memcmp(a.out[j].data(), b.out[j].data(), a.out[j].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace checkpoint

TEST_P(EngineConformance, AResumedJobContinuesBitForBit) {
  using checkpoint::Job;
  for (const std::string c : {"topk", "micro"}) {
    SCOPED_TRACE(c);
    const Job whole = checkpoint::RunJob(backend(), c, 0, checkpoint::kSteps, nullptr, false);
    const Job before = checkpoint::RunJob(backend(), c, 0, checkpoint::kStop, nullptr, true);
    const Job resumed = checkpoint::RunJob(backend(), c, checkpoint::kStop, checkpoint::kSteps,
                                           &before.saved, false);
    const Job fresh =
        checkpoint::RunJob(backend(), c, checkpoint::kStop, checkpoint::kSteps, nullptr, false);
    for (const Job* j : {&whole, &before, &resumed, &fresh}) {
      for (const std::string& e : j->errors) ASSERT_EQ(e, "");
    }
    EXPECT_TRUE(checkpoint::SameFrom(resumed, whole, checkpoint::kStop))
        << c << ": the resumed job differs";
    EXPECT_FALSE(checkpoint::SameFrom(fresh, whole, checkpoint::kStop))
        << c << ": resuming without the records should differ";
  }
}

}  // namespace
}  // namespace spex::test
