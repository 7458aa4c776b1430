// histogram_select_bench: the cost of MiCRO's and ExDyna's selection (HistogramQuotaSelect over
// one node's partition) with and without the edge hint, interleaved call by call in one process
// on the same inputs. Inputs: one partition of a ResNet-50-sized bucket at --nodes nodes
// (25,557,032 / nodes floats), heavy-tailed like bench/sparse_exchange_trainer's (a fixed
// per-coordinate scale, 0.5% of coordinates x10, times fresh normal noise every step), quota
// k / nodes for each density. Each step draws new noise; the hinted call carries its hint from
// the previous step (as the compressors do), the hint-less one counts the full histogram. Both
// selections are compared (they must be equal). One JSON object per (density, step) on stdout.
//
//   bazel build //bench:histogram_select_bench && bazel-bin/bench/histogram_select_bench
//   /usr/bin/python3 bench/histogram_select_bench.py   # pinned, plotted
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "kernels/compressor.h"
#include "kernels/compressors/threshold_control.h"
#include "kernels/cpu/cpu_primitives.h"

ABSL_FLAG(int64_t, bucket, 25557032, "bucket size in floats (a node selects in bucket / nodes)");
ABSL_FLAG(int, nodes, 2, "node count (the partition is bucket / nodes)");
ABSL_FLAG(std::string, densities, "0.001,0.01", "comma-separated densities");
ABSL_FLAG(int, steps, 21, "timed steps per density (after 2 untimed)");
ABSL_FLAG(int, threads, 1, "CPU primitives' threads");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_bucket) / absl::GetFlag(FLAGS_nodes));
  auto prims = spex::MakeCpuPrimitives(absl::GetFlag(FLAGS_threads));
  std::mt19937 gen(7);
  std::exponential_distribution<float> expo(1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> sigma(n), x(n);
  for (size_t i = 0; i < n; ++i) sigma[i] = expo(gen) * (gen() % 200 == 0 ? 10.0f : 1.0f);
  std::vector<float> pool(2 * n);
  for (float& z : pool) z = normal(gen);
  for (double d : spex::bench::FlagList<double>(absl::GetFlag(FLAGS_densities))) {
    const size_t quota = std::max<size_t>(
        1, static_cast<size_t>(d * absl::GetFlag(FLAGS_bucket)) / absl::GetFlag(FLAGS_nodes));
    std::vector<uint32_t> bins_full, bins_hint;
    uint32_t hint = 0;
    const int steps = absl::GetFlag(FLAGS_steps);
    for (int step = -2; step < steps; ++step) {
      const size_t off = (static_cast<size_t>(step + 2) * 7919 * 64) % n;
      for (size_t i = 0; i < n; ++i) x[i] = sigma[i] * pool[off + i];
      spex::Selection full, hinted;
      double ms[2];
      for (int pass = 0; pass < 2; ++pass) {  // the order alternates from step to step
        const bool with_hint = ((pass + step) & 1) == 1;
        spex::Selection& out = with_hint ? hinted : full;
        const auto t0 = std::chrono::steady_clock::now();
        spex::HistogramQuotaSelect(prims.get(), x.data(), 0, n, quota, true,
                                   with_hint ? &bins_hint : &bins_full, &out, nullptr,
                                   with_hint ? &hint : nullptr);
        ms[with_hint] =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
      }
      if (full.idx != hinted.idx || full.val != hinted.val) {
        std::fprintf(stderr, "histogram_select_bench: density %g step %d: selections differ\n", d,
                     step);
        return 1;
      }
      if (step < 0) continue;
      std::printf(
          "{\"density\":%g,\"step\":%d,\"elements\":%zu,\"quota\":%zu,\"selected\":%zu,"
          "\"full_ms\":%.4f,\"hint_ms\":%.4f,\"hint_bin\":%u}\n",
          d, step, n, quota, full.idx.size(), ms[0], ms[1], hint);
    }
  }
  return 0;
}
