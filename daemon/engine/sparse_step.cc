// The sparse step (see step.h). The sparse exchange's wire chunks, union and values are host
// memory (StepEnv::host_prims). On the CPU path acc and the output are host memory too. On the
// device path the compressor selects from the device's acc (copying back only its selection)
// and the exchange reads acc at the union and adds into the output on the device (uploading
// indices and values through the bucket's scratch slots): no whole-bucket copy.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "daemon/engine/step.h"

namespace spex {
namespace {

// x[idx] = 0 for host indices idx, in the bucket's memory (uploaded to slot 2 on the device).
absl::Status ZeroAt(const StepEnv& env, const BucketData& b, float* x,
                    const std::vector<uint32_t>& idx) {
  if (!b.on_device || idx.empty()) return env.prims->ZeroAt(x, b.elements, idx.data(), idx.size());
  absl::StatusOr<void*> d = b.scratch->Upload(2, idx.data(), idx.size() * 4);
  if (!d.ok()) return d.status();
  return env.prims->ZeroAt(x, b.elements, static_cast<const uint32_t*>(*d), idx.size());
}

// The values went out rounded to the bucket's wire type on the device path: what rounding took
// off stays in the device's residual, acc[idx[j]] += add[j] (the host computes add from values
// it holds; the pairs go up through the bucket's scratch and are scatter-added there).
absl::Status AddAtOnDevice(const StepEnv& env, const BucketData& b,
                           const std::vector<uint32_t>& idx, const std::vector<float>& add) {
  if (idx.empty()) return absl::OkStatus();
  const std::vector<size_t> runs = {0, idx.size()};
  return ScatterAddOnDevice(DeviceSide{env.prims, b.scratch}, b.acc,
                            static_cast<uint32_t>(b.elements), idx, add, runs);
}

// Pattern A with half values on the wire (`t`) on the device path: acc[u] -= round_t(acc[u]) at
// the union u, as FinishSparseExchange does on the host (a + (-r) is a - r exactly): acc at the
// union comes down, the negated roundings go up.
absl::Status KeepUnionRoundingOnDevice(const StepEnv& env, const BucketData& b, DType t,
                                       const std::vector<uint32_t>& u) {
  if (u.empty()) return absl::OkStatus();
  absl::StatusOr<void*> du = b.scratch->Upload(0, u.data(), u.size() * 4);
  if (!du.ok()) return du.status();
  absl::StatusOr<void*> dv = b.scratch->Get(1, u.size() * 4);
  if (!dv.ok()) return dv.status();
  absl::Status s = env.prims->Gather(b.acc, b.elements, static_cast<const uint32_t*>(*du), u.size(),
                                     static_cast<float*>(*dv));
  std::vector<float> v(u.size());
  if (s.ok()) s = env.prims->CopyToHost(v.data(), *dv, v.size() * 4);
  if (!s.ok()) return s;
  for (float& x : v) x = -HalfToFloat(t, FloatToHalf(t, x));
  return AddAtOnDevice(env, b, u, v);
}

// Pattern B's values went out rounded to `t` (a half bucket's type, float16 under
// --fp16_values): what rounding took off stays in the residual (error feedback keeps it, as it
// keeps what was not selected). Where one did not fit, the chunk went as float32 (ValuesWire):
// nothing was rounded, and the caller does not call this. On the device the selection zeroed acc
// there, so adding the remainders writes them.
absl::Status KeepSelectionRounding(const StepEnv& env, const BucketData& b, const Selection& sel,
                                   DType t) {
  if (!b.on_device) {  // one vector pass (kernels/half.h)
    half::KeepRounding(t, b.acc, sel.idx.data(), sel.val.data(), sel.idx.size());
    return absl::OkStatus();
  }
  std::vector<float> rem(sel.val.size());
  for (size_t j = 0; j < rem.size(); ++j) {
    rem[j] = sel.val[j] - HalfToFloat(t, FloatToHalf(t, sel.val[j]));
  }
  return AddAtOnDevice(env, b, sel.idx, rem);
}

// Pattern A on the host with its passes over the bucket fused (SparseExchangeArgs): the residual
// keeps the wire's rounding as acc is read at the union (a half wire, error feedback on, no
// local failure), and out is zeroed at `prev` (last step's union) as the average is written.
// Where the exchange left out untouched, `prev` is zeroed here; where the step fails after out
// was written, the union is kept as what to zero next (FinishSparseExchange takes it only on
// success).
absl::Status ExchangeIndexUnionFused(const StepEnv& env, const BucketData& b, SparseState& st,
                                     SparseExchangeArgs args, bool local_ok,
                                     const std::vector<uint32_t>& prev, SparseExchangeResult* res) {
  args.keep_rounding = local_ok && env.error_feedback;
  args.out_nonzero = &prev;
  absl::Status x =
      ExchangeIndexUnion(env.coll, env.host_prims, args, st.sel.idx, b.acc, b.output, res, nullptr);
  if (!res->out_replaced) {
    absl::Status z = ZeroAt(env, b, b.output, prev);
    if (x.ok()) x = std::move(z);
  } else if (!x.ok() || !local_ok) {
    st.touched = res->touched;
  }
  return x;
}

void SparseStepOne(const StepEnv& env, StepItem& item, const Lap& lap) {
  const int local = env.local_trainers, N = env.coll->size();
  BucketData& b = *item.data;
  SparseState& st = *item.sparse;
  Compressor& c = *st.compressor;
  const size_t n = b.elements;
  const uint64_t step = item.step;
  // The first local failure (the engine's local reduce's, when it ran it); the collectives are
  // issued regardless.
  absl::Status s = item.status;
  auto keep = [&s](absl::Status x) {
    if (s.ok() && !x.ok()) s = std::move(x);
  };
  // acc = residual + local sum (error feedback), or just the local sum: reduced before the step
  // (step.h: StepItem::status).
  lap(Phase::kReduceLocal);
  const Pattern pattern = c.pattern();
  Selection& sel = st.sel;
  if (s.ok() && item.density != c.density()) keep(c.SetDensity(item.density));
  // Pattern B zeroes the residual at the selection as it selects; through Ok-Topk only what the
  // global selection kept is zeroed, after the exchange (the rest stays in the residual).
  const bool zero_selected = pattern == Pattern::kSparseGather && !st.oktopk;
  if (s.ok()) keep(c.Select(step, b.acc, /*add=*/nullptr, zero_selected, &sel));
  if (!s.ok()) {  // contribute nothing; the step fails everywhere at the commit vote
    sel.idx.clear();
    sel.val.clear();
  }
  lap(Phase::kCompress);
  // The output holds last step's result: zero only the positions written then (pattern A on the
  // host: the exchange does, in its pass that writes the new ones).
  const bool fuse_a = pattern == Pattern::kIndexUnion && !b.on_device;
  std::vector<uint32_t> prev;
  if (st.output_dense) {
    keep(env.prims->Fill(b.output, 0.0f, n));
    st.output_dense = false;
  } else if (fuse_a) {
    prev.swap(st.touched);
  } else if (!st.touched.empty()) {
    keep(ZeroAt(env, b, b.output, st.touched));
  }
  SparseExchangeArgs args;
  args.group_id = b.id;
  args.step = step;
  args.elements = static_cast<uint32_t>(n);
  args.scale = 1.0f / static_cast<float>(N * local);
  args.fp16 = env.fp16_values;
  args.index_encoding = env.index_encoding;
  // A half bucket's own type (Ok-Topk's reduce-scatter too, docs/dtypes.md), float16 for a
  // float32 bucket under --fp16_values (A's values at the union, B's chunks), else float32.
  args.wire = SparseValuesWire(env, b);
  std::memcpy(args.scalars, sel.scalars, sizeof(args.scalars));
  DeviceSide device_side{env.prims, b.scratch};
  const DeviceSide* dev = b.on_device ? &device_side : nullptr;
  SparseExchangeResult res;
  absl::Status x;
  if (fuse_a) {
    x = ExchangeIndexUnionFused(env, b, st, args, s.ok(), prev, &res);
  } else if (pattern == Pattern::kIndexUnion) {
    x = ExchangeIndexUnion(env.coll, env.host_prims, args, sel.idx, b.acc, b.output, &res, dev);
  } else if (st.oktopk) {
    // The selection and the exchange are host memory; on the device path only the kept
    // entries go up (into the output) and the kept indices (into the residual). Update then
    // gets Gathered::reduced (counts and the sorted kept indices), which no compressor of
    // OkTopkCompressorNames reads; the stats' gathered elements are the kept entries.
    OkTopkOptions o = st.oktopk_options;
    o.k = std::max<uint64_t>(1, static_cast<uint64_t>(item.density * static_cast<double>(n)));
    OkTopkResult ok;
    x = ExchangeOkTopk(env.coll, env.host_prims, args, o, &st.oktopk_state, sel.idx, sel.val,
                       b.output, &ok, dev);
    // Error feedback: the residual is zeroed where this node's selection was kept globally
    // (with global "all", its whole selection); the rest of what it sent stays. Half values on
    // the wire: where kept, what rounding took off stays instead of 0 (acc still holds the
    // selected values there: Ok-Topk selects without zeroing); sent as float32 because one did
    // not fit (ValuesWire), nothing was rounded: zeroed.
    if (x.ok() && s.ok() && IsHalf(ok.values_sent) && env.error_feedback) {
      if (!b.on_device) {
        half::KeepRounding(ok.values_sent, b.acc, ok.my_kept.data(), nullptr, ok.my_kept.size());
      } else {
        x = KeepUnionRoundingOnDevice(env, b, ok.values_sent, ok.my_kept);
      }
    } else if (x.ok() && s.ok()) {
      x = ZeroAt(env, b, b.acc, ok.my_kept);
    }
    res = std::move(ok);
  } else {
    x = ExchangeSparseGather(env.coll, env.host_prims, args, sel.idx, sel.val, b.output, &res, dev);
    if (x.ok() && s.ok() && zero_selected && env.error_feedback && IsHalf(res.values_sent)) {
      x = KeepSelectionRounding(env, b, sel, res.values_sent);
    }
  }
  keep(x);
  lap(Phase::kCollective);
  FinishSparseExchange(env, item, std::move(s), &res, lap);
}

}  // namespace

void FinishSparseExchange(const StepEnv& env, StepItem& item, absl::Status s,
                          SparseExchangeResult* res, const Lap& lap) {
  auto keep = [&s](absl::Status x) {
    if (s.ok() && !x.ok()) s = std::move(x);
  };
  BucketData& b = *item.data;
  SparseState& st = *item.sparse;
  Compressor& c = *st.compressor;
  const Pattern pattern = c.pattern();
  const size_t n = b.elements;
  const uint64_t step = item.step;
  ExchangeRecord& rec = *item.rec;
  rec.pattern = PatternName(pattern);
  if (pattern == Pattern::kSparseGather) rec.sparse_allreduce = st.oktopk ? "oktopk" : "allgather";
  rec.target_density = item.density;
  rec.bytes_sent = res->bytes_sent;
  rec.bytes_received = res->bytes_received;
  if (!s.ok()) {
    item.status = std::move(s);
    return;
  }
  // The union's values went out rounded to a half type (a half bucket's own, float16 under
  // --fp16_values) unless the half exchange's result was not finite and they went again as
  // float32 (res->values_sent; sparse_exchange.h).
  const DType sent = res->values_sent;
  const bool rounded = IsHalf(sent);
  if (pattern == Pattern::kIndexUnion && res->residual_kept) {
    // The exchange's gather kept what rounding took off (ExchangeIndexUnionFused).
  } else if (pattern == Pattern::kIndexUnion && rounded && env.error_feedback && b.on_device) {
    keep(KeepUnionRoundingOnDevice(env, b, sent, res->gathered_idx));
  } else if (pattern == Pattern::kIndexUnion && rounded && env.error_feedback) {
    // All of it was sent, rounded to `sent`: what rounding took off stays (one
    // gather-convert-scatter pass, kernels/half.h).
    half::KeepRounding(sent, b.acc, res->gathered_idx.data(), nullptr, res->gathered_idx.size());
  } else if (pattern == Pattern::kIndexUnion) {
    // Every node zeroes its residual at the whole union: all of it was sent.
    keep(ZeroAt(env, b, b.acc, res->gathered_idx));
  }
  if (!env.error_feedback) keep(env.prims->Fill(b.acc, 0.0f, n));
  if (s.ok()) {
    Gathered g;
    g.counts = absl::MakeConstSpan(res->counts);
    g.indices = absl::MakeConstSpan(res->gathered_idx);
    g.reduced = st.oktopk && pattern == Pattern::kSparseGather;
    keep(c.Update(step, g));
  }
  st.touched = std::move(res->touched);
  lap(Phase::kDecode);
  rec.selected_elements = st.sel.idx.size();
  rec.achieved_density = static_cast<double>(st.sel.idx.size()) / n;
  rec.gathered_elements =
      pattern == Pattern::kIndexUnion ? st.touched.size() : res->gathered_idx.size();
  if (env.residual_norm_every > 0 && step % env.residual_norm_every == 0) {
    // Without the log moments (Moments computes them: 3-4x the time of this pass); the same
    // sum of squares bit for bit.
    st.last_residual_norm =
        std::sqrt(env.prims->AccumulateMoments(b.acc, nullptr, n, -1.0f, /*logs=*/false).sum_sq);
    st.last_residual_norm_step = step;
  }
  rec.residual_norm = st.last_residual_norm;
  rec.residual_norm_step = st.last_residual_norm_step;
  item.status = std::move(s);
}

void SparseStep(const StepEnv& env, absl::Span<StepItem> group, const Lap& lap) {
  for (StepItem& item : group) SparseStepOne(env, item, lap);
}

}  // namespace spex
