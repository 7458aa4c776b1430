// A plain, single-process model of spex's exchange across N nodes x L local trainers with one
// compressor, written from docs/algorithms.md#patterns and independent of the daemon's engine,
// wire format and collectives. It is the oracle of the sparse-exchange tests (in-process and
// under mpirun: every trainer can rebuild every node's inputs and replay the cluster) and the
// simulator of benchmarks that need more nodes than the machine has cores.
//
// One Step, for every node r:   acc_r = residual_r + sum_t input[r][t]   (t in order; without
//                               error feedback the residual is dropped first)
//                               sel_r = compressor_r.Select(acc_r)
//   A (index union):  U = sorted union of sel_r.idx;  out[U] = (sum_r acc_r[U]) / (N*L);
//                     acc_r[U] = 0
//   B (sparse gather): out = sum_r scatter(sel_r.idx, sel_r.val) / (N*L);  acc_r[sel_r] = 0
//   D (dense):        out = sum_r acc_r / (N*L);  acc_r = 0
//   compressor_r.Update(counts, U or every node's idx in node order); residual_r = acc_r.
// Everything else of `out` is 0.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"

namespace spex {

class ReferenceCluster {
 public:
  // spec.node_rank/node_count are ignored (one compressor per node is built for `nodes`).
  static absl::StatusOr<std::unique_ptr<ReferenceCluster>> Create(const CompressorSpec& spec,
                                                                  int nodes, int local_trainers,
                                                                  bool error_feedback,
                                                                  Primitives* prims);

  // inputs[r][t] points at trainer t of node r's n floats; out receives the n averaged floats
  // every trainer reads.
  absl::Status Step(uint64_t step, const std::vector<std::vector<const float*>>& inputs,
                    float* out);
  // Applies a new target density to every node's compressor (from the next Step on).
  absl::Status SetDensity(double density);

  Pattern pattern() const { return pattern_; }
  int nodes() const { return nodes_; }
  const std::vector<float>& residual(int node) const { return acc_[node]; }
  // For checkpoint tests: node r's compressor (SaveState/LoadState) and a restored residual
  // (n floats).
  Compressor& compressor(int node) { return *comp_[node]; }
  void set_residual(int node, std::vector<float> residual) { acc_[node] = std::move(residual); }
  // Figures of the last Step: per-node selected counts and the elements gathered
  // (A: |U|; B: sum of counts; D: n).
  const std::vector<uint64_t>& counts() const { return counts_; }
  uint64_t gathered() const { return gathered_; }

 private:
  ReferenceCluster() = default;

  Pattern pattern_ = Pattern::kDense;
  int nodes_ = 1;
  int local_trainers_ = 1;
  bool error_feedback_ = true;
  size_t n_ = 0;
  Primitives* prims_ = nullptr;
  std::vector<std::unique_ptr<Compressor>> comp_;
  std::vector<std::vector<float>> acc_;
  std::vector<Selection> sel_;
  std::vector<uint64_t> counts_;
  std::vector<uint32_t> gathered_idx_;
  uint64_t gathered_ = 0;
};

}  // namespace spex
