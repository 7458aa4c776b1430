// The single-process model of the exchange across N nodes, the oracle of the sparse-exchange
// tests (reference_cluster.h).
#include "kernels/reference_cluster.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace spex {

absl::StatusOr<std::unique_ptr<ReferenceCluster>> ReferenceCluster::Create(
    const CompressorSpec& spec, int nodes, int local_trainers, bool error_feedback,
    Primitives* prims) {
  if (nodes < 1 || local_trainers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReferenceCluster: nodes and local trainers must be >= 1, got ", nodes,
                     " and ", local_trainers));
  }
  std::unique_ptr<ReferenceCluster> c(new ReferenceCluster());
  c->nodes_ = nodes;
  c->local_trainers_ = local_trainers;
  c->error_feedback_ = error_feedback;
  c->n_ = spec.elements;
  c->prims_ = prims;
  for (int r = 0; r < nodes; ++r) {
    CompressorSpec s = spec;
    s.node_rank = r;
    s.node_count = nodes;
    auto comp = MakeCompressor(s, prims);
    if (!comp.ok()) return comp.status();
    c->pattern_ = (*comp)->pattern();
    c->comp_.push_back(std::move(*comp));
    c->acc_.emplace_back(spec.elements, 0.0f);
  }
  c->sel_.resize(nodes);
  return c;
}

absl::Status ReferenceCluster::SetDensity(double density) {
  for (auto& c : comp_) {
    if (absl::Status s = c->SetDensity(density); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ReferenceCluster::Step(uint64_t step,
                                    const std::vector<std::vector<const float*>>& inputs,
                                    float* out) {
  if (static_cast<int>(inputs.size()) != nodes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReferenceCluster: ", inputs.size(), " nodes' inputs for ", nodes_, " nodes"));
  }
  const float scale = 1.0f / static_cast<float>(nodes_ * local_trainers_);
  for (int r = 0; r < nodes_; ++r) {
    if (static_cast<int>(inputs[r].size()) != local_trainers_) {
      return absl::InvalidArgumentError(absl::StrCat("ReferenceCluster: node ", r, " has ",
                                                     inputs[r].size(), " inputs, expected ",
                                                     local_trainers_));
    }
    std::vector<float>& acc = acc_[r];
    if (!error_feedback_) std::fill(acc.begin(), acc.end(), 0.0f);
    for (const float* in : inputs[r]) {
      for (size_t i = 0; i < n_; ++i) acc[i] += in[i];
    }
  }
  std::fill(out, out + n_, 0.0f);
  counts_.assign(nodes_, 0);
  gathered_idx_.clear();
  if (pattern_ == Pattern::kDense) {
    for (size_t i = 0; i < n_; ++i) {
      float sum = 0;
      for (int r = 0; r < nodes_; ++r) sum += acc_[r][i];
      out[i] = sum * scale;
    }
    for (auto& acc : acc_) std::fill(acc.begin(), acc.end(), 0.0f);
    for (int r = 0; r < nodes_; ++r) counts_[r] = n_;
    gathered_ = n_;
    return absl::OkStatus();
  }
  const bool union_pattern = pattern_ == Pattern::kIndexUnion;
  for (int r = 0; r < nodes_; ++r) {
    Selection& sel = sel_[r];
    if (absl::Status s =
            comp_[r]->Select(step, acc_[r].data(), nullptr, /*zero_selected=*/false, &sel);
        !s.ok()) {
      return s;
    }
    counts_[r] = sel.idx.size();
    gathered_idx_.insert(gathered_idx_.end(), sel.idx.begin(), sel.idx.end());
  }
  if (union_pattern) {
    std::sort(gathered_idx_.begin(), gathered_idx_.end());
    gathered_idx_.erase(std::unique(gathered_idx_.begin(), gathered_idx_.end()),
                        gathered_idx_.end());
    for (uint32_t i : gathered_idx_) {
      float sum = 0;
      for (int r = 0; r < nodes_; ++r) sum += acc_[r][i];
      out[i] = sum * scale;
      for (int r = 0; r < nodes_; ++r) acc_[r][i] = 0.0f;
    }
  } else {
    for (int r = 0; r < nodes_; ++r) {
      const Selection& sel = sel_[r];
      for (size_t j = 0; j < sel.idx.size(); ++j) {
        out[sel.idx[j]] += sel.val[j] * scale;
        acc_[r][sel.idx[j]] = 0.0f;
      }
    }
  }
  gathered_ = gathered_idx_.size();
  Gathered g;
  g.counts = absl::MakeConstSpan(counts_);
  g.indices = absl::MakeConstSpan(gathered_idx_);
  for (int r = 0; r < nodes_; ++r) {
    if (absl::Status s = comp_[r]->Update(step, g); !s.ok()) return s;
  }
  if (!error_feedback_) {
    for (auto& acc : acc_) std::fill(acc.begin(), acc.end(), 0.0f);
  }
  return absl::OkStatus();
}

}  // namespace spex
