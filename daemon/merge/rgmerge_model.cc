// rgmerge's model plan (rgmerge_model.h): the public RGMerge/SAFusion three-step plan over the
// measured, agreed bucket costs.
#include "daemon/merge/rgmerge_model.h"

#include <algorithm>

namespace spex {
namespace {

struct Group {
  size_t first = 0, count = 0;  // buckets [first, first + count)
  uint64_t elements = 0;
  int64_t wait = 0, select = 0, m = 0;  // sum W, sum C, comm(sum n) + sum C
};

}  // namespace

int64_t RgmergeModelComm(const RgmergeModelInputs& in, uint64_t elements) {
  const uint64_t k = static_cast<uint64_t>(in.density * static_cast<double>(elements));
  const int64_t peers = std::max(0, in.nodes - 1);
  return in.alpha_ns + in.beta_ps_per_byte * 8 * static_cast<int64_t>(k) * peers / 1000;
}

std::vector<size_t> RgmergeModelPlan(const RgmergeModelInputs& in) {
  const size_t num_buckets = in.elements.size();
  if (num_buckets == 0) return {};
  bool valid = in.gap_ns.size() == num_buckets && in.select_ns.size() == num_buckets;
  for (size_t b = 0; valid && b < num_buckets; ++b)
    valid = in.gap_ns[b] >= 0 && in.select_ns[b] >= 0;
  if (!valid) return std::vector<size_t>(num_buckets, 1);
  auto finish = [&in](Group* g) { g->m = RgmergeModelComm(in, g->elements) + g->select; };
  // 1. Initial groups.
  std::vector<Group> initial;
  Group g;
  for (size_t b = 0; b < num_buckets; ++b) {
    if (g.count == 0) g.first = b;
    ++g.count;
    g.elements += in.elements[b];
    g.wait += in.gap_ns[b];
    g.select += in.select_ns[b];
    if (g.count >= 2 && g.wait < static_cast<int64_t>(g.count - 1) * in.alpha_ns + in.slack_ns) {
      finish(&g);
      initial.push_back(g);
      g = Group();
    }
  }
  if (g.count > 0) {
    finish(&g);
    initial.push_back(g);
  }
  // 2. Overlap merging.
  std::vector<Group> merged = {initial[0]};
  for (size_t i = 1; i < initial.size();) {
    const int64_t budget = merged.back().m;
    Group run = initial[i];
    int64_t acc = initial[i].wait + initial[i].select;
    size_t j = i + 1;
    if (acc <= budget) {
      for (; j < initial.size(); ++j) {
        const int64_t next = acc + initial[j].wait + initial[j].select;
        if (next > budget) break;
        acc = next;
        run.count += initial[j].count;
        run.elements += initial[j].elements;
        run.wait += initial[j].wait;
        run.select += initial[j].select;
        run.m += initial[j].m;
      }
    }
    merged.push_back(run);
    i = j;
  }
  // 3. Long-tail elimination.
  int64_t rest_time = 0;
  for (size_t i = 1; i < initial.size(); ++i) rest_time += initial[i].wait + initial[i].select;
  std::vector<size_t> plan;
  size_t assigned = 0;
  uint64_t prefix = 0;
  for (size_t i = 0; i < merged.size(); ++i) {
    plan.push_back(merged[i].count);
    assigned += merged[i].count;
    prefix += merged[i].elements;
    if (assigned == num_buckets || RgmergeModelComm(in, prefix) <= rest_time) continue;
    size_t rest = num_buckets - assigned;
    if (in.equal_tail && i >= 2) {
      size_t size = merged[i].count;
      if (size < 3) size = std::max<size_t>(1, rest / 3);
      while (2 * assigned < num_buckets && rest > size) {
        plan.push_back(size);
        assigned += size;
        rest -= size;
      }
    }
    if (rest > 0) plan.push_back(rest);
    return plan;
  }
  return plan;
}

}  // namespace spex
