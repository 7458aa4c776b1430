// The fused exchange, selection behind (see fused_behind_step.h), as named stages over the group:
// CheckMembers (the static checks) -> GatherMembers (each member's local sum and residual into
// the group's accumulator) -> SelectGroup -> ExchangeGroup (one sparse exchange) -> UpdateGroup
// (residual at the union, Update) -> SplitBack (each member's slice of the result and residual,
// and its record). A local failure is kept and every collective is still issued.
#include "daemon/engine/fused_behind_step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/sparse_exchange.h"

namespace spex {
namespace {

void Keep(absl::Status* s, absl::Status x) {
  if (s->ok() && !x.ok()) *s = std::move(x);
}

// The static checks (agreed inputs: every node reaches the same verdict).
absl::Status CheckMembers(const BehindGroup& g, absl::Span<const StepItem> group) {
  if (group.size() != g.ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("behind step: ", group.size(), " items for a group of ", g.ids.size()));
  }
  for (size_t i = 0; i < group.size(); ++i) {
    const StepItem& item = group[i];
    const BucketData& b = *item.data;
    if (b.id != g.ids[i] || b.elements != g.offsets[i + 1] - g.offsets[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "behind step: item ", i, " is bucket ", b.id, " (", b.elements,
          " elements), but the group's member there is bucket ", g.ids[i], " (",
          g.offsets[i + 1] - g.offsets[i], " elements); a behind group's plan never changes"));
    }
    if (item.step != group[0].step) {
      return absl::InvalidArgumentError(absl::StrCat("behind step: bucket ", b.id, " is at step ",
                                                     item.step, ", the group's head at step ",
                                                     group[0].step));
    }
    if (b.on_device || b.acc == nullptr || g.sparse.oktopk) {
      return absl::InvalidArgumentError(absl::StrCat(
          "behind step: bucket ", b.id,
          b.on_device        ? " is device memory; behind groups are host memory only"
          : b.acc == nullptr ? " has no accumulator (a dense-only bucket)"
                             : ": behind groups exchange through the all-gather, not Ok-Topk"));
    }
  }
  return absl::OkStatus();
}

// Each member's acc = its residual + its local sum (error feedback), or just the local sum,
// reduced before the step as for SparseStep, copied into the member's slice of the group's
// accumulator.
void GatherMembers(const StepEnv& env, BehindGroup* g, absl::Span<StepItem> group,
                   absl::Status* s) {
  for (size_t i = 0; i < group.size(); ++i) {
    BucketData& b = *group[i].data;
    Keep(s, env.host_prims->Copy(g->acc.data() + g->offsets[i], b.acc, b.elements));
  }
}

// One Select over the whole accumulator at the head's density (nothing selected after a
// failure, so the exchange still takes part with an empty contribution).
void SelectGroup(BehindGroup* g, double density, uint64_t step, absl::Status* s) {
  Compressor& c = *g->sparse.compressor;
  Selection& sel = g->sparse.sel;
  if (s->ok() && density != c.density()) Keep(s, c.SetDensity(density));
  if (s->ok()) {
    Keep(s, c.Select(step, g->acc.data(), /*add=*/nullptr, c.pattern() == Pattern::kSparseGather,
                     &sel));
  }
  if (!s->ok()) {
    sel.idx.clear();
    sel.val.clear();
  }
}

// The group's output cleared where the last step wrote it, then one exchange by the compressor's
// pattern (A or B) under the group's id.
void ExchangeGroup(const StepEnv& env, BehindGroup* g, uint64_t step, absl::Status* s,
                   SparseExchangeResult* res) {
  SparseState& st = g->sparse;
  const size_t n = g->elements;
  if (st.output_dense) {
    Keep(s, env.host_prims->Fill(g->out.data(), 0.0f, n));
    st.output_dense = false;
  } else if (!st.touched.empty()) {
    Keep(s, env.host_prims->ZeroAt(g->out.data(), n, st.touched.data(), st.touched.size()));
  }
  const Selection& sel = st.sel;
  SparseExchangeArgs args;
  args.group_id = g->group_id;
  args.step = step;
  args.elements = static_cast<uint32_t>(n);
  args.scale = 1.0f / static_cast<float>(env.coll->size() * env.local_trainers);
  args.fp16 = env.fp16_values;
  args.wire = env.fp16_values ? DType::kFloat16 : DType::kFloat32;  // A's values at the union too
  args.index_encoding = env.index_encoding;
  std::memcpy(args.scalars, sel.scalars, sizeof(args.scalars));
  Keep(s, st.compressor->pattern() == Pattern::kIndexUnion
              ? ExchangeIndexUnion(env.coll, env.host_prims, args, sel.idx, g->acc.data(),
                                   g->out.data(), res)
              : ExchangeSparseGather(env.coll, env.host_prims, args, sel.idx, sel.val,
                                     g->out.data(), res));
}

