// The engine's life (start, stop) and its thread's loop: picking work, idling, publishing. One
// exchange's stages are in engine_bucket_exchange.cc (per bucket) and engine_group_exchange.cc
// (merge groups), the wire stage in engine_wire_stage.cc, the RPC threads' requests in
// engine_requests.cc.
#include "daemon/engine/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine_passes.h"
#include "daemon/util/heap.h"
#include "daemon/util/log.h"
#include "proto/contract/futex.h"

namespace spex {

const char* PhaseName(Phase p) {
  static const char* const kNames[] = {"wait_local", "reduce_local", "compress",
                                       "collective", "decode",       "publish"};
  return kNames[static_cast<int>(p)];
}

namespace {
constexpr int64_t kIdleWaitNs = 50 * 1000 * 1000;  // engine re-checks peers/stop this often
}  // namespace

Engine::Engine(EngineOptions options, Collective* collective, Primitives* prims, DevicePath device)
    : options_(std::move(options)),
      collective_(collective),
      prims_(prims),
      device_(device),
      io_(device, prims, options_.local_trainers),
      sessions_(options_.local_trainers, options_.job),
      buckets_(&options_, collective, prims, device),
      doorbell_(options_.shm_tag),
      wire_([this](WireJob* job) { return RunPack(static_cast<WirePack*>(job)); },
            [this](const absl::Status&) { WireDone(); }) {
  env_.coll = collective;
  collective_->SetComputeProbe(&pending_inputs_);
  env_.prims = prims;
  env_.host_prims = device.host_prims != nullptr ? device.host_prims : prims;
  env_.local_trainers = options_.local_trainers;
  env_.error_feedback = options_.error_feedback;
  env_.fp16_values = options_.fp16_values;
  env_.index_encoding = options_.index_encoding;
  env_.residual_norm_every = options_.residual_norm_every;
  // Ok-Topk as the control round compares a bucket's exchange across nodes: with its global
  // selection and schedule.
  oktopk_key_ = absl::StrCat("oktopk --oktopk_global=", AbslUnparseFlag(options_.oktopk_global),
                             " --oktopk_recompute_every=", options_.oktopk_recompute_every,
                             " --oktopk_rebalance_every=", options_.oktopk_rebalance_every);
  auto_key_ = absl::StrCat("auto ", oktopk_key_);
}

Engine::~Engine() {
  RequestStop();
  if (thread_.joinable()) thread_.join();
  collective_->SetComputeProbe(nullptr);
}

absl::Status Engine::Start() {
  if (absl::Status s = ValidateEngineOptions(options_); !s.ok()) return s;
  const uint64_t machine = DefaultMemoryLimit();
  limits_.daemon = options_.max_daemon_bytes ? options_.max_daemon_bytes : machine;
  limits_.bucket = options_.max_bucket_bytes ? options_.max_bucket_bytes : limits_.daemon;
  limits_.session = options_.max_session_bytes ? options_.max_session_bytes : limits_.daemon;
  auto merger = MakeMerger(options_.merger, options_.merge);
  if (!merger.ok()) return merger.status();
  if (device_buckets() && options_.merger != MergerPolicy::kNone) {
    return absl::UnimplementedError(
        "--merger: fused exchanges run on host-memory buckets only; use --merger=none with a "
        "--device");
  }
  if (device_buckets()) {
    if (device_.ordering == nullptr || device_.host_prims == nullptr) {
      return absl::InvalidArgumentError(
          "engine device path: an allocator needs its slot ordering and host primitives too");
    }
    if (device_.host_prims->device() != Device::kCpu) {
      return absl::InvalidArgumentError(
          "engine device path: host_prims must be CPU primitives (the sparse exchange's wire "
          "messages are host memory)");
    }
    if (device_.allocator->device() != prims_->device()) {
      return absl::InvalidArgumentError(
          "engine device path: the allocator's device differs from the primitives' device; build "
          "both for the same device (spexd: --device)");
    }
    for (const NodeDevice& d : device_.others) {
      if (d.allocator == nullptr || d.ordering == nullptr || device_.link == nullptr ||
          d.ordinal == device_.home || d.allocator->device() != prims_->device()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "engine device path: GPU ", d.ordinal,
            " needs an allocator and slot ordering of the "
            "primitives' device, a link between the GPUs, and an ordinal other than the home "
            "GPU's (",
            device_.home, ")"));
      }
    }
  } else if (prims_->device() != Device::kCpu) {
    return absl::InvalidArgumentError(
        "engine: device primitives need a device path (allocator, ordering, host primitives); "
        "without one buckets are host memory");
  }
  {
    absl::MutexLock lock(&mu_);
    merger_ = merger->get();
    scheduler_ = std::make_unique<Scheduler>(options_.local_trainers, std::move(*merger));
    if (absl::Status s = doorbell_.NewGeneration(); !s.ok()) return s;
  }
  if (overlapping()) {
    if (wire_coll_->size() != collective_->size() || wire_coll_->rank() != collective_->rank()) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine: the wire collective is rank ", wire_coll_->rank(), " of ",
                       wire_coll_->size(), ", the engine's collective rank ", collective_->rank(),
                       " of ", collective_->size(), "; both must span the same nodes"));
    }
    wire_env_ = env_;
    wire_env_.coll = wire_coll_;
    wire_.Start();
  }
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Engine::RequestStop() {
  if (stop_.exchange(true)) return;
  WakeEverybody();
}

