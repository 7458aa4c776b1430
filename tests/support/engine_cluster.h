// The one multi-node fixture for engine tests (gloo's spawn() shape): N engines over one
// in-process hub (threads as nodes), each serving L local trainers, with pluggable primitives,
// device path and collective wrapper per node; a Trainer that drives a bucket as a client does
// (the doorbell in the shared header, or the Exchange call); and FailingCompressor, a library
// compressor that fails on one node at a chosen step. Typical use:
//   EngineClusterOptions o;
//   o.nodes = 2;
//   o.trainers = 2;
//   EngineCluster cluster(o);
//   cluster.ForEachTrainer([&](int node, int local) {
//     auto t = Trainer::Open(&cluster.engine(node), local, cluster.trainers());
//     ... t->Register(bucket, n, "topk", 0.01); fill t->input(bucket); t->Exchange(bucket, s) ...
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/engine/engine.h"
#include "daemon/transport/collective.h"
#include "daemon/transport/inproc_collective.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "proto/contract/layout.h"

namespace spex::test {

// What one node's engine works with. The pointers are not owned (the test keeps, e.g., the
// FakeDevice they belong to alive longer than the cluster).
struct NodeParts {
  Primitives* prims = nullptr;  // the buckets' data (device primitives with a device path)
  DevicePath device;            // empty: the CPU path
};

struct EngineClusterOptions {
  int nodes = 2;
  int trainers = 1;  // local trainers per node (sets engine.local_trainers)
  // Every node's options; shm_tag "spex" (the default) becomes "spextest".
  EngineOptions engine;
  absl::Duration hub_timeout = absl::Seconds(20);
  // Default primitives, one instance per node: the reference primitives, or the CPU ones (one
  // thread) with cpu_primitives. Ignored where `parts` is set.
  bool cpu_primitives = false;
  std::function<NodeParts(int node)> parts;
  // Wraps node r's collective (a tampering, checking or failing one); default: as it is.
  std::function<std::unique_ptr<Collective>(int node, std::unique_ptr<Collective>)> wrap;
  // Gives every engine a wire collective over a second hub (Engine::set_wire_collective), as
  // spexd does: with a merger and engine.merge_overlap, groups' collectives run on the wire
  // stage.
  bool wire_collective = true;
  // Edits node r's copy of `engine` (e.g. a per-node observer or a differing flag).
  std::function<void(int node, EngineOptions* options)> node_options;
  // Starts every engine in the constructor (status() says how that went); false: call Start().
  bool start = true;
};

class EngineCluster {
 public:
  explicit EngineCluster(EngineClusterOptions options);
  // Stops every engine (RequestStop, then joins and destroys them).
  ~EngineCluster();
  EngineCluster(const EngineCluster&) = delete;
  EngineCluster& operator=(const EngineCluster&) = delete;

  // Starts the engines that are not started yet; the first error, naming the node.
  absl::Status Start();
  // The constructor's Start() (OK when options.start was false).
  const absl::Status& status() const { return status_; }
  // Stops and destroys every engine now (the destructor does it otherwise).
  void Stop();

  int nodes() const { return options_.nodes; }
  int trainers() const { return options_.trainers; }
  Engine& engine(int node) { return *nodes_[node].engine; }
  Collective* collective(int node) { return nodes_[node].collective.get(); }
  Primitives* prims(int node) { return nodes_[node].parts.prims; }

  // Runs fn(node) on one thread per node, fn(node, local_rank) on one thread per trainer of
  // every node; each returns when every thread ended. Failures are traced with the node.
  void ForEachNode(const std::function<void(int node)>& fn);
  void ForEachTrainer(const std::function<void(int node, int local_rank)>& fn);

 private:
  struct Node {
    std::unique_ptr<Primitives> owned_prims;
    NodeParts parts;
    std::unique_ptr<Collective> collective;
    std::unique_ptr<Collective> wire;  // over wire_hub_
    std::unique_ptr<Engine> engine;
    bool started = false;
  };
  EngineClusterOptions options_;
  InProcessHub hub_;
  InProcessHub wire_hub_;
  std::vector<Node> nodes_;
  absl::Status status_;
};

// One local trainer of one engine: a session and its buckets, driven as the client drives them.
class Trainer {
 public:
  // Says Hello as local trainer `local_rank` of `local_size`.
  // `pid` and `uid`: the caller as the kernel would name it (0: unknown, as by default).
  static absl::StatusOr<Trainer> Open(Engine* engine, uint32_t local_rank, uint32_t local_size,
                                      const std::string& job = "",
                                      const std::string& client = "test", uint32_t pid = 0,
                                      uint32_t uid = 0);

