// The sparse exchange patterns (docs/algorithms.md#patterns), over any Collective:
//  A: index all-gather (counts implied by the variable-size gather) -> union of indices ->
//     every node's acc at the union, summed by an all-reduce -> out[I] = sum * scale. With
//     half values on the wire, a result that is not finite (a node's value, or the average,
//     past the type's range: every node sees the same result) is exchanged again in float32,
//     each value scaled first, so no value is narrowed into an infinity.
//  B: all-gather of (index, value) chunks in the wire format (no padding) -> validate ->
//     scatter-add every node's chunk into out, * scale. A chunk whose values do not all fit
//     the half wire type goes out as float32 (wire.h ValuesWire).
// Both add into the output positions they touch, which must be zero: the caller zeroes the
// positions of the previous step (kept in `touched`) before calling, so the output slot stays
// exact without a full memset per step.
//
// Memory: the wire chunks, the union and the values are host memory and `prims` are host
// primitives (the wire chunks are host bytes for any Collective; NCCL stages them through
// device scratch), and the compressors' selections are host vectors. `acc` and `out` are host
// memory unless a DeviceSide is given: then they are that device's memory, and only what
// touches them moves: A gathers acc at the union on the device (the union goes up, its values
// come back for the all-reduce), and both patterns upload the indices and the scaled values
// they add into out and scatter-add there, in the same order as on the host (bit-identical).
//
// Lockstep: a malformed peer chunk is seen alike by every node (all receive the same bytes), so
// every node returns DATA_LOSS before the next collective. A local failure between A's two
// collectives (a device copy) still takes part in the second, with zeros, and is returned after.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/wire.h"
#include "daemon/transport/collective.h"
#include "kernels/half.h"
#include "kernels/primitives.h"

namespace spex {

struct SparseExchangeResult {
  std::vector<uint32_t> touched;       // output positions written (sorted, unique)
  std::vector<uint64_t> counts;        // per-node selected counts
  std::vector<uint32_t> gathered_idx;  // A: the union; B: every node's indices, concatenated
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  // The type this node's values went out as: a half wire's own type, or float32 where one did
  // not fit it (wire.h ValuesWire; A: where the half exchange's result was not finite). The
  // residual keeps the wire's rounding only when they went out rounded (docs/dtypes.md).
  DType values_sent = DType::kFloat32;
  // A on the host, when asked (SparseExchangeArgs::keep_rounding / out_nonzero): the residual
  // already keeps the wire's rounding at the union (values_sent is then the half wire type), and
  // out was zeroed at out_nonzero and written at the union in one pass.
  bool residual_kept = false;
  bool out_replaced = false;
};

struct SparseExchangeArgs {
  uint64_t group_id = 0;
  uint64_t step = 0;
  uint32_t elements = 0;
  float scale = 1.0f;  // 1 / (nodes * local trainers)
  bool fp16 = false;   // B: values as float16 on the wire
  // A half bucket's values on the wire (its own type, docs/dtypes.md): B's chunks carry them,
  // A's values at the union are summed by HalfAllReduceScaled. float32: as fp16 says.
  DType wire = DType::kFloat32;
  float scalars[4] = {};
  IndexEncoding index_encoding = IndexEncoding::kDelta;  // the chunks' indices (wire.h)
  // Pattern A on the host only (no DeviceSide), passes fused to spare a walk over the bucket:
  // - keep_rounding (a half `wire`, error feedback on): acc is the residual, and the pass that
  //   reads acc at the union also leaves there what the wire's rounding takes off
  //   (half::GatherKeepRounding). Where the values end up going as float32 (an overflow) or the
  //   exchange fails, acc is written back first, so the caller's usual handling applies;
  //   otherwise SparseExchangeResult::residual_kept says the residual is done.
  // - out_nonzero (sorted): the positions out holds last step's values at. The exchange zeroes
  //   them and writes the average at the union in one pass, in blocks that fit a core's cache
  //   (out_replaced), instead of the caller's ZeroAt before and a scatter-add after. When it
  //   returns without out_replaced, out is untouched and the caller zeroes them.
  bool keep_rounding = false;
  const std::vector<uint32_t>* out_nonzero = nullptr;
};

// Where acc and out live when they are device memory: the device's primitives and scratch of
// theirs (slots 0 and 1 are used; the union of A stays in slot 0 afterwards).
struct DeviceSide {
  Primitives* prims = nullptr;
  Scratch* scratch = nullptr;
};

// out[idx[j]] += val[j] on the device: the pairs go up in one upload each (slots 0 and 1), then
// one scatter-add per run [runs[r], runs[r+1]) in order, as the host's per-run scatter-adds
// would add them (bit for bit). idx and val are the same length; runs starts at 0 and ends at it.
// The sorted union of `runs` into *out (*scratch: working space; neither may hold a run).
// Strictly ascending runs that do not overlap (MiCRO's and ExDyna's selections) are copied in
// order, once. Otherwise every node's selection arrives ascending, so a pairwise merge
// (log2(nodes) linear passes) replaces a full sort of the concatenation; a run that is not
// ascending (a peer not following the contract) falls back to std::sort, so the result is the
// same either way.
void SortedUnion(const std::vector<absl::Span<const uint32_t>>& runs, std::vector<uint32_t>* out,
                 std::vector<uint32_t>* scratch);
// The same, run r being v[off[r] .. off[r + 1]).
void SortedUnion(const std::vector<uint32_t>& v, const std::vector<size_t>& off,
                 std::vector<uint32_t>* out, std::vector<uint32_t>* scratch);

absl::Status ScatterAddOnDevice(const DeviceSide& device, float* out, uint32_t elements,
                                const std::vector<uint32_t>& idx, const std::vector<float>& val,
                                const std::vector<size_t>& runs);

// out[prev] = 0, then out[u[j]] = val[j], a block of out at a time (prev and u sorted, every
// index < n): each block's lines are read from memory once for both writes.
void ReplaceAt(float* out, size_t n, const std::vector<uint32_t>& prev, const uint32_t* u,
               const float* val, size_t m);

// Pattern A. `acc` is this node's accumulated buffer (read at the union only, and written there
// only under args.keep_rounding).
absl::Status ExchangeIndexUnion(Collective* coll, Primitives* prims, const SparseExchangeArgs& args,
                                absl::Span<const uint32_t> my_idx, float* acc, float* out,
                                SparseExchangeResult* res, const DeviceSide* device = nullptr);

// Pattern B. `my_idx`/`my_val` are this node's selection.
absl::Status ExchangeSparseGather(Collective* coll, Primitives* prims,
                                  const SparseExchangeArgs& args, absl::Span<const uint32_t> my_idx,
                                  absl::Span<const float> my_val, float* out,
                                  SparseExchangeResult* res, const DeviceSide* device = nullptr);

}  // namespace spex
