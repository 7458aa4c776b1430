// The exchange engine of one node: trainer sessions, registered buckets and their shared
// buffers, and the single thread that runs every bucket's exchange in the canonical order
// (ascending (step, bucket id) over the buckets all local trainers registered), so every node
// issues the same collectives in the same order whatever order the trainers' signals arrive in.
// It knows nothing of gRPC (daemon/service adapts it) or MPI (it gets a Collective).
//
// Devices: the engine works on bucket data only through the Primitives it is given and moves
// it only through the Collective it is given, so one code path serves both devices. The CPU
// path (no DevicePath) keeps each bucket in one host shm segment (header, input slots, output).
// The device path (a DevicePath, e.g. CUDA: CudaPrimitives, NcclCollective, CudaDeviceMemory)
// keeps the BucketHeader in host shm and the data in a buffer from the DevicePath's allocator;
// per step it waits for every trainer's input event before reading the inputs and records the
// output event before publishing. A sparse step on the device runs its compressor on the
// device's primitives when it can (DeviceCompressorNames: no staging, only the selection and the
// exchanged indices and values cross); the others stage through host copies of the accumulator
// and the output (SparseStep).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/engine/codec.h"
#include "daemon/memory/device_memory.h"
#include "daemon/memory/layout.h"
#include "daemon/memory/shm_buffer.h"
#include "daemon/merge/merger.h"
#include "daemon/transport/collective.h"
#include "kernels/primitives.h"

