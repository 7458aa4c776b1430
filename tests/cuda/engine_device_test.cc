// The engine's device path without a GPU, on the fake device of fake_device.h (host memory
// that claims to be a GPU's, CPU primitives claiming Device::kCuda and checking which side of
// the device every pointer is on, a recorder for the slot ordering, the in-process collective
// checked the same way):
//  - results equal the CPU path's bit for bit, for dense, every sparse compressor (all run on
//    device primitives: topk, gtopk, randomk, dgc, gaussiank, redsync, redsync_trim, sage,
//    sidco_e, sidco_p, sidco_gp: pattern B; topk_union, cltk, thresh, micro, exdyna, deft:
//    pattern A), 2 and 4 nodes x 2 trainers, both signalling paths, with and without the
//    dense-fallback probe (some); the device compressors' steps copy no whole bucket (no
//    staging);
//  - a test compressor factory that refuses device primitives (the factory gets the bucket's
//    primitives) makes RegisterBucket fail with an error naming the bucket, leaving no buffer;
//  - per exchange the engine waits for every trainer's input event before touching the bucket,
//    and records the output event after writing it and before publishing;
//  - a node whose input events fail makes every node skip that step with an error, no hang;
//  - misconfigured device paths are refused at Start with what to fix.
// The service and client side of the device path is device_service_test.cc.
// Every cluster is the fixture of tests/support/engine_cluster.h with a FakeDevice per node.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/engine/engine.h"
#include "daemon/memory/cuda_ipc_buffer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "proto/spex.pb.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/fake_device.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

using fake::FakeDevice;

constexpr uint64_t kSparseBucket = 7;
constexpr uint64_t kDenseBucket = 9;
constexpr size_t kSparseElements = 30011;
constexpr size_t kDenseElements = 4099;

// Roughly Gaussian, not integers: the order of additions shows in the bits, so equal results
// mean the device path adds in the CPU path's order.
float Value(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  return Gradient({node, trainer, bucket, step, i});
}

// The FakeBuffer id of a device grant's buffer (0 on the CPU path).
uint64_t FakeBufferId(const BucketGrant& g) {
  if (g.device_buffer == nullptr) return 0;
  return dynamic_cast<const fake::FakeBuffer*>(g.device_buffer)->id();
}

// An engine cluster of `nodes` engines on the fake device: one FakeDevice per node (in
// `devices`, which must outlive the cluster), its primitives and path, the collective checked.
EngineClusterOptions OnFakeDevices(int nodes, std::vector<std::unique_ptr<FakeDevice>>* devices) {
  EngineClusterOptions o;
  o.nodes = nodes;
  o.engine.shm_tag = "devtest";
  o.parts = [devices](int n) {
    FakeDevice* d = (*devices)[n].get();
    return NodeParts{d->device_prims(), d->path()};
  };
  o.wrap = [devices](int n, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), (*devices)[n].get());
  };
  return o;
}

// `nodes` engines x `trainers`: on the fake device (one FakeDevice per node, created into
// `devices`, which must outlive the cluster) or, with device false, on the CPU primitives.
EngineClusterOptions DeviceOrCpu(bool device, int nodes, int trainers,
                                 std::vector<std::unique_ptr<FakeDevice>>* devices) {
  EngineClusterOptions o;
  if (device) {
    for (int n = 0; n < nodes; ++n) {
      devices->push_back(std::make_unique<FakeDevice>(/*ordinal=*/0, /*cpu_threads=*/1));
    }
    o = OnFakeDevices(nodes, devices);
  } else {
    o.nodes = nodes;
    o.cpu_primitives = true;
    o.engine.shm_tag = "devtest";
  }
  o.trainers = trainers;
  return o;
}

struct RunConfig {
  std::string compressor = "topk";
  int nodes = 2;
  int trainers = 2;
  int steps = 6;
  DenseFallback dense_fallback = DenseFallback::kOff;
  SparseAllreduce sparse_allreduce = SparseAllreduce::kAllGather;
  // auto's choice follows measured times, which differ between the two runs: with "all" both
  // exchanges give the same result, so the runs compare whatever each chose.
  OkTopkSelect oktopk_global = OkTopkSelect::kTopk;
  bool device = false;
};

