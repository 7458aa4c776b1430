// The per-bucket path of the engine thread (--merger=none): one bucket's exchange as a sequence
// of stages (Process), each taking the bucket's pass (engine_passes.h), and the policies only
// this path applies (dense fallback, --sparse_allreduce=auto, the device path's events).
#include <cstdio>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine_passes.h"
#include "daemon/engine/exchange_choice.h"
#include "daemon/transport/agreement.h"
#include "daemon/util/log.h"
#include "proto/contract/futex.h"

namespace spex {

void Engine::Process(const std::vector<EngineBucket*>& group) {
  BucketPass x(group.front(), !options_.observers.empty());  // `none`: one bucket per exchange
  GatherControl(x);
  WaitAndReduce(x);
  x.status = AgreeControl(x);
  const bool skip = SkipNonfinite(x);
  x.ran = x.status.ok() && !skip;
  if (x.ran) x.status = RunStep(x);
  CommitVote(x);
  PublishPass(x);
}

void Engine::GatherControl(BucketPass& x) {
  const EngineBucket* b = x.b;
  {
    absl::MutexLock lock(&mu_);
    x.control.density_key = density_key_;
    // A local trainer that died left this step without its input: every node fails the step
    // alike, naming it (the control round carries who).
    const uint64_t dead = dead_mask_ & b->out.registered_mask;
    if (dead != 0) x.control.dead_trainer = dead_word_[__builtin_ctzll(dead)];
  }
  // From the deciding step on until a step runs (a non-finite step is skipped everywhere).
  if (b->ex.sparse != nullptr && b->ex.mode == BucketExchange::Mode::kProbe &&
      x.step + b->ex.step_base >= 2 * static_cast<uint64_t>(options_.probe_steps)) {
    x.control.sparse_us = b->ex.probe_sparse_ns / 1000;
    x.control.dense_us = b->ex.probe_dense_ns / 1000;
  }
  // The same for --sparse_allreduce=auto, counted in the bucket's sparse exchanges.
  if (b->ex.allreduce_probe &&
      b->ex.allreduce_probed >= 2 * static_cast<uint64_t>(options_.probe_steps)) {
    x.control.allgather_us = b->ex.probe_allgather_ns / 1000;
    x.control.oktopk_us = b->ex.probe_oktopk_ns / 1000;
  }
}

void Engine::WaitAndReduce(BucketPass& x) {
  EngineBucket* b = x.b;
  // Device path: the trainers' device writes must be visible before anything reads the inputs.
  // A node that cannot wait for them says so in the control round, so every node skips the
  // step alike; nothing was touched, so the bucket goes on.
  x.inputs = x.control.dead_trainer != 0 ? absl::OkStatus() : io_.WaitInputs(b);
  x.lap(Phase::kWaitLocal);
  x.control.inputs_failed = !x.inputs.ok() || x.control.dead_trainer != 0;
  // The local reduce runs now, before the control round, with the finite check (fused into its
  // pass on the CPU; a second pass over the sum and an 8-byte read-back on a GPU). It writes
  // nothing a skipped step must keep (step.h: ReduceLocalChecked), and the control round's
  // nonfinite word then tells every node, before any collective of the step, whether some
  // trainer of some node handed in a NaN or +-Inf. A failure of the reduce itself goes into the
  // step, which fails at the commit vote like any local failure.
  if (x.control.inputs_failed) return;
  // A dense half bucket's sum goes straight into its half output, rounded (DenseStep exchanges
  // it there); a merge group's path (engine_group_exchange.cc) keeps the float32 staging.
  size_t first_bad = b->elements;
  x.reduced = ReduceLocal(b, /*half_in_output=*/true, &first_bad, x.step + b->ex.step_base);
  b->ex.reduced_step = UINT64_MAX;  // this step's own sum replaces a merge group's
  if (x.reduced.ok()) x.control.nonfinite = NonfiniteWordFor(b, first_bad);
  x.lap(Phase::kReduceLocal);
}

absl::Status Engine::ReduceLocal(EngineBucket* b, bool half_in_output, size_t* first_bad,
                                 uint64_t step) {
  const bool sparse_bucket = b->ex.sparse != nullptr;
  // A dense bucket under propagate needs no check: its all-reduce carries NaN/Inf anyway.
  const bool check = sparse_bucket || b->policy.nonfinite == NonfinitePolicy::kError;
  // The selection's first histogram, counted by the sum as it writes acc (MiCRO's partition).
  SumHistogram* hist = nullptr;
  if (sparse_bucket && step != UINT64_MAX && !b->mem.view.on_device && !IsHalf(b->mem.view.dtype)) {
    hist = b->ex.sparse->compressor->PlanSumHistogram(step);
  }
  return ReduceLocalChecked(env_, b->mem.view, sparse_bucket, check, first_bad, half_in_output,
                            hist);
}

uint64_t Engine::NonfiniteWordFor(const EngineBucket* b, size_t first_bad) const {
  if (first_bad >= b->elements) return 0;
  const int r = NonfiniteInput(env_, b->mem.view, first_bad);  // rare: find which trainer
  return NonfiniteWord(collective_->rank(), r < 0 ? kNonfiniteSum : static_cast<uint32_t>(r),
                       static_cast<uint32_t>(first_bad));
}

absl::Status Engine::AgreeControl(BucketPass& x) {
  const EngineBucket* b = x.b;
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
      collective_, {b->id, x.step, b->elements, b->compressor, policy, exchange}, &x.control);
  if (status.ok() && x.control.dead_trainer != 0) {
    status =
        DeadTrainerError(absl::StrCat("bucket ", b->id, " step ", x.step), x.control.dead_trainer);
  }
  if (status.ok() && !x.inputs.ok()) status = x.inputs;
  if (status.ok() && x.control.inputs_failed) {
    status =
        absl::UnavailableError(absl::StrCat("bucket ", b->id, " step ", x.step,
                                            ": another node could not read its trainers' inputs "
                                            "(device event failure); see that node's log"));
  }
  x.lap(Phase::kCollective);
  return status;
}