// The residual after the exchange (zeroed at the whole union for A: all of it was sent; all of
// it without error feedback; where the values went out as float16, --fp16_values, what rounding
// took off stays, as in SparseStep) and the compressor's Update on the gathered counts.
void UpdateGroup(const StepEnv& env, BehindGroup* g, uint64_t step, absl::Status* s,
                 SparseExchangeResult* res) {
  SparseState& st = g->sparse;
  const size_t n = g->elements;
  const bool rounded = env.error_feedback && IsHalf(res->values_sent);
  if (s->ok() && st.compressor->pattern() == Pattern::kIndexUnion && rounded) {
    half::KeepRounding(res->values_sent, g->acc.data(), res->gathered_idx.data(), nullptr,
                       res->gathered_idx.size());
  } else if (s->ok() && st.compressor->pattern() == Pattern::kIndexUnion) {
    Keep(s, env.host_prims->ZeroAt(g->acc.data(), n, res->gathered_idx.data(),
                                   res->gathered_idx.size()));
  } else if (s->ok() && rounded) {  // B: the selection zeroed acc there
    half::KeepRounding(res->values_sent, g->acc.data(), st.sel.idx.data(), st.sel.val.data(),
                       st.sel.idx.size());
  }
  if (s->ok() && !env.error_feedback) Keep(s, env.host_prims->Fill(g->acc.data(), 0.0f, n));
  if (s->ok()) {
    Gathered gathered;
    gathered.counts = absl::MakeConstSpan(res->counts);
    gathered.indices = absl::MakeConstSpan(res->gathered_idx);
    Keep(s, st.compressor->Update(step, gathered));
  }
  st.touched = std::move(res->touched);
}

// Each member's output is its slice of the group's result, and its residual goes back to it (it
// stays with its bucket whatever groups come next); each record counts the member's own slice.
void SplitBack(const StepEnv& env, const BehindGroup& g, absl::Span<StepItem> group, uint64_t step,
               const SparseExchangeResult& res, absl::Status* s) {
  const SparseState& st = g.sparse;
  const Pattern pattern = st.compressor->pattern();
  const bool norm = env.residual_norm_every > 0 && step % env.residual_norm_every == 0;
  for (size_t i = 0; i < group.size(); ++i) {
    StepItem& item = group[i];
    BucketData& b = *item.data;
    const size_t lo = g.offsets[i], hi = g.offsets[i + 1];
    if (s->ok()) Keep(s, env.prims->Copy(b.output, g.out.data() + lo, hi - lo));
    if (s->ok()) Keep(s, env.host_prims->Copy(b.acc, g.acc.data() + lo, hi - lo));
    ExchangeRecord& rec = *item.rec;
    rec.pattern = PatternName(pattern);
    if (pattern == Pattern::kSparseGather) rec.sparse_allreduce = "allgather";
    rec.target_density = item.density;
    rec.bytes_sent = i == 0 ? res.bytes_sent : 0;  // one chunk carries the whole group
    rec.bytes_received = i == 0 ? res.bytes_received : 0;
    const auto in_slice = [lo, hi](const std::vector<uint32_t>& v) {
      return static_cast<size_t>(std::lower_bound(v.begin(), v.end(), hi) -
                                 std::lower_bound(v.begin(), v.end(), lo));
    };
    rec.selected_elements = in_slice(st.sel.idx);
    rec.achieved_density = static_cast<double>(rec.selected_elements) / (hi - lo);
    rec.gathered_elements = in_slice(st.touched);
    if (item.sparse == nullptr) continue;
    if (norm && s->ok()) {
      item.sparse->last_residual_norm =
          std::sqrt(env.host_prims
                        ->AccumulateMoments(const_cast<float*>(g.acc.data()) + lo, /*add=*/nullptr,
                                            hi - lo, -1.0f, /*logs=*/false)  // only reads
                        .sum_sq);
      item.sparse->last_residual_norm_step = step;
    }
    rec.residual_norm = item.sparse->last_residual_norm;
    rec.residual_norm_step = item.sparse->last_residual_norm_step;
    // The whole output was written: a later step of the member's own zeroes all of it.
    item.sparse->output_dense = true;
    item.sparse->touched.clear();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<BehindGroup>> MakeBehindGroup(
    absl::Span<const BucketData* const> members, CompressorSpec spec, Primitives* prims) {
  if (members.empty()) return absl::InvalidArgumentError("behind group: no members");
  auto g = std::make_unique<BehindGroup>();
  g->group_id = (uint64_t{1} << 63) | members[0]->id;
  for (const BucketData* m : members) {
    g->ids.push_back(m->id);
    g->offsets.push_back(g->elements);
    g->elements += m->elements;
  }
  g->offsets.push_back(g->elements);
  if (g->elements > 0xffffffffu) {
    return absl::InvalidArgumentError(absl::StrCat(
        "behind group starting at bucket ", members[0]->id, ": ", g->elements,
        " elements; a group exchanged as one bucket holds fewer than 2^32 (the wire's field)"));
  }
  spec.elements = g->elements;
  absl::StatusOr<std::unique_ptr<Compressor>> c = MakeCompressor(spec, prims);
  if (!c.ok()) return c.status();
  g->sparse.compressor = std::move(*c);
  g->acc.assign(g->elements, 0.0f);
  g->out.assign(g->elements, 0.0f);
  return g;
}

void FusedBehindStep(const StepEnv& env, BehindGroup* g, absl::Span<StepItem> group,
                     const Lap& lap) {
  if (absl::Status bad = CheckMembers(*g, group); !bad.ok()) {
    for (StepItem& item : group) item.status = bad;
    return;
  }
  if (group.empty()) return;
  const uint64_t step = group[0].step;
  absl::Status s;  // the first local failure; the collectives are issued regardless
  for (StepItem& item : group) Keep(&s, item.status);
  GatherMembers(env, g, group, &s);
  lap(Phase::kReduceLocal);
  SelectGroup(g, group[0].density, step, &s);
  lap(Phase::kCompress);
  SparseExchangeResult res;
  ExchangeGroup(env, g, step, &s, &res);
  lap(Phase::kCollective);
  UpdateGroup(env, g, step, &s, &res);
  SplitBack(env, *g, group, step, res, &s);
  lap(Phase::kDecode);
  for (StepItem& item : group) item.status = s;
}

}  // namespace spex
