// The engine's life (start, stop) and its thread: the loop, one exchange, publishing. The
// requests of the RPC threads are in engine_requests.cc.
#include "daemon/engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/fused_step.h"
#include "daemon/engine/group_round.h"
#include "daemon/memory/futex.h"
#include "daemon/transport/agreement.h"
#include "daemon/util/heap.h"
#include "daemon/util/log.h"

namespace spex {

const char* PhaseName(Phase p) {
  static const char* const kNames[] = {"wait_local", "reduce_local", "compress",
                                       "collective", "decode",       "publish"};
  return kNames[static_cast<int>(p)];
}

namespace {
constexpr int64_t kIdleWaitNs = 50 * 1000 * 1000;  // engine re-checks peers/stop this often

// A local rank whose ready word went back (a write into the shared header no client makes)
// travels in the control round as a dead trainer with this bit set in the word's rank field
// (DeadTrainerWord; local ranks are < kMaxLocalTrainers).
constexpr uint32_t kBrokenRank = 0x8000;
constexpr uint64_t kBrokenRankBit = static_cast<uint64_t>(kBrokenRank) << 32;

// "local trainer R (pid P) of node N died", or what the broken one did.
std::string TrainerFault(uint64_t word) {
  if ((word & kBrokenRankBit) == 0) return absl::StrCat(DeadTrainerName(word), " died");
  return absl::StrCat(DeadTrainerName(word & ~kBrokenRankBit),
                      " broke the shared-segment protocol (its ready word went back below the "
                      "step being exchanged: a trainer of that node wrote into a bucket's header)");
}
}  // namespace

Engine::Engine(EngineOptions options, Collective* collective, Primitives* prims, DevicePath device)
    : options_(std::move(options)),
      collective_(collective),
      prims_(prims),
      device_(device),
      sessions_(options_.local_trainers, options_.job),
      buckets_(&options_, collective, prims, device),
      doorbell_(options_.shm_tag) {
  env_.coll = collective;
  env_.prims = prims;
  env_.host_prims = device.host_prims != nullptr ? device.host_prims : prims;
  env_.local_trainers = options_.local_trainers;
  env_.error_feedback = options_.error_feedback;
  env_.fp16_values = options_.fp16_values;
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
    wire_thread_ = std::thread([this] { WireLoop(); });
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
  bool had_sessions = false;  // whether the last iteration saw a session (a job running)
  std::vector<EngineBucket*> group, failed;  // this iteration's picks (capacity reused)
  std::vector<MergeCandidate> candidates;    // the group's, with --merger
  Scheduler::Pick pick;
  while (true) {
    if (options_.heartbeat) options_.heartbeat();
    if (stop_.load()) {
      if (!announced && options_.announce_stop) options_.announce_stop();
      break;
    }
    DoorbellSegment* bell = doorbell_.segment();
    const uint32_t seen = bell->ring.load();
    group.clear();
    failed.clear();
    pick = Scheduler::Pick();
    bool run = false, waiting = false, fell_idle = false, drop_behind = false;
    {
      absl::MutexLock lock(&mu_);
      buckets_.UnlinkAttached();
      doorbell_.UnlinkIfAllAttached(options_.local_trainers);
      doorbell_.DropOld(bell);
      ReapDeadTrainersLocked();
      fell_idle = had_sessions && sessions_.empty();
      // A new job (its buckets replaced the last one's): the behind groups, and their
      // compressors' state, belong to the old one.
      drop_behind = fell_idle || job_generation_ != behind_generation_;
      behind_generation_ = job_generation_;
      had_sessions = !sessions_.empty();
      // After every session left, only the steps dead trainers left half-done still run.
      if (!reset_pending_ || dead_mask_ != 0) {
        const auto& f = scheduler_->FailedAndReady(buckets_);
        failed.assign(f.begin(), f.end());
        const int64_t now = static_cast<int64_t>(MonotonicNanos());
        const auto& g =
            scheduler_->NextGroup(buckets_, now, wire_inflight_ > 0 ? now : last_exchange_end_ns_);
        group.assign(g.begin(), g.end());
        pick = scheduler_->pick();
        if (!pick.alone) {
          const auto& c = scheduler_->group_candidates();
          candidates.assign(c.begin(), c.end());
        }
        run = !group.empty() && std::all_of(group.begin(), group.end(), [&](const EngineBucket* b) {
          return scheduler_->LocallyReady(*b);
        });
        waiting = !run && group.size() > 1 &&
                  std::any_of(group.begin(), group.end(),
                              [&](const EngineBucket* b) { return scheduler_->LocallyReady(*b); });
      }
      if (run) {
        for (EngineBucket* b : group) b->MoveTo(BucketState::kExchanging);
      }
      processing_ = run || !failed.empty();
    }
    if (drop_behind && !behind_groups_.empty()) {  // the job that made them has ended
      DrainWire();
      behind_groups_.clear();
    }
    if (fell_idle) {
      // The job's last trainer has gone (Goodbye or death): hand the heap's free pages back.
      const int64_t released = ReleaseFreeHeap();
      SPEX_LOG(DEBUG) << "node idle: released " << released / 1024 << " KiB of free heap";
    }
    // A pack on the wire stays there while the next merge group is prepared; anything else
    // waits for it (its buckets and collectives are the engine thread's alone).
    if (!failed.empty()) DrainWire();
    for (EngineBucket* b : failed) PublishFailed(b);
    if (run && !pick.alone) {
      ProcessGroup(group, candidates, pick.agreed);
    } else if (run) {
      DrainWire();
      Process(group);
    }
    WarnSlowGroup(group, waiting);
    if (run || !failed.empty()) {
      absl::MutexLock lock(&mu_);
      processing_ = false;
      if (run) last_exchange_end_ns_ = static_cast<int64_t>(MonotonicNanos());
      published_cv_.SignalAll();
      continue;
    }
    Idle(bell, seen, pick.linger_until_ns);
    int who = -1;
    if (options_.peer_stopped && options_.peer_stopped(&who)) {
      SPEX_LOG(INFO) << "node " << who << " is stopping; stopping this node too";
      announced = true;  // every node hears from the first one that stopped
      stop_.store(true);
      WakeEverybody();
    }
  }
  if (wire_thread_.joinable()) {  // it publishes what was handed to it, then ends
    {
      absl::MutexLock lock(&mu_);
      wire_stop_ = true;
      wire_cv_.SignalAll();
    }
    wire_thread_.join();
  }
  {
    absl::MutexLock lock(&stopped_mu_);
    stopped_ = true;
  }
  SPEX_LOG(DEBUG) << "engine thread stopped";
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

void Engine::Process(const std::vector<EngineBucket*>& group) {
  EngineBucket* b = group.front();  // the merger is `none`: one bucket per exchange
  const uint64_t step = b->ex.next_step;
  ExchangeRecord rec;
  rec.bucket_id = b->id;
  rec.step = step;
  rec.compressor = b->compressor;
  const uint64_t t0 = MonotonicNanos();
  uint64_t t = t0;
  const bool observed = !options_.observers.empty();
  ExchangeEvent event;
  if (observed) event.spans.reserve(2 * kPhaseCount);
  const Lap lap = [&](Phase p) {
    const uint64_t now = MonotonicNanos();
    rec.phase_seconds[static_cast<int>(p)] += (now - t) * 1e-9;
    if (observed) event.spans.push_back({p, t, now});
    t = now;
  };
  Control control;
  {
    absl::MutexLock lock(&mu_);
    control.density_key = density_key_;
    // A local trainer that died left this step without its input: every node fails the step
    // alike, naming it (the control round carries who).
    const uint64_t dead = dead_mask_ & b->out.registered_mask;
    if (dead != 0) control.dead_trainer = dead_word_[__builtin_ctzll(dead)];
  }
  // From the deciding step on until a step runs (a non-finite step is skipped everywhere).
  if (b->ex.sparse != nullptr && b->ex.mode == BucketExchange::Mode::kProbe &&
      step >= 2 * static_cast<uint64_t>(options_.probe_steps)) {
    control.sparse_us = b->ex.probe_sparse_ns / 1000;
    control.dense_us = b->ex.probe_dense_ns / 1000;
  }
  // The same for --sparse_allreduce=auto, counted in the bucket's sparse exchanges.
  if (b->ex.allreduce_probe &&
      b->ex.allreduce_probed >= 2 * static_cast<uint64_t>(options_.probe_steps)) {
    control.allgather_us = b->ex.probe_allgather_ns / 1000;
    control.oktopk_us = b->ex.probe_oktopk_ns / 1000;
  }
  // Device path: the trainers' device writes must be visible before anything reads the inputs.
  // A node that cannot wait for them says so in the control round, so every node skips the
  // step alike; nothing was touched, so the bucket goes on.
  const absl::Status inputs = control.dead_trainer != 0 ? absl::OkStatus() : WaitInputs(b);
  lap(Phase::kWaitLocal);
  control.inputs_failed = !inputs.ok() || control.dead_trainer != 0;
  // The local reduce runs now, before the control round, with the finite check (fused into its
  // pass on the CPU; a second pass over the sum and an 8-byte read-back on a GPU). It writes
  // nothing a skipped step must keep (step.h: ReduceLocalChecked), and the control round's
  // nonfinite word then tells every node, before any collective of the step, whether some
  // trainer of some node handed in a NaN or +-Inf. A failure of the reduce itself goes into the
  // step, which fails at the commit vote like any local failure.
  const bool reduce_now = !control.inputs_failed;
  absl::Status reduced;
  if (reduce_now) {
    const bool sparse_bucket = b->ex.sparse != nullptr;
    // A dense bucket under propagate needs no check: its all-reduce carries NaN/Inf anyway.
    const bool check = sparse_bucket || b->policy.nonfinite == NonfinitePolicy::kError;
    size_t first_bad = b->elements;
    reduced = ReduceLocalChecked(env_, b->mem.view, sparse_bucket, check, &first_bad);
    b->ex.reduced_step = UINT64_MAX;                // this step's own sum replaces a merge group's
    if (reduced.ok() && first_bad < b->elements) {  // rare: find which trainer
      const int r = NonfiniteInput(env_, b->mem.view, first_bad);
      control.nonfinite =
          NonfiniteWord(collective_->rank(), r < 0 ? kNonfiniteSum : static_cast<uint32_t>(r),
                        static_cast<uint32_t>(first_bad));
    }
    lap(Phase::kReduceLocal);
  }
  // The bucket's policies every node must share (a difference fails the control round, naming
  // the bucket): the non-finite policy and, per bucket, the dense fallback.
  const bool fallback = b->policy.dense_fallback == DenseFallback::kAuto;
  const absl::string_view policy = b->policy.nonfinite == NonfinitePolicy::kError
                                       ? (fallback ? "error" : "error dense_fallback=off")
                                       : (fallback ? "propagate" : "propagate dense_fallback=off");
  absl::string_view exchange = "allgather";
  if (b->policy.sparse_allreduce == SparseAllreduce::kOkTopk) exchange = oktopk_key_;
  if (b->policy.sparse_allreduce == SparseAllreduce::kAuto) exchange = auto_key_;
  absl::Status status = RunControlRound(
      collective_, {b->id, step, b->elements, b->compressor, policy, exchange}, &control);
  if (status.ok() && control.dead_trainer != 0) {
    status = absl::AbortedError(absl::StrCat(
        "bucket ", b->id, " step ", step, ": ", TrainerFault(control.dead_trainer),
        ", so this step cannot complete; end the job (spexd takes a new one once the other "
        "trainers of that node have left)"));
  }
  if (status.ok() && !inputs.ok()) status = inputs;
  if (status.ok() && control.inputs_failed) {
    status =
        absl::UnavailableError(absl::StrCat("bucket ", b->id, " step ", step,
                                            ": another node could not read its trainers' inputs "
                                            "(device event failure); see that node's log"));
  }
  lap(Phase::kCollective);
  // The non-finite policy. The word is the same on every node, so all decide alike before any
  // collective of the step; a skipped step leaves the residual (acc) and the compressor as they
  // were, and the bucket goes on.
  bool skip = false;
  if (status.ok() && control.nonfinite != 0) {
    if (b->policy.nonfinite == NonfinitePolicy::kError) {
      skip = true;
      status = absl::InvalidArgumentError(absl::StrCat(
          "bucket ", b->id, " step ", step, ": non-finite gradient from ",
          NonfiniteName(control.nonfinite),
          " (nonfinite=error: this step is skipped on every node, the residual and the "
          "compressor's state are as before it, and the next step can go on)"));
    } else if (b->ex.sparse != nullptr) {
      // propagate: NaN across the bucket on every trainer of every node (a dense bucket runs
      // its step: the all-reduce puts the NaN/Inf where an input had one).
      skip = true;
      status =
          prims_->Fill(b->mem.view.output, std::numeric_limits<float>::quiet_NaN(), b->elements);
      b->ex.sparse->output_dense = true;
      b->ex.sparse->touched.clear();
    }
  }
  const bool ran = status.ok() && !skip;
  if (ran) {
    double density;
    {
      absl::MutexLock lock(&mu_);
      ApplyDensityLocked(control.density_key);
      density = b->out.density;
    }
    const bool sparse = b->ex.sparse != nullptr && UseSparse(b, step, control);
    if (sparse && b->ex.allreduce_probe) ChooseSparseAllreduce(b, control);
    StepItem item{&b->mem.view, b->ex.sparse.get(), step, density, &rec, reduced, reduce_now};
    if (reduce_now && reduced.ok()) CommitLocalSum(&b->mem.view);
    const uint64_t t_work = MonotonicNanos();
    if (sparse) {
      SparseStep(env_, absl::MakeSpan(&item, 1), lap);
    } else {
      DenseStep(env_, absl::MakeSpan(&item, 1), lap);
    }
    const uint64_t work_ns = MonotonicNanos() - t_work;
    if (b->ex.mode == BucketExchange::Mode::kProbe) {
      (sparse ? b->ex.probe_sparse_ns : b->ex.probe_dense_ns) += work_ns;
    }
    if (sparse && b->ex.allreduce_probe) {
      (b->ex.sparse->oktopk ? b->ex.probe_oktopk_ns : b->ex.probe_allgather_ns) += work_ns;
      ++b->ex.allreduce_probed;
    }
    rec.fell_back_to_dense = b->ex.sparse != nullptr && !sparse;
    status = item.status;
    // Device calls without a Status result (Accumulate, Scale) report failures here.
    if (absl::Status health = prims_->Health(); status.ok() && !health.ok()) {
      status =
          absl::Status(health.code(), absl::StrCat("device primitives failed: ", health.message()));
    }
  }
  // Device path: the output event marks the result written (recorded on failure too, so no
  // trainer waits on a stale record).
  if (absl::Status recorded = RecordOutput(b); status.ok()) status = recorded;
  bool terminal = false;
  if (ran) {
    // The commit vote: a step that failed on any node after the control round fails on every
    // node, and leaves the bucket's state (residual, compressor) unknown: terminal.
    char what[64];  // no allocation per exchange
    std::snprintf(what, sizeof(what), "bucket %llu step %llu",
                  static_cast<unsigned long long>(b->id), static_cast<unsigned long long>(step));
    status = AgreeOnAllNodes(collective_, status, what);
    terminal = !status.ok();
    lap(Phase::kCollective);
  }
  rec.total_seconds = (MonotonicNanos() - t0) * 1e-9;
  const uint64_t t_publish = t;  // the last lap's end: the timeline's phases stay contiguous
  Publish(b, step, status, rec, terminal);
  if (observed) {
    const uint64_t now = MonotonicNanos();
    rec.phase_seconds[static_cast<int>(Phase::kPublish)] += (now - t_publish) * 1e-9;
    event.spans.push_back({Phase::kPublish, t_publish, now});
    event.record = &rec;
    event.code = status.code();
    event.terminal = terminal;
    event.elements = b->elements;
    event.begin_ns = t0;
    event.end_ns = now;
    for (ExchangeObserver* o : options_.observers) o->OnExchange(event);
  }
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

// A packed group between its local half (ProcessGroup) and its publishing (RunPack).
struct Engine::WirePack {
  uint64_t t0 = 0;                 // the group's start (the records' total time)
  double phase[kPhaseCount] = {};  // the group's phases so far, then the pack's own
  uint64_t group_first = 0;        // the pack's first member's id (observers)
  uint32_t group_size = 0;         // the pack's members, skipped ones included (observers)
  std::vector<EngineBucket*> buckets;
  uint64_t elements = 0;             // the members' sizes summed (Merger::PackHandedOff/PackDone)
  std::vector<ExchangeRecord> recs;  // items[j].rec == &recs[j]
  std::vector<StepItem> items;
  std::vector<MergeKind> kinds;
  FusedExchange fx;
  BehindGroup* behind = nullptr;  // selection behind: FusedBehindStep on the wire stage
};

BehindGroup* Engine::BehindFor(WirePack* p) {
  // Eligible: two or more members, none skipped, all sparse buckets of one compressor (name,
  // parameters, density, pattern) on the host, none through Ok-Topk.
  const size_t n = p->buckets.size();
  if (n < 2 || n != p->group_size) return nullptr;
  const EngineBucket* head = p->buckets[0];
  uint64_t total = 0;
  for (size_t j = 0; j < n; ++j) {
    const EngineBucket* b = p->buckets[j];
    if (p->kinds[j] != p->kinds[0] ||
        (p->kinds[j] != MergeKind::kPatternA && p->kinds[j] != MergeKind::kPatternB) ||
        b->ex.sparse == nullptr || b->ex.sparse->oktopk || b->mem.view.on_device ||
        b->compressor != head->compressor || b->params != head->params ||
        p->items[j].density != p->items[0].density) {
      return nullptr;
    }
    total += b->elements;
  }
  if (total >= (uint64_t{1} << 32)) return nullptr;
  auto it = behind_groups_.find(head->id);
  if (it != behind_groups_.end()) {
    const BehindGroup& g = *it->second;
    bool same = g.ids.size() == n && g.sparse.compressor != nullptr &&
                std::string(g.sparse.compressor->name()) == head->compressor;
    for (size_t j = 0; same && j < n; ++j) {
      same = g.ids[j] == p->buckets[j]->id &&
             g.offsets[j + 1] - g.offsets[j] == p->buckets[j]->elements;
    }
    if (same) return it->second.get();
    DrainWire();  // the old group may still be in a pack on the wire
    behind_groups_.erase(it);
  }
  std::vector<const BucketData*> members;
  for (const EngineBucket* b : p->buckets) members.push_back(&b->mem.view);
  CompressorSpec spec;
  spec.name = head->compressor;
  spec.density = p->items[0].density;
  spec.params = head->params;
  spec.node_rank = collective_->rank();
  spec.node_count = collective_->size();
  absl::StatusOr<std::unique_ptr<BehindGroup>> g = MakeBehindGroup(members, spec, env_.host_prims);
  if (!g.ok()) {  // alike on every node (agreed inputs): the group selects ahead instead
    SPEX_LOG(WARNING) << "--merger=" << merger_->name() << ": the group starting at bucket "
                      << head->id << " selects ahead: " << g.status().message();
    return nullptr;
  }
  BehindGroup* raw = g->get();
  behind_groups_[head->id] = std::move(*g);
  SPEX_LOG(DEBUG) << "behind group of " << n << " buckets (" << total << " elements, "
                  << head->compressor << ") starting at bucket " << head->id;
  return raw;
}

void Engine::ProcessGroup(const std::vector<EngineBucket*>& group,
                          const std::vector<MergeCandidate>& candidates, bool agreed) {
  const uint64_t t0 = MonotonicNanos();
  uint64_t t = t0;
  double phase[kPhaseCount] = {};
  const Lap lap = [&](Phase p) {
    const uint64_t now = MonotonicNanos();
    phase[static_cast<int>(p)] += (now - t) * 1e-9;
    t = now;
  };
  const size_t window = std::min<size_t>(options_.merge.limits.window, kGroupRoundMaxWindow);
  size_t offered = std::min(group.size(), window);
  GroupRoundInput in;
  std::vector<uint64_t> registrations(offered);
  {
    absl::MutexLock lock(&mu_);
    in.density_key = density_key_;
    for (size_t i = 0; i < offered; ++i) registrations[i] = group[i]->out.registrations;
    for (size_t i = 0; i < offered && in.dead_trainer == 0; ++i) {
      const uint64_t dead = dead_mask_ & group[i]->out.registered_mask;
      if (dead != 0) in.dead_trainer = dead_word_[__builtin_ctzll(dead)];
    }
  }
  in.inputs_failed = in.dead_trainer != 0;
  lap(Phase::kWaitLocal);
  // The local reduce with the finite check, before the round (as on the per-bucket path). An
  // agreed merger offers only up to the first member with a non-finite input, and that member
  // only as the head, alone: so a non-finite word in the round always means the group's head
  // (m is then 1), alike on every node. A static plan offers its whole group; a non-finite input
  // anywhere in it applies the policy to every member.
  // A member an earlier round reduced but left for a later group still has its sum in place
  // (nothing touches a waiting bucket's sum, and its inputs stay as they were until it is
  // published): that reduce is not done again. Under an agreed merger a node whose trainers are
  // ahead offers more than the round agrees on, every round, so this matters under skew.
  std::vector<absl::Status> reduced(offered);
  if (!in.inputs_failed) {
    for (size_t i = 0; i < offered; ++i) {
      EngineBucket* b = group[i];
      const bool sparse_bucket = b->ex.sparse != nullptr;
      const bool check = sparse_bucket || b->policy.nonfinite == NonfinitePolicy::kError;
      size_t first_bad = b->elements;
      if (b->ex.reduced_step == b->ex.next_step &&
          b->ex.reduced_registrations == registrations[i]) {
        first_bad = b->ex.reduced_first_bad;
        reduces_reused_.fetch_add(1, std::memory_order_relaxed);
      } else {
        reduced[i] = ReduceLocalChecked(env_, b->mem.view, sparse_bucket, check, &first_bad);
        if (reduced[i].ok()) {
          b->ex.reduced_step = b->ex.next_step;
          b->ex.reduced_registrations = registrations[i];
          b->ex.reduced_first_bad = first_bad;
        }
      }
      if (!reduced[i].ok() || first_bad >= b->elements) continue;
      if (agreed && i > 0) {  // deferred: it heads a later group
        offered = i;
        break;
      }
      if (in.nonfinite == 0) {
        const int r = NonfiniteInput(env_, b->mem.view, first_bad);
        in.nonfinite =
            NonfiniteWord(collective_->rank(), r < 0 ? kNonfiniteSum : static_cast<uint32_t>(r),
                          static_cast<uint32_t>(first_bad));
        in.nonfinite_member = static_cast<uint32_t>(i);
      }
      if (agreed) {
        offered = 1;
        break;
      }
    }
    lap(Phase::kReduceLocal);
  }
  std::vector<GroupMemberKey> keys(offered);
  for (size_t i = 0; i < offered; ++i) {
    const EngineBucket* b = group[i];
    keys[i] = {b->id,
               b->ex.next_step,
               b->elements,
               b->compressor,
               candidates[i].kind,
               options_.fp16_values && candidates[i].kind == MergeKind::kPatternB};
  }
  Merger* merger = merger_;
  in.plan_due = merger->PlanDue(group[0]->ex.next_step);
  in.config = {merger->name(), options_.merge.limits.window,
               options_.merge.limits.max_group_elements, merger->ConfigHash(), overlapping()};
  in.offer = keys;
  in.exact = !agreed;
  GroupRoundResult res;
  absl::Status status = RunGroupRound(collective_, in, &res);
  lap(Phase::kCollective);
  // A failed round (nodes configured differently, a different bucket order) fails the head
  // only, as the per-bucket control round does: the offers' lengths may differ between nodes, so
  // every node goes on with one round per bucket, in step.
  const size_t m = status.ok() ? std::min(res.agreed, offered) : 1;
  if (status.ok() && res.dead_trainer != 0) {
    status = absl::AbortedError(absl::StrCat(
        "merge group starting at bucket ", group[0]->id, " step ", group[0]->ex.next_step, ": ",
        TrainerFault(res.dead_trainer),
        ", so this step cannot complete; end the job (spexd takes a new one once the other "
        "trainers of that node have left)"));
  }
  if (status.ok() && res.inputs_failed) {
    status = absl::UnavailableError(
        absl::StrCat("merge group starting at bucket ", group[0]->id, " step ",
                     group[0]->ex.next_step, ": another node could not read its trainers' inputs"));
  }
  // Members offered past the agreed m go back to waiting (their reduce is redone next time).
  if (m < group.size()) {
    absl::MutexLock lock(&mu_);
    for (size_t i = m; i < group.size(); ++i) {
      EngineBucket* b = group[i];
      if (b->out.state == BucketState::kExchanging) {
        const bool full = b->out.registered_mask == (1ull << options_.local_trainers) - 1;
        b->MoveTo(full ? BucketState::kWaiting : BucketState::kRegistering);
      }
    }
  }
  // Per member: skipped (non-finite policy) or run.
  std::vector<absl::Status> st(m, status);
  std::vector<bool> run(m, status.ok());
  if (status.ok() && res.nonfinite != 0) {
    for (size_t i = 0; i < m; ++i) {
      EngineBucket* b = group[i];
      if (b->policy.nonfinite == NonfinitePolicy::kError) {
        run[i] = false;
        st[i] = absl::InvalidArgumentError(absl::StrCat(
            "bucket ", b->id, " step ", b->ex.next_step, ": non-finite gradient from ",
            NonfiniteName(res.nonfinite), agreed ? "" : " in its merge group",
            " (nonfinite=error: this step is skipped on every node, the residual and the "
            "compressor's state are as before it, and the next step can go on)"));
      } else if (b->ex.sparse != nullptr) {
        run[i] = false;
        st[i] =
            prims_->Fill(b->mem.view.output, std::numeric_limits<float>::quiet_NaN(), b->elements);
        b->ex.sparse->output_dense = true;
        b->ex.sparse->touched.clear();
      }
    }
  }
  // Per member: in a pack (published by RunPack) or published here (skipped or failed), and
  // the index of its pack's first member (observers see a skipped member in its pack).
  std::vector<bool> packed(m, false);
  std::vector<size_t> group_of(m, 0);
  if (status.ok()) {
    std::vector<double> density(m);
    {
      absl::MutexLock lock(&mu_);
      ApplyDensityLocked(res.density_key);
      for (size_t i = 0; i < m; ++i) density[i] = group[i]->out.density;
    }
    if (res.plan_due) AgreePlan(group[0]->ex.next_step, density[0]);
    std::vector<size_t> packs =
        agreed ? merger->Pack(absl::MakeConstSpan(candidates.data(), m)) : std::vector<size_t>{m};
    size_t first = 0;
    uint64_t local_since = t0;  // this pack's local work began (the round, for the first)
    for (size_t len : packs) {
      auto p = std::make_unique<WirePack>();
      p->t0 = t0;
      std::copy(phase, phase + kPhaseCount, p->phase);
      std::vector<size_t> at;
      for (size_t i = first; i < first + len && i < m; ++i) {
        group_of[i] = first;
        if (run[i]) at.push_back(i);
      }
      p->group_first = group[first]->id;
      p->group_size = static_cast<uint32_t>(std::min(first + len, m) - first);
      p->recs.resize(at.size());
      p->items.reserve(at.size());
      for (size_t j = 0; j < at.size(); ++j) {
        const size_t i = at[j];
        EngineBucket* b = group[i];
        ExchangeRecord& rec = p->recs[j];
        rec.bucket_id = b->id;
        rec.step = b->ex.next_step;
        rec.compressor = b->compressor;
        rec.fell_back_to_dense = b->ex.sparse != nullptr && candidates[i].kind == MergeKind::kDense;
        if (reduced[i].ok()) CommitLocalSum(&b->mem.view);
        b->ex.reduced_step = UINT64_MAX;
        p->buckets.push_back(b);
        p->elements += b->elements;
        p->items.push_back({&b->mem.view, b->ex.sparse.get(), b->ex.next_step, density[i], &rec,
                            reduced[i], true});
        p->kinds.push_back(candidates[i].kind);
        packed[i] = true;
      }
      first += len;
      if (p->items.empty()) continue;
      // The local half here, on the engine thread; the wire half in RunPack.
      uint64_t pt = MonotonicNanos();
      WirePack* raw = p.get();
      const Lap plap = [raw, &pt](Phase ph) {
        const uint64_t now = MonotonicNanos();
        raw->phase[static_cast<int>(ph)] += (now - pt) * 1e-9;
        pt = now;
      };
      FusedScratch* scratch = &fused_scratch_[next_scratch_];
      next_scratch_ ^= 1;
      // Selection behind (a static plan's group of one compressor): the whole step on the
      // wire stage; otherwise the local half here.
      if (!agreed && merger->behind()) p->behind = BehindFor(p.get());
      if (p->behind == nullptr) {
        p->fx.Prepare(env_, absl::MakeSpan(p->items), p->kinds, scratch, plap);
      }
      if (merger->measures()) {
        for (size_t j = 0; j < p->items.size(); ++j) {
          const EngineBucket* b = p->buckets[j];
          int64_t ready = b->ReadyStamp(options_.local_trainers);  // docs/merging.md 2.6
          // Without stamps (an older client): when this engine took the group, late by up to
          // what it was busy with before.
          if (ready == 0) ready = static_cast<int64_t>(t0);
          merger->ObserveMember(b->id, p->items[j].step, ready, p->items[j].select_ns);
        }
      }
      const uint64_t elements = p->elements;
      const int64_t local_ns = static_cast<int64_t>(MonotonicNanos() - local_since);
      HandOff(std::move(p));
      local_since = MonotonicNanos();  // on the wire from now (with --merge_overlap)
      if (overlapping()) {
        merger->PackHandedOff(elements, local_ns, static_cast<int64_t>(local_since));
      }
    }
  }
  SPEX_LOG(DEBUG) << "merge group of " << m << " bucket(s) starting at bucket " << group[0]->id;
  // The members no pack publishes: their results do not wait for the wire (and what observers
  // see stays on one thread at a time).
  if (std::find(packed.begin(), packed.end(), false) == packed.end()) return;
  DrainWire();
  const uint64_t end = MonotonicNanos();
  for (size_t i = 0; i < m; ++i) {
    if (packed[i]) continue;
    EngineBucket* b = group[i];
    ExchangeRecord rec;
    rec.bucket_id = b->id;
    rec.step = b->ex.next_step;
    rec.compressor = b->compressor;
    for (int p = 0; p < kPhaseCount; ++p) rec.phase_seconds[p] = phase[p];
    rec.total_seconds = (end - t0) * 1e-9;
    const uint64_t step = b->ex.next_step;
    Publish(b, step, st[i], rec, /*terminal=*/false);
    if (!options_.observers.empty()) {
      ExchangeEvent event;
      event.record = &rec;
      event.code = st[i].code();
      event.terminal = false;
      event.elements = b->elements;
      event.begin_ns = t0;
      event.end_ns = MonotonicNanos();
      event.group_first = group[group_of[i]]->id;
      size_t n = 0;
      for (size_t j = group_of[i]; j < m && group_of[j] == group_of[i]; ++j) ++n;
      event.group_size = static_cast<uint32_t>(n);
      event.spans.push_back({Phase::kPublish, end, event.end_ns});
      for (ExchangeObserver* o : options_.observers) o->OnExchange(event);
    }
  }
}

void Engine::AgreePlan(uint64_t step, double density) {
  std::vector<PlanBucket> buckets;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t full = (uint64_t{1} << options_.local_trainers) - 1;
    for (const auto& [id, b] : buckets_.all()) {  // ascending id: the canonical order
      if (b->out.registered_mask == full) {
        buckets.push_back({id, b->elements, Scheduler::KindOf(*b)});
      }
    }
  }
  std::vector<uint64_t> words = merger_->PlanInputs(buckets);
  absl::Status s = RunPlanAgreement(collective_, buckets, &words);
  if (!s.ok()) {
    SPEX_LOG(WARNING) << "--merger=" << merger_->name() << ": no plan (" << s.message()
                      << "); it keeps merging what is ready";
    merger_->AbandonPlan(std::string(s.message()));
    return;
  }
  PlanContext ctx;
  ctx.nodes = collective_->size();
  ctx.density = density;
  merger_->InstallPlan(buckets, words, step, ctx);
  SPEX_LOG(INFO) << "--merger=" << merger_->name() << ": plan over " << buckets.size()
                 << " buckets agreed at step " << step << " (effective from step " << step + 1
                 << "): " << merger_->PlanSummary();
}

void Engine::HandOff(std::unique_ptr<WirePack> p) {
  if (!overlapping()) {
    RunPack(p.get());
    return;
  }
  absl::MutexLock lock(&mu_);
  while (wire_inflight_ > 0) wire_cv_.Wait(&mu_);  // one pack on the wire at a time
  wire_slot_ = std::move(p);
  wire_inflight_ = 1;
  wire_cv_.SignalAll();
}

void Engine::DrainWire() {
  if (!overlapping()) return;
  absl::MutexLock lock(&mu_);
  while (wire_inflight_ > 0) wire_cv_.Wait(&mu_);
}

void Engine::WireLoop() {
  SPEX_LOG(DEBUG) << "wire thread started";
  while (true) {
    std::unique_ptr<WirePack> p;
    {
      absl::MutexLock lock(&mu_);
      while (wire_slot_ == nullptr && !wire_stop_) wire_cv_.Wait(&mu_);
      if (wire_slot_ == nullptr) break;  // stopping, nothing left
      p = std::move(wire_slot_);
    }
    RunPack(p.get());
    p.reset();
    {
      absl::MutexLock lock(&mu_);
      wire_inflight_ = 0;
      last_exchange_end_ns_ = static_cast<int64_t>(MonotonicNanos());
      wire_cv_.SignalAll();
      published_cv_.SignalAll();  // a request waiting to erase a bucket (not while on the wire)
    }
    // The engine may be asleep on the doorbell with nothing else to do: what was just published
    // lets trainers (and so the next group) go on, and the engine must see them.
    doorbell_.Ring();
  }
  SPEX_LOG(DEBUG) << "wire thread stopped";
}

void Engine::RunPack(WirePack* p) {
  const StepEnv& env = overlapping() ? wire_env_ : env_;
  uint64_t t = MonotonicNanos();
  const Lap lap = [p, &t](Phase ph) {
    const uint64_t now = MonotonicNanos();
    p->phase[static_cast<int>(ph)] += (now - t) * 1e-9;
    t = now;
  };
  const uint64_t wire_begin = t;
  if (p->behind != nullptr) {
    FusedBehindStep(env, p->behind, absl::MakeSpan(p->items), lap);
  } else {
    p->fx.Exchange(env, lap);
  }
  if (merger_->measures()) {  // every pack: the link's start-up and per-byte cost
    uint64_t bytes = 0;
    bool ok = true;
    for (size_t j = 0; j < p->items.size(); ++j) {
      bytes += p->recs[j].bytes_received;
      ok = ok && p->items[j].status.ok();
    }
    if (ok) merger_->ObserveExchange(bytes, static_cast<int64_t>(MonotonicNanos() - wire_begin));
  }
  absl::Status vote;
  for (const StepItem& item : p->items) {
    if (vote.ok() && !item.status.ok()) vote = item.status;
  }
  char what[96];
  std::snprintf(what, sizeof(what), "merge group starting at bucket %llu step %llu",
                static_cast<unsigned long long>(p->buckets[0]->id),
                static_cast<unsigned long long>(p->items[0].step));
  vote = AgreeOnAllNodes(env.coll, vote, what);
  lap(Phase::kCollective);
  const uint64_t end = MonotonicNanos();
  for (size_t j = 0; j < p->buckets.size(); ++j) {
    EngineBucket* b = p->buckets[j];
    ExchangeRecord& rec = p->recs[j];
    for (int ph = 0; ph < kPhaseCount; ++ph) rec.phase_seconds[ph] = p->phase[ph];
    rec.total_seconds = (end - p->t0) * 1e-9;
    const bool terminal = !vote.ok();
    Publish(b, p->items[j].step, vote, rec, terminal);
    if (!options_.observers.empty()) {
      ExchangeEvent event;
      event.record = &rec;
      event.code = vote.code();
      event.terminal = terminal;
      event.elements = b->elements;
      event.begin_ns = p->t0;
      event.end_ns = MonotonicNanos();
      event.group_first = p->group_first;
      event.group_size = p->group_size;
      event.spans.push_back({Phase::kPublish, end, event.end_ns});
      for (ExchangeObserver* o : options_.observers) o->OnExchange(event);
    }
  }
  if (overlapping()) {  // the wire stage's whole occupancy, for rgmerge's --rgmerge_bind=late
    merger_->PackDone(p->elements, static_cast<int64_t>(MonotonicNanos() - wire_begin));
  }
}

// Dense-fallback policy ("never slower than dense"): a sparse bucket first alternates sparse
// and dense exchanges for 2 * probe_steps steps, then every node adopts the faster, judged on
// the slowest node's timings (carried by the control round of the deciding step, so all nodes
// decide alike).
bool Engine::UseSparse(EngineBucket* b, uint64_t step, const Control& control) {
  using Mode = BucketExchange::Mode;
  if (b->ex.mode == Mode::kSparse) return true;
  if (b->ex.mode == Mode::kDense) return false;
  const uint64_t window = 2 * static_cast<uint64_t>(options_.probe_steps);
  if (step < window) return step % 2 == 0;
  b->ex.mode = control.sparse_us < control.dense_us ? Mode::kSparse : Mode::kDense;
  SPEX_LOG(INFO) << "bucket " << b->id << ": " << b->compressor << " took "
                 << control.sparse_us / options_.probe_steps << " us per exchange, dense "
                 << control.dense_us / options_.probe_steps << " us: going "
                 << (b->ex.mode == Mode::kSparse ? "sparse" : "dense");
  return b->ex.mode == Mode::kSparse;
}

// --sparse_allreduce=auto, the same policy for the two sparse exchanges of a pattern-B bucket:
// its first 2 * probe_steps sparse exchanges alternate the all-gather (even) and Ok-Topk (odd),
// then every node adopts the faster, judged on the slowest node's timings (the control round of
// the deciding step carries them; every node has run the same sparse exchanges, so all decide
// alike). Ok-Topk's state (threshold, regions) only advances on its own exchanges.
void Engine::ChooseSparseAllreduce(EngineBucket* b, const Control& control) {
  const uint64_t window = 2 * static_cast<uint64_t>(options_.probe_steps);
  SparseState& st = *b->ex.sparse;
  if (b->ex.allreduce_probed < window) {
    st.oktopk = b->ex.allreduce_probed % 2 == 1;
    return;
  }
  b->ex.allreduce_probe = false;
  st.oktopk = control.oktopk_us < control.allgather_us;
  SPEX_LOG(INFO) << "bucket " << b->id << ": " << b->compressor << " through the all-gather took "
                 << control.allgather_us / options_.probe_steps << " us per exchange, through "
                 << "Ok-Topk " << control.oktopk_us / options_.probe_steps << " us: going "
                 << (st.oktopk ? "oktopk" : "allgather");
}

absl::Status Engine::WaitInputs(EngineBucket* b) {
  if (device_.ordering == nullptr || b->mem.data == nullptr) return absl::OkStatus();
  for (int r = 0; r < options_.local_trainers; ++r) {
    if (absl::Status s = device_.ordering->WaitInput(b->mem.data.get(), r); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("bucket ", b->id, ": waiting for local trainer ",
                                                 r, "'s input event: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::RecordOutput(EngineBucket* b) {
  if (device_.ordering == nullptr || b->mem.data == nullptr) return absl::OkStatus();
  absl::Status s = device_.ordering->RecordOutput(b->mem.data.get(), options_.local_trainers);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("bucket ", b->id, ": recording the output event: ", s.message()));
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
  for (const auto& [id, b] : buckets_.all()) {
    if (b->out.state != BucketState::kWaiting) continue;
    for (int r = 0; r < options_.local_trainers; ++r) {
      const uint64_t bit = 1ull << r;
      if ((dead_mask_ & bit) || !(b->out.registered_mask & bit)) continue;
      const uint64_t ready = b->mem.header->ready[r].value.load();
      if (ready >= b->ex.next_step) continue;
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