void Engine::WakeEverybody() {
  absl::MutexLock lock(&mu_);
  doorbell_.ShutdownAll();
  for (const auto& [id, b] : buckets_.all()) FutexWake(&b->mem.header->published);
  published_cv_.SignalAll();
}

void Engine::WaitStopped() {
  absl::MutexLock lock(&stopped_mu_);
  stopped_mu_.Await(absl::Condition(&stopped_));
}

bool Engine::JoinFor(absl::Duration timeout) {
  {
    absl::MutexLock lock(&stopped_mu_);
    if (!stopped_mu_.AwaitWithTimeout(absl::Condition(&stopped_), timeout)) return false;
  }
  if (thread_.joinable()) thread_.join();
  return true;
}

void Engine::Run() {
  SPEX_LOG(DEBUG) << "engine thread started";
  bool announced = false;
  Work w;  // this iteration's picks (capacity reused)
  while (true) {
    if (options_.heartbeat) options_.heartbeat();
    if (stop_.load()) {
      if (!announced && options_.announce_stop) options_.announce_stop();
      break;
    }
    DoorbellSegment* bell = doorbell_.segment();
    const uint32_t seen = bell->ring.load();
    {
      absl::MutexLock lock(&mu_);
      TakeWorkLocked(bell, w);
    }
    if (DoWork(w)) continue;
    Idle(bell, seen, w.pick.linger_until_ns);
    int who = -1;
    if (options_.peer_stopped && options_.peer_stopped(&who)) {
      SPEX_LOG(INFO) << "node " << who << " is stopping; stopping this node too";
      announced = true;  // every node hears from the first one that stopped
      stop_.store(true);
      WakeEverybody();
    }
  }
  wire_.Stop();  // the wire stage publishes what was handed to it, then ends
  {
    absl::MutexLock lock(&stopped_mu_);
    stopped_ = true;
  }
  SPEX_LOG(DEBUG) << "engine thread stopped";
}

