// The generator of `rgmerge --rgmerge_plan=model` (docs/merging.md 5.2): RGMerge/SAFusion's
// three-step plan (`optimal_gradient_merging_0101` of the public code), with its hard-coded
// tables replaced by inputs a node can measure and all nodes can agree on. A pure function of
// integers (and the density), so every node that is given the same inputs computes the same plan.
//
//  1. initial groups: walk the buckets in canonical (backprop) order and grow a group G; close it
//     at the first |G| >= 2 with sum(W_G) < (|G| - 1) * alpha + slack (merging saves more
//     start-ups than it waits); a leftover becomes one group. Per group M = comm(sum n) + sum C;
//  2. overlap merging: emit the first group; then, with the budget M of the last emitted group,
//     take the longest run of following groups whose accumulated W + C stays within it (the
//     accumulator restarts at every emission, which the reference forgot) and emit it merged,
//     or the next group alone if it already exceeds the budget;
//  3. long-tail elimination: R = sum(W + C) over the initial groups but the first; walk the
//     step-2 groups, and after appending group i, if comm(buckets up to i) > R, the rest is
//     one final group; with equal_tail (the reference's behaviour) and i >= 2 the rest is cut
//     into groups of group i's bucket count (floor(rest / 3) when that is < 3) until at least
//     half of all buckets are assigned, the remainder last.
// comm(x) = alpha + beta * 8 * floor(density * x) * (nodes - 1): the all-gather of pattern B's
// (index, value) pairs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spex {

struct RgmergeModelInputs {
  std::vector<uint64_t> elements;   // n_b, per bucket in canonical order
  std::vector<int64_t> gap_ns;      // W_b: the backward gap before bucket b is ready (>= 0)
  std::vector<int64_t> select_ns;   // C_b: its selection time (>= 0)
  int64_t alpha_ns = 3780956;       // a collective's start-up (SAFusion's 3.78 ms by default)
  int64_t beta_ps_per_byte = 1000;  // a byte's cost (1 ns/B by default)
  double density = 0.01;
  int nodes = 2;
  int64_t slack_ns = 0;    // delta (--rgmerge_slack_us)
  bool equal_tail = true;  // step 3's equal split (--rgmerge_equal_tail)
};

// The plan: group lengths (each >= 1) summing to the number of buckets; empty for no buckets.
// Inputs of different lengths, or negative times, give one group per bucket.
std::vector<size_t> RgmergeModelPlan(const RgmergeModelInputs& in);

// comm(x) of the model, in ns.
int64_t RgmergeModelComm(const RgmergeModelInputs& in, uint64_t elements);

}  // namespace spex
