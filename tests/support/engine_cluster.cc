#include "tests/support/engine_cluster.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/memory/shared_buffer.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_primitives.h"
#include "proto/contract/futex.h"

namespace spex::test {

EngineCluster::EngineCluster(EngineClusterOptions options)
    : options_(std::move(options)),
      hub_(options_.nodes, options_.hub_timeout),
      wire_hub_(options_.nodes, options_.hub_timeout) {
  options_.engine.local_trainers = options_.trainers;
  if (options_.engine.shm_tag == EngineOptions().shm_tag) options_.engine.shm_tag = "spextest";
  nodes_.resize(options_.nodes);
  for (int n = 0; n < options_.nodes; ++n) {
    Node& node = nodes_[n];
    if (options_.parts) {
      node.parts = options_.parts(n);
    } else {
      node.owned_prims = options_.cpu_primitives ? MakeCpuPrimitives(1) : MakeReferencePrimitives();
      node.parts.prims = node.owned_prims.get();
    }
    node.collective = hub_.Connect(n);
    if (options_.wrap) node.collective = options_.wrap(n, std::move(node.collective));
    EngineOptions engine = options_.engine;
    if (options_.node_options) options_.node_options(n, &engine);
    node.engine = std::make_unique<Engine>(std::move(engine), node.collective.get(),
                                           node.parts.prims, node.parts.device);
    if (options_.wire_collective) {
      node.wire = wire_hub_.Connect(n);
      node.engine->set_wire_collective(node.wire.get());
    }
  }
  if (options_.start) status_ = Start();
}

EngineCluster::~EngineCluster() { Stop(); }

absl::Status EngineCluster::Start() {
  for (int n = 0; n < options_.nodes; ++n) {
    Node& node = nodes_[n];
    if (node.started || node.engine == nullptr) continue;
    absl::Status s = node.engine->Start();
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("node ", n, ": ", s.message()));
    node.started = true;
  }
  return absl::OkStatus();
}

void EngineCluster::Stop() {
  for (Node& node : nodes_) {
    if (node.engine != nullptr) node.engine->RequestStop();
  }
  for (Node& node : nodes_) node.engine.reset();
}

void EngineCluster::ForEachNode(const std::function<void(int node)>& fn) {
  std::vector<std::thread> threads;
  for (int n = 0; n < options_.nodes; ++n) {
    threads.emplace_back([&fn, n] {
      SCOPED_TRACE(absl::StrCat("node ", n));
      fn(n);
    });
  }
  for (std::thread& t : threads) t.join();
}

void EngineCluster::ForEachTrainer(const std::function<void(int node, int local_rank)>& fn) {
  std::vector<std::thread> threads;
  for (int n = 0; n < options_.nodes; ++n) {
    for (int t = 0; t < options_.trainers; ++t) {
      threads.emplace_back([&fn, n, t] {
        SCOPED_TRACE(absl::StrCat("node ", n, " trainer ", t));
        fn(n, t);
      });
    }
  }
  for (std::thread& t : threads) t.join();
}

Trainer::Trainer(Engine* engine, uint32_t local_rank, const HelloResult& hello)
    : engine_(engine),
      local_rank_(local_rank),
      session_id_(hello.session_id),
      doorbell_(static_cast<DoorbellSegment*>(const_cast<ShmBuffer*>(hello.doorbell)->data())) {}

absl::StatusOr<Trainer> Trainer::Open(Engine* engine, uint32_t local_rank, uint32_t local_size,
                                      const std::string& job, const std::string& client,
                                      uint32_t pid, uint32_t uid) {
  absl::StatusOr<HelloResult> hello = engine->Hello(job, local_rank, local_size, pid, client, uid);
  if (!hello.ok()) return hello.status();
  return Trainer(engine, local_rank, *hello);
}

absl::StatusOr<BucketGrant> Trainer::Register(uint64_t bucket, uint64_t elements,
                                              const std::string& compressor, double density,
                                              const std::map<std::string, std::string>& params,
                                              int device, const TrainerInputSpec* own_input) {
  absl::StatusOr<BucketGrant> g = engine_->RegisterBucket(session_id_, bucket, elements, compressor,
                                                          density, params, device, own_input);
  if (!g.ok()) return g;
  Registered r;
  r.grant = *g;
  auto* shm = static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data());
  r.header = reinterpret_cast<BucketHeader*>(shm);
  if (g->device_buffer == nullptr) {
    r.input = reinterpret_cast<float*>(shm + g->input_offset);
    r.output = reinterpret_cast<const float*>(shm + g->output_offset);
  } else {
    auto* base = static_cast<uint8_t*>(const_cast<SharedBuffer*>(g->device_buffer)->data());
    r.input = reinterpret_cast<float*>(base + g->device_input_offset);
    r.output = reinterpret_cast<const float*>(base + g->device_output_offset);
  }
  buckets_[bucket] = r;
  return g;
}

