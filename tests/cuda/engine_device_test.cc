// The engine's device path without a GPU, on the fake device of fake_device.h (host memory
// that claims to be a GPU's, CPU primitives claiming Device::kCuda and checking which side of
// the device every pointer is on, a recorder for the slot ordering, the in-process collective
// checked the same way):
//  - results equal the CPU path's bit for bit, for dense, every sparse compressor (all run on
//    device primitives: topk, gtopk, randomk, dgc, gaussiank, redsync, redsync_trim, sage,
//    sidco_e, sidco_p, sidco_gp: pattern B; topk_union, cltk, thresh, micro, exdyna, deft:
//    pattern A) and a staged one (sidco_e built by a test codec factory, which the engine hands
//    its host primitives on staged host copies; the factory refuses device primitives), 2 and
//    4 nodes x 2 trainers, both signalling paths, with and without the dense-fallback probe
//    (some); the device compressors' steps copy no whole bucket (no staging), the staged one
//    makes exactly the three documented staging copies;
//  - per exchange the engine waits for every trainer's input event before touching the bucket,
//    and records the output event after writing it and before publishing;
//  - a node whose input events fail makes every node skip that step with an error, no hang;
//  - the RegisterBucket reply carries a cuda_ipc device descriptor that decodes with the right
//    sizes and events, and the unchanged client (gRPC, IpcHandleCache) exchanges through it;
//  - misconfigured device paths are refused at Start with what to fix.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "daemon/engine/codec.h"
#include "daemon/engine/engine.h"
#include "daemon/memory/cuda_ipc_buffer.h"
#include "daemon/memory/futex.h"
#include "daemon/service/spex_service.h"
#include "daemon/transport/inproc_collective.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "proto/spex.pb.h"
#include "tests/cuda/fake_device.h"

