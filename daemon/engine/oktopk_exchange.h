// The Ok-Topk style sparse all-reduce for pattern-B selections (docs/algorithms.md#oktopk):
//  0. every `rebalance_every` exchanges the region boundaries are re-agreed from the selections:
//     each node offers the P-1 quantiles of its sorted selection (or the equal split when it
//     selected fewer than P), they are all-gathered and validated, and b_j is their mean, so
//     skewed selections (all in one region) get balanced regions;
//  1. every node splits its (index, value) selection by region (node r owns [b_r, b_{r+1})) and
//     sends each part to its owner in the wire format (AllToAllV), its values of the bucket's
//     wire type (args.wire: bfloat16/float16 for a half bucket; else float32, or float16 with
//     args.fp16), as ExchangeSparseGather's chunks;
//  2. each owner validates what it received and sums it per index in node order, each value
//     times `scale` first, exactly as ExchangeSparseGather adds into a zeroed output;
//  3. global selection: "all" keeps every reduced entry; "topk" keeps about k of them: on exact
//     exchanges (every `recompute_every`, counted from 0) exactly the k largest |sum| over all
//     owners (ties to the smaller index), found by a 4-round radix search of the k-th magnitude
//     over 256-bin histograms (4 all-reduces of 2 KiB, one all-gather of P counts; no entries
//     move), and that magnitude becomes the threshold; otherwise every entry with |sum| above the
//     threshold, which is then nudged (x or / `global_factor`) towards [2k/3, 4k/3] kept;
//  4. the kept entries are all-gathered (one fp32 wire chunk per owner) and written into `out`.
// With "all" the output is bit-identical to ExchangeSparseGather's. A node receives its region's
// share of the selections plus the kept entries: about 2k(P-1)/P pairs with "topk" and balanced
// regions, instead of every node's selection ((P-1)k).
//
// Error feedback: the caller zeroes its residual only at res->my_kept (its selected indices that
// were kept globally) and keeps everything else it sent; with "all" that is its whole selection.
//
// Lockstep: a malformed reduce-scatter part is seen by its receiver only, so after phase 1 every
// node takes part in a small sum all-reduce of "I refused something" (which also carries every
// node's selection size); all nodes then return DATA_LOSS before the next phase (the receiver's
// names the node), nothing written to `out` and the state unchanged. Everything else (offered
// quantiles, histograms, tie counts, kept entries) reaches every node alike, so all refuse alike.
//
// Not here: the engine's use of "topk" (the caller owns the options and the state). Device
// buckets: only the output is device memory (the selection arrives on the host, as for
// ExchangeSparseGather). The volume bound needs a real all-to-all: MPI has one; the
// in-process and NCCL collectives use Collective::AllToAllV's default built on AllGatherV.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/sparse_exchange.h"
#include "daemon/transport/collective.h"
#include "kernels/primitives.h"

namespace spex {

// Region boundaries for `nodes` owners of `elements` positions: equal shares, the remainder
// spread over the first owners. bounds.size() == nodes + 1, bounds[0] == 0, back() == elements.
std::vector<uint32_t> EqualRegions(uint32_t elements, int nodes);

enum class OkTopkGlobal {
  kAll,   // keep every reduced entry: the sum of every node's selection (pattern B's result)
  kTopk,  // keep about k of the sums (Ok-Topk proper)
};

// Identical on every node (the caller agrees them, e.g. through the engine's config hash).
// The defaults are the behaviour of the first version: "all", regions as given.
struct OkTopkOptions {
  OkTopkGlobal global = OkTopkGlobal::kAll;
  uint64_t k = 0;                 // kTopk: entries kept globally (required > 0)
  uint32_t recompute_every = 32;  // kTopk: exact selection when exchanges % this == 0 (>= 1)
  uint32_t rebalance_every = 0;   // regions re-agreed when exchanges % this == 0; 0 = never
  float global_factor = 1.008f;   // kTopk: threshold step between exact selections (> 1)
};

// Per bucket, kept by the caller from one exchange to the next; identical on every node after
// every successful exchange. Left unchanged by a failed one.
struct OkTopkState {
  uint64_t exchanges = 0;        // exchanges done (c)
  float threshold = 0.0f;        // kTopk: the global magnitude threshold
  std::vector<uint32_t> bounds;  // regions; empty = EqualRegions(elements, nodes)
};

struct OkTopkResult : SparseExchangeResult {
  // Inherited: touched = gathered_idx = the kept indices (sorted, unique); counts = every node's
  // selection size |S_i| (as pattern B); bytes_* = the wire chunks sent and received.
  std::vector<uint64_t> owner_kept;  // per owner: kept entries of its region
  std::vector<uint32_t> my_kept;     // this node's selected indices that were kept (sorted)
  uint64_t rs_pairs = 0;             // pairs this owner reduced, its own included
  uint64_t rs_received = 0;          // ... of them received from other nodes
  uint64_t ag_received = 0;          // kept entries received from other owners
  uint64_t control_bytes = 0;        // small collectives: flags/sizes, quantiles, histograms
  bool exact = false;                // kTopk: this exchange recomputed the threshold exactly
  bool rebalanced = false;           // the regions were re-agreed before this exchange
};

// The exchange. `out` must be zero at every position written (as for ExchangeSparseGather).
// Bad options, state or selection are INVALID_ARGUMENT naming what to fix; malformed peer data
// is DATA_LOSS. On success `state` is advanced (exchanges + 1, threshold, bounds). With a
// DeviceSide, `out` is that device's memory: the kept entries go up in one upload (scratch
// slots 0 and 1) and one scatter-add; everything else stays on the host (`prims`).
absl::Status ExchangeOkTopk(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                            const OkTopkOptions& opts, OkTopkState* state,
                            absl::Span<const uint32_t> my_idx, absl::Span<const float> my_val,
                            float* out, OkTopkResult* res, const DeviceSide* device = nullptr);

// The first version's call: global "all" with fixed regions `bounds` (every node must pass the
// same; EqualRegions if empty). res->touched and res->gathered_idx hold the positions written,
// res->counts every node's selection size.
absl::Status ExchangeOkTopk(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                            absl::Span<const uint32_t> bounds, absl::Span<const uint32_t> my_idx,
                            absl::Span<const float> my_val, float* out, SparseExchangeResult* res);

}  // namespace spex
