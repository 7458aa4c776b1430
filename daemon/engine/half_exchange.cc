// HalfAllReduceScaled (half_exchange.h): reduce-scatter through AllToAllV, all-gather through
// AllGather, both over half values.
#include "daemon/engine/half_exchange.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

struct Scratch16 {
  std::vector<uint16_t> mine, owned, all;
  std::vector<float> sum;
  std::vector<std::vector<uint8_t>> out, in;
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

// The exchange of this rank's n half values, already in scratch.mine (c * N values, zero
// padded): the owners' float32 sums, scaled and rounded once, gathered into scratch.all (its
// first n values are the result).
absl::Status ExchangeNarrowed(Collective* coll, DType t, Scratch16& scratch, size_t n, float scale,
                              HalfAllReduceBytes* bytes) {
  const int N = coll->size(), me = coll->rank();
  const size_t c = ChunkValues(n, N);
  std::vector<uint16_t>& mine = scratch.mine;
  std::vector<std::vector<uint8_t>>& out = scratch.out;
  std::vector<std::vector<uint8_t>>& in = scratch.in;
  out.resize(N);
  const uint16_t* chunk[kMaxHalfNodes];
  std::vector<std::vector<uint16_t>> aligned;
  if (N > 1) {
    for (int r = 0; r < N; ++r) {
      if (r == me) {  // our own chunk stays here
        out[r].clear();
        continue;
      }
      out[r].resize(c * 2);
      std::memcpy(out[r].data(), mine.data() + r * c, c * 2);
    }
    if (absl::Status s = coll->AllToAllV(out, &in); !s.ok()) return s;
    for (int r = 0; r < N; ++r) {
      if (r == me) continue;
      if (in[r].size() != c * 2) {
        return absl::DataLossError(absl::StrCat("half dense exchange: node ", r, " sent ",
                                                in[r].size(), " bytes, ", c * 2, " expected"));
      }
      chunk[r] = reinterpret_cast<const uint16_t*>(in[r].data());
      if (reinterpret_cast<uintptr_t>(chunk[r]) % alignof(uint16_t) != 0) {
        aligned.emplace_back(c);
        std::memcpy(aligned.back().data(), in[r].data(), c * 2);
        chunk[r] = aligned.back().data();
      }
    }
  }
  chunk[me] = mine.data() + me * c;
  // The owner's sum in float32, in rank order, scaled and rounded once (one fused pass).
  std::vector<float>& sum = scratch.sum;
  sum.resize(c);
  half::SumWidenScaled(t, sum.data(), nullptr, chunk, N, scale, c, false);
  std::vector<uint16_t>& owned = scratch.owned;
  owned.resize(c);
  half::Narrow(t, sum.data(), owned.data(), c);
  std::vector<uint16_t>& all = scratch.all;
  if (N > 1) {
    all.resize(c * N);
    if (absl::Status s = coll->AllGather(owned.data(), c * 2, all.data()); !s.ok()) return s;
  } else {
    all = owned;
  }
  if (bytes != nullptr && N > 1) {
    bytes->sent = bytes->received = 2ull * (N - 1) * c * 2;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HalfAllReduceScaled(Collective* coll, DType t, const float* send, float* recv,
                                 size_t n, float scale, HalfAllReduceBytes* bytes,
                                 uint16_t* half_out) {
  if (absl::Status s = CheckHalfExchange(coll, t); !s.ok()) return s;
  if (bytes != nullptr) *bytes = {};
  if (n == 0) return absl::OkStatus();
  Scratch16& scratch = ThreadScratch();
  std::vector<uint16_t>& mine = scratch.mine;
  mine.resize(ChunkValues(n, coll->size()) * coll->size());
  half::Narrow(t, send, mine.data(), n);
  std::fill(mine.begin() + n, mine.end(), uint16_t{0});
  if (absl::Status s = ExchangeNarrowed(coll, t, scratch, n, scale, bytes); !s.ok()) return s;
  if (half_out != nullptr) std::memcpy(half_out, scratch.all.data(), n * 2);
  if (recv != nullptr) half::Widen(t, scratch.all.data(), recv, n);
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
  std::vector<uint16_t>& mine = host.mine;
  mine.resize(ChunkValues(n, coll->size()) * coll->size());
  // Rounded on the device; only the half values come down.
  absl::StatusOr<void*> dev = scratch->Get(3, n * 2);
  absl::Status local = dev.status();
  uint16_t* dev_half = dev.ok() ? static_cast<uint16_t*>(*dev) : nullptr;
  if (local.ok()) local = prims->NarrowHalf(t, send, dev_half, n);
  if (local.ok()) local = prims->CopyToHost(mine.data(), dev_half, n * 2);
  if (!local.ok()) std::fill(mine.begin(), mine.begin() + n, uint16_t{0});
  std::fill(mine.begin() + n, mine.end(), uint16_t{0});
  if (absl::Status s = ExchangeNarrowed(coll, t, host, n, scale, bytes); !s.ok()) return s;
  if (!local.ok()) return local;
  // The result goes up once, as half values; widened there where a float32 copy is wanted.
  uint16_t* up = half_out != nullptr ? half_out : dev_half;
  if (half_out == nullptr && recv == nullptr) return absl::OkStatus();
  if (absl::Status s = prims->CopyFromHost(up, host.all.data(), n * 2); !s.ok()) return s;
  if (recv != nullptr) return prims->WidenHalf(t, up, recv, n);
  return absl::OkStatus();
}

}  // namespace spex