// What one run saw: every trainer's output per step and bucket, trainer 0's records.
struct RunResult {
  // outputs[node][trainer][step][b] for b in {sparse, dense}
  std::vector<std::vector<std::vector<std::vector<std::vector<float>>>>> outputs;
  // records[node][step][b] (trainer 0, the RPC path)
  std::vector<std::vector<std::vector<ExchangeRecord>>> records;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::vector<std::string> errors;
};

// One engine on `device`.
EngineClusterOptions OnFakeDevice(FakeDevice* device) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.engine.shm_tag = "devtest";
  o.parts = [device](int) { return NodeParts{device->device_prims(), device->path()}; };
  o.wrap = [device](int, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), device);
  };
  return o;
}

// N engines (threads as nodes) x L trainers, buckets kSparseBucket (the compressor) and
// kDenseBucket ("dense"). Trainer 0 exchanges through the Exchange call, the others through
// the doorbell (odd nodes marking the buckets in reverse order).
RunResult RunCluster(const RunConfig& c) {
  const int N = c.nodes, L = c.trainers;
  const uint64_t ids[2] = {kSparseBucket, kDenseBucket};
  const size_t sizes[2] = {kSparseElements, kDenseElements};
  const std::string compressors[2] = {c.compressor, "dense"};
  RunResult r;
  r.outputs.assign(N, std::vector<std::vector<std::vector<std::vector<float>>>>(
                          L, std::vector<std::vector<std::vector<float>>>(
                                 c.steps, std::vector<std::vector<float>>(2))));
  r.records.assign(
      N, std::vector<std::vector<ExchangeRecord>>(c.steps, std::vector<ExchangeRecord>(2)));
  r.errors.assign(N * L, "");
  EngineClusterOptions o = DeviceOrCpu(c.device, N, L, &r.devices);
  o.engine.dense_fallback = c.dense_fallback;
  o.engine.sparse_allreduce = c.sparse_allreduce;
  o.engine.oktopk_global = c.oktopk_global;
  o.engine.probe_steps = 3;
  o.engine.min_sparse_elements = 0;
  o.engine.residual_norm_every = 1;
  EngineCluster cluster(o);
  if (!cluster.status().ok()) {
    r.errors[0] = cluster.status().ToString();
    return r;
  }
  cluster.ForEachTrainer([&](int n, int t) {
    std::string& err = r.errors[n * L + t];
    auto tr = Trainer::Open(&cluster.engine(n), t, L);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (int b = 0; b < 2; ++b) {
      auto g = tr->Register(ids[b], sizes[b], compressors[b], 0.01);
      if (!g.ok()) return void(err = g.status().ToString());
      if ((g->device_buffer != nullptr) != c.device) return void(err = "wrong kind of grant");
    }
    for (int s = 0; s < c.steps; ++s) {
      for (int b = 0; b < 2; ++b) {
        tr->Fill(ids[b], [&](size_t i) { return Value(n, t, ids[b], s, i); });
      }
      if (t == 0) {
        for (int b = 0; b < 2; ++b) {
          auto rec = tr->Exchange(ids[b], s);
          if (!rec.ok()) return void(err = rec.status().ToString());
          r.records[n][s][b] = *rec;
        }
      } else {
        for (int k = 0; k < 2; ++k) tr->MarkReady(ids[n % 2 ? 1 - k : k], s);
        for (int b = 0; b < 2; ++b) {
          if (!tr->WaitPublished(ids[b], s).ok()) return void(err = "a step failed");
        }
      }
      for (int b = 0; b < 2; ++b) {
        r.outputs[n][t][s][b].assign(tr->output(ids[b]), tr->output(ids[b]) + sizes[b]);
      }
    }
  });
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// compressor, nodes, dense_fallback, sparse_allreduce
using Case = std::tuple<std::string, int, std::string, std::string>;

class DevicePathMatchesCpuPath : public testing::TestWithParam<Case> {};

TEST_P(DevicePathMatchesCpuPath, BitForBit) {
  RunConfig c;
  std::string fallback;
  std::string sparse_allreduce;
  std::tie(c.compressor, c.nodes, fallback, sparse_allreduce) = GetParam();
  c.dense_fallback = fallback == "auto" ? DenseFallback::kAuto : DenseFallback::kOff;
  std::string error;
  ASSERT_TRUE(AbslParseFlag(sparse_allreduce, &c.sparse_allreduce, &error)) << error;
  if (c.sparse_allreduce == SparseAllreduce::kAuto) {
    c.oktopk_global = OkTopkSelect::kAll;
    c.steps = 9;  // the probe's 6 sparse exchanges, then the choice
  }
  RunResult cpu = RunCluster(c);
  c.device = true;
  RunResult dev = RunCluster(c);
  for (const std::string& e : cpu.errors) ASSERT_EQ(e, "") << "CPU path";
  for (const std::string& e : dev.errors) ASSERT_EQ(e, "") << "device path";

  int differing = 0, sparse_steps = 0;
  for (int n = 0; n < c.nodes; ++n) {
    for (int t = 0; t < c.trainers; ++t) {
      for (int s = 0; s < c.steps; ++s) {
        for (int b = 0; b < 2; ++b) {
          differing += !SameBits(cpu.outputs[n][t][s][b], dev.outputs[n][t][s][b]);
          // Every trainer of a node reads the same result.
          EXPECT_TRUE(SameBits(dev.outputs[n][t][s][b], dev.outputs[n][0][s][b]));
        }
      }
    }
    for (int s = 0; s < c.steps; ++s) {
      for (int b = 0; b < 2; ++b) {
        const ExchangeRecord& x = cpu.records[n][s][b];
        const ExchangeRecord& y = dev.records[n][s][b];
        EXPECT_EQ(x.pattern, y.pattern) << "node " << n << " step " << s;
        EXPECT_EQ(x.selected_elements, y.selected_elements);
        // auto's choice after the probe may differ between the runs (measured times): then
        // what moved differs, the results do not.
        if (c.sparse_allreduce != SparseAllreduce::kAuto || s < 6) {
          EXPECT_EQ(x.sparse_allreduce, y.sparse_allreduce) << "node " << n << " step " << s;
          EXPECT_EQ(x.gathered_elements, y.gathered_elements);
          EXPECT_EQ(x.bytes_sent, y.bytes_sent);
          EXPECT_EQ(x.bytes_received, y.bytes_received);
        }
        EXPECT_EQ(x.residual_norm, y.residual_norm) << "node " << n << " step " << s;
        EXPECT_EQ(x.fell_back_to_dense, y.fell_back_to_dense);
      }
      sparse_steps += dev.records[n][s][0].pattern != "D";
    }
  }
  EXPECT_EQ(differing, 0) << "outputs differing between the CPU and the device path";

  // What the device path did on the fake device.
  const uint64_t bytes = kSparseElements * sizeof(float);
  uint64_t to_host = 0, from_host = 0;
  uint64_t whole_to_host = 0, whole_from_host = 0;  // copies of a whole sparse bucket
  for (const auto& d : dev.devices) {
    for (const std::string& v : d->violations()) ADD_FAILURE() << v;
    const fake::Staging st = d->staging();
    to_host += st.to_host_calls;
    from_host += st.from_host_calls;
    if (auto it = st.to_host_sizes.find(bytes); it != st.to_host_sizes.end()) {
      whole_to_host += it->second;
    }
    if (auto it = st.from_host_sizes.find(bytes); it != st.from_host_sizes.end()) {
      whole_from_host += it->second;
    }
    int waits = 0, records = 0;
    for (const fake::Event& e : d->events()) {
      waits += e.kind == fake::Event::kWait;
      records += e.kind == fake::Event::kRecord;
    }
    EXPECT_EQ(waits, c.steps * 2 * c.trainers);
    EXPECT_EQ(records, c.steps * 2);
  }
  if (c.compressor == "dense") {
    EXPECT_EQ(sparse_steps, 0);
  } else {
    EXPECT_GT(sparse_steps, 0);
  }
  ASSERT_TRUE(c.compressor == "dense" || CompressorRunsOnDevice(c.compressor));
  // The compressor selects from the device's acc and the exchange decodes into the device's
  // output: only selections, samples, histogram bins, indices and values cross, never a
  // whole bucket; dense steps (and the dense bucket) copy nothing.
  EXPECT_EQ(whole_to_host, 0u);
  EXPECT_EQ(whole_from_host, 0u);
  if (sparse_steps > 0) {
    EXPECT_GT(to_host + from_host, 0u);
  }
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  const std::string& sparse_allreduce = std::get<3>(info.param);
  return absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param), "nodes_fallback_",
                      std::get<2>(info.param),
                      sparse_allreduce == "allgather" ? "" : "_" + sparse_allreduce);
}