absl::Status Trainer::Unregister(uint64_t bucket) {
  absl::Status s = engine_->UnregisterBucket(session_id_, bucket);
  if (s.ok()) buckets_.erase(bucket);
  return s;
}

Trainer::Registered& Trainer::Find(uint64_t bucket) {
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) {
    ADD_FAILURE() << "bucket " << bucket << " is not registered by this trainer";
    static Registered none;
    return none;
  }
  return it->second;
}

float* Trainer::input(uint64_t bucket) { return Find(bucket).input; }
const float* Trainer::output(uint64_t bucket) { return Find(bucket).output; }
BucketHeader* Trainer::header(uint64_t bucket) { return Find(bucket).header; }
const BucketGrant& Trainer::grant(uint64_t bucket) { return Find(bucket).grant; }

void Trainer::Fill(uint64_t bucket, const std::function<float(size_t i)>& value) {
  Registered& r = Find(bucket);
  for (size_t i = 0; i < r.grant.elements; ++i) r.input[i] = value(i);
}

absl::StatusOr<ExchangeRecord> Trainer::Exchange(uint64_t bucket, uint64_t step,
                                                 absl::Duration timeout) {
  return engine_->Exchange(session_id_, bucket, step, absl::Now() + timeout);
}

void Trainer::MarkReady(uint64_t bucket, uint64_t step) {
  BucketHeader* h = Find(bucket).header;
  // As the clients do: when it became ready (the mergers' timings, rgmerge's linger).
  h->ready[local_rank_].ready_ns.store(MonotonicNanos(), std::memory_order_relaxed);
  h->ready[local_rank_].value.store(step + 1);
  doorbell_->ring.fetch_add(1);
  if (doorbell_->engine_sleeping.load()) FutexWake(&doorbell_->ring);
}

absl::Status Trainer::WaitPublished(uint64_t bucket, uint64_t step, absl::Duration timeout) {
  BucketHeader* h = Find(bucket).header;
  const absl::Time deadline = absl::Now() + timeout;
  const uint32_t want = static_cast<uint32_t>(step + 1);
  h->waiters.fetch_add(1);
  uint32_t cur;
  while ((cur = h->published.load()) != want && absl::Now() < deadline) {
    FutexWait(&h->published, cur, 100 * 1000 * 1000);
  }
  h->waiters.fetch_sub(1);
  if (cur != want) {
    return absl::DeadlineExceededError(absl::StrCat("bucket ", bucket, " step ", step,
                                                    " was not published within ",
                                                    absl::FormatDuration(timeout)));
  }
  const int32_t status = h->status.load();
  if (status != 0) {
    return absl::InternalError(
        absl::StrCat("bucket ", bucket, " step ", step, " published error status ", status));
  }
  return absl::OkStatus();
}

CompressorFactory FactoryOf(
    std::function<std::unique_ptr<Compressor>(const CompressorSpec&, Primitives*)> make) {
  return [make = std::move(make)](const CompressorSpec& spec, Primitives* prims)
             -> absl::StatusOr<std::unique_ptr<Compressor>> { return make(spec, prims); };
}

FailingCompressor::FailingCompressor(const CompressorSpec& spec, Primitives* prims,
                                     std::unique_ptr<Compressor> inner, Plan plan)
    : Compressor(spec, prims), inner_(std::move(inner)), plan_(std::move(plan)) {}

CompressorFactory FailingCompressor::Factory(Plan plan) {
  return [plan](const CompressorSpec& spec,
                Primitives* prims) -> absl::StatusOr<std::unique_ptr<Compressor>> {
    absl::StatusOr<std::unique_ptr<Compressor>> inner = MakeCompressor(spec, prims);
    if (!inner.ok()) return inner.status();
    return std::unique_ptr<Compressor>(new FailingCompressor(spec, prims, std::move(*inner), plan));
  };
}

absl::Status FailingCompressor::DoSelect(const StepContext& ctx, float* acc, const float* add,
                                         bool zero_selected, Selection* out) {
  if (Fails(ctx, Phase::kSelect)) return plan_.status;
  // A run-time density change reaches this wrapper (Compressor::SetDensity is not virtual).
  if (inner_->density() != ctx.density) {
    if (absl::Status s = inner_->SetDensity(ctx.density); !s.ok()) return s;
  }
  return inner_->Select(ctx.step, acc, add, zero_selected, out);
}

absl::Status FailingCompressor::DoUpdate(const StepContext& ctx, const Gathered& gathered) {
  if (Fails(ctx, Phase::kUpdate)) return plan_.status;
  return inner_->Update(ctx.step, gathered);
}

}  // namespace spex::test
