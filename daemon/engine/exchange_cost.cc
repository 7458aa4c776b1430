// The exchange cost model (exchange_cost.h): latency-bandwidth terms of the collectives each
// exchange issues, in the order the engine issues them.
#include "daemon/engine/exchange_cost.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

// ceil(log2(P)): the rounds of recursive doubling or halving.
double Rounds(int nodes) {
  return nodes > 1 ? std::ceil(std::log2(static_cast<double>(nodes))) : 0;
}

constexpr double kHeaderBytes = 48;       // a wire chunk's header (wire.h)
constexpr double kControlBytes = 20 * 8;  // the control round's words (control_round.cc)
constexpr double kVoteBytes = 3 * 8;      // the commit vote's words (agreement.cc)
constexpr double kHistogramBytes = 256 * 8;

}  // namespace

const char* ExchangeChoiceName(ExchangeChoice c) {
  switch (c) {
    case ExchangeChoice::kDense:
      return "dense";
    case ExchangeChoice::kAllGather:
      return "allgather";
    case ExchangeChoice::kOkTopk:
      return "oktopk";
  }
  return "?";
}

double ExchangeCosts::Of(ExchangeChoice c) const {
  switch (c) {
    case ExchangeChoice::kDense:
      return dense_s;
    case ExchangeChoice::kAllGather:
      return allgather_s;
    case ExchangeChoice::kOkTopk:
      return oktopk_s;
  }
  return 0;
}

// Open MPI 4.1's fixed choice of all-reduce algorithm for a commutative operation by node count
// and size (coll_tuned_decision_fixed.c, as SimGrid's ompi selector copies it).
enum class AllReduceAlg { kReduceBcast, kRecursiveDoubling, kRing, kSegmentedRing, kRabenseifner };

AllReduceAlg ChooseAllReduce(int p, double m) {
  using A = AllReduceAlg;
  if (p < 4) {
    if (m < 8) return A::kRing;
    if (m < 4096) return A::kRecursiveDoubling;
    if (m < 8192) return A::kRing;
    if (m < 16384) return A::kRecursiveDoubling;
    if (m < 65536) return A::kRing;
    if (m < 262144) return A::kSegmentedRing;
    return A::kRabenseifner;
  }
  if (p < 8) return m < 16 ? A::kRing : m < 8192 ? A::kRecursiveDoubling : A::kRabenseifner;
  if (p < 16) return m < 8192 ? A::kRecursiveDoubling : A::kRabenseifner;
  if (p < 32) {
    return m < 64 ? A::kSegmentedRing : m < 4096 ? A::kRecursiveDoubling : A::kRabenseifner;
  }
  if (p < 64) return m < 128 ? A::kSegmentedRing : A::kRabenseifner;
  if (p < 128) return m < 262144 ? A::kRecursiveDoubling : A::kRabenseifner;
  if (p < 256) {
    return m < 131072 ? A::kReduceBcast : m < 262144 ? A::kRecursiveDoubling : A::kRabenseifner;
  }
  if (p < 512) return m < 4096 ? A::kReduceBcast : A::kRabenseifner;
  return m < 2048 ? A::kReduceBcast : m < 16384 ? A::kRecursiveDoubling : A::kRabenseifner;
}

// One all-reduce of `bytes` by the algorithm Open MPI picks. Recursive doubling: log2 P rounds of
// the whole buffer; reduce + broadcast (binomial trees): twice that; the ring: 2 (P-1) rounds of
// a P-th (a segmented ring of fewer elements than nodes runs as recursive doubling);
// Rabenseifner: recursive halving and doubling, 2 log2 P rounds moving 2 (P-1)/P of the buffer.
double AllReduceTime(const LinkModel& link, int nodes, double bytes) {
  if (nodes <= 1) return 0;
  const double r = Rounds(nodes), a = link.latency_s, b = link.bytes_per_s;
  switch (ChooseAllReduce(nodes, bytes)) {
    case AllReduceAlg::kReduceBcast:
      return 2 * r * (a + bytes / b);
    case AllReduceAlg::kRecursiveDoubling:
      return r * (a + bytes / b);
    case AllReduceAlg::kSegmentedRing:
      if (bytes < 8.0 * nodes) return r * (a + bytes / b);
      [[fallthrough]];
    case AllReduceAlg::kRing:
      return 2 * (nodes - 1) * (a + bytes / nodes / b);
    case AllReduceAlg::kRabenseifner:
      break;
  }
  return 2 * r * a + 2.0 * (nodes - 1) / nodes * bytes / b;
}

// The ring: P-1 rounds, each forwarding one node's block (the largest block sets a round's time).
double AllGatherTime(const LinkModel& link, int nodes, double bytes_per_node) {
  if (nodes <= 1) return 0;
  if (bytes_per_node * nodes < 8192) {
    return Rounds(nodes) * link.latency_s + (nodes - 1) * bytes_per_node / link.bytes_per_s;
  }
  return (nodes - 1) * (link.latency_s + bytes_per_node / link.bytes_per_s);
}

