// The compressor configurations the device tests run (every compressor of
// DeviceCompressorNames(), SIDCo in its stage layouts) and their input data. Shared by
// device_compressor_test (fake device) and cuda_compressor_test (a real GPU).
#ifndef SPEX_TESTS_CUDA_COMPRESSOR_CASES_H_
#define SPEX_TESTS_CUDA_COMPRESSOR_CASES_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kernels/compressor.h"

namespace spex {
namespace testcases {

struct Case {
  std::string label;
  std::string name;
  std::map<std::string, std::string> params;
  double density = 0.01;
};

// SIDCo at both densities, on its compact list and pass per stage. At d = 0.01 with 3 stages
// both later stages read stage 1's survivors and the final selection is picked from that list
// in device scratch; at d = 0.001 with 5 stages the last one cuts a list of few from it, which
// comes back; compact=false collects lists of few only.
inline void AddSidco(std::vector<Case>* cases) {
  for (const char* name : {"sidco_e", "sidco_p", "sidco_gp"}) {
    for (const char* compact : {"true", "false"}) {
      for (const double d : {0.01, 0.001}) {
        const std::string label = std::string(name) + (d == 0.01 ? "_d01" : "_d001") +
                                  (compact[0] == 't' ? "_compact" : "_passes");
        cases->push_back(
            {label, name, {{"compact", compact}, {"stages", d == 0.01 ? "3" : "5"}}, d});
      }
    }
  }
  // The default stage count (2): a single later stage, on acc.
  cases->push_back({"sidco_e_default", "sidco_e", {}});
  // d = 0.01 with 4 stages: the list of stage 1's survivors, then a cut of few from it.
  cases->push_back({"sidco_p_d01_cut", "sidco_p", {{"stages", "4"}}});
}

inline std::vector<Case> Cases() {
  std::vector<Case> cases = {
      {"topk", "topk", {}},
      {"gtopk", "gtopk", {}},
      {"topk_union", "topk_union", {}},
      {"cltk", "cltk", {}},
      {"randomk", "randomk", {{"seed", "3"}}},
      {"thresh", "thresh", {}},
      {"thresh_constant", "thresh", {{"threshold", "0.01"}}},
      {"micro", "micro", {}},
      {"micro_reference", "micro", {{"threshold_control", "reference"}}},
      {"micro_untrimmed", "micro", {{"histogram_trim", "false"}}},
      {"exdyna", "exdyna", {}},
      {"exdyna_reference", "exdyna", {{"threshold_control", "reference"}}},
      {"dgc", "dgc", {{"seed", "5"}}},
      {"gaussiank", "gaussiank", {}},
      {"gaussiank_reference", "gaussiank", {{"refine", "reference"}}},
      {"redsync", "redsync", {}},
      {"redsync_reference", "redsync", {{"search", "reference"}}},
      {"redsync_trim", "redsync_trim", {}},
      {"sage", "sage", {{"seed", "9"}}},
      {"deft", "deft", {}},
  };
  AddSidco(&cases);
  return cases;
}

// Laplace-like values with ties (a fifth rounded to a coarse grid) and exact zeros.
inline std::vector<float> Data(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::exponential_distribution<float> expo(200.0f);  // mean |x| 0.005
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> x(n);
  for (float& v : x) {
    const int k = kind(gen);
    v = (k % 2 ? 1.0f : -1.0f) * expo(gen);
    if (k == 0) v = 0;
    if (k == 1 || k == 2) v = std::round(v * 400.0f) / 400.0f;
  }
  return x;
}

// The exchange's bookkeeping as the engine does it: every node's count and indices, node after
// node; for pattern A (kIndexUnion) the indices are their sorted union (where the caller then
// zeroes acc). Owns what `view()` (the Gathered that Update takes) points into.
struct AllSelections {
  std::vector<uint64_t> counts;
  std::vector<uint32_t> indices;
  Gathered view() const {
    Gathered g;
    g.counts = counts;
    g.indices = indices;
    return g;
  }
};

inline AllSelections GatherSelections(const std::vector<Selection>& selections, Pattern pattern) {
  AllSelections all;
  for (const Selection& s : selections) {
    all.counts.push_back(s.idx.size());
    all.indices.insert(all.indices.end(), s.idx.begin(), s.idx.end());
  }
  if (pattern == Pattern::kIndexUnion) {
    std::sort(all.indices.begin(), all.indices.end());
    all.indices.erase(std::unique(all.indices.begin(), all.indices.end()), all.indices.end());
  }
  return all;
}

}  // namespace testcases
}  // namespace spex

#endif  // SPEX_TESTS_CUDA_COMPRESSOR_CASES_H_
