// The engine's narrow view of a compressor: what it must do once per exchange of one bucket.
// The adapter in codec.cc maps it onto the compressor library (kernels/compressor.h); tests may
// supply their own. Error feedback stays in the engine: the codec sees `acc` (residual + this
// step's local sum) and, for pattern B with zero_selected, zeroes what it selected; for pattern A
// the engine zeroes the gathered union after the exchange.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

// The wire patterns and the selection are the compressor library's own types.
using WirePattern = Pattern;       // A: kIndexUnion, B: kSparseGather, D: kDense
using CodecSelection = Selection;  // idx ascending, unique, < n; val = acc at idx (B)

class Codec {
 public:
  virtual ~Codec() = default;
  virtual WirePattern pattern() const = 0;
  virtual absl::Status SetDensity(double density) = 0;
  // `out` is the bucket's own selection, reused across steps.
  virtual absl::Status Select(float* acc, size_t n, uint64_t step, bool zero_selected,
                              CodecSelection* out) = 0;
  // What every node gathered this step: per-node counts and, for A the union, for B every
  // node's indices in node order.
  virtual absl::Status Update(uint64_t step, const std::vector<uint64_t>& counts,
                              const std::vector<uint32_t>& gathered) = 0;
};

struct CodecSpec {
  std::string name;
  double density = 0.01;
  std::map<std::string, std::string> params;
  int node_rank = 0;
  int node_count = 1;
  size_t elements = 0;
};

// Null for "dense" (pattern D is the engine's own path, an all-reduce); otherwise the named
// compressor of kernels/compressors. An error naming the accepted compressors for an unknown
// name, and naming the parameter for a bad one.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const CodecSpec& spec, Primitives* prims);
// Checks a name and parameters without building anything (for registration-time errors).
absl::Status ValidateCodec(const std::string& name, double density,
                           const std::map<std::string, std::string>& params);

}  // namespace spex
