// gathered_volume_sim: total gathered elements per step vs node count, simulated with
// kernels/reference_cluster.h (the real compressors with their real controllers on N nodes in
// one process; the exchange itself is modelled, not timed). Part 2 of
// bench/sparse_exchange_bench.py (issue 4 item 8): with k = density * n, pattern A (micro, exdyna)
// gathers the union of the nodes' selections, pattern B (topk) every node's k.
//
// Inputs: the generator of bench/sparse_exchange_trainer.cc (fixed heavy-tailed per-coordinate
// scale shared by all nodes, a fresh normal window per (step, node)), 1 trainer per node, error
// feedback on. One JSON object per (nodes, density, compressor) on stdout: gathered elements per
// step (median over the timed steps; warm-up steps let the controllers settle).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"

using spex::bench::FlagList;

ABSL_FLAG(int64_t, elements, 3194629, "bucket size in floats");
ABSL_FLAG(std::string, nodes, "2,4,8", "comma-separated node counts");
ABSL_FLAG(std::string, densities, "0.001,0.01", "comma-separated target densities");
ABSL_FLAG(std::string, compressors, "micro,exdyna,topk", "comma-separated compressors");
ABSL_FLAG(int, warmup, 5, "steps before measuring (controllers settle)");
ABSL_FLAG(int, steps, 10, "measured steps");
ABSL_FLAG(int, threads, 0, "CPU primitive threads (0 = all cores)");

namespace {

void Check(const absl::Status& s, const std::string& what) {
  if (!s.ok()) {
    std::fprintf(stderr, "gathered_volume_sim: %s: %s\n", what.c_str(), s.ToString().c_str());
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_elements));
  const std::vector<int> node_counts = FlagList<int>(absl::GetFlag(FLAGS_nodes));
  const int max_nodes = *std::max_element(node_counts.begin(), node_counts.end());
  std::unique_ptr<spex::Primitives> prims = spex::MakeCpuPrimitives(absl::GetFlag(FLAGS_threads));
  std::vector<float> sigma(n), pool(2 * n);
  {
    std::mt19937 gen(99);
    std::exponential_distribution<float> expo(1.0f);
    for (float& v : sigma) v = expo(gen) * ((gen() % 1000) < 5 ? 10.0f : 1.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : pool) v = normal(gen);
  }
  auto offset = [&](uint64_t step, int node) {
    return (step * 1000003ull + node * 7777777ull) % n;
  };
  std::vector<std::vector<float>> grads(max_nodes, std::vector<float>(n));
  std::vector<float> out(n), mag(n);
  for (size_t i = 0; i < n; ++i) mag[i] = std::fabs(sigma[i] * pool[offset(0, 0) + i]);
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  for (double d : FlagList<double>(absl::GetFlag(FLAGS_densities))) {
    const size_t k = std::max<size_t>(1, static_cast<size_t>(d * n));
    std::nth_element(mag.begin(), mag.begin() + (n - k), mag.end());
    const float scale =
        static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(k)))) / mag[n - k];
    for (int nodes : node_counts) {
      for (const std::string& name : FlagList<std::string>(absl::GetFlag(FLAGS_compressors))) {
        spex::CompressorSpec spec;
        spec.name = name;
        spec.density = d;
        spec.elements = n;
        auto cluster =
            spex::ReferenceCluster::Create(spec, nodes, 1, /*error_feedback=*/true, prims.get());
        Check(cluster.status(), name);
        std::vector<double> gathered, selected;
        for (int step = 0; step < warmup + steps; ++step) {
          std::vector<std::vector<const float*>> inputs(nodes);
          for (int r = 0; r < nodes; ++r) {
            const float* z = pool.data() + offset(step, r);
            float* g = grads[r].data();
            for (size_t i = 0; i < n; ++i) g[i] = scale * sigma[i] * z[i];
            inputs[r] = {g};
          }
          Check((*cluster)->Step(step, inputs, out.data()), name);
          if (step >= warmup) {
            gathered.push_back(static_cast<double>((*cluster)->gathered()));
            double sum = 0;
            for (uint64_t c : (*cluster)->counts()) sum += static_cast<double>(c);
            selected.push_back(sum / nodes);
          }
        }
        std::sort(gathered.begin(), gathered.end());
        double mean_sel = 0;
        for (double s : selected) mean_sel += s / selected.size();
        const double med = gathered[gathered.size() / 2];
        std::printf(
            "{\"source\":\"simulator\",\"nodes\":%d,\"elements\":%zu,\"density\":%g,\"compressor\":"
            "\"%s\","
            "\"k\":%zu,\"gathered_p50\":%.0f,\"gathered_min\":%.0f,\"gathered_max\":%.0f,"
            "\"gathered_over_k\":%.4f,"
            "\"mean_selected_per_node\":%.1f}\n",
            nodes, n, d, name.c_str(), k, med, gathered.front(), gathered.back(), med / k,
            mean_sel);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