void Engine::TakeWorkLocked(DoorbellSegment* bell, Work& w) {
  w.group.clear();
  w.failed.clear();
  w.pick = Scheduler::Pick();
  w.run = w.waiting = false;
  buckets_.UnlinkAttached();
  doorbell_.UnlinkIfAllAttached(options_.local_trainers);
  doorbell_.DropOld(bell);
  ReapDeadTrainersLocked();
  w.fell_idle = w.had_sessions && sessions_.empty();
  // A new job (its buckets replaced the last one's): the behind groups, and their compressors'
  // state, belong to the old one.
  w.drop_behind = w.fell_idle || job_generation_ != behind_generation_;
  behind_generation_ = job_generation_;
  w.had_sessions = !sessions_.empty();
  // After every session left, only the steps dead trainers left half-done still run.
  if (!reset_pending_ || dead_mask_ != 0) {
    const auto& f = scheduler_->FailedAndReady(buckets_);
    w.failed.assign(f.begin(), f.end());
    const int64_t now = static_cast<int64_t>(MonotonicNanos());
    const auto& g = scheduler_->NextGroup(buckets_, now, LastExchangeEndLocked(now));
    w.group.assign(g.begin(), g.end());
    w.pick = scheduler_->pick();
    if (!w.pick.alone) {
      const auto& c = scheduler_->group_candidates();
      w.candidates.assign(c.begin(), c.end());
    }
    const auto ready = [&](const EngineBucket* b) { return scheduler_->LocallyReady(*b); };
    w.run = !w.group.empty() && std::all_of(w.group.begin(), w.group.end(), ready);
    w.waiting = !w.run && w.group.size() > 1 && std::any_of(w.group.begin(), w.group.end(), ready);
  }
  if (w.run) {
    scheduler_->PendingOfStep(buckets_, w.group.front()->ex.compute_step(), &pending_inputs_);
    for (EngineBucket* b : w.group) b->MoveTo(BucketState::kExchanging);
  }
  processing_ = w.run || !w.failed.empty();
}

bool Engine::DoWork(Work& w) {
  if (w.drop_behind && !behind_groups_.empty()) {  // the job that made them has ended
    DrainWire();
    behind_groups_.clear();
  }
  if (w.fell_idle) {
    // The job's last trainer has gone (Goodbye or death): hand the heap's free pages back.
    const int64_t released = ReleaseFreeHeap();
    SPEX_LOG(DEBUG) << "node idle: released " << released / 1024 << " KiB of free heap";
  }
  // A pack on the wire stays there while the next merge group is prepared; anything else waits
  // for it (its buckets and collectives are the engine thread's alone).
  if (!w.failed.empty()) DrainWire();
  for (EngineBucket* b : w.failed) PublishFailed(b);
  if (w.run && !w.pick.alone) {
    ProcessGroup(w.group, w.candidates, w.pick.agreed);
  } else if (w.run) {
    DrainWire();
    Process(w.group);
  }
  WarnSlowGroup(w.group, w.waiting);
  if (!w.run && w.failed.empty()) return false;
  absl::MutexLock lock(&mu_);
  processing_ = false;
  if (w.run) last_exchange_end_ns_ = static_cast<int64_t>(MonotonicNanos());
  published_cv_.SignalAll();
  return true;
}

void Engine::Idle(DoorbellSegment* bell, uint32_t seen, int64_t linger_until_ns) {
  const uint64_t spin_until =
      MonotonicNanos() + static_cast<uint64_t>(options_.engine_spin_us) * 1000;
  while (options_.engine_spin_us > 0 && MonotonicNanos() < spin_until) {
    if (bell->ring.load(std::memory_order_relaxed) != seen || stop_.load()) return;
    CpuRelax();
  }
  bell->engine_sleeping.store(1);
  int64_t wait_ns = kIdleWaitNs;
  if (linger_until_ns > 0) {  // an agreed merger lingers until then (or a doorbell ring)
    const int64_t left = linger_until_ns - static_cast<int64_t>(MonotonicNanos());
    wait_ns = std::max<int64_t>(1, std::min<int64_t>(wait_ns, left));
  }
  if (bell->ring.load() == seen && !stop_.load()) FutexWait(&bell->ring, seen, wait_ns);
  bell->engine_sleeping.store(0);
}

