// Deciding a bucket's exchange from the cost model (exchange_choice.h): the link's fit and
// agreement, the model's pick among the candidates, and the engine's hook that applies it.
#include "daemon/engine/exchange_choice.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "daemon/engine/bucket.h"
#include "daemon/engine/step.h"
#include "daemon/util/log.h"
#include "kernels/compressor.h"
#include "kernels/half.h"

namespace spex {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The fastest of `repeats` all-reduces of `bytes` (after one untimed), on this node.
absl::StatusOr<double> TimeAllReduce(Collective* coll, size_t bytes, int repeats) {
  std::vector<float> buf(std::max<size_t>(1, bytes / sizeof(float)), 1.0f);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i <= repeats; ++i) {
    const double t0 = Now();
    absl::Status s = coll->AllReduce(buf.data(), buf.size(), ElemType::kFloat32, ReduceOp::kSum);
    if (!s.ok()) return s;
    if (i > 0) best = std::min(best, Now() - t0);
  }
  return best;
}

std::string Ms(double s) { return absl::StrFormat("%.3g ms", s * 1e3); }

std::string LinkText(const LinkModel& l) {
  return absl::StrFormat("%.3g Gbit/s, %.3g us", l.bytes_per_s * 8e-9, l.latency_s * 1e6);
}

}  // namespace

absl::StatusOr<LinkModel> FitLink(int nodes, double small_bytes, double small_s, double large_bytes,
                                  double large_s) {
  if (nodes < 2) return absl::FailedPreconditionError("one node has no link to measure");
  // The model's all-reduce time is a x latency + b / rate for the algorithm of that size: read a
  // and b off the model itself, then solve the two equations.
  const LinkModel unit_latency{std::numeric_limits<double>::infinity(), 1.0};
  const LinkModel unit_rate{1.0, 0.0};
  const double as = AllReduceTime(unit_latency, nodes, small_bytes);
  const double bs = AllReduceTime(unit_rate, nodes, small_bytes);
  const double al = AllReduceTime(unit_latency, nodes, large_bytes);
  const double bl = AllReduceTime(unit_rate, nodes, large_bytes);
  const double det = as * bl - al * bs;
  double latency = det != 0 ? (small_s * bl - large_s * bs) / det : -1;
  double inv_rate = det != 0 ? (as * large_s - al * small_s) / det : -1;
  if (!(latency >= 0)) {  // noise on a fast link: no latency the small all-reduce can show
    latency = 0;
    inv_rate = large_s / bl;
  }
  if (!(inv_rate > 0) || !std::isfinite(inv_rate) || !std::isfinite(latency)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no positive link rate fits the measured all-reduces (%g bytes: %g s, %g bytes: %g s on "
        "%d nodes)",
        small_bytes, small_s, large_bytes, large_s, nodes));
  }
  return LinkModel{1.0 / inv_rate, latency};
}

absl::StatusOr<LinkModel> AgreeOnLink(Collective* coll, const EngineOptions& o) {
  const int nodes = coll->size();
  if (nodes < 2) return absl::FailedPreconditionError("one node: no link to model");
  // Declared: every node says what it was told; measured: every node its fastest times. Either
  // way the MAX all-reduce hands every node the same numbers (the slowest node's times, the
  // most pessimistic declaration).
  double v[4] = {o.link_gbps > 0 ? 1.0 : 0.0, 0, 0, 0};
  if (o.link_gbps > 0) {
    v[1] = 1.0 / (o.link_gbps * 1.25e8);  // seconds per byte
    v[2] = o.link_latency_us * 1e-6;
  } else {
    absl::StatusOr<double> small = TimeAllReduce(coll, kLinkSmallBytes, kLinkSmallRepeats);
    if (!small.ok()) return small.status();
    absl::StatusOr<double> large = TimeAllReduce(coll, kLinkLargeBytes, kLinkLargeRepeats);
    if (!large.ok()) return large.status();
    v[1] = *small;
    v[2] = *large;
  }
  v[3] = o.link_gbps > 0 ? 0.0 : 1.0;  // every node declared (MAX of "measured" is 0)
  if (absl::Status s = coll->AllReduce(v, 4, ElemType::kFloat64, ReduceOp::kMax); !s.ok()) return s;
  if (v[0] > 0 && v[3] > 0) {
    return absl::FailedPreconditionError(
        "some nodes declare the link (--link_gbps) and others measure it: set --link_gbps alike "
        "on every node");
  }
  if (v[0] > 0) return LinkModel{1.0 / v[1], v[2]};
  return FitLink(nodes, kLinkSmallBytes, v[1], kLinkLargeBytes, v[2]);
}

