// The device path seen through the service and the client, on the fake device of
// fake_device.h (one engine, device_engine_server.h):
//  - the RegisterBucket reply carries a cuda_ipc device descriptor that decodes with the right
//    sizes and events, and the client's ResolveBucketView attaches it through an IpcHandleCache;
//  - the unchanged client (gRPC, IpcHandleCache) exchanges through it, both signalling paths.
// (Split from engine_device_test.cc: the client's spex::Bucket and the engine's cannot meet in
// one translation unit.)
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/ipc_handle_cache.h"
#include "client/shm_mapping.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/half.h"
#include "proto/contract/layout.h"
#include "proto/spex.pb.h"
#include "tests/cuda/device_engine_server.h"
#include "tests/support/fake_device.h"

namespace spex::test {
namespace {

using fake::FakeDevice;

// The service's replies on a device engine: Hello says DEVICE_CUDA (and refuses host-buffer
// trainers), RegisterBucket carries the header in shm and a cuda_ipc device buffer with
// L + 1 events, DeviceBucketBytes bytes and the GPU ordinal; the client's ResolveBucketView
// attaches it through an IpcHandleCache to the engine's memory.
TEST(DeviceService, RegisterBucketReplyCarriesTheDeviceDescriptor) {
  const uint32_t L = 2;
  const size_t n = 5000;
  FakeDevice device(/*ordinal=*/3);
  auto server = DeviceEngineServer::Start(&device, {L, false});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->device_buckets());
  v1::Spex::Service& service = *(*server)->service();

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

// A device engine served over gRPC on a unix socket of this process, stopped and unlinked when
// it goes out of scope.
class ServedDeviceEngine : public ServedEngine {
 public:
  ServedDeviceEngine(FakeDevice* device, uint32_t trainers, const std::string& tag)
      : ServedEngine(DeviceEngineServer::Start(device, {static_cast<int>(trainers), true}),
                     "devtest-" + tag) {}
};

// Trainer `rank` of `size` asking for device buckets through the fake IPC opener, which logs
// into `log`.
absl::StatusOr<std::unique_ptr<Client>> ConnectDeviceTrainer(const std::string& socket,
                                                             uint32_t rank, uint32_t size,
                                                             fake::FakeIpcOpener::Log* log) {
  ClientOptions co;
  co.socket = socket;
  co.local_rank = rank;
  co.local_size = size;
  co.device = v1::DEVICE_CUDA;
  co.ipc_opener = [log] { return std::make_unique<fake::FakeIpcOpener>(log); };
  return Client::Connect(co);
}

// The unchanged C++ client over gRPC against a device engine: ClientOptions::device =
// DEVICE_CUDA with the fake IPC opener, both signalling paths, the stream ordering around
// every exchange, and exact averages on the device buffers.
TEST(DeviceService, ClientExchangesThroughTheDevicePath) {
  const uint32_t L = 2;
  const size_t n = 20000;
  FakeDevice device(/*ordinal=*/1);
  ServedDeviceEngine served(&device, L, "exchange");
  ASSERT_TRUE(served.status().ok()) << served.status();
  const std::string& socket = served.socket();

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
      auto client = ConnectDeviceTrainer(socket, t, L, &logs[t]);
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
}

// Half buckets through the unchanged C++ client on the device path (docs/dtypes.md): a bfloat16
// dense bucket and a float16 topk bucket registered with DEVICE_CUDA, written and read through
// half_input()/half_output() on the device buffers; the dense average is exact (every input a
// small integer, the average a multiple of 0.5), the topk output sparse.
TEST(DeviceService, ClientExchangesHalfBucketsThroughTheDevicePath) {
  const uint32_t L = 2;
  const size_t n = 9000;
  FakeDevice device(/*ordinal=*/0);
  ServedDeviceEngine served(&device, L, "half");
  ASSERT_TRUE(served.status().ok()) << served.status();
  fake::FakeIpcOpener::Log logs[L];
  std::vector<std::string> errors(L);
  std::vector<std::thread> threads;
  auto value = [](size_t i, uint32_t t, int s) {
    return static_cast<float>((i * 7 + t * 13 + s) % 101) - 50;
  };
  for (uint32_t t = 0; t < L; ++t) {
    threads.emplace_back([&, t] {
      std::string& err = errors[t];
      auto client = ConnectDeviceTrainer(served.socket(), t, L, &logs[t]);
      if (!client.ok()) return void(err = client.status().ToString());
      auto dense = (*client)->RegisterBucket(1, n, {"dense", 0}, v1::DTYPE_BFLOAT16);
      if (!dense.ok()) return void(err = dense.status().ToString());
      auto sparse = (*client)->RegisterBucket(2, n, {"topk", 0.01}, v1::DTYPE_FLOAT16);
      if (!sparse.ok()) return void(err = sparse.status().ToString());
      if (!(*dense)->on_device() || !(*dense)->half() || (*dense)->half_input().size() != n ||
          !(*dense)->input().empty()) {
        return void(err = "not a half device bucket");
      }
      for (int s = 0; s < 3; ++s) {
        for (Bucket* b : {*dense, *sparse}) {
          const DType type = b == *dense ? DType::kBFloat16 : DType::kFloat16;
          absl::Span<uint16_t> in = b->half_input();
          for (size_t i = 0; i < n; ++i) in[i] = FloatToHalf(type, value(i, t, s));
          const ExchangeMode mode = s % 2 ? ExchangeMode::kRpc : ExchangeMode::kDoorbell;
          if (absl::Status st = (*client)->Exchange(b, mode, nullptr); !st.ok()) {
            return void(err = st.ToString());
          }
        }
        absl::Span<const uint16_t> out = (*dense)->half_output();
        for (size_t i = 0; i < n; ++i) {
          const float want = (value(i, 0, s) + value(i, 1, s)) / 2;
          if (out[i] != FloatToBf16(want)) {
            return void(err = absl::StrCat("step ", s, " element ", i, ": ", Bf16ToFloat(out[i]),
                                           ", expected ", want));
          }
        }
        size_t nonzero = 0;
        for (uint16_t x : (*sparse)->half_output()) nonzero += (x & 0x7fff) != 0;
        if (nonzero == 0 || nonzero > 2 * n / 100 + 2) {
          return void(err = absl::StrCat("step ", s, ": sparse output has ", nonzero, " nonzeros"));
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (const std::string& v : device.violations()) ADD_FAILURE() << v;
}

// Client::Start and Client::Wait, the doorbell exchange in two halves (what a DDP-like trainer
// and --merger need): every trainer starts both buckets of a step, then waits for both; the
// averages are exact. Wait before Start, and Start twice, are FailedPrecondition and change
// nothing.
TEST(DeviceService, ClientStartsEveryBucketThenWaits) {
  const uint32_t L = 2;
  const size_t n = 3000;
  FakeDevice device(/*ordinal=*/0);
  ServedDeviceEngine served(&device, L, "startwait");
  ASSERT_TRUE(served.status().ok()) << served.status();
  const std::string& socket = served.socket();
  fake::FakeIpcOpener::Log logs[L];
  std::vector<std::string> errors(L);
  std::vector<std::thread> threads;
  const int steps = 3;
  auto value = [](size_t i, uint32_t t, int s, int b) {
    return static_cast<float>((i * 5 + t * 11 + s * 3 + b * 17) % 97) - 48;
  };
  for (uint32_t t = 0; t < L; ++t) {
    threads.emplace_back([&, t] {
      std::string& err = errors[t];
      auto client = ConnectDeviceTrainer(socket, t, L, &logs[t]);
      if (!client.ok()) return void(err = client.status().ToString());
      std::vector<Bucket*> buckets;
      for (uint64_t id : {1, 2}) {
        auto b = (*client)->RegisterBucket(id, n, {"dense", 0});
        if (!b.ok()) return void(err = b.status().ToString());
        buckets.push_back(*b);
      }
      absl::Status early = (*client)->Wait(buckets[0]);
      if (early.code() != absl::StatusCode::kFailedPrecondition) {
        return void(err = absl::StrCat("Wait before Start: ", early.ToString()));
      }
      for (int s = 0; s < steps; ++s) {
        for (int b = 0; b < 2; ++b) {
          absl::Span<float> in = buckets[b]->input();
          for (size_t i = 0; i < n; ++i) in[i] = value(i, t, s, b);
          if (absl::Status st = (*client)->Start(buckets[b]); !st.ok()) {
            return void(err = st.ToString());
          }
        }
        absl::Status twice = (*client)->Start(buckets[1]);
        if (twice.code() != absl::StatusCode::kFailedPrecondition) {
          return void(err = absl::StrCat("Start twice: ", twice.ToString()));
        }
        for (int b = 0; b < 2; ++b) {
          if (absl::Status st = (*client)->Wait(buckets[b]); !st.ok()) {
            return void(err = st.ToString());
          }
          if (buckets[b]->next_step() != static_cast<uint64_t>(s + 1)) {
            return void(err = absl::StrCat("bucket ", b, " next_step ", buckets[b]->next_step()));
          }
          absl::Span<const float> out = buckets[b]->output();
          for (size_t i = 0; i < n; ++i) {
            float sum = 0;
            for (uint32_t u = 0; u < L; ++u) sum += value(i, u, s, b);
            if (out[i] != sum / L) {
              return void(err = absl::StrCat("step ", s, " bucket ", b, " element ", i, ": ",
                                             out[i], " want ", sum / L));
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (const std::string& v : device.violations()) ADD_FAILURE() << v;
}

}  // namespace
}  // namespace spex::test
