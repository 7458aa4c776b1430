// The Ok-Topk style sparse all-reduce for pattern-B selections (docs/algorithms.md#oktopk):
//  1. every node splits its (index, value) selection by region (node r owns [bounds[r],
//     bounds[r+1])) and sends each part to its owner in the wire format (AllToAllV);
//  2. each owner validates what it received and sums it per index in node order, each value
//     times `scale` first, exactly as ExchangeSparseGather adds into a zeroed output;
//  3. the owners' reduced (index, value) entries are all-gathered and written into `out`.
// With every reduced entry kept (global selection "all") the output is bit-identical to
// ExchangeSparseGather's. A node receives its region's share of the selections plus the
// reduced entries (at most the union), instead of every node's selection.
//
// What is not written yet (refused by the callers, said in the docs): the "topk" global
// selection, rebalancing the regions from the selected indices, the engine flag
// --sparse_allreduce, device memory and a real all-to-all in the MPI backend (the Collective
// default of AllToAllV is built on AllGatherV, so the volume bound does not hold there yet).
//
// Lockstep: a malformed chunk is seen by its receiver only, so after phase 1 every node takes
// part in a one-element max all-reduce of "I refused something"; all nodes then return
// DATA_LOSS before the all-gather (the receiver's names the node), nothing written to `out`.
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

// The exchange. `bounds` are the regions (every node must pass the same; EqualRegions if
// empty). `out` must be zero at every position written (as for ExchangeSparseGather); on
// success res->touched holds them and res->gathered_idx the reduced indices in owner order.
// res->counts is each owner's reduced count.
absl::Status ExchangeOkTopk(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                            absl::Span<const uint32_t> bounds, absl::Span<const uint32_t> my_idx,
                            absl::Span<const float> my_val, float* out, SparseExchangeResult* res);

}  // namespace spex
