// HalfAllReduceScaled and HalfAllReduceInPlace (half_exchange.h): reduce-scatter through an
// all-to-all of equal chunks, all-gather in place, both over half values (on two nodes one
// all-gather of the whole vectors, the same bytes in one round).
#include "daemon/engine/half_exchange.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/base/no_init.h"

namespace spex {
namespace {

// Written in full before they are read (Narrow and the padding, the all-gather or all-to-all):
// a resize that grows them (a large bucket after a small one) adds nothing to clear.
struct Scratch16 {
  NoInitVector<uint16_t> mine, in;
};

// Scratch kept by the calling thread (the engine's or the wire stage's) across exchanges:
// fresh buffers of a large bucket would cost their page faults at every step.
Scratch16& ThreadScratch() {
  thread_local Scratch16 scratch;
  return scratch;
}

absl::Status CheckHalfExchange(Collective* coll, DType t) {
  if (!IsHalf(t)) return absl::InternalError("HalfAllReduceScaled on a float32 bucket (a bug)");
  if (coll->size() > kMaxHalfNodes) {
    return absl::UnimplementedError(absl::StrCat("the half dense exchange serves at most ",
                                                 kMaxHalfNodes, " nodes; this world has ",
                                                 coll->size()));
  }
  return absl::OkStatus();
}

// Rank r owns [r * c, min(n, (r + 1) * c)); the last chunks may be short or empty, and every
// chunk travels padded to c values so that the all-gather's blocks are equal.
size_t ChunkValues(size_t n, int nodes) { return (n + nodes - 1) / nodes; }

// The exchange of this rank's n half values in data[0, c * N) (zero padded past n), in place:
// an all-to-all of equal chunks straight from `data` into scratch.in, the owner's chunk summed
// in float32 in rank order, scaled and rounded once into its own chunk of `data` (one fused
// pass), and an all-gather of the owners' chunks into `data` in place. No other copy.
absl::Status ExchangeInPlace(Collective* coll, DType t, Scratch16& scratch, uint16_t* data,
                             size_t n, float scale, HalfAllReduceBytes* bytes) {
  const int N = coll->size(), me = coll->rank();
  const size_t c = ChunkValues(n, N);
  uint16_t* own = data + me * c;
  if (N == 1) {
    const uint16_t* chunk[1] = {data};
    half::SumWidenNarrow(t, data, nullptr, chunk, 1, scale, n, false);
    return absl::OkStatus();
  }
  NoInitVector<uint16_t>& in = scratch.in;
  if (N == 2) {
    // Two nodes: one all-gather of the whole vectors moves the bytes of the all-to-all and the
    // all-gather together, in one round instead of two. Each node sums both over all n in rank
    // order, the owner's formula below, so every value has the same bits.
    in.resize(2 * c * 2);
    if (absl::Status s = coll->AllGather(data, 2 * c * 2, in.data()); !s.ok()) return s;
    const uint16_t* both[2] = {in.data(), in.data() + 2 * c};
    half::SumWidenNarrow(t, data, nullptr, both, 2, scale, n, false);
    if (bytes != nullptr) bytes->sent = bytes->received = 2ull * c * 2;
    return absl::OkStatus();
  }
  in.resize(c * N);
  if (absl::Status s = coll->AllToAll(data, c * 2, in.data()); !s.ok()) return s;
  const uint16_t* chunk[kMaxHalfNodes];
  for (int r = 0; r < N; ++r) chunk[r] = in.data() + r * c;
  half::SumWidenNarrow(t, own, nullptr, chunk, N, scale, c, false);
  if (absl::Status s = coll->AllGather(own, c * 2, data); !s.ok()) return s;
  if (bytes != nullptr) bytes->sent = bytes->received = 2ull * (N - 1) * c * 2;
  return absl::OkStatus();
}

// `mine` resized to the padded c * nodes values, the padding zeroed.
uint16_t* Padded(NoInitVector<uint16_t>& mine, size_t n, int nodes) {
  mine.resize(ChunkValues(n, nodes) * nodes);
  std::fill(mine.begin() + n, mine.end(), uint16_t{0});
  return mine.data();
}

}  // namespace

absl::Status HalfAllReduceScaled(Collective* coll, DType t, const float* send, float* recv,
                                 size_t n, float scale, HalfAllReduceBytes* bytes,
                                 uint16_t* half_out) {
  if (absl::Status s = CheckHalfExchange(coll, t); !s.ok()) return s;
  if (bytes != nullptr) *bytes = {};
  if (n == 0) return absl::OkStatus();
  Scratch16& scratch = ThreadScratch();
  uint16_t* mine = Padded(scratch.mine, n, coll->size());
  half::Narrow(t, send, mine, n);
  if (absl::Status s = ExchangeInPlace(coll, t, scratch, mine, n, scale, bytes); !s.ok()) return s;
  if (half_out != nullptr) std::memcpy(half_out, mine, n * 2);
  if (recv != nullptr) half::Widen(t, mine, recv, n);
  return absl::OkStatus();
}

absl::Status HalfAllReduceInPlace(Collective* coll, DType t, uint16_t* data, size_t n, float scale,
                                  HalfAllReduceBytes* bytes) {
  if (absl::Status s = CheckHalfExchange(coll, t); !s.ok()) return s;
  if (bytes != nullptr) *bytes = {};
  if (n == 0) return absl::OkStatus();
  Scratch16& scratch = ThreadScratch();
  const int N = coll->size();
  if (n % N == 0) return ExchangeInPlace(coll, t, scratch, data, n, scale, bytes);
  // Chunks padded past n: through scratch (a copy in and out).
  uint16_t* mine = Padded(scratch.mine, n, N);
  std::memcpy(mine, data, n * 2);
  if (absl::Status s = ExchangeInPlace(coll, t, scratch, mine, n, scale, bytes); !s.ok()) return s;
  std::memcpy(data, mine, n * 2);
  return absl::OkStatus();
}

absl::Status HalfAllReduceScaledOnDevice(Collective* coll, Primitives* prims, Scratch* scratch,
                                         DType t, const float* send, float* recv, size_t n,
                                         float scale, HalfAllReduceBytes* bytes,
                                         uint16_t* half_out) {
  if (absl::Status s = CheckHalfExchange(coll, t); !s.ok()) return s;
  if (bytes != nullptr) *bytes = {};
  if (n == 0) return absl::OkStatus();
  if (scratch == nullptr) return absl::InternalError("a device half exchange without scratch");
  Scratch16& host = ThreadScratch();
  NoInitVector<uint16_t>& mine = host.mine;
  Padded(mine, n, coll->size());
  // Rounded on the device; only the half values come down.
  absl::StatusOr<void*> dev = scratch->Get(3, n * 2);
  absl::Status local = dev.status();
  uint16_t* dev_half = dev.ok() ? static_cast<uint16_t*>(*dev) : nullptr;
  if (local.ok()) local = prims->NarrowHalf(t, send, dev_half, n);
  if (local.ok()) local = prims->CopyToHost(mine.data(), dev_half, n * 2);
  if (!local.ok()) std::fill(mine.begin(), mine.begin() + n, uint16_t{0});
  if (absl::Status s = ExchangeInPlace(coll, t, host, mine.data(), n, scale, bytes); !s.ok()) {
    return s;
  }
  if (!local.ok()) return local;
  // The result goes up once, as half values; widened there where a float32 copy is wanted.
  uint16_t* up = half_out != nullptr ? half_out : dev_half;
  if (half_out == nullptr && recv == nullptr) return absl::OkStatus();
  if (absl::Status s = prims->CopyFromHost(up, mine.data(), n * 2); !s.ok()) return s;
  if (recv != nullptr) return prims->WidenHalf(t, up, recv, n);
  return absl::OkStatus();
}

}  // namespace spex