// Open MPI 4.1's all-to-all(v) of larger blocks: pairwise (P-1 rounds of one block each way)
// below 4 nodes, from 64 to 127 and from 256 to 1,023; otherwise linear (every block posted at
// once: one latency, the node's link carrying P-1 blocks).
double AllToAllTime(const LinkModel& link, int nodes, double bytes_per_pair) {
  if (nodes <= 1) return 0;
  const bool pairwise = nodes < 4 || (nodes >= 64 && nodes < 128) || (nodes >= 256 && nodes < 1024);
  if (pairwise) return (nodes - 1) * (link.latency_s + bytes_per_pair / link.bytes_per_s);
  return link.latency_s + (nodes - 1) * bytes_per_pair / link.bytes_per_s;
}

absl::Status CheckExchangeInputs(const LinkModel& link, const ExchangeShape& s) {
  if (s.nodes < 1)
    return absl::InvalidArgumentError(absl::StrCat("nodes must be >= 1, not ", s.nodes));
  if (!(link.bytes_per_s > 0) || !std::isfinite(link.bytes_per_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the link rate must be positive and finite, not ", link.bytes_per_s, " B/s"));
  }
  if (!(link.latency_s >= 0) || !std::isfinite(link.latency_s)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the latency must be >= 0 and finite, not ", link.latency_s, " s"));
  }
  if (s.elements == 0) return absl::InvalidArgumentError("elements must be > 0");
  if (s.k > s.elements) {
    return absl::InvalidArgumentError(
        absl::StrCat("k (", s.k, ") must be <= elements (", s.elements, "): lower the density"));
  }
  if (s.value_bytes != 2 && s.value_bytes != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value_bytes must be 4 (float32) or 2 (bfloat16, float16), not ", s.value_bytes));
  }
  if (!(s.index_bytes >= 1 && s.index_bytes <= 4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "index_bytes must be in [1, 4] (4: uint32; the delta form's expected size below), not ",
        s.index_bytes));
  }
  if (!(s.skew >= 1) || !std::isfinite(s.skew) || s.skew > s.nodes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "skew (the busiest Ok-Topk region's share over the mean) must be in [1, nodes], not ",
        s.skew));
  }
  if (s.recompute_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("recompute_every must be >= 1, not ", s.recompute_every));
  }
  return absl::OkStatus();
}

double DeltaIndexBytes(uint64_t elements, uint64_t k) {
  if (k == 0 || elements == 0) return 4;
  const double gap = static_cast<double>(elements) / static_cast<double>(k);
  double bytes = 1, reach = 128;
  for (int extra = 1; extra <= 4; ++extra, reach *= 128) bytes += std::exp(-reach / gap);
  return std::min(4.0, bytes);
}

ExchangeCosts EstimateExchange(const LinkModel& link, const ExchangeShape& s) {
  ExchangeCosts c;
  const int p = s.nodes;
  const double n = static_cast<double>(s.elements), k = static_cast<double>(s.k);
  const double pair = s.index_bytes + s.value_bytes;  // an (index, value) pair on the wire
  if (s.control) {
    c.control_s = AllReduceTime(link, p, kControlBytes) + AllReduceTime(link, p, kVoteBytes);
  }
  // Dense: one all-reduce of the bucket (float32: MPI_Allreduce; a half bucket: an all-to-all of
  // n/P-value chunks and the all-gather of the owners' sums, the same volume as a ring).
  if (s.value_bytes == 4) {
    c.dense_s = AllReduceTime(link, p, 4.0 * n);
  } else if (p == 2) {  // one all-gather of the whole half vectors
    c.dense_s = AllGatherTime(link, p, 2 * std::ceil(n / p) * s.value_bytes);
  } else {
    const double chunk = std::ceil(n / p) * s.value_bytes;
    c.dense_s = AllToAllTime(link, p, chunk) + AllGatherTime(link, p, chunk);
  }
  // Pattern B: every node's count (an int), then every node's chunk to every node.
  c.allgather_s = AllGatherTime(link, p, 4) + AllGatherTime(link, p, kHeaderBytes + k * pair);
  // Ok-Topk: block sizes (all-to-all of ints), the selections by region (the busiest owner
  // receives skew x k / P pairs from each node), the flags all-reduce (P + 1 int64), the kept
  // entries' count and all-gather (about k float32 pairs over all owners, the busiest skew x k
  // / P); the exact selection's 4 histogram all-reduces and tie-count all-gather once every
  // recompute_every exchanges; the regions' re-agreement (every 64) is left out.
  if (p > 1) {
    const double region = s.skew * k / p;
    // The block sizes' all-to-all of ints: Bruck's log2 P rounds from 32 nodes, one latency
    // (linear) below.
    const double sizes =
        (p >= 32 ? Rounds(p) : 1) * link.latency_s + (p - 1) * 4 / link.bytes_per_s;
    c.oktopk_s = sizes + AllToAllTime(link, p, kHeaderBytes + region * pair) +
                 AllReduceTime(link, p, 8.0 * (p + 1)) + AllGatherTime(link, p, 4) +
                 AllGatherTime(link, p, kHeaderBytes + region * (s.index_bytes + 4.0)) +
                 (4 * AllReduceTime(link, p, kHistogramBytes) + AllGatherTime(link, p, 8)) /
                     s.recompute_every;
  }
  c.dense_s += c.control_s;
  c.allgather_s += c.control_s;
  c.oktopk_s += c.control_s;
  c.best = ExchangeChoice::kDense;
  for (ExchangeChoice e : {ExchangeChoice::kAllGather, ExchangeChoice::kOkTopk}) {
    if (c.Of(e) < c.Of(c.best)) c.best = e;
  }
  return c;
}

}  // namespace spex
