// The cost model of one bucket's exchange on a cluster (docs/scale.md#the-cost-model): the time
// of the dense all-reduce, the sparse all-gather (pattern B) and Ok-Topk for P nodes, n elements
// and k selected per node on a link of a given rate and latency, each with the control round and
// the commit vote every exchange pays. It exists so that a user (bench/scale/spex_scale.py
// whatif) and the scale simulation can say which exchange wins where without running a cluster;
// the SimGrid simulation of the real code (bench/scale) checks it.
//
// The terms follow the algorithms Open MPI 4.1's fixed decision (as SimGrid's ompi selector
// copies it) picks by node count and size: recursive doubling or reduce + broadcast for small
// all-reduces, Rabenseifner for large ones, the ring all-gather, a linear or pairwise
// all-to-all(v). A message costs latency + bytes / rate on a full-duplex, non-blocking network
// (no oversubscription, no contention beyond the node's link).
// Sparse chunks count their indices at ExchangeShape::index_bytes: 4 for uint32, or for spexd's
// default delta form (--wire_index_encoding, wire.h) DeltaIndexBytes, the varint gaps' expected
// size at the selection's density (1.0 byte at 0.1, 1.28 at 0.01, 1.88 at 0.001).
// A half bucket's dense exchange on two nodes is one all-gather (half_exchange.h).
//
// spexd decides from it: --dense_fallback=auto and --sparse_allreduce=auto under
// --auto_decide=model (exchange_choice.h) take the model's pick for the measured link at a
// bucket's first exchange; --auto_decide=probe measures the candidates instead.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace spex {

struct LinkModel {
  double bytes_per_s = 1.25e9;  // each node's link, each direction (10 Gbit/s = 1.25e9)
  double latency_s = 4e-6;      // one message from node to node (a star: twice a link's latency)
};

struct ExchangeShape {
  int nodes = 2;             // P
  uint64_t elements = 0;     // n, the bucket's elements
  uint64_t k = 0;            // elements each node selects (pattern B), <= n
  int value_bytes = 4;       // a value on the wire: 4 (float32), 2 (bfloat16, float16, fp16_values)
  double index_bytes = 4;    // a sparse index on the wire: 4 (uint32) or DeltaIndexBytes, in [1, 4]
  double skew = 1.0;         // Ok-Topk: the busiest region's selected entries over the mean (>= 1)
  int recompute_every = 32;  // Ok-Topk: one exact selection (4 histogram all-reduces) every so many
  bool control = true;       // count the control round and the commit vote
};

enum class ExchangeChoice { kDense, kAllGather, kOkTopk };
const char* ExchangeChoiceName(ExchangeChoice c);  // "dense", "allgather", "oktopk"

struct ExchangeCosts {
  double control_s = 0;    // control round + commit vote (included in each total below)
  double dense_s = 0;      // dense all-reduce of n values of value_bytes
  double allgather_s = 0;  // pattern B: count all-gather + all-gatherv of (index, value) chunks
  double oktopk_s = 0;     // Ok-Topk, topk global selection, averaged over recompute_every
  ExchangeChoice best = ExchangeChoice::kDense;  // the cheapest (ties: dense, then allgather)
  double Of(ExchangeChoice c) const;
};

// INVALID_ARGUMENT naming the field to fix: nodes < 1, rate or latency not positive and finite,
// elements 0, k > elements, value_bytes not 2 or 4, index_bytes outside [1, 4], skew outside
// [1, nodes], recompute_every < 1.
absl::Status CheckExchangeInputs(const LinkModel& link, const ExchangeShape& shape);

// The expected bytes an index takes in the delta form (LEB128 varints of the gaps, wire.h) for k
// ascending positions spread evenly at random over n: a gap of at least 128^j takes a byte more,
// and a gap of mean g = n / k reaches 128^j with probability about exp(-128^j / g). At most 4:
// the encoder sends uint32 where that is smaller. 4 when k is 0.
double DeltaIndexBytes(uint64_t elements, uint64_t k);

// The model's times. The inputs must pass CheckExchangeInputs.
ExchangeCosts EstimateExchange(const LinkModel& link, const ExchangeShape& shape);

// The terms, for the simulation's checks: one collective's time on P nodes.
double AllReduceTime(const LinkModel& link, int nodes, double bytes);
double AllGatherTime(const LinkModel& link, int nodes, double bytes_per_node);
double AllToAllTime(const LinkModel& link, int nodes, double bytes_per_pair);

}  // namespace spex