  // Registers a bucket ("" and 0: the engine's default compressor and density) on GPU
  // `device` (-1: the home GPU; a device path with several GPUs, docs/design.md#multi-gpu).
  absl::StatusOr<BucketGrant> Register(uint64_t bucket, uint64_t elements,
                                       const std::string& compressor = "", double density = 0,
                                       const std::map<std::string, std::string>& params = {},
                                       int device = -1,
                                       const TrainerInputSpec* own_input = nullptr);
  absl::Status Unregister(uint64_t bucket);
  absl::Status Goodbye() { return engine_->Goodbye(session_id_); }

  // A registered bucket's pieces: this trainer's input slot (its slot even with own_input) and the
  // output (host shm on the CPU path, the device buffer on the device path), the shared header, the
  // grant.
  float* input(uint64_t bucket);
  const float* output(uint64_t bucket);
  BucketHeader* header(uint64_t bucket);
  const BucketGrant& grant(uint64_t bucket);
  void Fill(uint64_t bucket, const std::function<float(size_t i)>& value);

  // The RPC path: Engine::Exchange with a deadline `timeout` from now.
  absl::StatusOr<ExchangeRecord> Exchange(uint64_t bucket, uint64_t step,
                                          absl::Duration timeout = absl::Seconds(20));
  // The doorbell path: ready[rank] = step + 1, ring (and wake the engine if it sleeps); then
  // wait for published == step + 1 (DeadlineExceeded after `timeout`). WaitPublished returns
  // the step's published status: OK, or Internal naming the header's error code.
  void MarkReady(uint64_t bucket, uint64_t step);
  absl::Status WaitPublished(uint64_t bucket, uint64_t step,
                             absl::Duration timeout = absl::Seconds(30));
  absl::Status Ring(uint64_t bucket, uint64_t step) {
    MarkReady(bucket, step);
    return WaitPublished(bucket, step);
  }

  Engine& engine() { return *engine_; }
  uint64_t session_id() const { return session_id_; }
  uint32_t local_rank() const { return local_rank_; }
  DoorbellSegment* doorbell() const { return doorbell_; }

 private:
  Trainer(Engine* engine, uint32_t local_rank, const HelloResult& hello);
  struct Registered {
    BucketGrant grant;
    BucketHeader* header = nullptr;
    float* input = nullptr;
    const float* output = nullptr;
  };
  Registered& Find(uint64_t bucket);

  Engine* engine_;
  uint32_t local_rank_;
  uint64_t session_id_;
  DoorbellSegment* doorbell_;
  std::map<uint64_t, Registered> buckets_;
};

// A compressor factory from a function of (spec, the bucket's primitives); a null result means
// the bucket goes dense.
CompressorFactory FactoryOf(
    std::function<std::unique_ptr<Compressor>(const CompressorSpec&, Primitives*)> make);

// A library compressor (MakeCompressor) that fails one call: Select or Update of `step` on
// node `node` returns `status` instead of running. Everything else goes to the library's.
class FailingCompressor : public Compressor {
 public:
  enum class Phase { kSelect, kUpdate };
  struct Plan {
    int node = 0;
    uint64_t step = 0;
    Phase phase = Phase::kSelect;
    absl::Status status = absl::InternalError("injected compressor failure");
  };
  FailingCompressor(const CompressorSpec& spec, Primitives* prims,
                    std::unique_ptr<Compressor> inner, Plan plan);
  // A factory building every bucket's compressor this way.
  static CompressorFactory Factory(Plan plan);

  Pattern pattern() const override { return inner_->pattern(); }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero_selected,
                        Selection* out) override;
  absl::Status DoUpdate(const StepContext& ctx, const Gathered& gathered) override;

 private:
  bool Fails(const StepContext& ctx, Phase phase) const {
    return ctx.node_rank == plan_.node && ctx.step == plan_.step && phase == plan_.phase;
  }
  std::unique_ptr<Compressor> inner_;
  Plan plan_;
};

// `nodes` x `trainers` engines under shm tag `tag`, every sparse bucket exchanged sparse from its
// first step (dense fallback off, no minimum sparse size), 30 s for the hub.
inline EngineClusterOptions AlwaysSparseCluster(int nodes, int trainers, const std::string& tag) {
  EngineClusterOptions o;
  o.nodes = nodes;
  o.trainers = trainers;
  o.hub_timeout = absl::Seconds(30);
  o.engine.shm_tag = tag;
  o.engine.dense_fallback = DenseFallback::kOff;
  o.engine.min_sparse_elements = 0;
  return o;
}

}  // namespace spex::test