namespace spex {

struct EngineOptions {
  int local_trainers = 1;
  std::string job = "";                              // when set, Hello must name the same job
  std::string compressor = "dense";                  // default per bucket
  double density = 0.01;                             // default per bucket
  absl::Duration register_wait = absl::Seconds(30);  // Exchange waits this long for the
                                                     // other local trainers to register
  int engine_spin_us = 0;                            // engine spins this long before sleeping
  int client_spin_us = 0;                            // advertised to trainers in Hello
  std::string shm_tag = "spex";                      // goes into shm names
  bool error_feedback = true;            // keep what a sparse step did not send for later steps
  uint64_t min_sparse_elements = 16384;  // smaller buckets always go dense
  std::string dense_fallback = "auto";   // auto: probe sparse vs dense, keep the faster; off
  int probe_steps = 3;                   // auto: sparse and dense steps each measured
  bool fp16_values = false;              // pattern B values as float16 on the wire
  int residual_norm_every = 10;          // steps between residual-norm computations (0: never)
  std::string merger = "none";           // which ready buckets share one exchange (daemon/merge)
  // Builds a bucket's codec; empty = MakeCodec (the compressor library). Tests plug in theirs.
  std::function<absl::StatusOr<std::unique_ptr<Codec>>(const CodecSpec&, Primitives*)>
      codec_factory;
  // Out-of-band stop notices between nodes (MPI: PeerNotice). Both optional.
  std::function<void()> announce_stop;
  std::function<bool(int*)> peer_stopped;
};

enum class Phase { kWaitLocal, kReduceLocal, kCompress, kCollective, kDecode, kPublish, kCount };
const char* PhaseName(Phase p);

struct ExchangeRecord {
  uint64_t bucket_id = 0;
  uint64_t step = 0;
  std::string compressor;
  double target_density = 1.0;
  double achieved_density = 1.0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  double residual_norm = 0;
  double phase_seconds[static_cast<int>(Phase::kCount)] = {};
  double total_seconds = 0;
  uint64_t gathered_elements = 0;
  uint64_t selected_elements = 0;
  std::string pattern = "D";
  bool fell_back_to_dense = false;
  uint64_t residual_norm_step = 0;
};

struct BucketSummary {
  uint64_t bucket_id = 0;
  uint64_t elements = 0;
  std::string compressor;
  uint64_t exchanges = 0;
  ExchangeRecord last;
  double mean_phase_seconds[static_cast<int>(Phase::kCount)] = {};
};

struct SessionSummary {
  uint64_t session_id = 0;
  uint32_t local_rank = 0;
  uint32_t pid = 0;
  std::string client;
  uint32_t buckets = 0;
  double age_seconds = 0;
};

struct HelloResult {
  uint64_t session_id = 0;
  const ShmBuffer* doorbell = nullptr;
};

struct BucketGrant {
  const ShmBuffer* buffer = nullptr;  // host shm: the BucketHeader at offset 0 and, on the CPU
  uint64_t input_offset = 0;          // path, the data: this trainer's input slot and the output
  uint64_t output_offset = 0;         // (both 0 on the device path)
  // Device path: the buffer holding the data, and the slot and output offsets inside it.
  const SharedBuffer* device_buffer = nullptr;
  uint64_t device_input_offset = 0;
  uint64_t device_output_offset = 0;
  uint64_t elements = 0;
  std::string compressor;
  double density = 0;
  uint64_t next_step = 0;
};

class Engine {
 public:
  // `prims` works on the buckets' data: host memory on the CPU path, device memory with a
  // `device` path (whose host_prims then serve the sparse exchange's wire messages and a test's
  // codec_factory, whose codecs run on staged host copies). Start() checks the pieces fit.
  Engine(EngineOptions options, Collective* collective, Primitives* prims, DevicePath device = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  absl::Status Start();
  // Asks the engine thread to stop (also tells peers). Safe from any thread.
  void RequestStop();
  // Blocks until the engine thread stopped (after RequestStop or a peer's notice).
  void WaitStopped();
  // Waits at most `timeout` for the engine thread; false if it is still running (e.g. stuck in
  // a collective with a peer that left).
  bool JoinFor(absl::Duration timeout);
  bool stopping() const { return stop_.load(); }

  const EngineOptions& options() const { return options_; }
  // True when buckets' data lives on a device (the RegisterBucket grant has a device_buffer).
  bool device_buckets() const { return device_.allocator != nullptr; }
  int node_rank() const { return collective_->rank(); }
  int node_count() const { return collective_->size(); }
  const char* collective_name() const { return collective_->name(); }

  absl::StatusOr<HelloResult> Hello(const std::string& job, uint32_t local_rank,
                                    uint32_t local_size, uint32_t pid, const std::string& client);
  absl::Status Goodbye(uint64_t session_id);
  absl::StatusOr<BucketGrant> RegisterBucket(uint64_t session_id, uint64_t bucket_id,
                                             uint64_t elements, const std::string& compressor,
                                             double density,
                                             const std::map<std::string, std::string>& params = {});
  absl::Status UnregisterBucket(uint64_t session_id, uint64_t bucket_id);
  // Changes the target density of every sparse bucket; all nodes apply the newest change any
  // of them has seen at the same step. Returns this node's change counter.
  absl::StatusOr<uint64_t> SetDensity(double density);
  // The RPC path: marks this trainer's input for (bucket, step) written and waits until the
  // result is published or `deadline` passes.
  absl::StatusOr<ExchangeRecord> Exchange(uint64_t session_id, uint64_t bucket_id, uint64_t step,
                                          absl::Time deadline);

  std::vector<BucketSummary> Buckets() const;
  std::vector<SessionSummary> Sessions() const;
  uint64_t total_exchanges() const;
  // Names of /dev/shm segments currently linked (for tests and diagnostics).
  std::vector<std::string> LinkedSegments() const;

 private:
  struct Bucket;
  struct Session;

  void Run();
  // A new bucket's memory (header, data, accumulators) and codec; called under mu_.
  absl::StatusOr<std::unique_ptr<Bucket>> NewBucket(
      uint64_t bucket_id, uint64_t elements, const std::string& compressor, double density,
      const std::map<std::string, std::string>& params);
  // Picks the next item in canonical order; null when no bucket is schedulable.
  Bucket* PickNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::unique_ptr<Merger> merger_;
  std::vector<MergeCandidate> candidates_ ABSL_GUARDED_BY(mu_);
  bool LocallyReady(const Bucket& b) const;
  void Process(Bucket* b);
  void Publish(Bucket* b, uint64_t step, const absl::Status& status, const ExchangeRecord& rec);
  // What the per-exchange control all-reduce carries (maxed over nodes).
  struct Control {
    uint64_t density_key = 0;  // (version << 32) | float bits of the density
    uint64_t sparse_us = 0;    // dense-fallback probe: this bucket's sparse and dense timings
    uint64_t dense_us = 0;
    uint64_t failed = 0;  // 1: this node cannot run the step (its inputs' events failed)
  };
  absl::Status Agree(const Bucket& b, uint64_t step, Control* c);
  void ApplyDensityLocked(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UseSparse(Bucket* b, uint64_t step, const Control& control);
  absl::Status LocalReduce(Bucket* b, bool add_to_acc);
  // Device path: the ordering hooks around a step (no-ops on the CPU path).
  absl::Status WaitInputs(Bucket* b);
  absl::Status RecordOutput(Bucket* b);
  absl::Status DenseStep(Bucket* b, ExchangeRecord* rec, const std::function<void(Phase)>& lap);
  absl::Status SparseStep(Bucket* b, uint64_t step, ExchangeRecord* rec,
                          const std::function<void(Phase)>& lap);

  void UnlinkAttachedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Ring();
  DoorbellSegment* doorbell() const { return doorbell_.load(); }
  absl::Status NewDoorbellLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeEverybody();

  const EngineOptions options_;
  Collective* const collective_;
  Primitives* const prims_;  // the buckets' data (device memory on the device path)
  const DevicePath device_;
  Primitives* const host_prims_;  // sparse exchange, staged test codecs: prims_ on the CPU path

  mutable absl::Mutex mu_;
  absl::CondVar published_cv_;  // signalled after every publish and on stop
  std::map<uint64_t, std::unique_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::unique_ptr<Bucket>> buckets_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<ShmBuffer>> doorbells_ ABSL_GUARDED_BY(mu_);  // newest last
  bool reset_pending_ ABSL_GUARDED_BY(mu_) =
      false;  // every session left; drop buckets on next register
  bool processing_ ABSL_GUARDED_BY(mu_) = false;  // the engine thread is inside Process()
  uint64_t total_exchanges_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t density_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t density_key_ ABSL_GUARDED_BY(mu_) = 0;          // this node's newest change
  uint64_t applied_density_key_ ABSL_GUARDED_BY(mu_) = 0;  // the change in effect

  std::atomic<DoorbellSegment*> doorbell_{nullptr};
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};
  absl::Mutex stopped_mu_;
  bool stopped_ ABSL_GUARDED_BY(stopped_mu_) = false;
  std::thread thread_;
};

}  // namespace spex
