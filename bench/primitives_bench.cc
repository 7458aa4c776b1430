// Micro-benchmark of the CPU primitives on a gradient-sized buffer (25,557,032 floats, ResNet-50):
// each primitive's median time as a ratio to memcpy of the same buffer measured in the same run,
// with 1 and 2 threads, its speed-up over the scalar reference, and TopK against
// std::nth_element. Prints a table and writes JSON (--json_out).
//
//   bazel run //bench:primitives_bench -- --json_out=bench/results/primitives.json
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "kernels/cpu/cpu_primitives.h"
#include "kernels/half.h"
#include "kernels/primitives.h"
#include "kernels/reference/reference_primitives.h"

using spex::bench::Median;

ABSL_FLAG(std::string, json_out, "bench/results/primitives.json",
          "where to write the results (relative paths are under the workspace with bazel run)");
ABSL_FLAG(int64_t, n, 25557032, "floats per buffer");
ABSL_FLAG(int, reps, 7, "timed repetitions per measurement (the median is reported)");
ABSL_FLAG(std::string, threads, "1,2", "comma-separated thread counts to measure");
ABSL_FLAG(std::string, only, "", "time only primitives whose name contains this");
ABSL_FLAG(bool, reference, true, "also time the scalar reference (slow: TopK sorts everything)");

namespace spex {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Median milliseconds of `reps` runs of fn and of the baseline, interleaved (baseline, fn, ...)
// after one warm-up of each, so that both see the same machine load. prepare() runs untimed
// before each run of fn.
struct Timing {
  double ms, baseline_ms;
};
Timing TimePaired(int reps, const std::function<void()>& fn, const std::function<void()>& baseline,
                  const std::function<void()>& prepare = nullptr) {
  std::vector<double> a, b;
  for (int r = -1; r < reps; ++r) {
    const double tb = Ms(baseline);
    if (prepare) prepare();
    const double ta = Ms(fn);
    if (r >= 0) {
      a.push_back(ta);
      b.push_back(tb);
    }
  }
  return {Median(a), Median(b)};
}

std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(gen) * ((gen() % 1000) < 5 ? 100.0f : 1.0f);
  return x;
}