namespace spex {
namespace {

using fake::FakeDevice;

constexpr uint64_t kSparseBucket = 7;
constexpr uint64_t kDenseBucket = 9;
constexpr size_t kSparseElements = 30011;
constexpr size_t kDenseElements = 4099;

// Roughly Gaussian, not integers: the order of additions shows in the bits, so equal results
// mean the device path adds in the CPU path's order.
float Value(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  uint64_t x = (static_cast<uint64_t>(node) << 56) ^ (static_cast<uint64_t>(trainer) << 48) ^
               (bucket << 40) ^ (step << 32) ^ i;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  const double u1 = ((x & 0xffffffull) + 0.5) / 16777216.0;
  const double u2 = (((x >> 24) & 0xffffffull) + 0.5) / 16777216.0;
  const double g = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<float>(g * (1.0 + 4.0 * ((i * 2654435761u) % 97 == 0)) * 1e-3);
}

// Where a trainer finds its bucket's pieces in a grant (CPU or device path).
struct View {
  BucketHeader* header = nullptr;
  float* input = nullptr;
  const float* output = nullptr;
  uint64_t device_buffer = 0;  // FakeBuffer id; 0 on the CPU path
};

View ViewOf(const BucketGrant& g) {
  View v;
  auto* shm = static_cast<uint8_t*>(const_cast<ShmBuffer*>(g.buffer)->data());
  v.header = reinterpret_cast<BucketHeader*>(shm);
  if (g.device_buffer == nullptr) {
    v.input = reinterpret_cast<float*>(shm + g.input_offset);
    v.output = reinterpret_cast<const float*>(shm + g.output_offset);
    return v;
  }
  auto* buffer = const_cast<SharedBuffer*>(g.device_buffer);
  auto* base = static_cast<uint8_t*>(buffer->data());
  v.input = reinterpret_cast<float*>(base + g.device_input_offset);
  v.output = reinterpret_cast<const float*>(base + g.device_output_offset);
  v.device_buffer = dynamic_cast<fake::FakeBuffer*>(buffer)->id();
  return v;
}

void MarkReady(DoorbellSegment* bell, BucketHeader* h, uint32_t rank, uint64_t step) {
  h->ready[rank].value.store(step + 1);
  bell->ring.fetch_add(1);
  if (bell->engine_sleeping.load()) FutexWake(&bell->ring);
}

void WaitPublished(BucketHeader* h, uint64_t step) {
  h->waiters.fetch_add(1);
  for (uint32_t cur; (cur = h->published.load()) != static_cast<uint32_t>(step + 1);) {
    FutexWait(&h->published, cur, 100 * 1000 * 1000);
  }
  h->waiters.fetch_sub(1);
}

struct RunConfig {
  std::string compressor = "topk";
  int nodes = 2;
  int trainers = 2;
  int steps = 6;
  std::string dense_fallback = "off";
  bool device = false;
  // Codecs from a test codec factory (the library's, refusing device primitives): the engine
  // stages such a codec's steps through host copies on the device path.
  bool staged = false;
};

// "staged_<compressor>" names a staged case.
constexpr char kStagedPrefix[] = "staged_";

// What one run saw: every trainer's output per step and bucket, trainer 0's records.
struct RunResult {
  // outputs[node][trainer][step][b] for b in {sparse, dense}
  std::vector<std::vector<std::vector<std::vector<std::vector<float>>>>> outputs;
  // records[node][step][b] (trainer 0, the RPC path)
  std::vector<std::vector<std::vector<ExchangeRecord>>> records;
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::vector<std::string> errors;
};

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
  InProcessHub hub(N, absl::Seconds(20));
  std::vector<std::unique_ptr<Primitives>> cpu;
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int n = 0; n < N; ++n) {
    EngineOptions o;
    o.local_trainers = L;
    o.shm_tag = "devtest";
    o.dense_fallback = c.dense_fallback;
    o.probe_steps = 3;
    o.min_sparse_elements = 0;
    o.residual_norm_every = 1;
    if (c.staged) {
      o.codec_factory = [](const CodecSpec& spec,
                           Primitives* p) -> absl::StatusOr<std::unique_ptr<Codec>> {
        if (p->device() != Device::kCpu) {
          return absl::UnimplementedError("the staged test codecs run on host primitives only");
        }
        return MakeCodec(spec, p);
      };
    }
    if (c.device) {
      r.devices.push_back(std::make_unique<FakeDevice>(/*ordinal=*/0, /*cpu_threads=*/1));
      FakeDevice* d = r.devices.back().get();
      colls.push_back(fake::CheckedCollective(hub.Connect(n), d));
      engines.push_back(
          std::make_unique<Engine>(o, colls.back().get(), d->device_prims(), d->path()));
    } else {
      cpu.push_back(MakeCpuPrimitives(1));
      colls.push_back(hub.Connect(n));
      engines.push_back(std::make_unique<Engine>(o, colls.back().get(), cpu.back().get()));
    }
    absl::Status started = engines.back()->Start();
    if (!started.ok()) {
      r.errors[0] = started.ToString();
      return r;
    }
  }
  std::vector<std::thread> threads;
  for (int n = 0; n < N; ++n) {
    for (int t = 0; t < L; ++t) {
      threads.emplace_back([&, n, t] {
        std::string& err = r.errors[n * L + t];
        Engine& e = *engines[n];
        auto hello = e.Hello("", t, L, 0, "t");
        if (!hello.ok()) return void(err = hello.status().ToString());
        auto* bell = static_cast<DoorbellSegment*>(const_cast<ShmBuffer*>(hello->doorbell)->data());
        View views[2];
        for (int b = 0; b < 2; ++b) {
          auto g = e.RegisterBucket(hello->session_id, ids[b], sizes[b], compressors[b], 0.01);
          if (!g.ok()) return void(err = g.status().ToString());
          if ((g->device_buffer != nullptr) != c.device) return void(err = "wrong kind of grant");
          views[b] = ViewOf(*g);
        }
        for (int s = 0; s < c.steps; ++s) {
          for (int b = 0; b < 2; ++b) {
            for (size_t i = 0; i < sizes[b]; ++i) views[b].input[i] = Value(n, t, ids[b], s, i);
          }
          if (t == 0) {
            for (int b = 0; b < 2; ++b) {
              auto rec = e.Exchange(hello->session_id, ids[b], s, absl::Now() + absl::Seconds(20));
              if (!rec.ok()) return void(err = rec.status().ToString());
              r.records[n][s][b] = *rec;
            }
          } else {
            for (int k = 0; k < 2; ++k) MarkReady(bell, views[n % 2 ? 1 - k : k].header, t, s);
            for (int b = 0; b < 2; ++b) WaitPublished(views[b].header, s);
            for (int b = 0; b < 2; ++b) {
              if (views[b].header->status.load() != 0) return void(err = "a step failed");
            }
          }
          for (int b = 0; b < 2; ++b) {
            r.outputs[n][t][s][b].assign(views[b].output, views[b].output + sizes[b]);
          }
        }
      });
    }
  }
  for (auto& th : threads) th.join();
  for (auto& e : engines) e->RequestStop();
  engines.clear();
  return r;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using Case = std::tuple<std::string, int, std::string>;  // compressor, nodes, dense_fallback

class DevicePathMatchesCpuPath : public testing::TestWithParam<Case> {};

TEST_P(DevicePathMatchesCpuPath, BitForBit) {
  RunConfig c;
  std::tie(c.compressor, c.nodes, c.dense_fallback) = GetParam();
  if (c.compressor.rfind(kStagedPrefix, 0) == 0) {
    c.compressor = c.compressor.substr(sizeof(kStagedPrefix) - 1);
    c.staged = true;
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
        EXPECT_EQ(x.gathered_elements, y.gathered_elements);
        EXPECT_EQ(x.bytes_sent, y.bytes_sent);
        EXPECT_EQ(x.bytes_received, y.bytes_received);
        EXPECT_EQ(x.residual_norm, y.residual_norm) << "node " << n << " step " << s;
        EXPECT_EQ(x.fell_back_to_dense, y.fell_back_to_dense);
      }
      sparse_steps += dev.records[n][s][0].pattern != "D";
    }
  }
  EXPECT_EQ(differing, 0) << "outputs differing between the CPU and the device path";

  // What the device path did on the fake device.
  const uint64_t bytes = kSparseElements * sizeof(float);
  uint64_t to_host = 0, from_host = 0, to_host_bytes = 0, from_host_bytes = 0;
  uint64_t whole_to_host = 0, whole_from_host = 0;  // copies of a whole sparse bucket
  for (const auto& d : dev.devices) {
    for (const std::string& v : d->violations()) ADD_FAILURE() << v;
    const fake::Staging st = d->staging();
    to_host += st.to_host_calls;
    from_host += st.from_host_calls;
    to_host_bytes += st.to_host_bytes;
    from_host_bytes += st.from_host_bytes;
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
  if (c.compressor == "dense" || !c.staged) {
    ASSERT_TRUE(c.compressor == "dense" || CompressorRunsOnDevice(c.compressor));
    // The compressor selects from the device's acc and the exchange decodes into the device's
    // output: only selections, samples, histogram bins, indices and values cross, never a
    // whole bucket; dense steps (and the dense bucket) copy nothing.
    EXPECT_EQ(whole_to_host, 0u);
    EXPECT_EQ(whole_from_host, 0u);
    if (sparse_steps > 0) {
      EXPECT_GT(to_host + from_host, 0u);
    }
    return;
  }
  // The staged sparse steps: acc to the host once, the output and the residual back.
  EXPECT_EQ(to_host, static_cast<uint64_t>(sparse_steps));
  EXPECT_EQ(from_host, 2u * sparse_steps);
  EXPECT_EQ(to_host_bytes, bytes * sparse_steps);
  EXPECT_EQ(from_host_bytes, 2 * bytes * sparse_steps);
}