absl::StatusOr<ModelChoice> ChooseExchange(const LinkModel& link, const ChoiceInputs& in) {
  if (!in.dense && !in.allgather && !in.oktopk) {
    return absl::InvalidArgumentError("no exchange to choose from");
  }
  const uint64_t k = std::min<uint64_t>(
      in.elements,
      std::max<uint64_t>(1, static_cast<uint64_t>(std::floor(in.density * in.elements))));
  ExchangeShape shape;
  shape.nodes = in.nodes;
  shape.elements = in.elements;
  shape.k = k;
  shape.recompute_every = in.recompute_every;
  shape.value_bytes = in.dense_value_bytes;
  shape.index_bytes = in.delta_indices ? DeltaIndexBytes(in.elements, k) : 4.0;
  if (absl::Status s = CheckExchangeInputs(link, shape); !s.ok()) return s;
  ModelChoice out;
  out.costs = EstimateExchange(link, shape);
  if (in.sparse_value_bytes != in.dense_value_bytes) {  // the pairs' values differ (fp16_values)
    shape.value_bytes = in.sparse_value_bytes;
    if (absl::Status s = CheckExchangeInputs(link, shape); !s.ok()) return s;
    const ExchangeCosts sparse = EstimateExchange(link, shape);
    out.costs.allgather_s = sparse.allgather_s;
    out.costs.oktopk_s = sparse.oktopk_s;
  }
  const bool allowed[3] = {in.dense, in.allgather, in.oktopk};
  const ExchangeChoice order[3] = {ExchangeChoice::kDense, ExchangeChoice::kAllGather,
                                   ExchangeChoice::kOkTopk};
  bool any = false;
  std::string times;
  for (int i = 0; i < 3; ++i) {
    if (!allowed[i]) continue;
    if (!any || out.costs.Of(order[i]) < out.costs.Of(out.choice)) out.choice = order[i];
    any = true;
    absl::StrAppend(&times, times.empty() ? "" : ", ", ExchangeChoiceName(order[i]), " ",
                    Ms(out.costs.Of(order[i])));
  }
  for (int i = 0; i < 3; ++i) {
    out.close[i] =
        allowed[i] && out.costs.Of(order[i]) <= kModelCloseFactor * out.costs.Of(out.choice);
  }
  out.why = absl::StrCat(ExchangeChoiceName(out.choice), " by the cost model: ", times, " (link ",
                         LinkText(link), "; ", in.nodes, " nodes, ", in.elements, " elements, k ",
                         k, ")");
  return out;
}

namespace {

// DecideByModel's first stage: why the cost model cannot decide bucket `b` ("" when it can),
// agreeing on the link (once per engine: *link_asked) when nothing else stops it.
std::string WhatTheModelLacks(Collective* coll, const EngineOptions& o, const EngineBucket& b,
                              absl::StatusOr<LinkModel>* link, bool* link_asked) {
  const BucketExchange& ex = b.ex;
  const SparseState& st = *ex.sparse;
  std::string lacks;
  // What the model cannot cost: the bucket probes (every node alike: these are agreed inputs).
  if (coll->size() < 2) {
    lacks = "one node: no link to model";
  } else if (st.compressor->pattern() != Pattern::kSparseGather) {
    lacks = absl::StrCat("the cost model has no term for pattern ",
                         PatternName(st.compressor->pattern()), " (", b.compressor, ")");
  } else if ((ex.allreduce_probe || st.oktopk) && o.oktopk_global == OkTopkSelect::kAll) {
    lacks = "the cost model has no term for --oktopk_global=all";
  }
  if (lacks.empty()) {
    if (!*link_asked) {
      *link_asked = true;
      *link = AgreeOnLink(coll, o);
      if (link->ok()) {
        SPEX_LOG(INFO) << "link for the cost model: " << LinkText(**link)
                       << (o.link_gbps > 0 ? " (declared)" : " (measured)");
      } else {
        SPEX_LOG(WARNING) << "the cost model has no link (" << link->status().message()
                          << "): auto buckets probe";
      }
    }
    if (!link->ok()) lacks = absl::StrCat("no link: ", link->status().message());
  }
  return lacks;
}

}  // namespace