INSTANTIATE_TEST_SUITE_P(Compressors, DevicePathMatchesCpuPath,
                         testing::Combine(testing::Values("dense", "topk", "micro", "dgc",
                                                          "sidco_e"),
                                          testing::Values(2, 4), testing::Values("off", "auto"),
                                          testing::Values("allgather")),
                         CaseName);

// The other compressors that run on device primitives (no dense fallback).
INSTANTIATE_TEST_SUITE_P(DeviceCompressors, DevicePathMatchesCpuPath,
                         testing::Combine(testing::Values("gtopk", "topk_union", "cltk", "randomk",
                                                          "thresh", "exdyna", "gaussiank",
                                                          "redsync", "redsync_trim", "sage", "deft",
                                                          "sidco_p", "sidco_gp"),
                                          testing::Values(2, 4), testing::Values("off"),
                                          testing::Values("allgather")),
                         CaseName);

// Ok-Topk on device buckets: the selection and the exchange on the host, the kept entries
// uploaded into the device's output and the residual zeroed there (--sparse_allreduce=oktopk,
// global topk); and auto's probe (global all, so that either choice gives the same result).
INSTANTIATE_TEST_SUITE_P(OkTopk, DevicePathMatchesCpuPath,
                         testing::Combine(testing::Values("topk", "dgc", "sidco_e"),
                                          testing::Values(2, 4), testing::Values("off"),
                                          testing::Values("oktopk", "auto")),
                         CaseName);

