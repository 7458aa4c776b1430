// HalfAllReduceScaled (half_exchange.h): reduce-scatter through AllToAllV, all-gather through
// AllGather, both over half values.
#include "daemon/engine/half_exchange.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace spex {

absl::Status HalfAllReduceScaled(Collective* coll, DType t, const float* send, float* recv,
                                 size_t n, float scale, HalfAllReduceBytes* bytes) {
  if (!IsHalf(t)) return absl::InternalError("HalfAllReduceScaled on a float32 bucket (a bug)");
  const int N = coll->size(), me = coll->rank();
  if (bytes != nullptr) *bytes = {};
  if (n == 0) return absl::OkStatus();
  // Rank r owns [r * c, min(n, (r + 1) * c)); the last chunks may be short or empty, and every
  // chunk travels padded to c values so that the all-gather's blocks are equal.
  const size_t c = (n + N - 1) / N;
  std::vector<uint16_t> mine(c * N, 0);
  half::Narrow(t, send, mine.data(), n);
  std::vector<std::vector<uint8_t>> out(N), in;
  for (int r = 0; r < N; ++r) {
    if (r == me) continue;  // our own chunk stays here
    out[r].resize(c * 2);
    std::memcpy(out[r].data(), mine.data() + r * c, c * 2);
  }
  if (N > 1) {
    if (absl::Status s = coll->AllToAllV(out, &in); !s.ok()) return s;
    for (int r = 0; r < N; ++r) {
      if (r != me && in[r].size() != c * 2) {
        return absl::DataLossError(absl::StrCat("half dense exchange: node ", r, " sent ",
                                                in[r].size(), " bytes, ", c * 2, " expected"));
      }
    }
  }
  // The owner's sum in float32, in rank order, scaled and rounded once.
  std::vector<float> sum(c), part(c);
  for (int r = 0; r < N; ++r) {
    const uint16_t* src =
        r == me ? mine.data() + me * c : reinterpret_cast<const uint16_t*>(in[r].data());
    std::vector<uint16_t> aligned;
    if (r != me && reinterpret_cast<uintptr_t>(src) % 2 != 0) {
      aligned.resize(c);
      std::memcpy(aligned.data(), in[r].data(), c * 2);
      src = aligned.data();
    }
    half::Widen(t, src, r == 0 ? sum.data() : part.data(), c);
    if (r > 0) {
      for (size_t i = 0; i < c; ++i) sum[i] += part[i];
    }
  }
  if (scale != 1.0f) {
    for (float& v : sum) v *= scale;
  }
  std::vector<uint16_t> owned(c), all(c * N);
  half::Narrow(t, sum.data(), owned.data(), c);
  if (N > 1) {
    if (absl::Status s = coll->AllGather(owned.data(), c * 2, all.data()); !s.ok()) return s;
  } else {
    all = owned;
  }
  half::Widen(t, all.data(), recv, n);
  if (bytes != nullptr && N > 1) {
    bytes->sent = bytes->received = 2ull * (N - 1) * c * 2;
  }
  return absl::OkStatus();
}

}  // namespace spex
