// The expected results of a sparse bucket's steps, from kernels/reference_cluster.h, and an
// engine job over the same inputs checked step by step against them: every trainer's output and
// every node's residual norm. Used by the engine conformance suite and
// tests/daemon/compressor_engine_test.
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"
#include "tests/support/engine_cluster.h"

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

// Runs the oracle's steps on every trainer of `cluster` (bucket 7 of the oracle's size, the RPC
// path; trainer t of a node on GPU device_of(t)), each trainer's input value(node, t, step, i),
// and expects every output within float rounding of the oracle's, every exchange reported with
// `pattern`, and the residual norm within 1e-5 of the oracle's wherever check_norm(node, t).
inline void ExpectJobMatchesOracle(EngineCluster& cluster, int trainers,
                                   const std::string& compressor, double density, Pattern pattern,
                                   const OracleSteps& oracle,
                                   const std::function<float(int, int, uint64_t, size_t)>& value,
                                   const std::function<int(int)>& device_of,
                                   const std::function<bool(int, int)>& check_norm) {
  const int nodes = static_cast<int>(oracle.residual_norm.at(0).size());
  const size_t n = oracle.out.at(0).size();
  std::atomic<int> wrong{0}, norm_wrong{0}, bad_pattern{0};
  std::vector<std::string> errors(nodes * trainers);
  cluster.ForEachTrainer([&](int r, int t) {
    std::string& err = errors[r * trainers + t];
    auto tr = Trainer::Open(&cluster.engine(r), t, trainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(7, n, compressor, density, {}, device_of(t));
    if (!g.ok()) return void(err = g.status().ToString());
    const float* out = tr->output(7);
    for (size_t s = 0; s < oracle.out.size(); ++s) {
      tr->Fill(7, [&](size_t i) { return value(r, t, s, i); });
      auto rec = tr->Exchange(7, s, absl::Seconds(30));
      if (!rec.ok()) return void(err = rec.status().ToString());
      bad_pattern += rec->pattern != PatternName(pattern);
      for (size_t i = 0; i < n; ++i) {
        const float want = oracle.out[s][i];
        wrong += !(std::abs(out[i] - want) <= 1e-6f * (1e-3f + std::abs(want)));
      }
      if (check_norm(r, t)) {
        const double want = oracle.residual_norm[s][r];
        norm_wrong += !(std::abs(rec->residual_norm - want) <= 1e-5 * (1e-6 + want));
      }
    }
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(wrong.load(), 0) << "elements differing from the oracle's result";
  EXPECT_EQ(norm_wrong.load(), 0) << "residual norms differing from the oracle's residual";
  EXPECT_EQ(bad_pattern.load(), 0)
      << "exchanges not reported with pattern " << PatternName(pattern);
}

}  // namespace spex::test