std::string CaseName(const testing::TestParamInfo<Case>& info) {
  return absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param), "nodes_fallback_",
                      std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Compressors, DevicePathMatchesCpuPath,
                         testing::Combine(testing::Values("dense", "topk", "micro", "dgc",
                                                          "sidco_e", "staged_sidco_e"),
                                          testing::Values(2, 4), testing::Values("off", "auto")),
                         CaseName);

// The other compressors that run on device primitives (no dense fallback).
INSTANTIATE_TEST_SUITE_P(DeviceCompressors, DevicePathMatchesCpuPath,
                         testing::Combine(testing::Values("gtopk", "topk_union", "cltk", "randomk",
                                                          "thresh", "exdyna", "gaussiank",
                                                          "redsync", "redsync_trim", "sage", "deft",
                                                          "sidco_p", "sidco_gp"),
                                          testing::Values(2, 4), testing::Values("off")),
                         CaseName);

// Per exchange on every node: wait for input event 0..L-1 of the bucket's buffer, then the
// engine's device work on that buffer, then the output event L; the output is complete when
// the event is recorded and the step is not yet published.
TEST(DevicePathOrdering, WaitsBeforeReadingRecordsBeforePublishing) {
  const int N = 2, L = 2, steps = 4;
  InProcessHub hub(N, absl::Seconds(20));
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
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
    colls.push_back(fake::CheckedCollective(hub.Connect(n), d));
    EngineOptions o;
    o.local_trainers = L;
    o.shm_tag = "devtest";
    o.dense_fallback = "off";
    o.min_sparse_elements = 0;
    engines.push_back(
        std::make_unique<Engine>(o, colls.back().get(), d->device_prims(), d->path()));
    ASSERT_TRUE(engines.back()->Start().ok());
  }
  std::vector<std::string> errors(N * L);
  std::vector<std::thread> threads;
  for (int n = 0; n < N; ++n) {
    for (int t = 0; t < L; ++t) {
      threads.emplace_back([&, n, t] {
        std::string& err = errors[n * L + t];
        Engine& e = *engines[n];
        auto hello = e.Hello("", t, L, 0, "t");
        if (!hello.ok()) return void(err = hello.status().ToString());
        const uint64_t ids[2] = {kSparseBucket, kDenseBucket};
        const size_t sizes[2] = {kSparseElements, kDenseElements};
        View views[2];
        for (int b = 0; b < 2; ++b) {
          auto g = e.RegisterBucket(hello->session_id, ids[b], sizes[b], b == 0 ? "topk" : "dense",
                                    0.01);
          if (!g.ok()) return void(err = g.status().ToString());
          views[b] = ViewOf(*g);
          absl::MutexLock lock(&mu);
          headers[n * 1000 + views[b].device_buffer] = views[b].header;
          outputs[n * 1000 + views[b].device_buffer] = {g->device_output_offset, sizes[b]};
        }
        for (int s = 0; s < steps; ++s) {
          for (int b = 0; b < 2; ++b) {
            for (size_t i = 0; i < sizes[b]; ++i) views[b].input[i] = Value(n, t, ids[b], s, i);
          }
          for (int b = 0; b < 2; ++b) {
            auto rec = e.Exchange(hello->session_id, ids[b], s, absl::Now() + absl::Seconds(20));
            if (!rec.ok()) return void(err = rec.status().ToString());
            absl::MutexLock lock(&mu);
            auto it = seen.find({n * 1000 + views[b].device_buffer, static_cast<uint32_t>(s)});
            if (it == seen.end()) {
              return void(err = absl::StrCat("no record before step ", s, " was published"));
            }
            if (!std::equal(it->second.output.begin(), it->second.output.end(), views[b].output)) {
              return void(
                  err = absl::StrCat("output changed after its event was recorded, step ", s));
            }
          }
        }
      });
    }
  }
  for (auto& th : threads) th.join();
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
  for (auto& e : engines) e->RequestStop();
}

