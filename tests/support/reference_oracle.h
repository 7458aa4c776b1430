// The expected results of a sparse bucket's steps, from kernels/reference_cluster.h: what the
// engine tests compare every trainer's output and every node's residual norm against. Both the
// engine conformance suite and tests/daemon/compressor_engine_test run an engine job over the
// same inputs and check it step by step against this.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"

namespace spex::test {

struct OracleSteps {
  std::vector<std::vector<float>> out;             // [step][element]: every trainer's output
  std::vector<std::vector<double>> residual_norm;  // [step][node]: the L2 norm of the residual
};

// Runs `steps` steps of `nodes` x `trainers` with error feedback over value(node, trainer,
// step, i) for i < spec.elements.
inline absl::StatusOr<OracleSteps> RunReferenceCluster(
    const CompressorSpec& spec, int nodes, int trainers, int steps, Primitives* prims,
    const std::function<float(int, int, uint64_t, size_t)>& value) {
  auto oracle = ReferenceCluster::Create(spec, nodes, trainers, /*error_feedback=*/true, prims);
  if (!oracle.ok()) return oracle.status();
  const size_t n = spec.elements;
  OracleSteps r;
  r.out.assign(steps, std::vector<float>(n));
  r.residual_norm.assign(steps, std::vector<double>(nodes));
  std::vector<std::vector<std::vector<float>>> inputs(
      nodes, std::vector<std::vector<float>>(trainers, std::vector<float>(n)));
  for (int s = 0; s < steps; ++s) {
    std::vector<std::vector<const float*>> ptrs(nodes);
    for (int node = 0; node < nodes; ++node) {
      for (int t = 0; t < trainers; ++t) {
        for (size_t i = 0; i < n; ++i) inputs[node][t][i] = value(node, t, s, i);
        ptrs[node].push_back(inputs[node][t].data());
      }
    }
    absl::Status st = (*oracle)->Step(s, ptrs, r.out[s].data());
    if (!st.ok()) return st;
    for (int node = 0; node < nodes; ++node) {
      double sq = 0;
      for (float x : (*oracle)->residual(node)) sq += static_cast<double>(x) * x;
      r.residual_norm[s][node] = std::sqrt(sq);
    }
  }
  return r;
}

}  // namespace spex::test
