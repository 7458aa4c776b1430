// The dense exchange of a half-precision bucket (docs/dtypes.md): a sum-all-reduce whose wire
// carries the bucket's type (2 bytes a value, half of float32's) while every sum is taken in
// float32. MPI has no bfloat16/float16 sum, and an all-reduce over a user-defined half type
// would round the partial sum at every hop; instead this is a reduce-scatter (a personalised
// all-to-all of half chunks, each summed in float32 by its owner in rank order) followed by an
// all-gather of the owners' results rounded once to the bucket's type: per node
// 2 (N - 1) / N x 2 bytes a value each way, what a float32 ring all-reduce moves at 4. On two
// nodes that is what one all-gather of the whole half vectors moves: one round, each node
// summing both in rank order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "daemon/transport/collective.h"
#include "kernels/half.h"
#include "kernels/primitives.h"

namespace spex {

struct HalfAllReduceBytes {
  uint64_t sent = 0, received = 0;
};

// The most nodes HalfAllReduceScaled serves (UNIMPLEMENTED beyond).
inline constexpr int kMaxHalfNodes = 4096;

// recv = round_t(scale * sum over ranks r of round_t(send_r)), widened back to float32 in recv
// (send may equal recv; recv null: not widened), and the same half values in half_out when it
// is set (the bucket's published output: no widening and rounding again). `t` is a half type.
// Every rank must call it with the same n, t and scale. On one rank: round_t(scale *
// round_t(send)). *bytes (may be null): this rank's wire bytes.
absl::Status HalfAllReduceScaled(Collective* coll, DType t, const float* send, float* recv,
                                 size_t n, float scale, HalfAllReduceBytes* bytes = nullptr,
                                 uint16_t* half_out = nullptr);

// The same exchange over half values already rounded: data[i] (n values of `t`, this rank's
// round_t(send)) becomes round_t(scale * sum over ranks of data_r[i]), in place, bit for bit
// HalfAllReduceScaled's half_out. For a dense half bucket whose local sum was rounded straight
// into the trainers' output (ReduceLocalChecked): no float32 staging, no conversion pass, and
// (n a multiple of the nodes) no copy; otherwise one copy in and out of padded scratch.
absl::Status HalfAllReduceInPlace(Collective* coll, DType t, uint16_t* data, size_t n, float scale,
                                  HalfAllReduceBytes* bytes = nullptr);

// HalfAllReduceScaled for a device bucket (the device path, whose exchange runs on the host):
// `send` (n floats of the primitives' device) is rounded to `t` there, the n half values go
// down to the host, through the same exchange, and the result comes back up into half_out
// (device; null: not kept) and, widened on the device, into recv (device; null: not widened).
// Only half values cross between host and device; the result is HalfAllReduceScaled's bit for
// bit. `scratch` (the bucket's) lends its slot 3 for the device half values. A device copy
// that fails still takes part in the collectives (with zeros) and is returned after them.
absl::Status HalfAllReduceScaledOnDevice(Collective* coll, Primitives* prims, Scratch* scratch,
                                         DType t, const float* send, float* recv, size_t n,
                                         float scale, HalfAllReduceBytes* bytes = nullptr,
                                         uint16_t* half_out = nullptr);

// A ring all-reduce's bytes per node for n values of `t` on `nodes` nodes (each way).
inline uint64_t DenseWireBytes(size_t n, int nodes, DType t) {
  return nodes > 1 ? 2ull * n * DTypeSize(t) * (nodes - 1) / nodes : 0;
}

}  // namespace spex
