// sum_histogram_bench: MiCRO's local sum and selection on one node, with the partition's histogram
// counted in the sum's pass (Compressor::PlanSumHistogram,
// Primitives::SumScaledCheckFiniteHistogram: what spexd's CPU path does) against the sum and a
// selection that counts for itself, interleaved step by step in one process on the same inputs. The
// bucket is the main job's CNN bucket by default (3,222,538 floats, 2 nodes, density 0.1): each
// step the residual plus two trainers' gradients (a fixed heavy-tailed per-coordinate scale times
// fresh normal noise, the whole step scaled by 2^u, u uniform in [-octaves, octaves], so that the
// partition's edge moves between its selections as it did on the CNN) is summed into the second
// accumulator, the selection runs, and the residual is zeroed at the node's selection and at a
// tenth of the other partition (the peer's share of the union). Both variants keep their own
// residual and must select the same entries. One JSON object per step on stdout (sum and select
// milliseconds of each, the counted start and the edge bin of the fused one).
//
//   bazel build -c opt //bench:sum_histogram_bench
//   /usr/bin/python3 bench/sum_histogram_bench.py   # pinned, repeated, plotted
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/compressor.h"
#include "kernels/cpu/cpu_primitives.h"

ABSL_FLAG(int64_t, bucket, 3222538, "bucket size in floats");
ABSL_FLAG(int, nodes, 2, "node count (MiCRO's partitions)");
ABSL_FLAG(double, density, 0.1, "MiCRO's density");
ABSL_FLAG(int, steps, 40, "timed steps (after 4 untimed)");
ABSL_FLAG(double, octaves, 1.25,
          "each step's gradients are scaled by 2^u, u in [-octaves, octaves]");
ABSL_FLAG(int, seed, 1, "inputs' seed");

namespace {

double Ms(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Variant {
  std::unique_ptr<spex::Compressor> c;
  std::vector<float> acc, next;
  spex::Selection sel;
  double sum_ms = 0, select_ms = 0;
  uint32_t first = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_bucket));
  const int nodes = absl::GetFlag(FLAGS_nodes);
  auto prims = spex::MakeCpuPrimitives(1);
  std::mt19937 gen(static_cast<uint32_t>(absl::GetFlag(FLAGS_seed)));
  std::exponential_distribution<float> expo(1.0f);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> unit(-1.0, 1.0);
  std::vector<float> sigma(n);
  for (size_t i = 0; i < n; ++i) sigma[i] = 1e-4f * expo(gen) * (gen() % 200 == 0 ? 10.0f : 1.0f);
  std::vector<float> pool(2 * n);
  for (float& z : pool) z = normal(gen);
  spex::CompressorSpec spec;
  spec.name = "micro";
  spec.density = absl::GetFlag(FLAGS_density);
  spec.node_rank = 0;
  spec.node_count = nodes;
  spec.elements = n;
  Variant v[2];  // 0: the sum counts the histogram; 1: the selection counts it
  for (Variant& x : v) {
    auto c = spex::MakeCompressor(spec, prims.get());
    if (!c.ok()) {
      std::fprintf(stderr, "sum_histogram_bench: %s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    x.c = *std::move(c);
    x.acc.assign(n, 0.0f);
    x.next.assign(n, 0.0f);
  }
  std::vector<float> g0(n), g1(n);
  std::vector<uint32_t> peer, uni;
  const int steps = absl::GetFlag(FLAGS_steps);
  for (int step = -4; step < steps; ++step) {
    const uint64_t s = static_cast<uint64_t>(step + 4);
    const float scale = static_cast<float>(std::exp2(absl::GetFlag(FLAGS_octaves) * unit(gen)));
    const size_t o0 = (s * 7919 * 64) % n, o1 = (s * 104729 * 32 + 17) % n;
    for (size_t i = 0; i < n; ++i) {
      g0[i] = scale * sigma[i] * pool[o0 + i];
      g1[i] = scale * sigma[i] * pool[o1 + i];
    }
    for (int pass = 0; pass < 2; ++pass) {  // the order alternates from step to step
      Variant& x = v[(pass + step + 4) & 1];
      const bool fused = &x == &v[0];
      const float* xs[3] = {x.acc.data(), g0.data(), g1.data()};
      size_t bad = 0;
      const auto t0 = std::chrono::steady_clock::now();
      if (fused) {
        spex::SumHistogram* plan = x.c->PlanSumHistogram(s);
        if (plan == nullptr) {
          std::fprintf(stderr, "sum_histogram_bench: micro planned no histogram\n");
          return 1;
        }
        x.first = plan->range.first_bin;
        plan->counted =
            prims->SumScaledCheckFiniteHistogram(x.next.data(), xs, 3, 1.0f, n, &bad, plan->range)
                .ok();
      } else {
        (void)prims->SumScaledCheckFinite(x.next.data(), xs, 3, 1.0f, n, &bad);
      }
      x.acc.swap(x.next);
      const auto t1 = std::chrono::steady_clock::now();
      if (absl::Status st = x.c->Select(s, x.acc.data(), nullptr, false, &x.sel); !st.ok()) {
        std::fprintf(stderr, "sum_histogram_bench: %s\n", std::string(st.message()).c_str());
        return 1;
      }
      const auto t2 = std::chrono::steady_clock::now();
      x.sum_ms = Ms(t0, t1);
      x.select_ms = Ms(t1, t2);
    }
    if (v[0].sel.idx != v[1].sel.idx || v[0].sel.val != v[1].sel.val) {
      std::fprintf(stderr, "sum_histogram_bench: step %d: the selections differ\n", step);
      return 1;
    }
    // The union: this node's selection and a tenth of the partition it does not own (the peer's).
    const int part = static_cast<int>((s + 0) % nodes);
    const size_t q = n / nodes;
    peer.clear();
    for (int p = 0; p < nodes; ++p) {
      if (p == part) continue;
      for (size_t i = p * q + (s % 10); i < (p + 1) * q && i < n; i += 10) {
        peer.push_back(static_cast<uint32_t>(i));
      }
    }
    uni.clear();
    uni.reserve(peer.size() + v[0].sel.idx.size());
    std::merge(peer.begin(), peer.end(), v[0].sel.idx.begin(), v[0].sel.idx.end(),
               std::back_inserter(uni));
    std::vector<uint64_t> counts(nodes, 0);
    counts[0] = v[0].sel.idx.size();
    counts[1 % nodes] += peer.size();
    for (Variant& x : v) {
      for (uint32_t i : uni) x.acc[i] = 0.0f;
      if (absl::Status st = x.c->Update(s, {counts, uni}); !st.ok()) {
        std::fprintf(stderr, "sum_histogram_bench: %s\n", std::string(st.message()).c_str());
        return 1;
      }
    }
    if (step < 0) continue;
    const uint32_t edge = spex::Primitives::MagnitudeBits(v[0].sel.scalars[0]) >> 15;
    std::printf(
        "{\"step\":%d,\"elements\":%zu,\"selected\":%zu,\"fused_sum_ms\":%.4f,"
        "\"fused_select_ms\":%.4f,\"plain_sum_ms\":%.4f,\"plain_select_ms\":%.4f,"
        "\"counted_from\":%u,\"edge_bin\":%u}\n",
        step, n, v[0].sel.idx.size(), v[0].sum_ms, v[0].select_ms, v[1].sum_ms, v[1].select_ms,
        v[0].first, edge);
  }
  return 0;
}
