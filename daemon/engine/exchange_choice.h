// --sparse_allreduce=auto and --dense_fallback=auto deciding from the cost model
// (exchange_cost.h) instead of probing (--auto_decide=model, spexd's default). It exists so that a
// bucket exchanges the right way from its first step on a cluster of any size: probing pays
// 2 x --probe_steps exchanges of the slow candidates per bucket, and on hundreds of nodes a slow
// candidate (the all-gather at 1,024 nodes: ten times the ring) costs seconds per probe.
//
// The inputs are the same on every node, so every node decides alike: the link (rate and
// latency) measured once per engine by a few all-reduces that every node times (the slowest
// node's times, agreed by one MAX all-reduce) or declared (--link_gbps, --link_latency_us, also
// agreed by a MAX all-reduce), the node count P, the bucket's n and k = max(1, floor(density x n))
// (both agreed by the control round), its wire type and the flags. Where the model has no term for
// the bucket (pattern A compressors, --oktopk_global=all, one node) or the link could not be
// measured, the bucket probes as before, and the reason is in the log and in `spexctl stats`.
//
// What the model leaves out: the compressor's selection and the encoding (CPU time a sparse
// exchange pays and a dense one does not), oversubscribed fabrics, and skewed selections (Ok-Topk's
// busiest region is taken as the mean: skew 1). docs/scale.md#where-spex-picks.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/exchange_cost.h"
#include "daemon/transport/collective.h"

namespace spex {

struct EngineBucket;

// The link's measurement: two all-reduce sizes, each timed on every node after one untimed run,
// the fastest time kept. The large one stays below spexd's --mpi_passive_wait_min_bytes default
// (1 MiB), so under the default it waits inside MPI: a passive wait's sleeps would count as link
// time (at 100 Gbit/s the all-reduce itself takes well under a millisecond). The small one is
// timed more often: it costs microseconds, and the measurement runs at a bucket's first exchange,
// where the trainers may be computing beside the daemon; one preemption in every small run would
// make it look slower than the large one allows, and then no link fits and the buckets probe.
inline constexpr size_t kLinkSmallBytes = 64;
inline constexpr size_t kLinkLargeBytes = 1020 << 10;
inline constexpr int kLinkSmallRepeats = 16;
inline constexpr int kLinkLargeRepeats = 3;

// The latency and rate that make the model's all-reduce times (AllReduceTime, the algorithm Open
// MPI picks for P nodes and the size) equal `small_s` for `small_bytes` and `large_s` for
// `large_bytes`. A negative latency fit (noise on a fast link) becomes 0 and the rate is fitted
// from the large all-reduce alone. FAILED_PRECONDITION where no positive rate fits (the large
// all-reduce no slower than the small one's latency allows) or nodes < 2.
absl::StatusOr<LinkModel> FitLink(int nodes, double small_bytes, double small_s, double large_bytes,
                                  double large_s);

// The link as this engine sees it, once: declared (o.link_gbps > 0) or measured. Every node must
// call it at the same point (it issues collectives: kLinkSmallRepeats + kLinkLargeRepeats + 2
// all-reduces when measuring, and one MAX all-reduce of the inputs either way), and every node
// returns the same result.
absl::StatusOr<LinkModel> AgreeOnLink(Collective* coll, const EngineOptions& o);

// What the model is asked for one bucket.
struct ChoiceInputs {
  int nodes = 2;
  uint64_t elements = 0;
  double density = 0.01;
  int dense_value_bytes = 4;   // the dense exchange's values on the wire (the wire type)
  int sparse_value_bytes = 4;  // the pairs' values (2 with --fp16_values or a half wire type)
  bool delta_indices = true;   // --wire_index_encoding=delta (else uint32: 4 bytes an index)
  int recompute_every = 32;    // --oktopk_recompute_every
  bool dense = true;           // candidates: the dense all-reduce (--dense_fallback=auto)
  bool allgather = true;       //   the sparse all-gather (pattern B)
  bool oktopk = false;         //   Ok-Topk (--sparse_allreduce=auto or oktopk)
};

// A candidate whose model time is within this factor of the cheapest's is too close to call: the
// bucket probes the close ones against each other instead. Probing candidates this close costs
// little (unlike probing one ten times slower), and the model's error against the simulation
// reaches about +40% on high-latency links (docs/scale.md#where-spex-picks).
inline constexpr double kModelCloseFactor = 1.5;

struct ModelChoice {
  ExchangeChoice choice = ExchangeChoice::kDense;  // the cheapest candidate
  // close[c]: candidate c is within kModelCloseFactor of the cheapest (the cheapest included).
  bool close[3] = {false, false, false};
  int close_count() const { return close[0] + close[1] + close[2]; }
  ExchangeCosts costs;  // the model's times of all three, candidates or not
  std::string why;      // "oktopk by the cost model: dense 163.1 ms, ... (link ..., P 256, ...)"
};

// The cheapest candidate by the model (ties: dense, then the all-gather, then Ok-Topk), and the
// candidates too close to it to call.
// INVALID_ARGUMENT for inputs the model refuses (CheckExchangeInputs) or no candidate.
absl::StatusOr<ModelChoice> ChooseExchange(const LinkModel& link, const ChoiceInputs& in);

// The engine's hook, on the per-bucket path of a bucket whose choice is open and
// `b->ex.model_pending`, at the step every node runs with the agreed `density`: decides the
// bucket's exchange from the model where it can (b->ex.mode, b->ex.sparse->oktopk,
// b->ex.allreduce_probe) and clears model_pending; candidates too close to call stay open for
// the probes (dense against one sparse exchange, the two sparse ones, or all three). `*link` caches
// AgreeOnLink's answer for the engine (absent: not asked yet). Returns the text for the bucket's
// stats: the choice and why, or why it probes. Every node issues the same collectives and decides
// alike.
std::string DecideByModel(Collective* coll, const EngineOptions& o, double density,
                          absl::StatusOr<LinkModel>* link, bool* link_asked, EngineBucket* b);

}  // namespace spex
