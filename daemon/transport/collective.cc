// The Collective seam's defaults (collective.h): element sizes, and an AllToAllV built from the
// seam's other collectives for transports without one of their own.
#include "daemon/transport/collective.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {

size_t ElemSize(ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      return 4;
    case ElemType::kFloat64:
      return 8;
    case ElemType::kInt64:
      return 8;
    case ElemType::kUint64:
      return 8;
  }
  return 0;
}

namespace {

template <typename T>
void CombineT(T* acc, const T* x, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    switch (op) {
      case ReduceOp::kSum:
        acc[i] += x[i];
        break;
      case ReduceOp::kMax:
        acc[i] = acc[i] < x[i] ? x[i] : acc[i];
        break;
      case ReduceOp::kMin:
        acc[i] = x[i] < acc[i] ? x[i] : acc[i];
        break;
    }
  }
}

}  // namespace

void Combine(void* acc, const void* x, size_t n, ElemType t, ReduceOp op) {
  switch (t) {
    case ElemType::kFloat32:
      return CombineT(static_cast<float*>(acc), static_cast<const float*>(x), n, op);
    case ElemType::kFloat64:
      return CombineT(static_cast<double*>(acc), static_cast<const double*>(x), n, op);
    case ElemType::kInt64:
      return CombineT(static_cast<int64_t*>(acc), static_cast<const int64_t*>(x), n, op);
    case ElemType::kUint64:
      return CombineT(static_cast<uint64_t*>(acc), static_cast<const uint64_t*>(x), n, op);
  }
}

absl::Status Collective::AllToAll(const void* send, size_t block_bytes, void* recv) {
  const int n = size();
  std::vector<std::vector<uint8_t>> out(n), in;
  const uint8_t* from = static_cast<const uint8_t*>(send);
  for (int r = 0; r < n; ++r) out[r].assign(from + r * block_bytes, from + (r + 1) * block_bytes);
  if (absl::Status s = AllToAllV(out, &in); !s.ok()) return s;
  for (int r = 0; r < n; ++r) {
    if (in[r].size() != block_bytes) {
      return absl::DataLossError(absl::StrCat("AllToAll: rank ", r, " sent ", in[r].size(),
                                              " bytes, ", block_bytes, " expected"));
    }
    if (block_bytes)
      std::memcpy(static_cast<uint8_t*>(recv) + r * block_bytes, in[r].data(), block_bytes);
  }
  return absl::OkStatus();
}

absl::Status Collective::AllToAllV(const std::vector<std::vector<uint8_t>>& send,
                                   std::vector<std::vector<uint8_t>>* recv) {
  const int n = size();
  if (static_cast<int>(send.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("AllToAllV: ", send.size(), " send blocks for ", n, " ranks"));
  }
  // This rank's message: n block sizes (uint64), then the blocks in rank order.
  std::vector<uint8_t> mine(n * sizeof(uint64_t));
  for (int r = 0; r < n; ++r) {
    const uint64_t b = send[r].size();
    std::memcpy(mine.data() + r * sizeof(uint64_t), &b, sizeof(b));
    mine.insert(mine.end(), send[r].begin(), send[r].end());
  }
  std::vector<size_t> counts;
  std::vector<uint8_t> all;
  if (absl::Status s = AllGatherV(mine.data(), mine.size(), &counts, &all); !s.ok()) return s;
  recv->assign(n, {});
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    // The sizes come from our own collective, not a peer's payload, but check them anyway: a
    // wrong size here would read past the gathered buffer.
    if (counts[r] < n * sizeof(uint64_t)) {
      return absl::DataLossError(absl::StrCat("AllToAllV: rank ", r, "'s message is too short"));
    }
    const uint8_t* base = all.data() + off;
    size_t at = n * sizeof(uint64_t);
    for (int q = 0; q < n; ++q) {
      uint64_t b = 0;
      std::memcpy(&b, base + q * sizeof(uint64_t), sizeof(b));
      if (b > counts[r] - at) {
        return absl::DataLossError(
            absl::StrCat("AllToAllV: rank ", r, "'s block sizes exceed its message"));
      }
      if (q == rank()) (*recv)[r].assign(base + at, base + at + b);
      at += b;
    }
    off += counts[r];
  }
  return absl::OkStatus();
}

}  // namespace spex