// A NaN or +Inf from one trainer of one node (issue 16 item 3) on the device path: the engine
// reduces before the control round with the device primitives' SumScaledCheckFinite and decides
// from the round's word, as on the CPU path. Every trainer's status and output at every step
// equal the CPU path's bit for bit (whose clean steps tests/daemon/nonfinite_test shows equal a
// run that never saw the bad step): under error the bad step fails on every trainer naming the
// trainer and index, under propagate the sparse bucket is NaN across and the dense one carries
// the value where an input had it; the steps after it are finite.
struct NonfiniteRun {
  std::vector<std::string> status;  // [((n * L + t) * steps + s) * 2 + b]
  std::vector<std::vector<float>> output;
  std::vector<std::unique_ptr<FakeDevice>> devices;
};

NonfiniteRun RunNonfinite(bool device, const std::string& compressor, NonfinitePolicy policy,
                          float bad) {
  constexpr int N = 2, L = 2, kSteps = 4, kBad = 1;
  const uint64_t ids[2] = {kSparseBucket, kDenseBucket};
  const size_t sizes[2] = {kSparseElements, kDenseElements};
  NonfiniteRun r;
  r.status.assign(N * L * kSteps * 2, "not run");
  r.output.assign(N * L * kSteps * 2, {});
  EngineClusterOptions o = DeviceOrCpu(device, N, L, &r.devices);
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  o.engine.nonfinite = policy;
  EngineCluster cluster(o);
  if (!cluster.status().ok()) {
    r.status[0] = cluster.status().ToString();
    return r;
  }
  cluster.ForEachTrainer([&](int n, int t) {
    auto tr = Trainer::Open(&cluster.engine(n), t, L);
    if (!tr.ok()) return void(r.status[(n * L + t) * kSteps * 2] = tr.status().ToString());
    for (int b = 0; b < 2; ++b) {
      auto g = tr->Register(ids[b], sizes[b], b == 0 ? compressor : "dense", 0.01);
      if (!g.ok()) return void(r.status[(n * L + t) * kSteps * 2] = g.status().ToString());
    }
    for (int s = 0; s < kSteps; ++s) {
      for (int b = 0; b < 2; ++b) {
        tr->Fill(ids[b], [&](size_t i) { return Value(n, t, ids[b], s, i); });
        if (s == kBad && n == 1 && t == 1) tr->input(ids[b])[777] = bad;
        const size_t at = ((n * L + t) * kSteps + s) * 2 + b;
        absl::StatusOr<ExchangeRecord> rec = tr->Exchange(ids[b], s);
        r.status[at] = rec.ok() ? "OK" : rec.status().ToString();
        r.output[at].assign(tr->output(ids[b]), tr->output(ids[b]) + sizes[b]);
      }
    }
  });
  return r;
}

