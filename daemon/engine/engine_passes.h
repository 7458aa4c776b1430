// The state the engine thread's loop and one exchange carry through their stages, internal to
// the engine's .cc files: one iteration's picks (engine.cc), a bucket's pass on the per-bucket path
// (engine_bucket_exchange.cc), a merge group's pass (engine_group_exchange.cc), a packed group
// between its local half and the wire stage (engine_wire_stage.cc), and the clock that times their
// phases. Each stage is a member function of Engine that takes the pass, so a stage reads whole and
// its failure handling is in it.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/bucket.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/exchange_record.h"
#include "daemon/engine/fused_step.h"
#include "daemon/engine/group_round.h"
#include "daemon/engine/observer.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/step.h"
#include "daemon/merge/merger.h"
#include "proto/contract/futex.h"

namespace spex {

// The calling thread's CPU time (user + system), in nanoseconds.
inline uint64_t ThreadCpuNanos() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Times an exchange's phases: Mark(p) adds the time since the previous mark (or the start) to
// `phase_seconds[p]`, the calling thread's CPU time over it to `phase_cpu_seconds[p]` and, with
// `spans`, records the interval there (for observers). A clock is used by one thread.
class PhaseClock {
 public:
  PhaseClock(double* phase_seconds, double* phase_cpu_seconds, std::vector<PhaseSpan>* spans,
             uint64_t start_ns)
      : phase_seconds_(phase_seconds),
        phase_cpu_seconds_(phase_cpu_seconds),
        spans_(spans),
        last_ns_(start_ns),
        last_cpu_ns_(ThreadCpuNanos()) {}
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  void Mark(Phase p) {
    const uint64_t now = MonotonicNanos();
    const uint64_t cpu = ThreadCpuNanos();
    phase_seconds_[static_cast<int>(p)] += (now - last_ns_) * 1e-9;
    phase_cpu_seconds_[static_cast<int>(p)] += (cpu - last_cpu_ns_) * 1e-9;
    if (spans_ != nullptr) spans_->push_back({p, last_ns_, now});
    last_ns_ = now;
    last_cpu_ns_ = cpu;
  }
  // The end of the last phase marked (the start when none was).
  uint64_t last_ns() const { return last_ns_; }
  // The steps' callback (step.h), marking on this clock.
  Lap AsLap() {
    return [this](Phase p) { Mark(p); };
  }

 private:
  double* const phase_seconds_;
  double* const phase_cpu_seconds_;
  std::vector<PhaseSpan>* const spans_;
  uint64_t last_ns_;
  uint64_t last_cpu_ns_;
};

// One iteration of the engine thread's loop: what the scheduler picked (capacity reused).
struct Engine::Work {
  std::vector<EngineBucket*> group;        // the exchange's buckets (one without a merger)
  std::vector<EngineBucket*> failed;       // failed buckets to publish
  std::vector<MergeCandidate> candidates;  // the group's, with --merger
  Scheduler::Pick pick;
  bool run = false;           // every member is ready: the exchange runs now
  bool waiting = false;       // some members of a group are ready, others not (WarnSlowGroup)
  bool fell_idle = false;     // the job's last session has gone
  bool drop_behind = false;   // the behind groups belong to a job that ended
  bool had_sessions = false;  // the last iteration saw a session (a job running)
};

// One bucket's exchange on the per-bucket path (--merger=none), from its inputs to its publish.
struct Engine::BucketPass {
  BucketPass(EngineBucket* bucket, bool observed_by_any)
      : b(bucket),
        step(bucket->ex.next_step),
        observed(observed_by_any),
        t0(MonotonicNanos()),
        clock(rec.phase_seconds, rec.phase_cpu_seconds, observed ? &event.spans : nullptr, t0),
        lap(clock.AsLap()) {
    rec.bucket_id = b->id;
    rec.step = step;
    rec.compressor = b->compressor;
    if (observed) event.spans.reserve(2 * kPhaseCount);
  }
  BucketPass(const BucketPass&) = delete;
  BucketPass& operator=(const BucketPass&) = delete;

  EngineBucket* const b;
  const uint64_t step;
  const bool observed;  // some observer wants the exchange's event
  const uint64_t t0;    // the exchange's start
  ExchangeRecord rec;
  ExchangeEvent event;  // filled only when observed
  PhaseClock clock;     // into rec (and event.spans when observed)
  const Lap lap;
  Control control;        // this node's words, then the control round's maxed ones
  absl::Status inputs;    // waiting for the trainers' input events (device path)
  absl::Status reduced;   // the local reduce (before the control round; the step's input status)
  absl::Status status;    // the exchange's outcome so far (published)
  bool ran = false;       // the step ran: the commit vote follows
  bool terminal = false;  // the commit vote failed: the bucket is failed from now on
};

// One merge group's exchange on the engine thread (--merger other than none), from its inputs to
// the packs it hands to the wire stage and the members it publishes itself.
struct Engine::GroupPass {
  GroupPass(const std::vector<EngineBucket*>& members,
            const std::vector<MergeCandidate>& member_candidates, bool agreed_merger)
      : group(members),
        candidates(member_candidates),
        agreed(agreed_merger),
        t0(MonotonicNanos()),
        clock(phase, phase_cpu, nullptr, t0),
        lap(clock.AsLap()) {}
  GroupPass(const GroupPass&) = delete;
  GroupPass& operator=(const GroupPass&) = delete;

  const std::vector<EngineBucket*>& group;  // the plan group, or this node's offer (agreed)
  const std::vector<MergeCandidate>& candidates;
  const bool agreed;  // an agreed merger (the round agrees on a prefix), else a static plan
  const uint64_t t0;  // the group's start (its records' total time)
  double phase[kPhaseCount] = {};
  double phase_cpu[kPhaseCount] = {};  // the engine thread's CPU time per phase
  PhaseClock clock;                    // into phase and phase_cpu
  const Lap lap;
  size_t offered = 0;  // the members offered to the group round
  GroupRoundInput in;
  std::vector<uint64_t> registrations;  // per offered member, when its reduce was taken
  std::vector<absl::Status> reduced;    // per offered member: its local reduce
  GroupRoundResult res;
  absl::Status status;  // the group round's outcome (every member's, until its own)
  size_t m = 0;         // the members agreed on: the first m of `group`
  // Per agreed member (sized by AgreeGroup): its own outcome, whether its step runs (not skipped
  // by the non-finite policy), whether a pack publishes it, and its pack's first member.
  std::vector<absl::Status> st;
  std::vector<bool> run, packed;
  std::vector<size_t> group_of;
};

// A packed group between its local half (the group pass) and its publishing (RunPack).
struct Engine::WirePack : WireJob {
  uint64_t t0 = 0;                     // the group's start (the records' total time)
  double phase[kPhaseCount] = {};      // the group's phases so far, then the pack's own
  double phase_cpu[kPhaseCount] = {};  // and their CPU time (each on the thread that ran it)
  uint64_t group_first = 0;            // the pack's first member's id (observers)
  uint32_t group_size = 0;             // the pack's members, skipped ones included (observers)
  std::vector<EngineBucket*> buckets;
  uint64_t elements = 0;             // the members' sizes summed (MergeMeter::PackHandedOff)
  std::vector<ExchangeRecord> recs;  // items[j].rec == &recs[j]
  std::vector<StepItem> items;
  std::vector<MergeKind> kinds;
  FusedExchange fx;
  BehindGroup* behind = nullptr;  // selection behind: FusedBehindStep on the wire stage
};

}  // namespace spex
