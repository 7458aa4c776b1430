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

}  // namespace

absl::Status HalfAllReduceScaled(Collective* coll, DType t, const float* send, float* recv,
                                 size_t n, float scale, HalfAllReduceBytes* bytes,
                                 uint16_t* half_out) {
  if (!IsHalf(t)) return absl::InternalError("HalfAllReduceScaled on a float32 bucket (a bug)");
  const int N = coll->size(), me = coll->rank();
  if (bytes != nullptr) *bytes = {};
  if (n == 0) return absl::OkStatus();
  // Rank r owns [r * c, min(n, (r + 1) * c)); the last chunks may be short or empty, and every
  // chunk travels padded to c values so that the all-gather's blocks are equal.
  const size_t c = (n + N - 1) / N;
  if (N > kMaxHalfNodes) {
    return absl::UnimplementedError(absl::StrCat("the half dense exchange serves at most ",
                                                 kMaxHalfNodes, " nodes; this world has ", N));
  }
  // Scratch kept by the calling thread (the engine's or the wire stage's) across exchanges:
  // fresh buffers of a large bucket would cost their page faults at every step.
  thread_local Scratch16 scratch;
  std::vector<uint16_t>& mine = scratch.mine;
  mine.resize(c * N);
  half::Narrow(t, send, mine.data(), n);
  std::fill(mine.begin() + n, mine.end(), uint16_t{0});
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
  if (half_out != nullptr) std::memcpy(half_out, all.data(), n * 2);
  if (recv != nullptr) half::Widen(t, all.data(), recv, n);
  if (bytes != nullptr && N > 1) {
    bytes->sent = bytes->received = 2ull * (N - 1) * c * 2;
  }
  return absl::OkStatus();
}

}  // namespace spex
