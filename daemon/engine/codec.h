// The engine's narrow view of a compressor: what it must do once per exchange of one bucket.
// Adapters in codec.cc map it onto the compressor library (kernels/); tests may supply their
// own. Error feedback stays in the engine: the codec sees `acc` (residual + this step's local
// sum) and, for pattern B with zero_selected, zeroes what it selected.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/primitives.h"

namespace spex {

enum class WirePattern { kIndexUnion /*A*/, kSparseGather /*B*/, kDense /*D*/ };
const char* PatternName(WirePattern p);

struct CodecSelection {
  std::vector<uint32_t> idx;  // ascending, unique, < n
  std::vector<float> val;     // acc at idx (pattern B)
  float scalars[4] = {};      // e.g. the threshold used; travels in the chunk header
};

class Codec {
 public:
  virtual ~Codec() = default;
  virtual WirePattern pattern() const = 0;
  virtual void SetDensity(double density) = 0;
  virtual absl::Status Select(float* acc, size_t n, uint64_t step, bool zero_selected, CodecSelection* out) = 0;
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

// Null for "dense" (pattern D is the engine's own path); an error naming the accepted
// compressors for an unknown name or a bad parameter.
absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const CodecSpec& spec, Primitives* prims);
// Checks a name and parameters without building anything (for registration-time errors).
absl::Status ValidateCodec(const std::string& name, double density, const std::map<std::string, std::string>& params);

}  // namespace spex