// Node 0 cannot wait for its trainer's input event at step 1: both nodes report an error for
// step 1 (saying which node and why), nobody hangs in a collective, and step 2 works again.
TEST(DevicePathOrdering, AFailedInputEventFailsTheStepOnEveryNode) {
  const int N = 2, steps = 3;
  const size_t n = 1000;
  InProcessHub hub(N, absl::Seconds(20));
  std::vector<std::unique_ptr<FakeDevice>> devices;
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < N; ++r) {
    devices.push_back(std::make_unique<FakeDevice>());
    if (r == 0) {
      auto waits = std::make_shared<std::atomic<int>>(0);
      devices[r]->SetWaitFailure([waits](const fake::FakeBuffer&, int) { return ++*waits == 2; });
    }
    colls.push_back(fake::CheckedCollective(hub.Connect(r), devices[r].get()));
    EngineOptions o;
    o.shm_tag = "devtest";
    engines.push_back(std::make_unique<Engine>(o, colls.back().get(), devices[r]->device_prims(),
                                               devices[r]->path()));
    ASSERT_TRUE(engines.back()->Start().ok());
  }
  std::vector<std::vector<absl::Status>> results(N, std::vector<absl::Status>(steps));
  std::vector<std::vector<float>> step2(N);
  std::vector<std::thread> threads;
  for (int r = 0; r < N; ++r) {
    threads.emplace_back([&, r] {
      Engine& e = *engines[r];
      auto hello = e.Hello("", 0, 1, 0, "t");
      ASSERT_TRUE(hello.ok());
      auto g = e.RegisterBucket(hello->session_id, 1, n, "dense", 0);
      ASSERT_TRUE(g.ok()) << g.status();
      View v = ViewOf(*g);
      for (int s = 0; s < steps; ++s) {
        for (size_t i = 0; i < n; ++i) v.input[i] = static_cast<float>(r + 1);
        results[r][s] =
            e.Exchange(hello->session_id, 1, s, absl::Now() + absl::Seconds(20)).status();
      }
      step2[r].assign(v.output, v.output + n);
    });
  }
  for (auto& th : threads) th.join();
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
  for (auto& e : engines) e->RequestStop();
  engines.clear();
}