std::string DecideByModel(Collective* coll, const EngineOptions& o, double density,
                          absl::StatusOr<LinkModel>* link, bool* link_asked, EngineBucket* b) {
  BucketExchange& ex = b->ex;
  ex.model_pending = false;
  const bool open_dense = ex.mode == BucketExchange::Mode::kProbe;
  if (ex.sparse == nullptr || (!open_dense && !ex.allreduce_probe)) return "";
  SparseState& st = *ex.sparse;
  std::string lacks = WhatTheModelLacks(coll, o, *b, link, link_asked);
  ChoiceInputs in;
  if (lacks.empty()) {
    in.nodes = coll->size();
    in.elements = b->elements;
    in.density = density;
    in.dense_value_bytes = static_cast<int>(DTypeSize(b->mem.view.wire));
    in.sparse_value_bytes = o.fp16_values ? 2 : in.dense_value_bytes;
    in.delta_indices = o.index_encoding == IndexEncoding::kDelta;
    in.recompute_every = o.oktopk_recompute_every;
    in.dense = open_dense;
    in.allgather = ex.allreduce_probe || !st.oktopk;
    in.oktopk = ex.allreduce_probe || st.oktopk;
  }
  absl::StatusOr<ModelChoice> choice =
      lacks.empty() ? ChooseExchange(**link, in) : absl::FailedPreconditionError(lacks);
  // One all-reduce makes the verdict the same everywhere even if a node computed another (the
  // inputs are agreed, so it should not): every node takes the highest code any node chose.
  // The code: 0 none, else 1 + the choice + 3 x the close candidates' bits.
  int64_t code[2] = {0, 0};
  auto mine_code = [](const absl::StatusOr<ModelChoice>& c) -> int64_t {
    return c.ok() ? 1 + static_cast<int64_t>(c->choice) +
                        3 * (c->close[0] + 2 * c->close[1] + 4 * c->close[2])
                  : 0;
  };
  code[0] = mine_code(choice);
  if (lacks.empty()) {
    const int64_t mine = code[0];
    if (absl::Status s = coll->AllReduce(code, 1, ElemType::kInt64, ReduceOp::kMax); !s.ok()) {
      code[0] = 0;
      lacks = absl::StrCat("agreeing on the choice: ", s.message());
    } else if (code[0] != mine) {
      SPEX_LOG(WARNING) << "bucket " << b->id << ": another node's cost model chose otherwise; "
                        << "every node takes its choice";
    }
  }
  if (code[0] == 0) {
    if (lacks.empty()) lacks = std::string(choice.status().message());
    ex.probe_note = absl::StrCat(" (not the cost model: ", lacks, ")");
    SPEX_LOG(INFO) << "bucket " << b->id << ": probing" << ex.probe_note;
    return absl::StrCat("probing", ex.probe_note);
  }
  const auto picked = static_cast<ExchangeChoice>((code[0] - 1) % 3);
  const int close_bits = static_cast<int>((code[0] - 1) / 3);
  const bool close_dense = close_bits & 1, close_gather = close_bits & 2, close_ok = close_bits & 4;
  const int close = close_dense + close_gather + close_ok;
  std::string why = choice.ok() && code[0] == mine_code(choice)
                        ? choice->why
                        : absl::StrCat(ExchangeChoiceName(picked), " by another node's cost model");
  if (close <= 1) {  // decided
    if (open_dense) {
      ex.mode = picked == ExchangeChoice::kDense ? BucketExchange::Mode::kDense
                                                 : BucketExchange::Mode::kSparse;
    }
    if (picked != ExchangeChoice::kDense) st.oktopk = picked == ExchangeChoice::kOkTopk;
    ex.allreduce_probe = false;
    SPEX_LOG(INFO) << "bucket " << b->id << ": " << b->compressor << " going " << why;
    return why;
  }
  // Too close to call: what is not close is decided, the close ones are probed.
  if (!close_dense && open_dense) ex.mode = BucketExchange::Mode::kSparse;
  if (!(close_gather && close_ok)) {  // one sparse exchange is in: no choice between the two
    ex.allreduce_probe = false;
    st.oktopk = close_ok;
  }
  ex.probe_note = absl::StrCat(" (the cost model could not call it: ", why, ")");
  std::string probing = "probing";
  for (const auto& [is_close, name] :
       {std::make_pair(close_dense, "dense"), std::make_pair(close_gather, "allgather"),
        std::make_pair(close_ok, "oktopk")}) {
    if (is_close) absl::StrAppend(&probing, probing == "probing" ? " " : " against ", name);
  }
  absl::StrAppend(&probing, ex.probe_note);
  SPEX_LOG(INFO) << "bucket " << b->id << ": " << probing;
  return probing;
}

}  // namespace spex