TEST(DevicePathNonfinite, SameStatusesAndOutputsAsTheCpuPath) {
  for (const std::string compressor : {"topk", "micro"}) {
    for (NonfinitePolicy policy : {NonfinitePolicy::kError, NonfinitePolicy::kPropagate}) {
      for (float bad :
           {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        SCOPED_TRACE(absl::StrCat(compressor, " ", AbslUnparseFlag(policy), " ", bad));
        const NonfiniteRun cpu = RunNonfinite(false, compressor, policy, bad);
        const NonfiniteRun dev = RunNonfinite(true, compressor, policy, bad);
        ASSERT_EQ(cpu.status, dev.status);
        for (size_t at = 0; at < cpu.output.size(); ++at) {
          EXPECT_TRUE(SameBits(cpu.output[at], dev.output[at])) << "slot " << at;
        }
        for (const auto& d : dev.devices) {
          for (const std::string& v : d->violations()) ADD_FAILURE() << v;
        }
        // The bad step (1) of trainer 0 of node 0, both buckets, then the step after it.
        for (int b = 0; b < 2; ++b) {
          const size_t bad_at = (0 * 4 + 1) * 2 + b, next_at = (0 * 4 + 2) * 2 + b;
          if (policy == NonfinitePolicy::kError) {
            EXPECT_NE(dev.status[bad_at].find("local trainer 1 of node 1, first non-finite value "
                                              "at index 777"),
                      std::string::npos)
                << dev.status[bad_at];
          } else {
            EXPECT_EQ(dev.status[bad_at], "OK");
            const std::vector<float>& out = dev.output[bad_at];
            if (b == 0) {
              for (float x : out) ASSERT_TRUE(std::isnan(x));
            } else {
              EXPECT_FALSE(std::isfinite(out[777]));
              EXPECT_TRUE(std::isfinite(out[776]));
            }
          }
          EXPECT_EQ(dev.status[next_at], "OK");
          for (float x : dev.output[next_at]) ASSERT_TRUE(std::isfinite(x));
        }
      }
    }
  }
}

// Per exchange on every node: wait for input event 0..L-1 of the bucket's buffer, then the
// engine's device work on that buffer, then the output event L; the output is complete when
// the event is recorded and the step is not yet published.
TEST(DevicePathOrdering, WaitsBeforeReadingRecordsBeforePublishing) {
  const int N = 2, L = 2, steps = 4;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  // At record time: the buffer's published counter and a copy of its output.
  struct Seen {
    uint32_t published;
    std::vector<float> output;
  };
  absl::Mutex mu;
  std::map<uint64_t, const BucketHeader*> headers;        // by node * 1000 + buffer id
  std::map<uint64_t, std::pair<size_t, size_t>> outputs;  // output offset, elements
  std::map<std::pair<uint64_t, uint32_t>, Seen> seen;     // (node * 1000 + buffer, step)
  for (int n = 0; n < N; ++n) {
    devices.push_back(std::make_unique<FakeDevice>());
    FakeDevice* d = devices.back().get();
    d->SetOnRecord([&, n](fake::FakeBuffer& b, int slot) {
      absl::MutexLock lock(&mu);
      const uint64_t key = n * 1000 + b.id();
      const BucketHeader* h = headers.at(key);
      const uint32_t published = h->published.load();
      const auto [offset, elements] = outputs.at(key);
      const float* out = reinterpret_cast<const float*>(static_cast<uint8_t*>(b.data()) + offset);
      seen[{key, published}] = {published, std::vector<float>(out, out + elements)};
    });
  }
  EngineClusterOptions o = OnFakeDevices(N, &devices);
  o.trainers = L;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::string> errors(N * L);
  cluster.ForEachTrainer([&](int n, int t) {
    std::string& err = errors[n * L + t];
    auto tr = Trainer::Open(&cluster.engine(n), t, L);
    if (!tr.ok()) return void(err = tr.status().ToString());
    const uint64_t ids[2] = {kSparseBucket, kDenseBucket};
    const size_t sizes[2] = {kSparseElements, kDenseElements};
    uint64_t buffers[2];
    for (int b = 0; b < 2; ++b) {
      auto g = tr->Register(ids[b], sizes[b], b == 0 ? "topk" : "dense", 0.01);
      if (!g.ok()) return void(err = g.status().ToString());
      buffers[b] = FakeBufferId(*g);
      absl::MutexLock lock(&mu);
      headers[n * 1000 + buffers[b]] = tr->header(ids[b]);
      outputs[n * 1000 + buffers[b]] = {g->device_output_offset, sizes[b]};
    }
    for (int s = 0; s < steps; ++s) {
      for (int b = 0; b < 2; ++b) {
        tr->Fill(ids[b], [&](size_t i) { return Value(n, t, ids[b], s, i); });
      }
      for (int b = 0; b < 2; ++b) {
        auto rec = tr->Exchange(ids[b], s);
        if (!rec.ok()) return void(err = rec.status().ToString());
        absl::MutexLock lock(&mu);
        auto it = seen.find({n * 1000 + buffers[b], static_cast<uint32_t>(s)});
        if (it == seen.end()) {
          return void(err = absl::StrCat("no record before step ", s, " was published"));
        }
        if (!std::equal(it->second.output.begin(), it->second.output.end(), tr->output(ids[b]))) {
          return void(err = absl::StrCat("output changed after its event was recorded, step ", s));
        }
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (int n = 0; n < N; ++n) {
    for (const std::string& v : devices[n]->violations()) ADD_FAILURE() << v;
    // Split the node's log into exchanges and check each one's shape.
    const std::vector<fake::Event> log = devices[n]->events();
    std::map<uint64_t, int> exchanges;
    size_t i = 0;
    while (i < log.size()) {
      const uint64_t buffer = log[i].buffer;
      std::string shape;
      for (int slot = 0; slot < L; ++slot, ++i) {
        ASSERT_LT(i, log.size());
        EXPECT_EQ(log[i].ToString(), absl::StrCat("wait b", buffer, " ", slot))
            << "node " << n << " at " << i;
      }
      int touches = 0;
      for (; i < log.size() && log[i].kind == fake::Event::kTouch; ++i) {
        EXPECT_EQ(log[i].buffer, buffer)
            << "node " << n << ": another bucket touched inside an exchange";
        ++touches;
      }
      EXPECT_GT(touches, 0) << "the engine read no input after waiting";
      ASSERT_LT(i, log.size());
      EXPECT_EQ(log[i].ToString(), absl::StrCat("record b", buffer, " ", L))
          << "node " << n << " at " << i;
      ++i;
      exchanges[buffer]++;
    }
    ASSERT_EQ(exchanges.size(), 2u);
    for (const auto& [buffer, count] : exchanges) EXPECT_EQ(count, steps) << "buffer " << buffer;
  }
}

// Node 0 cannot wait for its trainer's input event at step 1: both nodes report an error for
// step 1 (saying which node and why), nobody hangs in a collective, and step 2 works again.
TEST(DevicePathOrdering, AFailedInputEventFailsTheStepOnEveryNode) {
  const int N = 2, steps = 3;
  const size_t n = 1000;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  for (int r = 0; r < N; ++r) {
    devices.push_back(std::make_unique<FakeDevice>());
    if (r == 0) {
      auto waits = std::make_shared<std::atomic<int>>(0);
      devices[r]->SetWaitFailure([waits](const fake::FakeBuffer&, int) { return ++*waits == 2; });
    }
  }
  EngineCluster cluster(OnFakeDevices(N, &devices));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::vector<absl::Status>> results(N, std::vector<absl::Status>(steps));
  std::vector<std::vector<float>> step2(N);
  cluster.ForEachNode([&](int r) {
    auto t = Trainer::Open(&cluster.engine(r), 0, 1);
    ASSERT_TRUE(t.ok());
    auto g = t->Register(1, n, "dense", 0);
    ASSERT_TRUE(g.ok()) << g.status();
    for (int s = 0; s < steps; ++s) {
      t->Fill(1, [&](size_t) { return static_cast<float>(r + 1); });
      results[r][s] = t->Exchange(1, s).status();
    }
    step2[r].assign(t->output(1), t->output(1) + n);
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_TRUE(results[r][0].ok()) << results[r][0];
    EXPECT_FALSE(results[r][1].ok());
    EXPECT_TRUE(results[r][2].ok()) << results[r][2];
    for (float x : step2[r]) ASSERT_EQ(x, 1.5f);
  }
  EXPECT_NE(results[0][1].message().find("waiting for local trainer 0's input event"),
            std::string::npos)
      << results[0][1];
  EXPECT_NE(results[0][1].message().find("fake cudaStreamWaitEvent failure"), std::string::npos);
  EXPECT_NE(results[1][1].message().find("another node could not read its trainers' inputs"),
            std::string::npos)
      << results[1][1];
}

// Starts one engine on `prims` and `path` and returns how Start went.
absl::Status StartWith(Primitives* prims, DevicePath path) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.engine.shm_tag = "devtest";
  o.start = false;
  o.parts = [&](int) { return NodeParts{prims, path}; };
  EngineCluster cluster(o);
  return cluster.Start();
}

TEST(DevicePathSetup, MisconfiguredPathsAreRefusedAtStart) {
  FakeDevice device;
  {
    DevicePath p = device.path();
    p.ordering = nullptr;
    absl::Status s = StartWith(device.device_prims(), p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("slot ordering"), std::string::npos) << s;
  }
  {
    DevicePath p = device.path();
    p.host_prims = device.device_prims();
    absl::Status s = StartWith(device.device_prims(), p);
    EXPECT_NE(s.message().find("host_prims must be CPU primitives"), std::string::npos) << s;
  }
  {
    absl::Status s = StartWith(device.host_prims(), device.path());
    EXPECT_NE(s.message().find("differs from the primitives' device"), std::string::npos) << s;
  }
  {
    absl::Status s = StartWith(device.device_prims(), DevicePath());
    EXPECT_NE(s.message().find("need a device path"), std::string::npos) << s;
  }
}

TEST(DevicePathSetup, AllocationFailuresNameTheBucket) {
  FakeDevice device;
  EngineCluster cluster(OnFakeDevice(&device));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto hello = e.Hello("", 0, 1, 0, "t");
  ASSERT_TRUE(hello.ok());
  device.FailAllocations(absl::ResourceExhaustedError("fake cudaMalloc: out of memory"));
  auto g = e.RegisterBucket(hello->session_id, 12, 1000, "dense", 0);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(g.status().message().find("bucket 12 (1000 elements)"), std::string::npos)
      << g.status();
  EXPECT_EQ(device.live_buffers(), 0);
  device.FailAllocations(absl::OkStatus());
  g = e.RegisterBucket(hello->session_id, 12, 1000, "dense", 0);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(device.live_buffers(), 1);
  // The device buffer goes with the bucket.
  EXPECT_TRUE(e.UnregisterBucket(hello->session_id, 12).ok());
  EXPECT_EQ(device.live_buffers(), 0);
}

// The compressor factory gets the bucket's primitives, the device's on the device path. A test
// factory that runs only on host primitives refuses them: RegisterBucket says so, naming the
// bucket, keeps no device buffer for it, and the engine keeps serving (a dense bucket, which
// the factory never sees, registers and exchanges).
TEST(DevicePathSetup, ACompressorFactoryRefusingDevicePrimitivesFailsRegistration) {
  FakeDevice device;
  EngineClusterOptions o = OnFakeDevice(&device);
  o.engine.min_sparse_elements = 0;
  o.engine.dense_fallback = DenseFallback::kOff;
  std::atomic<int> asked{0};
  o.engine.compressor_factory = [&](const CompressorSpec& spec,
                                    Primitives* p) -> absl::StatusOr<std::unique_ptr<Compressor>> {
    ++asked;
    if (p->device() != Device::kCpu) {
      return absl::UnimplementedError("the test compressors run on host primitives only");
    }
    return MakeCompressor(spec, p);
  };
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  auto t = Trainer::Open(&cluster.engine(0), 0, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  auto g = t->Register(kSparseBucket, kSparseElements, "sidco_e", 0.01);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnimplemented) << g.status();
  EXPECT_NE(g.status().message().find(
                absl::StrCat("bucket ", kSparseBucket, " (", kSparseElements, " elements)")),
            std::string::npos)
      << g.status();
  EXPECT_NE(g.status().message().find("host primitives only"), std::string::npos) << g.status();
  EXPECT_EQ(asked.load(), 1);
  EXPECT_EQ(device.live_buffers(), 0) << "the refused bucket kept its device buffer";
  ASSERT_TRUE(t->Register(kDenseBucket, kDenseElements, "dense", 0).ok());
  t->Fill(kDenseBucket, [](size_t i) { return static_cast<float>(i % 7); });
  auto rec = t->Exchange(kDenseBucket, 0);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->pattern, "D");
  for (size_t i = 0; i < kDenseElements; ++i) {
    ASSERT_EQ(t->output(kDenseBucket)[i], static_cast<float>(i % 7)) << i;
  }
  EXPECT_EQ(asked.load(), 1);
  for (const std::string& v : device.violations()) ADD_FAILURE() << v;
}

}  // namespace
}  // namespace spex::test
