// The C++ client of spexd: a trainer connects to its node's daemon, registers gradient
// buckets once, writes each step's gradients into the bucket's mapped input span and calls
// Exchange, then reads the average of every trainer of every node from the output span.
//
//   auto client = spex::Client::Connect({.local_rank = r, .local_size = 2});
//   auto bucket = (*client)->RegisterBucket(/*id=*/0, /*elements=*/n);
//   std::copy(grads, grads + n, (*bucket)->input().begin());
//   (*client)->Exchange(*bucket);            // doorbell; ExchangeMode::kRpc for the RPC path
//   use((*bucket)->output());
//
// Device buckets (ClientOptions::device = DEVICE_CUDA, a daemon started with --device=cuda):
// input() and output() are spans of device pointers on the daemon's GPU (bucket->cuda_device()),
// opened once through CUDA IPC (IpcHandleCache) and reused every step; the doorbell counters
// stay in host shm. Exchange(bucket, mode, stream) orders the exchange after the work queued
// on `stream` (records the input slot's IPC event there) and makes `stream` wait for the
// daemon's result (the output's IPC event) before it returns: work queued on `stream` after
// Exchange sees the average. Other streams must synchronise with `stream` themselves.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/ipc_handle_cache.h"
#include "client/shm_mapping.h"
#include "proto/contract/layout.h"
#include "proto/spex.grpc.pb.h"