void Engine::WarnSlowGroup(const std::vector<EngineBucket*>& group, bool waiting) {
  if (!waiting) {
    slow_since_ns_ = 0;
    slow_warned_ = false;
    return;
  }
  const uint64_t now = MonotonicNanos();
  const EngineBucket* head = group.front();
  if (slow_since_ns_ == 0 || slow_head_ != head->id || slow_step_ != head->ex.next_step) {
    slow_since_ns_ = now;
    slow_head_ = head->id;
    slow_step_ = head->ex.next_step;
    slow_warned_ = false;
    return;
  }
  const uint64_t limit_ns = static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Nanoseconds(options_.slow_group_warning)));
  if (slow_warned_ || now - slow_since_ns_ < limit_ns) return;
  slow_warned_ = true;
  SlowGroupEvent event;
  event.head = head->id;
  event.step = head->ex.next_step;
  event.waited_ns = now - slow_since_ns_;
  {
    absl::MutexLock lock(&mu_);
    for (const EngineBucket* b : group) {
      if (!scheduler_->LocallyReady(*b)) event.missing.push_back(b->id);
    }
  }
  SPEX_LOG(WARNING) << "--merger=" << scheduler_->merger_name() << ": the group starting at bucket "
                    << head->id << " step " << head->ex.next_step << " has waited more than "
                    << absl::FormatDuration(options_.slow_group_warning) << " for bucket(s) "
                    << absl::StrJoin(event.missing, ", ")
                    << " while its other members were ready. A trainer that waits for bucket b's "
                       "result before writing bucket b+1 deadlocks under a static plan (omgs); "
                       "use --merger=rgmerge or fixed, or none";
  for (ExchangeObserver* o : options_.observers) o->OnSlowGroup(event);
}

void Engine::PublishFailed(EngineBucket* b) {
  ExchangeRecord rec;
  rec.bucket_id = b->id;
  rec.step = b->ex.next_step;
  rec.compressor = b->compressor;
  absl::Status error;
  {
    absl::MutexLock lock(&mu_);
    error = b->out.error;
  }
  Publish(b, b->ex.next_step, error, rec, /*terminal=*/true);
}

void Engine::Publish(EngineBucket* b, uint64_t step, const absl::Status& status,
                     const ExchangeRecord& rec, bool terminal) {
  const bool first_failure = terminal && b->out.state != BucketState::kFailed;
  if (!status.ok() && (!terminal || first_failure)) {
    SPEX_LOG(ERROR) << "bucket " << b->id << " step " << step << ": " << status
                    << (terminal ? " (the bucket is failed from now on: restart the job)" : "");
  }
  // Stats first: a trainer that sees the result and then asks GetStats must find this exchange.
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok() && (!terminal || first_failure)) {
      b->out.error_step = step;
      b->out.error = status;
    }
    if (terminal) b->MoveTo(BucketState::kFailed);
    b->out.Count(rec);
    total_exchanges_++;
    // The bucket waits for its next step BEFORE its trainers can see this result: a trainer that
    // hands in the next step at once must find it among the engine's candidates (a pack is
    // published on the wire thread while the engine thread picks; a static plan's group would
    // otherwise come out shorter on one node). It cannot run before the trainers are ready.
    b->ex.next_step = step + 1;
    if (b->out.state == BucketState::kExchanging) {
      const bool full = b->out.registered_mask == (1ull << options_.local_trainers) - 1;
      b->MoveTo(full ? BucketState::kWaiting : BucketState::kRegistering);
    }
  }
  const uint64_t t = MonotonicNanos();
  BucketHeader* h = b->mem.header;
  h->status.store(status.ok() ? 0 : static_cast<int32_t>(status.code()));
  h->published.store(static_cast<uint32_t>(step + 1));
  if (h->waiters.load()) FutexWake(&h->published);
  const double publish_seconds = (MonotonicNanos() - t) * 1e-9;
  absl::MutexLock lock(&mu_);
  b->out.last.phase_seconds[static_cast<int>(Phase::kPublish)] += publish_seconds;
  b->out.phase_sum[static_cast<int>(Phase::kPublish)] += publish_seconds;
  b->out.completed = step + 1;
  published_cv_.SignalAll();
}

