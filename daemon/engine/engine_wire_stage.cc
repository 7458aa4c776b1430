// The wire stage (--merge_overlap): what it runs, a packed merge group's collectives, its commit
// vote and its publishing (RunPack), on the wire thread (wire_stage.h's WireStage) while the
// engine thread prepares the next group, or inline without overlap; the hand-off to it and its
// completion callback.
#include <algorithm>
#include <cstdio>

#include "absl/types/span.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine_passes.h"
#include "daemon/transport/agreement.h"
#include "daemon/util/log.h"
#include "proto/contract/futex.h"

namespace spex {

void Engine::HandOff(std::unique_ptr<WirePack> p) {
  if (!overlapping()) {
    RunPack(p.get()).IgnoreError();  // the vote is published to each member's trainers
    return;
  }
  wire_.Submit(std::move(p));  // waits while a pack is on the wire
}

void Engine::DrainWire() {
  if (!overlapping()) return;
  wire_.WaitIdle();
}

void Engine::WireDone() {
  {
    absl::MutexLock lock(&mu_);
    published_cv_.SignalAll();  // a request waiting to erase a bucket (not while on the wire)
  }
  // The engine may be asleep on the doorbell with nothing else to do: what was just published
  // lets trainers (and so the next group) go on, and the engine must see them.
  doorbell_.Ring();
}

int64_t Engine::LastExchangeEndLocked(int64_t now) const {
  // Both ends are stamped in order (the engine's under mu_, the wire stage's before Busy()
  // clears), so the later one is the last exchange's.
  if (wire_.Busy()) return now;
  return std::max(last_exchange_end_ns_, wire_.last_done_ns());
}

absl::Status Engine::RunPack(WirePack* p) {
  const StepEnv& env = overlapping() ? wire_env_ : env_;
  const uint64_t wire_begin = MonotonicNanos();
  PhaseClock clock(p->phase, p->phase_cpu, nullptr, wire_begin);
  const Lap lap = clock.AsLap();
  if (p->behind != nullptr) {
    FusedBehindStep(env, p->behind, absl::MakeSpan(p->items), lap);
  } else {
    p->fx.Exchange(env, lap);
  }
  MergeMeter* meter = merger_->meter();
  if (meter != nullptr && meter->measures()) {  // every pack: the link's start-up and per-byte cost
    uint64_t bytes = 0;
    bool ok = true;
    for (size_t j = 0; j < p->items.size(); ++j) {
      bytes += p->recs[j].bytes_received;
      ok = ok && p->items[j].status.ok();
    }
    if (ok) meter->ObserveExchange(bytes, static_cast<int64_t>(MonotonicNanos() - wire_begin));
  }
  absl::Status vote;
  for (const StepItem& item : p->items) {
    if (vote.ok() && !item.status.ok()) vote = item.status;
  }
  char what[96];
  std::snprintf(what, sizeof(what), "merge group starting at bucket %llu step %llu",
                static_cast<unsigned long long>(p->buckets[0]->id),
                static_cast<unsigned long long>(p->recs[0].step));
  vote = AgreeOnAllNodes(env.coll, vote, what);
  lap(Phase::kCollective);
  const uint64_t end = MonotonicNanos();
  for (size_t j = 0; j < p->buckets.size(); ++j) {
    EngineBucket* b = p->buckets[j];
    ExchangeRecord& rec = p->recs[j];
    for (int ph = 0; ph < kPhaseCount; ++ph) {
      rec.phase_seconds[ph] = p->phase[ph];
      rec.phase_cpu_seconds[ph] = p->phase_cpu[ph];
    }
    rec.total_seconds = (end - p->t0) * 1e-9;
    const bool terminal = !vote.ok();
    // A half member's float32 result rounded once into the trainers' output (step.h).
    const absl::Status out = io_.BeforePublish(b, vote);
    Publish(b, rec.step, out, rec, terminal || !out.ok());  // the trainers' step
    if (options_.observers.empty()) continue;
    ExchangeEvent event;
    event.group_first = p->group_first;
    event.group_size = p->group_size;
    NotifyObservers(&event, rec, vote.code(), terminal, b->elements, p->t0, end, MonotonicNanos());
  }
  if (overlapping() && meter != nullptr) {  // the wire's occupancy, for --rgmerge_bind=late
    meter->PackDone(p->elements, static_cast<int64_t>(MonotonicNanos() - wire_begin));
  }
  return vote;
}

}  // namespace spex