bool Engine::SkipNonfinite(BucketPass& x) {
  // The word is the same on every node, so all decide alike before any collective of the step;
  // a skipped step leaves the residual (acc) and the compressor as they were, and the bucket
  // goes on.
  if (!x.status.ok() || x.control.nonfinite == 0) return false;
  EngineBucket* b = x.b;
  if (b->policy.nonfinite == NonfinitePolicy::kError) {
    x.status = NonfiniteSkipError(b->id, x.step, x.control.nonfinite, "");
    return true;
  }
  // propagate: NaN across the bucket on every trainer of every node (a dense bucket runs its
  // step: the all-reduce puts the NaN/Inf where an input had one).
  if (b->ex.sparse == nullptr) return false;
  x.status = FillNonfinite(b);
  return true;
}

absl::Status Engine::FillNonfinite(EngineBucket* b) {
  absl::Status s =
      prims_->Fill(b->mem.view.output, std::numeric_limits<float>::quiet_NaN(), b->elements);
  b->ex.sparse->output_dense = true;
  b->ex.sparse->touched.clear();
  return s;
}

absl::Status Engine::RunStep(BucketPass& x) {
  EngineBucket* b = x.b;
  double density;
  {
    absl::MutexLock lock(&mu_);
    ApplyDensityLocked(x.control.density_key);
    density = b->out.density;
  }
  // The compressor and the probe see the compute step (a restored bucket's base added).
  const uint64_t step = x.step + b->ex.step_base;
  if (b->ex.model_pending) {  // --auto_decide=model: every node decides alike, now
    std::string why =
        DecideByModel(collective_, options_, density, &model_link_, &model_link_asked_, b);
    absl::MutexLock lock(&mu_);
    if (!why.empty()) b->out.exchange_choice = std::move(why);
  }
  const bool sparse = b->ex.sparse != nullptr && UseSparse(b, step, x.control);
  if (sparse && b->ex.allreduce_probe) ChooseSparseAllreduce(b, x.control);
  // The local sum (WaitAndReduce's) goes ahead; a failure of it comes in as the item's status.
  StepItem item{&b->mem.view, b->ex.sparse.get(), step, density, &x.rec, x.reduced};
  if (x.reduced.ok()) CommitLocalSum(&b->mem.view);
  const uint64_t t_work = MonotonicNanos();
  if (sparse) {
    SparseStep(env_, absl::MakeSpan(&item, 1), x.lap);
  } else {
    DenseStep(env_, absl::MakeSpan(&item, 1), x.lap);
  }
  const uint64_t work_ns = MonotonicNanos() - t_work;
  if (b->ex.mode == BucketExchange::Mode::kProbe) {
    (sparse ? b->ex.probe_sparse_ns : b->ex.probe_dense_ns) += work_ns;
  }
  if (sparse && b->ex.allreduce_probe) {
    (b->ex.sparse->oktopk ? b->ex.probe_oktopk_ns : b->ex.probe_allgather_ns) += work_ns;
    ++b->ex.allreduce_probed;
  }
  x.rec.fell_back_to_dense = b->ex.sparse != nullptr && !sparse;
  // Device calls without a Status result (Accumulate, Scale) report failures here.
  if (absl::Status health = prims_->Health(); item.status.ok() && !health.ok()) {
    return absl::Status(health.code(),
                        absl::StrCat("device primitives failed: ", health.message()));
  }
  return item.status;
}