// The service's replies on a device engine: Hello says DEVICE_CUDA (and refuses host-buffer
// trainers), RegisterBucket carries the header in shm and a cuda_ipc device buffer with
// L + 1 events, DeviceBucketBytes bytes and the GPU ordinal; the client's ResolveBucketView
// attaches it through an IpcHandleCache to the engine's memory.
TEST(DeviceService, RegisterBucketReplyCarriesTheDeviceDescriptor) {
  const uint32_t L = 2;
  const size_t n = 5000;
  FakeDevice device(/*ordinal=*/3);
  InProcessHub hub(1);
  auto coll = hub.Connect(0);
  EngineOptions o;
  o.local_trainers = L;
  o.shm_tag = "devtest";
  Engine engine(o, coll.get(), device.device_prims(), device.path());
  ASSERT_TRUE(engine.Start().ok());
  EXPECT_TRUE(engine.device_buckets());
  SpexService service(&engine, "test");

  v1::HelloRequest hello;
  hello.set_local_size(L);
  hello.set_device(v1::DEVICE_CPU);
  v1::HelloResponse hello_resp;
  grpc::Status refused = service.Hello(nullptr, &hello, &hello_resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("--device=cpu"), std::string::npos)
      << refused.error_message();

  fake::FakeIpcOpener::Log log;
  IpcHandleCache cache(std::make_unique<fake::FakeIpcOpener>(&log));
  for (uint32_t rank = 0; rank < L; ++rank) {
    hello.set_local_rank(rank);
    hello.set_device(rank == 0 ? v1::DEVICE_CUDA : v1::DEVICE_UNSPECIFIED);
    hello_resp.Clear();
    ASSERT_TRUE(service.Hello(nullptr, &hello, &hello_resp).ok());
    EXPECT_EQ(hello_resp.device(), v1::DEVICE_CUDA);

    v1::RegisterBucketRequest reg;
    reg.set_session_id(hello_resp.session_id());
    reg.set_bucket_id(4);
    reg.set_elements(n);
    reg.mutable_compressor()->set_name("topk");
    v1::RegisterBucketResponse resp;
    grpc::Status st = service.RegisterBucket(nullptr, &reg, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    ASSERT_TRUE(resp.buffer().has_shm());
    EXPECT_EQ(resp.buffer().shm().size(), kPageBytes);  // the header alone
    EXPECT_EQ(resp.layout().header_offset(), 0u);
    EXPECT_EQ(resp.layout().elements(), n);
    ASSERT_TRUE(resp.has_device_buffer());
    ASSERT_TRUE(resp.device_buffer().has_cuda_ipc());
    absl::StatusOr<CudaIpcHandles> h = DecodeCudaIpcDescriptor(resp.device_buffer().cuda_ipc());
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(h->size, DeviceBucketBytes(n, L));
    EXPECT_EQ(h->events.size(), L + 1);
    EXPECT_EQ(h->device, 3);
    EXPECT_EQ(resp.device_layout().input_offset(), DeviceInputOffset(n, rank));
    EXPECT_EQ(resp.device_layout().output_offset(), DeviceOutputOffset(n, L));
    EXPECT_EQ(resp.device_layout().elements(), n);

    auto mapping = ShmMapping::Attach(resp.buffer().shm().name(), resp.buffer().shm().size());
    ASSERT_TRUE(mapping.ok()) << mapping.status();
    absl::StatusOr<BucketView> view = ResolveBucketView(resp, n, rank, L, (*mapping)->data(),
                                                        resp.buffer().shm().size(), true, &cache);
    ASSERT_TRUE(view.ok()) << view.status();
    ASSERT_NE(view->device, nullptr);
    EXPECT_EQ(view->device->events.size(), L + 1);
    EXPECT_EQ(view->device->device, 3);
    EXPECT_EQ(view->header->bucket_id, 4u);
    // The trainer's pointers are the engine's device memory, at the described offsets.
    EXPECT_TRUE(device.IsDeviceMemory(view->input, n * sizeof(float)));
    EXPECT_TRUE(device.IsDeviceMemory(view->output, n * sizeof(float)));
    EXPECT_EQ(reinterpret_cast<const uint8_t*>(view->output) -
                  reinterpret_cast<const uint8_t*>(view->input),
              static_cast<ptrdiff_t>(DeviceOutputOffset(n, L) - DeviceInputOffset(n, rank)));
  }
  EXPECT_EQ(cache.open_count(), 1u);  // one device buffer, opened once for both trainers here
  absl::MutexLock lock(&log.mu);
  EXPECT_EQ(log.memory_opens, 1);
}

// The unchanged C++ client over gRPC against a device engine: ClientOptions::device =
// DEVICE_CUDA with the fake IPC opener, both signalling paths, the stream ordering around
// every exchange, and exact averages on the device buffers.
TEST(DeviceService, ClientExchangesThroughTheDevicePath) {
  const uint32_t L = 2;
  const size_t n = 20000;
  FakeDevice device(/*ordinal=*/1);
  InProcessHub hub(1);
  auto coll = fake::CheckedCollective(hub.Connect(0), &device);
  EngineOptions o;
  o.local_trainers = L;
  o.shm_tag = "devtest";
  o.min_sparse_elements = 0;
  o.dense_fallback = "off";
  Engine engine(o, coll.get(), device.device_prims(), device.path());
  ASSERT_TRUE(engine.Start().ok());
  SpexService service(&engine, "test");
  const std::string socket = absl::StrCat("/tmp/spex-devtest-", getpid(), ".sock");
  unlink(socket.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);

  // A host-buffer client is refused with what to do.
  {
    ClientOptions co;
    co.socket = socket;
    co.local_size = L;
    auto c = Client::Connect(co);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(c.status().message().find("serves CUDA buffers"), std::string::npos) << c.status();
  }

  fake::FakeIpcOpener::Log logs[L];
  std::vector<std::string> errors(L);
  std::vector<std::thread> threads;
  const int steps = 4;
  for (uint32_t t = 0; t < L; ++t) {
    threads.emplace_back([&, t] {
      std::string& err = errors[t];
      ClientOptions co;
      co.socket = socket;
      co.local_rank = t;
      co.local_size = L;
      co.device = v1::DEVICE_CUDA;
      co.ipc_opener = [&logs, t] { return std::make_unique<fake::FakeIpcOpener>(&logs[t]); };
      auto client = Client::Connect(co);
      if (!client.ok()) return void(err = client.status().ToString());
      auto dense = (*client)->RegisterBucket(1, n, {"dense", 0});
      if (!dense.ok()) return void(err = dense.status().ToString());
      auto sparse = (*client)->RegisterBucket(2, n, {"topk", 0.01});
      if (!sparse.ok()) return void(err = sparse.status().ToString());
      if (!(*dense)->on_device() || (*dense)->cuda_device() != 1) {
        return void(err = "not a device bucket");
      }
      void* stream = reinterpret_cast<void*>(uintptr_t{0x5});
      for (int s = 0; s < steps; ++s) {
        const ExchangeMode mode = (s + t) % 2 ? ExchangeMode::kRpc : ExchangeMode::kDoorbell;
        for (Bucket* b : {*dense, *sparse}) {
          absl::Span<float> in = b->input();
          for (size_t i = 0; i < n; ++i) {
            in[i] = static_cast<float>((i * 7 + t * 13 + s) % 101) - 50;
          }
          absl::Status st = (*client)->Exchange(b, mode, stream);
          if (!st.ok()) return void(err = st.ToString());
        }
        absl::Span<const float> out = (*dense)->output();
        for (size_t i = 0; i < n; ++i) {
          float sum = 0;
          for (uint32_t u = 0; u < L; ++u) {
            sum += static_cast<float>((i * 7 + u * 13 + s) % 101) - 50;
          }
          if (out[i] != sum / L) {
            return void(err = absl::StrCat("step ", s, " element ", i, ": ", out[i]));
          }
        }
        size_t nonzero = 0;
        for (float x : (*sparse)->output()) nonzero += x != 0;
        if (nonzero == 0 || nonzero > 2 * n / 100 + 2) {
          return void(err = absl::StrCat("step ", s, ": sparse output has ", nonzero, " nonzeros"));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (uint32_t t = 0; t < L; ++t) {
    absl::MutexLock lock(&logs[t].mu);
    // Per exchange: the trainer's input event recorded, then the output event waited on.
    ASSERT_EQ(logs[t].calls.size(), 2u * 2 * steps);
    for (size_t i = 0; i < logs[t].calls.size(); i += 2) {
      EXPECT_EQ(logs[t].calls[i], absl::StrCat("record ", t));
      EXPECT_EQ(logs[t].calls[i + 1], absl::StrCat("wait ", L));
    }
    EXPECT_EQ(logs[t].memory_opens, 2);  // one per bucket, reused every step
  }
  for (const std::string& v : device.violations()) ADD_FAILURE() << v;
  server->Shutdown();
  unlink(socket.c_str());
  engine.RequestStop();
}

TEST(DevicePathSetup, MisconfiguredPathsAreRefusedAtStart) {
  InProcessHub hub(1);
  auto coll = hub.Connect(0);
  FakeDevice device;
  EngineOptions o;
  o.shm_tag = "devtest";
  {
    DevicePath p = device.path();
    p.ordering = nullptr;
    Engine e(o, coll.get(), device.device_prims(), p);
    absl::Status s = e.Start();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("slot ordering"), std::string::npos) << s;
  }
  {
    DevicePath p = device.path();
    p.host_prims = device.device_prims();
    Engine e(o, coll.get(), device.device_prims(), p);
    absl::Status s = e.Start();
    EXPECT_NE(s.message().find("host_prims must be CPU primitives"), std::string::npos) << s;
  }
  {
    Engine e(o, coll.get(), device.host_prims(), device.path());
    absl::Status s = e.Start();
    EXPECT_NE(s.message().find("differs from the primitives' device"), std::string::npos) << s;
  }
  {
    Engine e(o, coll.get(), device.device_prims());
    absl::Status s = e.Start();
    EXPECT_NE(s.message().find("need a device path"), std::string::npos) << s;
  }
}

TEST(DevicePathSetup, AllocationFailuresNameTheBucket) {
  InProcessHub hub(1);
  auto coll = hub.Connect(0);
  FakeDevice device;
  EngineOptions o;
  o.shm_tag = "devtest";
  Engine e(o, coll.get(), device.device_prims(), device.path());
  ASSERT_TRUE(e.Start().ok());
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

}  // namespace
}  // namespace spex
