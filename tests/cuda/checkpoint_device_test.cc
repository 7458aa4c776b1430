// Checkpoint and restore of device buckets (issue 29 item 5) on the fake device
// (tests/cuda/fake_device.h): the residual lives in device memory, so SaveBucketState copies it
// to the host through the device primitives and LoadBucketState back. A 2-node job on the fake
// device interrupted after 3 of 6 steps and resumed on fresh engines and devices from its records
// gives every trainer the uninterrupted job's outputs bit for bit (topk and micro, device
// compressors); resumed without the records it differs.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/cuda/fake_device.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

using fake::FakeDevice;

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

// Job steps [first, last) on fresh fake devices and engines; `load`: every node loads its record
// after registering; `save`: every node saves after the last step.
Job RunJob(const std::string& compressor, int first, int last, const std::vector<std::string>* load,
           bool save) {
  Job job;
  job.out.assign(kSteps * kNodes, {});
  job.saved.assign(kNodes, "");
  job.errors.assign(kNodes, "");
  std::vector<std::unique_ptr<FakeDevice>> devices;
  for (int n = 0; n < kNodes; ++n) {
    devices.push_back(std::make_unique<FakeDevice>(/*ordinal=*/0, /*cpu_threads=*/1));
  }
  EngineClusterOptions o;
  o.nodes = kNodes;
  o.engine.shm_tag = "ckptdev";
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.parts = [&devices](int n) { return NodeParts{devices[n]->device_prims(), devices[n]->path()}; };
  o.wrap = [&devices](int n, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), devices[n].get());
  };
  EngineCluster cluster(o);
  if (!cluster.status().ok()) {
    job.errors[0] = cluster.status().ToString();
    return job;
  }
  cluster.ForEachTrainer([&](int n, int) {
    std::string& err = job.errors[n];
    auto tr = Trainer::Open(&cluster.engine(n), 0, 1);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(kBucket, kElements, compressor, 0.01);
    if (!g.ok()) return void(err = g.status().ToString());
    if (g->device_buffer == nullptr) return void(err = "not a device bucket");
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

class DeviceResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceResumeTest, ResumedDeviceJobIsBitIdentical) {
  const std::string c = GetParam();
  const Job whole = RunJob(c, 0, kSteps, nullptr, false);
  const Job before = RunJob(c, 0, kStop, nullptr, true);
  const Job resumed = RunJob(c, kStop, kSteps, &before.saved, false);
  const Job fresh = RunJob(c, kStop, kSteps, nullptr, false);
  for (const Job* j : {&whole, &before, &resumed, &fresh}) {
    for (const std::string& e : j->errors) ASSERT_EQ(e, "");
  }
  EXPECT_TRUE(SameFrom(resumed, whole, kStop)) << c << ": the resumed device job differs";
  EXPECT_FALSE(SameFrom(fresh, whole, kStop))
      << c << ": resuming without the records should differ";
}

INSTANTIATE_TEST_SUITE_P(DeviceCompressors, DeviceResumeTest, ::testing::Values("topk", "micro"));

}  // namespace
}  // namespace spex::test