float MagnitudeQuantile(const std::vector<float>& x, double top_fraction) {
  std::vector<float> a(x.size());
  for (size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(x[i]);
  const size_t pos = static_cast<size_t>((1.0 - top_fraction) * a.size());
  std::nth_element(a.begin(), a.begin() + pos, a.end());
  return a[pos];
}

struct Row {
  std::string name;
  int threads;
  double ms;
  double memcpy_ms;     // the baseline, interleaved with this row's runs
  double bytes;         // memory the operation must touch at least
  double reference_ms;  // < 0: not measured
};

struct Buffers {
  std::vector<float> x, x0, y, add, val;
  std::vector<uint32_t> idx, sel;  // sel: sorted indices of the top 1% (for Gather & co.)
  std::vector<uint32_t> bins = std::vector<uint32_t>(Primitives::kHistogramBins);
};

// Times every primitive of p; appends one row each.
void TimePrimitives(Primitives& p, int threads, int reps, Buffers& b, float t01, float t1,
                    const std::function<void()>& baseline, std::vector<Row>* rows) {
  const size_t n = b.x.size(), m = b.sel.size();
  const double fb = 4.0 * n;
  auto restore_x = [&] { std::memcpy(b.x.data(), b.x0.data(), n * sizeof(float)); };
  auto add = [&](const std::string& name, double bytes, const std::function<void()>& fn,
                 const std::function<void()>& prepare = nullptr) {
    if (name.find(absl::GetFlag(FLAGS_only)) == std::string::npos) return;
    const Timing t = TimePaired(reps, fn, baseline, prepare);
    rows->push_back({name, threads, t.ms, t.baseline_ms, bytes, -1});
  };
  add("Accumulate y+=x", 3 * fb, [&] { p.Accumulate(b.y.data(), b.x.data(), n); });
  add("Scale", 2 * fb, [&] { p.Scale(b.y.data(), 1.0f, n); });
  add("CountAbove 1%", fb, [&] { p.CountAbove(b.x.data(), n, t1); });
  add("SelectAbove 0.1%", fb,
      [&] { p.SelectAbove(b.x.data(), 0, n, t01, false, b.idx.data(), b.val.data(), n); });
  add("SelectAbove 1%", fb,
      [&] { p.SelectAbove(b.x.data(), 0, n, t1, false, b.idx.data(), b.val.data(), n); });
  add(
      "SelectAbove 1% +zero", fb,
      [&] { p.SelectAbove(b.x.data(), 0, n, t1, true, b.idx.data(), b.val.data(), n); }, restore_x);
  add(
      "AddSelectAbove 1% +zero", 3 * fb,
      [&] {
        p.AddSelectAbove(b.x.data(), b.add.data(), 0, n, t1, true, b.idx.data(), b.val.data(), n);
      },
      restore_x);
  add("TopK 0.1%", fb, [&] { p.TopK(b.x.data(), n, n / 1000, b.idx.data(), b.val.data()); });
  add("TopK 1%", fb, [&] { p.TopK(b.x.data(), n, n / 100, b.idx.data(), b.val.data()); });
  add("Moments all", fb, [&] { p.Moments(b.x.data(), n, -1.0f); });
  add("Moments >1% thr", fb, [&] { p.Moments(b.x.data(), n, t1); });
  add("AbsHistogram16", fb, [&] { p.AbsHistogram16(b.x.data(), 0, n, b.bins.data()); });
  add("Sample 1%", 4.0 * m, [&] { p.Sample(b.x.data(), n, m, 7, b.val.data()); });
  add("Gather 1%", 8.0 * m, [&] { (void)p.Gather(b.x.data(), n, b.sel.data(), m, b.val.data()); });
  add("ScatterAdd 1%", 8.0 * m,
      [&] { (void)p.ScatterAdd(b.y.data(), n, b.sel.data(), b.val.data(), m); });
  add("ZeroAt 1%", 4.0 * m, [&] { (void)p.ZeroAt(b.y.data(), n, b.sel.data(), m); });
}

int Main() {
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_n));
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<int> thread_counts;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int t;
    if (!absl::SimpleAtoi(s, &t) || t < 1) {
      std::fprintf(stderr, "--threads: '%s' is not a positive integer\n", std::string(s).c_str());
      return 2;
    }
    thread_counts.push_back(t);
  }
  if (n < 1000) {
    std::fprintf(stderr, "--n must be at least 1000\n");
    return 2;
  }

  Buffers b;
  b.x0 = Gradient(n, 1);
  b.x = b.x0;
  b.y = Gradient(n, 2);
  b.add = Gradient(n, 3);
  for (float& v : b.add) v *= 0.1f;
  b.idx.resize(n);
  b.val.resize(n);
  const float t01 = MagnitudeQuantile(b.x0, 0.001), t1 = MagnitudeQuantile(b.x0, 0.01);
  b.sel.resize(n / 100);
  b.sel.resize(MakeCpuPrimitives()->TopK(b.x0.data(), n, n / 100, b.sel.data(), b.val.data()));

  // Baselines, in the same run: memcpy of the buffer (interleaved with every row's runs) and
  // std::nth_element over a fresh copy of |x| (interleaved with TopK's; the copy is not timed).
  std::vector<float> dst(n);
  auto memcpy_buffer = [&] { std::memcpy(dst.data(), b.x0.data(), n * sizeof(float)); };
  std::vector<float> mags(n);
  auto fill_mags = [&] {
    for (size_t i = 0; i < n; ++i) mags[i] = std::fabs(b.x0[i]);
  };
  const size_t ks[2] = {n / 1000, n / 100};

  std::vector<Row> rows;
  for (int threads : thread_counts) {
    auto p = MakeCpuPrimitives(threads);
    TimePrimitives(*p, threads, reps, b, t01, t1, memcpy_buffer, &rows);
  }
  // TopK against nth_element, paired run by run.
  struct TopKRow {
    size_t k;
    int threads;
    double topk_ms, nth_ms;
  };
  std::vector<TopKRow> topk_rows;
  for (int threads : thread_counts) {
    auto p = MakeCpuPrimitives(threads);
    for (size_t k : ks) {
      std::vector<double> topk_ms, nth_ms;
      for (int r = -1; r < reps; ++r) {
        fill_mags();
        const double nth = Ms([&] {
          std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), std::greater<float>());
        });
        const double topk = Ms([&] { p->TopK(b.x0.data(), n, k, b.idx.data(), b.val.data()); });
        if (r >= 0) {
          nth_ms.push_back(nth);
          topk_ms.push_back(topk);
        }
      }
      topk_rows.push_back({k, threads, Median(topk_ms), Median(nth_ms)});
    }
  }
  // The non-finite policy's detecting local reduce (issue 16 item 3) against the plain
  // SumScaled it replaces, 2 trainers' inputs, paired run by run (stdout only, not in the JSON).
  struct CheckRow {
    int threads;
    double check_ms, sum_ms;
  };
  std::vector<CheckRow> check_rows;
  if (std::string("SumScaledCheckFinite").find(absl::GetFlag(FLAGS_only)) != std::string::npos) {
    const float* xs[2] = {b.x0.data(), b.add.data()};
    for (int threads : thread_counts) {
      auto p = MakeCpuPrimitives(threads);
      size_t first_bad = 0;
      const Timing t = TimePaired(
          reps, [&] { (void)p->SumScaledCheckFinite(b.y.data(), xs, 2, 0.5f, n, &first_bad); },
          [&] { (void)p->SumScaled(b.y.data(), xs, 2, 0.5f, n); });
      check_rows.push_back({threads, t.ms, t.baseline_ms});
    }
  }
  // Half-precision inputs (issue 30, docs/dtypes.md): the error-feedback local reduce (residual
  // + 2 trainers' inputs) and a 1% selection with zeroing, the inputs bfloat16 / float16 (widened
  // in the fused pass) against float32 inputs, paired run by run, one thread (the half passes
  // are single-threaded). The goal: no more time per element than float32.
  // Also the dense local reduce (2 trainers' inputs, scaled) and the residual at a 1% union
  // (pattern A: a half bucket keeps the wire's rounding there, float32 zeroes it).
  struct HalfRow {
    std::string what, type;
    double half_ms, f32_ms;
  };
  std::vector<HalfRow> half_rows;
  if (std::string("half-input").find(absl::GetFlag(FLAGS_only)) != std::string::npos) {
    auto p = MakeCpuPrimitives(1);
    std::vector<float> acc_next(n), x1(b.add);
    const float* xs[3] = {b.y.data(), b.x0.data(), x1.data()};
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      std::vector<uint16_t> h0(n), h1(n);
      half::Narrow(t, b.x0.data(), h0.data(), n);
      half::Narrow(t, x1.data(), h1.data(), n);
      const uint16_t* hs[2] = {h0.data(), h1.data()};
      const Timing tm = TimePaired(
          reps,
          [&] {
            half::SumWidenScaled(t, acc_next.data(), b.y.data(), hs, 2, 1.0f, n, true);
            p->SelectAbove(acc_next.data(), 0, n, t1, true, b.idx.data(), b.val.data(), n);
          },
          [&] {
            size_t bad = 0;
            (void)p->SumScaledCheckFinite(acc_next.data(), xs, 3, 1.0f, n, &bad);
            p->SelectAbove(acc_next.data(), 0, n, t1, true, b.idx.data(), b.val.data(), n);
          });
      half_rows.push_back({"EF reduce (residual + 2 inputs) + SelectAbove 1% +zero", DTypeName(t),
                           tm.ms, tm.baseline_ms});
      const float* xs2[2] = {b.x0.data(), x1.data()};
      const Timing dense = TimePaired(
          reps, [&] { half::SumWidenScaled(t, acc_next.data(), nullptr, hs, 2, 0.25f, n, true); },
          [&] {
            size_t bad = 0;
            (void)p->SumScaledCheckFinite(acc_next.data(), xs2, 2, 0.25f, n, &bad);
          });
      half_rows.push_back({"dense local reduce (2 inputs, x 1/4, finite check)", DTypeName(t),
                           dense.ms, dense.baseline_ms});
      const Timing keep = TimePaired(
          reps,
          [&] { half::KeepRounding(t, acc_next.data(), b.sel.data(), nullptr, b.sel.size()); },
          [&] { (void)p->ZeroAt(acc_next.data(), n, b.sel.data(), b.sel.size()); },
          // Fresh values at the union each time (not timed): remainders of remainders would go
          // subnormal. Only the union's lines are touched, so both sides find them alike in cache
          // (a copy of the whole buffer here evicted them before KeepRounding alone).
          [&] {
            for (uint32_t i : b.sel) acc_next[i] = b.x0[i];
          });
      half_rows.push_back({"residual at a 1% union: KeepRounding vs ZeroAt", DTypeName(t), keep.ms,
                           keep.baseline_ms});
    }
  }
  if (absl::GetFlag(FLAGS_reference)) {
    std::vector<Row> ref_rows;
    auto ref = MakeReferencePrimitives();
    // Interleaved with memcpy too, so the reference sees the same (cold) caches.
    TimePrimitives(*ref, 1, 1, b, t01, t1, memcpy_buffer, &ref_rows);
    for (Row& r : rows) {
      for (const Row& q : ref_rows) {
        if (q.name == r.name) r.reference_ms = q.ms;
      }
    }
  }

  std::printf("CPU primitives, n = %zu floats (%.1f MB), SIMD target %s, median of %d\n", n,
              4.0 * n / 1e6, CpuPrimitivesTarget(), reps);
  std::printf("x memcpy: the primitive's time / memcpy of the same buffer, runs interleaved\n\n");
  for (const HalfRow& r : half_rows) {
    std::printf("%s, %s inputs, 1 thread: %.2f ms vs float32 %.2f ms = %.3fx (%s)\n",
                r.what.c_str(), r.type.c_str(), r.half_ms, r.f32_ms, r.half_ms / r.f32_ms,
                half::TargetName());
  }
  for (const CheckRow& r : check_rows) {
    std::printf(
        "SumScaledCheckFinite (2 inputs), %d thread(s): %.2f ms vs SumScaled %.2f ms = %.3fx\n",
        r.threads, r.check_ms, r.sum_ms, r.check_ms / r.sum_ms);
  }

  std::printf("%-26s %7s %9s %10s %10s %9s %11s\n", "primitive", "threads", "ms", "memcpy ms",
              "x memcpy", "GB/s", "vs scalar");
  for (const Row& r : rows) {
    std::printf("%-26s %7d %9.2f %10.2f %10.2f %9.1f", r.name.c_str(), r.threads, r.ms, r.memcpy_ms,
                r.ms / r.memcpy_ms, r.bytes / r.ms / 1e6);
    if (r.reference_ms > 0) {
      std::printf(" %10.1fx\n", r.reference_ms / r.ms);
    } else {
      std::printf(" %11s\n", "-");
    }
  }
  std::printf("\nTopK vs std::nth_element over a copy of |x| (copy not timed):\n");
  std::printf("%-10s %7s %9s %14s %9s\n", "k", "threads", "TopK ms", "nth_element ms", "speedup");
  std::string topk_json;
  for (const TopKRow& r : topk_rows) {
    std::printf("%-10zu %7d %9.2f %14.2f %8.1fx\n", r.k, r.threads, r.topk_ms, r.nth_ms,
                r.nth_ms / r.topk_ms);
    absl::StrAppend(&topk_json, topk_json.empty() ? "" : ",\n    ",
                    absl::StrFormat("{\"k\": %zu, \"threads\": %d, \"topk_ms\": %.4f, "
                                    "\"nth_element_ms\": %.4f, \"speedup\": %.3f}",
                                    r.k, r.threads, r.topk_ms, r.nth_ms, r.nth_ms / r.topk_ms));
  }

  std::string json = absl::StrFormat(
      "{\n  \"n\": %zu,\n  \"simd_target\": \"%s\",\n  \"reps\": %d,\n  \"primitives\": [\n", n,
      CpuPrimitivesTarget(), reps);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    absl::StrAppend(
        &json, absl::StrFormat(
                   "    {\"name\": \"%s\", \"threads\": %d, \"ms\": %.4f, \"memcpy_ms\": "
                   "%.4f, \"vs_memcpy\": %.4f, \"gb_per_s\": %.3f, \"reference_ms\": %.4f}%s\n",
                   r.name, r.threads, r.ms, r.memcpy_ms, r.ms / r.memcpy_ms, r.bytes / r.ms / 1e6,
                   r.reference_ms, i + 1 < rows.size() ? "," : ""));
  }
  std::string half_json;
  for (const HalfRow& r : half_rows) {
    absl::StrAppend(&half_json, half_json.empty() ? "" : ",\n    ",
                    absl::StrFormat("{\"what\": \"%s\", \"inputs\": \"%s\", \"half_ms\": %.3f, "
                                    "\"float32_ms\": %.3f, \"ratio\": %.4f}",
                                    r.what, r.type, r.half_ms, r.f32_ms, r.half_ms / r.f32_ms));
  }
  absl::StrAppend(&json, "  ],\n  \"topk_vs_nth_element\": [\n    ", topk_json,
                  "\n  ],\n  \"half_input\": [\n    ", half_json, "\n  ]\n}\n");

  std::string path = absl::GetFlag(FLAGS_json_out);
  if (const char* ws = std::getenv("BUILD_WORKSPACE_DIRECTORY");
      ws && !path.empty() && path[0] != '/') {
    path = absl::StrCat(ws, "/", path);
  }
  std::ofstream out(path);
  out << json;
  if (!out.good()) {
    std::fprintf(stderr, "could not write %s (does its directory exist?)\n", path.c_str());
    return 1;
  }
  std::printf("\nwrote %s\n", path.c_str());
  return 0;
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return spex::Main();
}