void Engine::NotifyObservers(ExchangeEvent* event, const ExchangeRecord& rec, absl::StatusCode code,
                             bool terminal, uint64_t elements, uint64_t begin_ns,
                             uint64_t publish_ns, uint64_t end_ns) {
  event->record = &rec;
  event->code = code;
  event->terminal = terminal;
  event->elements = elements;
  event->begin_ns = begin_ns;
  event->end_ns = end_ns;
  event->spans.push_back({Phase::kPublish, publish_ns, end_ns});
  for (ExchangeObserver* o : options_.observers) o->OnExchange(*event);
}

void Engine::ApplyDensityLocked(uint64_t key) {
  if (key <= applied_density_key_) return;
  applied_density_key_ = key;
  density_version_ = std::max(density_version_, key >> 32);
  const float d = DensityOfKey(key);
  SPEX_LOG(INFO) << "target density is now " << d << " (change " << (key >> 32) << ")";
  for (const auto& [id, bucket] : buckets_.all()) {
    if (bucket->compressor != "dense") bucket->out.density = d;
  }
}

void Engine::ReapDeadTrainersLocked() {
  const uint64_t now = MonotonicNanos();
  if (now - last_reap_ns_ < 100 * 1000 * 1000) return;  // every 100 ms at most
  last_reap_ns_ = now;
  for (const Session& s : sessions_.Reap()) {
    SPEX_LOG(ERROR) << "local trainer " << s.local_rank << " (pid " << s.pid
                    << ") died without Goodbye; its session is closed and every step it left "
                       "fails on every node";
    dead_mask_ |= 1ull << s.local_rank;
    dead_word_[s.local_rank] = DeadTrainerWord(collective_->rank(), s.local_rank, s.pid);
  }
  // A client only raises its ready word, by one a step, and never before the previous step was
  // published, so a live rank's word is at least the bucket's next step. Below it, a trainer of
  // this node wrote into the shared header: nobody can wait for that rank any more, so it is
  // broken for the rest of the job like a dead one (every step of its buckets fails on every
  // node, naming it), instead of every trainer waiting out its exchange timeout.
  // Reading every waiting bucket's header here is also what notices a segment cut to nothing
  // while nobody touches it (the read faults and the guard marks it; Scheduler::LocallyReady
  // then runs its step, which fails on every node): its zeros are not a trainer's doing.
  const auto pulled = [](const EngineBucket& b) {
    return b.mem.view.pulled != nullptr && b.mem.view.pulled->load(std::memory_order_acquire);
  };
  for (const auto& [id, b] : buckets_.all()) {
    if (b->out.state != BucketState::kWaiting || pulled(*b)) continue;
    for (int r = 0; r < options_.local_trainers; ++r) {
      const uint64_t bit = 1ull << r;
      if ((dead_mask_ & bit) || !(b->out.registered_mask & bit)) continue;
      const uint64_t ready = b->mem.header->ready[r].value.load();
      if (ready >= b->ex.next_step) continue;
      if (pulled(*b)) break;  // this very read faulted: the segment is gone, not rewritten
      uint32_t pid = 0;
      for (const SessionSummary& s : sessions_.Summaries(absl::Now())) {
        if (s.local_rank == static_cast<uint32_t>(r)) pid = s.pid;
      }
      SPEX_LOG(ERROR) << "bucket " << id << ": local trainer " << r << " (pid " << pid
                      << ")'s ready word is " << ready << ", below the next step "
                      << b->ex.next_step
                      << ": a trainer of this node wrote into the shared header; every step of "
                         "that trainer's buckets fails from now on, on every node";
      dead_mask_ |= bit;
      dead_word_[r] = DeadTrainerWord(collective_->rank(), r | kBrokenRank, pid);
    }
  }
  scheduler_->set_dead(dead_mask_);
  if (sessions_.empty() && !buckets_.empty()) reset_pending_ = true;
}

void Engine::ResetLocked() {
  SPEX_LOG(INFO) << "new job: dropping the previous job's " << buckets_.size() << " buckets";
  buckets_.Clear();
  reset_pending_ = false;
  ++job_generation_;
  dead_mask_ = 0;
  scheduler_->set_dead(0);
  published_cv_.SignalAll();
}

}  // namespace spex