void Engine::CommitVote(BucketPass& x) {
  // Device path: the result made the trainers' output before the vote (rounded, its event
  // recorded on failure too, so no trainer waits on a stale record); the CPU path rounds at
  // publishing (PublishPass).
  x.status = io_.StepDone(x.b, x.status);
  if (!x.ran) return;
  // The commit vote: a step that failed on any node after the control round fails on every
  // node, and leaves the bucket's state (residual, compressor) unknown: terminal.
  char what[64];  // no allocation per exchange
  std::snprintf(what, sizeof(what), "bucket %llu step %llu",
                static_cast<unsigned long long>(x.b->id), static_cast<unsigned long long>(x.step));
  x.status = AgreeOnAllNodes(collective_, x.status, what);
  x.terminal = !x.status.ok();
  x.lap(Phase::kCollective);
}

void Engine::PublishPass(BucketPass& x) {
  x.rec.total_seconds = (MonotonicNanos() - x.t0) * 1e-9;
  const uint64_t t_publish = x.clock.last_ns();  // the timeline's phases stay contiguous
  // A half bucket's float32 result rounded once into the trainers' output (the CPU path; the
  // device path did it before its output event, CommitVote).
  x.status = io_.BeforePublish(x.b, x.status);
  Publish(x.b, x.step, x.status, x.rec, x.terminal);
  if (!x.observed) return;
  const uint64_t now = MonotonicNanos();
  x.rec.phase_seconds[static_cast<int>(Phase::kPublish)] += (now - t_publish) * 1e-9;
  NotifyObservers(&x.event, x.rec, x.status.code(), x.terminal, x.b->elements, x.t0, t_publish,
                  now);
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
  const std::string why =
      absl::StrCat(b->ex.mode == Mode::kSparse ? "sparse" : "dense", " by probing: sparse ",
                   control.sparse_us / options_.probe_steps, " us per exchange, dense ",
                   control.dense_us / options_.probe_steps, " us", b->ex.probe_note);
  SPEX_LOG(INFO) << "bucket " << b->id << ": " << b->compressor << " going " << why;
  {
    absl::MutexLock lock(&mu_);
    b->out.exchange_choice = why;
  }
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
  const std::string why =
      absl::StrCat(st.oktopk ? "oktopk" : "allgather", " by probing: allgather ",
                   control.allgather_us / options_.probe_steps, " us per exchange, oktopk ",
                   control.oktopk_us / options_.probe_steps, " us", b->ex.probe_note);
  SPEX_LOG(INFO) << "bucket " << b->id << ": " << b->compressor << " going " << why;
  absl::MutexLock lock(&mu_);
  if (b->out.exchange_choice.rfind("sparse by probing", 0) == 0) {
    b->out.exchange_choice = absl::StrCat(why, "; ", b->out.exchange_choice);
  } else {
    b->out.exchange_choice = why;
  }
}

}  // namespace spex