namespace spex {

struct ClientOptions {
  std::string socket;  // empty: $SPEX_SOCKET, else the default path for `job`
  std::string job;     // empty: $SPEX_JOB / $SLURM_JOB_ID / "default"
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  std::string client_name = "spex-cpp";
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration exchange_timeout = absl::Minutes(5);  // per exchange, either path
  // DEVICE_CPU: host buckets. DEVICE_CUDA: device buckets (the daemon must serve CUDA).
  v1::DeviceKind device = v1::DEVICE_CPU;
  // DEVICE_CUDA: the GPU this trainer's buckets live on, sent with every registration; the
  // daemon must serve it (spexd --devices). -1: the daemon's home GPU.
  int cuda_device = -1;
  // Opens CUDA IPC handles for device buckets; empty = MakeCudaIpcOpener(). Tests plug in fakes.
  std::function<std::unique_ptr<IpcOpener>()> ipc_opener;
};

// Where a registered bucket's pieces are in this process (client internals, public for tests).
struct BucketView {
  BucketHeader* header = nullptr;  // host shm: doorbell counters
  float* input = nullptr;          // this trainer's slot: host, or device memory when `device`
  const float* output = nullptr;
  const IpcMapping* device = nullptr;  // set for device buckets (owned by the IpcHandleCache)
};

// Resolves a RegisterBucket reply, with `host_base`/`host_size` the mapping of resp.buffer()
// (shm), into pointers, checking that everything fits. A reply with a device_buffer is attached
// through `cache` (opened on first use, then reused); `cache` null means this client asked for
// host buckets, and a device reply is then FailedPrecondition (and vice versa when
// `want_device`). A device buffer must carry local_size + 1 IPC events.
// `dtype`: the bucket's header dtype code (proto/contract/layout.h: 0 float32, 1 bfloat16,
// 2 float16), which the header must carry; half buckets have 2-byte slots (host and device).
absl::StatusOr<BucketView> ResolveBucketView(const v1::RegisterBucketResponse& resp,
                                             size_t elements, uint32_t local_rank,
                                             uint32_t local_size, void* host_base, size_t host_size,
                                             bool want_device, IpcHandleCache* cache,
                                             uint32_t dtype = 0);
// Device buckets: before signalling "ready", records IPC event `local_rank` on `stream` (the
// input slot is written once the work queued there before it is done).
absl::Status MarkDeviceInputWritten(IpcHandleCache* cache, const BucketView& view,
                                    uint32_t local_rank, void* stream);
// Device buckets: after "published", makes `stream` wait for the output's IPC event (index
// local_size), which the daemon recorded after writing the result.
absl::Status AwaitDeviceOutput(IpcHandleCache* cache, const BucketView& view, uint32_t local_size,
                               void* stream);

enum class ExchangeMode { kDoorbell, kRpc };

struct CompressorChoice {
  std::string name;    // empty: daemon default
  double density = 0;  // 0: daemon default
  // The compressor's parameters and the bucket's engine options (nonfinite=propagate|error,
  // sparse_allreduce=allgather|oktopk, ...; docs/algorithms.md and docs/clients.md).
  std::map<std::string, std::string> params;
};

class Client;

// Zero-copy input (docs/clients.md#zero-copy-input): memory of this process that spexd reads as
// this trainer's input of a host bucket instead of the input slot, so no step copies the
// gradients into the slot. `fd`: a descriptor of a shared-memory file of this process's user (a
// memfd, or a /dev/shm file, unlinked or not; SharedInputMemory makes one) that holds the
// bucket's elements from byte `offset`; `data`: this process's address of the first of them,
// aligned to the element size. Write the gradients there before Start or Exchange and not again
// until that step's result is in; never shrink the file while the bucket is registered (its
// steps then fail with DATA_LOSS).
struct OwnInput {
  int fd = -1;
  uint64_t offset = 0;
  void* data = nullptr;
};

// A memfd of `bytes`, mapped read-write into this process: memory to build buckets' gradients in
// and hand to RegisterBucket (At). Unmapped and closed when destroyed; spexd keeps its own
// mapping of the file for as long as a bucket registered with it stays registered.
class SharedInputMemory {
 public:
  static absl::StatusOr<std::unique_ptr<SharedInputMemory>> Create(size_t bytes);
  ~SharedInputMemory();
  SharedInputMemory(const SharedInputMemory&) = delete;
  SharedInputMemory& operator=(const SharedInputMemory&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  // The OwnInput of the bucket whose first element is `offset` bytes in.
  OwnInput At(uint64_t offset) const {
    return OwnInput{fd_, offset, static_cast<uint8_t*>(data_) + offset};
  }

 private:
  SharedInputMemory(int fd, void* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  void* data_;
  size_t size_;
};

// A registered bucket: its mapped input (this trainer's slot) and output (the shared result).
class Bucket {
 public:
  uint64_t id() const { return id_; }
  // Device bucket: input()/output() point to GPU memory of GPU cuda_device().
  bool on_device() const { return view_.device != nullptr; }
  int cuda_device() const { return on_device() ? view_.device->device : -1; }
  size_t elements() const { return elements_; }
  // The bucket's type (docs/dtypes.md). input()/output() are a float32 bucket's (empty for a
  // half one); half_input()/half_output() a bfloat16 or float16 bucket's bit patterns (empty
  // for a float32 one; kernels/half.h converts). On a device bucket all four are GPU memory.
  v1::DataType dtype() const { return dtype_; }
  bool half() const { return dtype_ == v1::DTYPE_BFLOAT16 || dtype_ == v1::DTYPE_FLOAT16; }
  absl::Span<float> input() {
    return half() ? absl::Span<float>() : absl::Span<float>(view_.input, elements_);
  }
  absl::Span<const float> output() const {
    return half() ? absl::Span<const float>() : absl::Span<const float>(view_.output, elements_);
  }
  absl::Span<uint16_t> half_input() {
    return half() ? absl::Span<uint16_t>(reinterpret_cast<uint16_t*>(view_.input), elements_)
                  : absl::Span<uint16_t>();
  }
  absl::Span<const uint16_t> half_output() const {
    return half() ? absl::Span<const uint16_t>(reinterpret_cast<const uint16_t*>(view_.output),
                                               elements_)
                  : absl::Span<const uint16_t>();
  }
  uint64_t next_step() const { return next_step_; }
  // Whether spexd reads this trainer's input from the OwnInput given to RegisterBucket (input()
  // and half_input() then point there); false without one, or when an older spexd ignored it
  // (then input() is the slot, as usual).
  bool own_input() const { return own_input_; }
  const std::string& compressor() const { return compressor_; }
  double density() const { return density_; }
  // Stats the daemon returned for the last exchange done through the RPC path.
  const v1::ExchangeStats& last_rpc_stats() const { return last_stats_; }

 private:
  friend class Client;
  uint64_t id_ = 0;
  size_t elements_ = 0;
  v1::DataType dtype_ = v1::DTYPE_FLOAT32;
  std::unique_ptr<ShmMapping> mapping_;
  BucketView view_;
  uint64_t next_step_ = 0;
  bool started_ = false;  // Start was called for next_step_ and Wait not yet
  bool own_input_ = false;
  std::string compressor_;
  double density_ = 0;
  v1::ExchangeStats last_stats_;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();  // says Goodbye

  // `dtype`: DTYPE_FLOAT32 (default), DTYPE_BFLOAT16 or DTYPE_FLOAT16 (host or device buckets;
  // the daemon sums and compresses in float32 and rounds the average once, docs/dtypes.md).
  // `own_input` (host buckets): the trainer's own memory as its input (OwnInput; zero copy); the
  // daemon checks the file (this user's, on tmpfs or hugetlbfs, holding the bucket from the
  // offset) and refuses with an error naming what to fix, registering nothing.
  absl::StatusOr<Bucket*> RegisterBucket(uint64_t id, size_t elements,
                                         const CompressorChoice& c = {},
                                         v1::DataType dtype = v1::DTYPE_FLOAT32,
                                         const OwnInput* own_input = nullptr);
  // One exchange of the bucket's next step. On success the output span holds the average.
  // Device buckets: `stream` (a cudaStream_t; null = the legacy default stream) orders it, see
  // the top of this file; host buckets ignore it.
  absl::Status Exchange(Bucket* bucket, ExchangeMode mode = ExchangeMode::kDoorbell,
                        void* stream = nullptr);
  // The doorbell exchange in two halves, for a trainer that hands over its buckets as they become
  // ready and collects the results later (as PyTorch DDP's hook does; what lets --merger fuse
  // several buckets into one exchange): Start marks this trainer's input of the bucket's next
  // step ready and returns at once; Wait waits for that step's result (Exchange(kDoorbell) is
  // Start then Wait). Start on a bucket already started, or Wait on one not started, is
  // FailedPrecondition. Device buckets: `stream` as for Exchange.
  absl::Status Start(Bucket* bucket, void* stream = nullptr);
  absl::Status Wait(Bucket* bucket, void* stream = nullptr);

  // Checkpointing (docs/checkpoint.md): this node's state of `bucket` (residual, compressor
  // state, density, step) as an opaque record, streamed from the daemon. Call it between steps
  // (after Exchange or Wait, before the next Start), on every node. Store the record with the
  // trainer's checkpoint and hand it to LoadBucketState on the same node of the restarted job,
  // after RegisterBucket and before the bucket's first exchange; refusals (another world, size,
  // compressor, a corrupt record) name what differs and change nothing.
  absl::StatusOr<std::string> SaveBucketState(const Bucket& bucket);
  absl::Status LoadBucketState(const Bucket& bucket, absl::string_view record);

  absl::StatusOr<v1::GetStatsResponse> Stats();
  absl::Status Goodbye();

  uint32_t node_rank() const { return hello_.node_rank(); }
  uint32_t node_count() const { return hello_.node_count(); }
  uint32_t local_rank() const { return options_.local_rank; }
  const std::string& socket() const { return socket_; }
  const v1::HelloResponse& hello() const { return hello_; }

 private:
  Client() = default;
  absl::Status ExchangeRpc(Bucket* b, uint64_t step);
  // After step `step` of `b` ended with `s` (Exchange's RPC path, Wait): consumes the step if it
  // succeeded or was published anyway.
  void FinishStep(Bucket* b, uint64_t step, const absl::Status& s);
  absl::Status WaitPublished(Bucket* b, uint64_t step);

  ClientOptions options_;
  std::string socket_;
  std::unique_ptr<v1::Spex::Stub> stub_;
  v1::HelloResponse hello_;
  std::unique_ptr<ShmMapping> doorbell_mapping_;
  DoorbellSegment* doorbell_ = nullptr;
  std::unique_ptr<IpcHandleCache> ipc_cache_;  // device buckets only; outlives buckets_
  std::map<uint64_t, std::unique_ptr<Bucket>> buckets_;
  bool said_goodbye_ = false;
};

}  // namespace spex
