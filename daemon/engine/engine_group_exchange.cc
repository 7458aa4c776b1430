// The merge-group path of the engine thread (--merger other than none): one group's exchange
// as a sequence of stages (ProcessGroup), each taking the group's pass (engine_passes.h), up to
// the packs it hands to the wire stage (engine_wire_stage.cc); the selection-behind groups and a
// measuring merger's plan agreement.
#include <algorithm>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/engine_passes.h"
#include "daemon/engine/group_round.h"
#include "daemon/util/log.h"
#include "proto/contract/futex.h"

namespace spex {

void Engine::ProcessGroup(const std::vector<EngineBucket*>& group,
                          const std::vector<MergeCandidate>& candidates, bool agreed) {
  GroupPass x(group, candidates, agreed);
  GatherGroupInputs(x);
  ReduceGroup(x);
  AgreeGroup(x);
  ReturnUnagreed(x);
  SkipNonfiniteMembers(x);
  if (x.status.ok()) PackAndHandOff(x);
  SPEX_LOG(DEBUG) << "merge group of " << x.m << " bucket(s) starting at bucket " << group[0]->id;
  PublishUnpacked(x);
}

void Engine::GatherGroupInputs(GroupPass& x) {
  const size_t window = std::min<size_t>(options_.merge.limits.window, kGroupRoundMaxWindow);
  x.offered = std::min(x.group.size(), window);
  x.registrations.resize(x.offered);
  {
    absl::MutexLock lock(&mu_);
    x.in.density_key = density_key_;
    for (size_t i = 0; i < x.offered; ++i) x.registrations[i] = x.group[i]->out.registrations;
    for (size_t i = 0; i < x.offered && x.in.dead_trainer == 0; ++i) {
      const uint64_t dead = dead_mask_ & x.group[i]->out.registered_mask;
      if (dead != 0) x.in.dead_trainer = dead_word_[__builtin_ctzll(dead)];
    }
  }
  x.in.inputs_failed = x.in.dead_trainer != 0;
  x.lap(Phase::kWaitLocal);
}

void Engine::ReduceGroup(GroupPass& x) {
  // The local reduce with the finite check, before the round (as on the per-bucket path). An
  // agreed merger offers only up to the first member with a non-finite input, and that member
  // only as the head, alone: so a non-finite word in the round always means the group's head
  // (m is then 1), alike on every node. A static plan offers its whole group; a non-finite input
  // anywhere in it applies the policy to every member.
  x.reduced.resize(x.offered);
  if (x.in.inputs_failed) return;
  for (size_t i = 0; i < x.offered; ++i) {
    const EngineBucket* b = x.group[i];
    size_t first_bad = b->elements;
    x.reduced[i] = ReduceMember(x, i, &first_bad);
    if (!x.reduced[i].ok() || first_bad >= b->elements) continue;
    if (x.agreed && i > 0) {  // deferred: it heads a later group
      x.offered = i;
      break;
    }
    if (x.in.nonfinite == 0) {
      x.in.nonfinite = NonfiniteWordFor(b, first_bad);
      x.in.nonfinite_member = static_cast<uint32_t>(i);
    }
    if (x.agreed) {
      x.offered = 1;
      break;
    }
  }
  x.lap(Phase::kReduceLocal);
}

absl::Status Engine::ReduceMember(GroupPass& x, size_t i, size_t* first_bad) {
  // A member an earlier round reduced but left for a later group still has its sum in place
  // (nothing touches a waiting bucket's sum, and its inputs stay as they were until it is
  // published): that reduce is not done again. Under an agreed merger a node whose trainers are
  // ahead offers more than the round agrees on, every round, so this matters under skew.
  EngineBucket* b = x.group[i];
  if (b->ex.reduced_step == b->ex.next_step && b->ex.reduced_registrations == x.registrations[i]) {
    *first_bad = b->ex.reduced_first_bad;
    reduces_reused_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  absl::Status s = ReduceLocal(b, /*half_in_output=*/false, first_bad);
  if (s.ok()) {
    b->ex.reduced_step = b->ex.next_step;
    b->ex.reduced_registrations = x.registrations[i];
    b->ex.reduced_first_bad = *first_bad;
  }
  return s;
}

void Engine::AgreeGroup(GroupPass& x) {
  std::vector<GroupMemberKey> keys(x.offered);
  for (size_t i = 0; i < x.offered; ++i) {
    const EngineBucket* b = x.group[i];
    const MergeKind kind = x.candidates[i].kind;
    keys[i] = {b->id,       b->ex.next_step,
               b->elements, b->compressor,
               kind,        options_.fp16_values && kind == MergeKind::kPatternB};
  }
  const EngineBucket* head = x.group[0];
  const MergePlanner* planner = merger_->planner();
  x.in.plan_due = planner != nullptr && planner->PlanDue(head->ex.next_step);
  x.in.config = {merger_->name(), options_.merge.limits.window,
                 options_.merge.limits.max_group_elements, merger_->ConfigHash(), overlapping()};
  x.in.offer = keys;
  x.in.exact = !x.agreed;
  x.status = RunGroupRound(collective_, x.in, &x.res);
  x.in.offer = {};  // `keys` ends here
  x.lap(Phase::kCollective);
  // A failed round (nodes configured differently, a different bucket order) fails the head
  // only, as the per-bucket control round does: the offers' lengths may differ between nodes, so
  // every node goes on with one round per bucket, in step.
  x.m = x.status.ok() ? std::min(x.res.agreed, x.offered) : 1;
  if (x.status.ok() && x.res.dead_trainer != 0) {
    x.status = DeadTrainerError(
        absl::StrCat("merge group starting at bucket ", head->id, " step ", head->ex.next_step),
        x.res.dead_trainer);
  }
  if (x.status.ok() && x.res.inputs_failed) {
    x.status = absl::UnavailableError(
        absl::StrCat("merge group starting at bucket ", head->id, " step ", head->ex.next_step,
                     ": another node could not read its trainers' inputs"));
  }
  x.st.assign(x.m, x.status);
  x.run.assign(x.m, x.status.ok());
  x.packed.assign(x.m, false);
  x.group_of.assign(x.m, 0);
}

void Engine::ReturnUnagreed(GroupPass& x) {
  // Members offered past the agreed m go back to waiting (their reduce is redone next time,
  // unless ReduceMember finds its sum still in place).
  if (x.m >= x.group.size()) return;
  absl::MutexLock lock(&mu_);
  for (size_t i = x.m; i < x.group.size(); ++i) {
    EngineBucket* b = x.group[i];
    if (b->out.state == BucketState::kExchanging) {
      const bool full = b->out.registered_mask == (1ull << options_.local_trainers) - 1;
      b->MoveTo(full ? BucketState::kWaiting : BucketState::kRegistering);
    }
  }
}

void Engine::SkipNonfiniteMembers(GroupPass& x) {
  if (!x.status.ok() || x.res.nonfinite == 0) return;
  for (size_t i = 0; i < x.m; ++i) {
    EngineBucket* b = x.group[i];
    if (b->policy.nonfinite == NonfinitePolicy::kError) {
      x.run[i] = false;
      x.st[i] = NonfiniteSkipError(b->id, b->ex.next_step, x.res.nonfinite,
                                   x.agreed ? "" : " in its merge group");
    } else if (b->ex.sparse != nullptr) {
      x.run[i] = false;
      x.st[i] = FillNonfinite(b);
    }
  }
}

void Engine::PackAndHandOff(GroupPass& x) {
  std::vector<double> density(x.m);
  {
    absl::MutexLock lock(&mu_);
    ApplyDensityLocked(x.res.density_key);
    for (size_t i = 0; i < x.m; ++i) density[i] = x.group[i]->out.density;
  }
  if (x.res.plan_due) AgreePlan(x.group[0]->ex.next_step, density[0]);
  const std::vector<size_t> packs =
      x.agreed ? merger_->Pack(absl::MakeConstSpan(x.candidates.data(), x.m))
               : std::vector<size_t>{x.m};
  size_t first = 0;
  uint64_t local_since = x.t0;  // this pack's local work began (the round, for the first)
  for (size_t len : packs) {
    std::unique_ptr<WirePack> p = BuildPack(x, first, len, density);
    first += len;
    if (!p->items.empty()) SendPack(x, std::move(p), &local_since);
  }
}

std::unique_ptr<Engine::WirePack> Engine::BuildPack(GroupPass& x, size_t first, size_t len,
                                                    const std::vector<double>& density) {
  auto p = std::make_unique<WirePack>();
  p->t0 = x.t0;
  std::copy(x.phase, x.phase + kPhaseCount, p->phase);
  std::copy(x.phase_cpu, x.phase_cpu + kPhaseCount, p->phase_cpu);
  std::vector<size_t> at;  // the members that run
  for (size_t i = first; i < first + len && i < x.m; ++i) {
    x.group_of[i] = first;
    if (x.run[i]) at.push_back(i);
  }
  p->group_first = x.group[first]->id;
  p->group_size = static_cast<uint32_t>(std::min(first + len, x.m) - first);
  p->recs.resize(at.size());
  p->items.reserve(at.size());
  for (size_t j = 0; j < at.size(); ++j) {
    const size_t i = at[j];
    EngineBucket* b = x.group[i];
    const MergeKind kind = x.candidates[i].kind;
    ExchangeRecord& rec = p->recs[j];
    rec.bucket_id = b->id;
    rec.step = b->ex.next_step;
    rec.compressor = b->compressor;
    rec.fell_back_to_dense = b->ex.sparse != nullptr && kind == MergeKind::kDense;
    if (x.reduced[i].ok()) CommitLocalSum(&b->mem.view);
    b->ex.reduced_step = UINT64_MAX;
    p->buckets.push_back(b);
    p->elements += b->elements;
    p->items.push_back(
        {&b->mem.view, b->ex.sparse.get(), b->ex.compute_step(), density[i], &rec, x.reduced[i]});
    p->kinds.push_back(kind);
    x.packed[i] = true;
  }
  return p;
}

void Engine::SendPack(GroupPass& x, std::unique_ptr<WirePack> p, uint64_t* local_since) {
  // The local half here, on the engine thread; the wire half in RunPack.
  PhaseClock clock(p->phase, p->phase_cpu, nullptr, MonotonicNanos());
  FusedScratch* scratch = &fused_scratch_[next_scratch_];
  next_scratch_ ^= 1;
  // Selection behind (a static plan's group of one compressor): the whole step on the wire
  // stage; otherwise the local half here.
  if (!x.agreed && merger_->behind()) p->behind = BehindFor(p.get());
  if (p->behind == nullptr) {
    p->fx.Prepare(env_, absl::MakeSpan(p->items), p->kinds, scratch, clock.AsLap());
  }
  MergeMeter* meter = merger_->meter();
  if (meter != nullptr && meter->measures()) {
    for (size_t j = 0; j < p->items.size(); ++j) {
      const EngineBucket* b = p->buckets[j];
      int64_t ready = b->ReadyStamp(options_.local_trainers);  // docs/merging.md 2.6
      // Without stamps (an older client): when this engine took the group, late by up to
      // what it was busy with before.
      if (ready == 0) ready = static_cast<int64_t>(x.t0);
      meter->ObserveMember(b->id, p->recs[j].step, ready, p->items[j].select_ns);
    }
  }
  const uint64_t elements = p->elements;
  const int64_t local_ns = static_cast<int64_t>(MonotonicNanos() - *local_since);
  HandOff(std::move(p));
  *local_since = MonotonicNanos();  // on the wire from now (with --merge_overlap)
  if (overlapping() && meter != nullptr) {
    meter->PackHandedOff(elements, local_ns, static_cast<int64_t>(*local_since));
  }
}

void Engine::PublishUnpacked(GroupPass& x) {
  // The members no pack publishes: their results do not wait for the wire (and what observers
  // see stays on one thread at a time).
  if (std::find(x.packed.begin(), x.packed.end(), false) == x.packed.end()) return;
  DrainWire();
  const uint64_t end = MonotonicNanos();
  for (size_t i = 0; i < x.m; ++i) {
    if (x.packed[i]) continue;
    EngineBucket* b = x.group[i];
    ExchangeRecord rec;
    rec.bucket_id = b->id;
    rec.step = b->ex.next_step;
    rec.compressor = b->compressor;
    for (int p = 0; p < kPhaseCount; ++p) {
      rec.phase_seconds[p] = x.phase[p];
      rec.phase_cpu_seconds[p] = x.phase_cpu[p];
    }
    rec.total_seconds = (end - x.t0) * 1e-9;
    // A half member's float32 result rounded once into the trainers' output (step.h).
    x.st[i] = io_.BeforePublish(b, x.st[i]);
    Publish(b, b->ex.next_step, x.st[i], rec, /*terminal=*/false);
    if (options_.observers.empty()) continue;
    ExchangeEvent event;
    event.group_first = x.group[x.group_of[i]]->id;
    size_t n = 0;
    for (size_t j = x.group_of[i]; j < x.m && x.group_of[j] == x.group_of[i]; ++j) ++n;
    event.group_size = static_cast<uint32_t>(n);
    NotifyObservers(&event, rec, x.st[i].code(), /*terminal=*/false, b->elements, x.t0, end,
                    MonotonicNanos());
  }
}

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

void Engine::AgreePlan(uint64_t step, double density) {
  // Every node runs the agreement's collectives once any node asked; only a merger that plans
  // brings inputs and takes the plan (the group round's configuration hash keeps mergers equal).
  MergePlanner* planner = merger_->planner();
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
  std::vector<uint64_t> words;
  if (planner != nullptr) words = planner->PlanInputs(buckets);
  absl::Status s = RunPlanAgreement(collective_, buckets, &words);
  if (planner == nullptr) return;
  if (!s.ok()) {
    SPEX_LOG(WARNING) << "--merger=" << merger_->name() << ": no plan (" << s.message()
                      << "); it keeps merging what is ready";
    planner->AbandonPlan(std::string(s.message()));
    return;
  }
  PlanContext ctx;
  ctx.nodes = collective_->size();
  ctx.density = density;
  planner->InstallPlan(buckets, words, step, ctx);
  SPEX_LOG(INFO) << "--merger=" << merger_->name() << ": plan over " << buckets.size()
                 << " buckets agreed at step " << step << " (effective from step " << step + 1
                 << "): " << planner->PlanSummary();
}

}  // namespace spex
