// Compressor benchmark (issue 3 part 2):
//  1. Cost: every compressor, error feedback included (ErrorFeedback::Select + Complete, the acc
//     += gradient fused where the compressor can), on gradient-sized buffers (25,557,032 and
//     11,173,962 floats) at densities 0.001 and 0.01, with 1 and 2 threads, as a ratio to memcpy
//     of the same buffer measured interleaved in the same run; exact top-k also against the same
//     error-feedback top-k step written plainly around std::nth_element (PlainTopKStep), on the
//     same gradients. Inputs: Student-t (2.5 dof) values with 5% zeros, shaped after the real
//     trace, scaled so 1 / (2 sqrt(k)) is the target quantile (where thresh, SAGE and the
//     published MiCRO/ExDyna controller start); each step adds a fresh gradient window. The timed
//     node is rank 0 of --nodes simulated nodes (pattern A compressors run every node, so the
//     residual is zeroed at the real union; MiCRO/ExDyna/DEFT/CLT-k select in 1/nodes of it).
//     The density column is node 0's own count / n. The goals are evaluated at the end.
//     --dtypes adds half-input rows (issue 30, docs/dtypes.md): with a half type listed, every
//     dtype's step begins with the engine's local reduce of --local_trainers trainers' inputs of
//     that type (widened and summed in float32 for a half type, in one pass), and a half type's
//     step also keeps the wire's rounding in the residual as the engine does (pattern B at the
//     selection, A at the union); each half row gets its time as a ratio to the float32 row of
//     the same compressor and configuration measured in the same run (`vs_float32`).
//     --input / --inputs pick the input kind(s): heavy (the above) or a tie-heavy one (constant,
//     zero, distinct2/3/16, ramp, reversed; issue 12 item 4b); with heavy and others, every row
//     also gets its time as a ratio to heavy's (printed as a table, `vs_heavy` in the JSON, and a
//     goal line per kind: no compressor over 20x).
//  2. Compression-ratio error mean |K/k - 1| over --ratio_steps steps of micro and exdyna under
//     both threshold controls, 4 simulated nodes with error feedback, on (a) a slowly drifting
//     synthetic gradient sequence and (b) a real gradient trace (bench/make_grad_trace.py), with
//     the selection time of each control.
// Prints tables and writes JSON (--json_out).
//
//   /usr/bin/python3 bench/make_grad_trace.py --out /tmp/spex_grad_trace.bin
//   bazel run //bench:compressors_bench -- --json_out=$PWD/bench/results/compressors.json
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "kernels/compressor.h"
#include "kernels/cpu/cpu_primitives.h"
#include "kernels/error_feedback.h"
#include "kernels/half.h"
#include "kernels/primitives.h"

using spex::bench::FlagList;
using spex::bench::Median;

ABSL_FLAG(std::string, json_out, "bench/results/compressors.json",
          "where to write the results (relative paths are under the workspace with bazel run)");
ABSL_FLAG(std::string, sizes, "25557032,11173962", "comma-separated buffer sizes (floats)");
ABSL_FLAG(std::string, densities, "0.001,0.01", "comma-separated target densities");
ABSL_FLAG(std::string, threads, "1,2", "comma-separated thread counts");
ABSL_FLAG(int, reps, 7, "timed steps per measurement (the median is reported)");
ABSL_FLAG(int, warmup, 3, "untimed steps before timing (controllers settle)");
ABSL_FLAG(int, nodes, 4, "simulated node count of the timed node (rank 0)");
ABSL_FLAG(std::string, only, "", "time only compressors whose label contains this");
ABSL_FLAG(bool, cost, true, "run part 1 (cost)");
ABSL_FLAG(bool, ratio, true, "run part 2 (compression-ratio error)");
ABSL_FLAG(std::string, trace, "/tmp/spex_grad_trace.bin",
          "real gradient trace from bench/make_grad_trace.py (part 2b skipped if missing)");
ABSL_FLAG(int, ratio_steps, 300, "steps for the compression-ratio error");
ABSL_FLAG(std::string, input, "heavy",
          "part 1's input kind: heavy (Student-t, today's), constant, zero, distinct2, distinct3, "
          "distinct16, ramp, reversed (degenerate inputs that can send a selection down a slow "
          "path)");
ABSL_FLAG(std::string, inputs, "",
          "comma-separated input kinds for part 1 (overrides --input), e.g. "
          "heavy,constant,zero,distinct2,distinct3,distinct16,ramp,reversed; with heavy among "
          "them, each row also gets its time as a ratio to heavy (same compressor, size, density "
          "and threads)");
ABSL_FLAG(std::string, dtypes, "float32",
          "comma-separated input types for part 1: float32, bfloat16, float16; with a half type, "
          "every type's step includes the local reduce of --local_trainers inputs of that type "
          "and each half row is compared with the float32 row of the same run");
ABSL_FLAG(int, local_trainers, 2,
          "trainers' inputs summed by the local reduce of every step when --dtypes lists a half "
          "type");
ABSL_FLAG(int64_t, synthetic_n, 1126410, "floats per gradient of the synthetic sequence");

namespace spex {
namespace {

using Clock = std::chrono::steady_clock;

double Ms(const std::function<void()>& fn) {
  const auto start = Clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Gradient-like values shaped after the real trace (bench/make_grad_trace.py: |g| has
// q99/q90 ~ 3.2 and q999/q99 ~ 2.6, and ~5% exact zeros from inactive units): Student-t with 2.5
// degrees of freedom, 5% zeros.
std::vector<float> Gradient(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::student_t_distribution<float> t(2.5f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = (gen() % 100) < 5 ? 0.0f : 1e-3f * t(gen);
  return x;
}

// Part 1's input of kind `kind` (see --input); nullopt names an unknown kind. The degenerate kinds
// are the ones where many or all magnitudes tie: a selection that handles ties by copying or
// sorting everything shows up there as a time far above the heavy-tailed one.
std::optional<std::vector<float>> Input(const std::string& kind, size_t n, uint32_t seed) {
  if (kind == "heavy") return Gradient(n, seed);
  std::vector<float> x(n);
  if (kind == "constant") {
    std::fill(x.begin(), x.end(), 1e-3f);
  } else if (kind == "zero") {
    std::fill(x.begin(), x.end(), 0.0f);
  } else if (kind == "distinct2" || kind == "distinct3" || kind == "distinct16") {
    const uint32_t m = kind == "distinct2" ? 2 : kind == "distinct3" ? 3 : 16;
    std::mt19937 gen(seed);
    for (float& v : x) v = 1e-3f * static_cast<float>(1 + gen() % m);
  } else if (kind == "ramp" || kind == "reversed") {
    for (size_t i = 0; i < n; ++i) {
      const size_t j = kind == "ramp" ? i : n - 1 - i;
      x[i] = 1e-3f * static_cast<float>(j + 1) / static_cast<float>(n);
    }
  } else {
    return std::nullopt;
  }
  return x;
}

struct Variant {
  std::string label, name;
  std::map<std::string, std::string> params;
};

std::vector<Variant> Variants() {
  std::vector<Variant> v;
  for (const std::string& name : CompressorNames()) {
    if (name == "micro" || name == "exdyna") {
      v.push_back({name + ":histogram", name, {{"threshold_control", "histogram"}}});
      v.push_back({name + ":reference", name, {{"threshold_control", "reference"}}});
    } else {
      v.push_back({name, name, {}});
    }
  }
  return v;
}

// The nodes of one timed configuration. Pattern A compressors run every node (their residuals
// depend on the union of all nodes' selections); B and D run node 0 alone (its residual and state
// depend only on its own selection; the peers' gathered indices are stand-ins of the right size).
// Only node 0's Select and Complete are timed.
struct Nodes {
  std::vector<std::unique_ptr<Compressor>> c;
  std::vector<std::unique_ptr<ErrorFeedback>> ef;
  std::vector<Selection> sel;
  std::vector<uint64_t> counts;
  std::vector<uint32_t> gathered;
  int nodes = 1;
  DType dtype = DType::kFloat32;  // a half type: the wire's rounding stays in the residual

  static void Check(const absl::Status& s, const Compressor& c) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name().c_str(), s.ToString().c_str());
      std::exit(1);
    }
  }
  // Returns node 0's time in ms.
  double Step(uint64_t step, const std::function<const float*(uint64_t, int)>& grad) {
    const Pattern p = c[0]->pattern();
    double ms = 0;
    for (size_t r = 0; r < c.size(); ++r) {
      // grad() is timed: with --dtypes it runs the local reduce of the trainers' inputs.
      const double t = Ms([&] {
        const float* g = grad(step, static_cast<int>(r));
        Check(ef[r]->Select(c[r].get(), step, g, &sel[r]), *c[r]);
        if (IsHalf(dtype) && p == Pattern::kSparseGather && ef[r]->enabled()) {
          // As sparse_step.cc: the values go out rounded, the rounding stays in the residual.
          half::KeepRounding(dtype, ef[r]->acc(), sel[r].idx.data(), sel[r].val.data(),
                             sel[r].idx.size());
        }
      });
      if (r == 0) ms += t;
    }
    gathered.clear();
    if (p == Pattern::kIndexUnion) {
      for (size_t r = 0; r < c.size(); ++r) {
        counts[r] = sel[r].count();
        gathered.insert(gathered.end(), sel[r].idx.begin(), sel[r].idx.end());
      }
      std::sort(gathered.begin(), gathered.end());
      gathered.erase(std::unique(gathered.begin(), gathered.end()), gathered.end());
    } else {
      std::fill(counts.begin(), counts.end(), sel[0].count());
      if (p == Pattern::kSparseGather) {
        for (int r = 0; r < nodes; ++r) {
          gathered.insert(gathered.end(), sel[0].idx.begin(), sel[0].idx.end());
        }
      }
    }
    const bool round_union = IsHalf(dtype) && p == Pattern::kIndexUnion;
    for (size_t r = 0; r < c.size(); ++r) {
      const double t = Ms([&] {
        if (round_union) {
          // As sparse_step.cc: every value at the union went out rounded; the rounding stays in
          // the residual instead of the zeroing (so Update is called without Complete's ZeroAt).
          half::KeepRounding(dtype, ef[r]->acc(), gathered.data(), nullptr, gathered.size());
          Check(c[r]->Update(step, {counts, gathered}), *c[r]);
        } else {
          Check(ef[r]->Complete(c[r].get(), step, {counts, gathered}), *c[r]);
        }
      });
      if (r == 0) ms += t;
    }
    return ms;
  }
};

struct CostRow {
  size_t n;
  double density;
  int threads;
  std::string label;
  std::string pattern;
  double ms, memcpy_ms, vs_memcpy, achieved;
  double nth_ms = 0;    // topk only
  std::string input;    // the input kind (--input / --inputs)
  double vs_heavy = 0;  // ms / the heavy input's ms of the same configuration (0: not measured)
  std::string dtype = "float32";  // the trainers' input type (--dtypes)
  double vs_float32 = 0;          // ms / the float32 row's ms of the same configuration (half rows)
};

// Part 1's input types (--dtypes); exits naming the accepted names on a bad one.
std::vector<DType> InputTypes() {
  std::vector<DType> out;
  for (const std::string& name : FlagList<std::string>(absl::GetFlag(FLAGS_dtypes))) {
    absl::StatusOr<DType> t = ParseDType(name);
    if (!t.ok()) {
      std::fprintf(stderr, "--dtypes: %s\n", std::string(t.status().message()).c_str());
      std::exit(2);
    }
    out.push_back(*t);
  }
  if (out.empty()) out.push_back(DType::kFloat32);
  return out;
}

// With a half type in --dtypes every step runs the local reduce of the trainers' inputs.
bool LocalReduceMode() {
  for (DType t : InputTypes()) {
    if (IsHalf(t)) return true;
  }
  return false;
}

// The input kinds of part 1: --inputs, else --input.
std::vector<std::string> InputKinds() {
  const std::string list = absl::GetFlag(FLAGS_inputs);
  if (list.empty()) return {absl::GetFlag(FLAGS_input)};
  return absl::StrSplit(list, ',', absl::SkipEmpty());
}

// The same error-feedback top-k step written plainly: acc += g in a loop, |acc| copied,
// std::nth_element for the k-th magnitude, one scan collecting k indices and values (ties toward
// the lower index), and the selected positions zeroed.
void PlainTopKStep(float* acc, const float* g, size_t n, size_t k, std::vector<float>* mag,
                   std::vector<uint32_t>* idx, std::vector<float>* val) {
  for (size_t i = 0; i < n; ++i) acc[i] += g[i];
  mag->resize(n);
  for (size_t i = 0; i < n; ++i) (*mag)[i] = std::fabs(acc[i]);
  std::nth_element(mag->begin(), mag->begin() + (k - 1), mag->end(), std::greater<float>());
  const float t = (*mag)[k - 1];
  size_t above = 0;  // entries strictly above the k-th magnitude all make it
  for (size_t i = 0; i < n; ++i) above += std::fabs(acc[i]) > t;
  size_t ties = k - above;
  idx->clear();
  val->clear();
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(acc[i]);
    if (a > t || (a == t && ties > 0)) {
      if (a == t) --ties;
      idx->push_back(static_cast<uint32_t>(i));
      val->push_back(acc[i]);
      acc[i] = 0;
    }
  }
}

std::vector<CostRow> RunCost() {
  std::vector<CostRow> rows;
  const int reps = absl::GetFlag(FLAGS_reps), warm = absl::GetFlag(FLAGS_warmup);
  const int nodes = absl::GetFlag(FLAGS_nodes);
  const std::string only = absl::GetFlag(FLAGS_only);
  const std::vector<std::string> kinds = InputKinds();
  const std::vector<DType> types = InputTypes();
  const bool reduce = LocalReduceMode();
  const int L = absl::GetFlag(FLAGS_local_trainers);
  constexpr int kMaxL = 16;
  if (reduce && (L < 1 || L > kMaxL)) {
    std::fprintf(stderr, "--local_trainers=%d: give 1 to %d\n", L, kMaxL);
    std::exit(2);
  }
  for (const std::string& kind : kinds) {
    if (!Input(kind, 1, 1)) {
      std::fprintf(stderr,
                   "input kind '%s' (--input / --inputs) is not a kind: use heavy, constant, "
                   "zero, distinct2, distinct3, distinct16, ramp or reversed\n",
                   kind.c_str());
      std::exit(2);
    }
  }
  for (size_t n : FlagList<size_t>(absl::GetFlag(FLAGS_sizes))) {
    for (const std::string& kind : kinds) {
      // Each (step, node) gradient is a window of n into a pool of 2n, at its own offset.
      const std::optional<std::vector<float>> input = Input(kind, 2 * n, 1);
      const std::vector<float>& raw = *input;
      std::vector<float> pool(2 * n), copy_dst(n), mag, plain_acc(n, 0.0f), plain_val;
      std::vector<uint32_t> plain_idx;
      auto grad = [&](uint64_t step, int node) {
        return pool.data() + (step * 1000003u + static_cast<uint64_t>(node) * 7777777u) % n;
      };
      auto memcpy_fn = [&] { std::memcpy(copy_dst.data(), pool.data(), n * sizeof(float)); };
      // --dtypes: trainer t of node r reads its own window of the pool (of the input's type),
      // and the local reduce writes node r's float32 sum.
      auto window = [&](uint64_t step, int node, int trainer) {
        return (step * 1000003u + static_cast<uint64_t>(node * L + trainer) * 7777777u) % n;
      };
      std::map<DType, std::vector<uint16_t>> half_pool;
      std::vector<std::vector<float>> sums(reduce ? nodes : 0);
      for (double d : FlagList<double>(absl::GetFlag(FLAGS_densities))) {
        // Scale so that 1 / (2 sqrt(k)), where the threshold controllers (micro/exdyna reference,
        // thresh, sage) start, is the target quantile of |gradient|.
        const size_t k = std::max<size_t>(1, static_cast<size_t>(d * n));
        mag.assign(raw.begin(), raw.begin() + n);
        for (float& v : mag) v = std::fabs(v);
        std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
        // All-zero input: no quantile to match, left as it is.
        const float scale =
            mag[k - 1] == 0.0f
                ? 1.0f
                : static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(k)))) / mag[k - 1];
        for (size_t i = 0; i < 2 * n; ++i) pool[i] = raw[i] * scale;
        for (DType t : types) {
          if (!IsHalf(t)) continue;
          half_pool[t].resize(2 * n);
          half::Narrow(t, pool.data(), half_pool[t].data(), 2 * n);
        }
        for (int threads : FlagList<int>(absl::GetFlag(FLAGS_threads))) {
          std::unique_ptr<Primitives> prims = MakeCpuPrimitives(threads);
          std::printf(
              "\nn=%zu d=%g threads=%d input=%s (rank 0 of %d nodes; ratio = time / memcpy of "
              "the same buffer, interleaved)\n",
              n, d, threads, kind.c_str(), nodes);
          if (reduce) {
            std::printf(
                "  every step: the local reduce of %d trainers' inputs of the row's type "
                "(half: widened and summed in float32, %s), then the selection\n",
                L, half::TargetName());
          }
          std::printf("  %-20s %3s %8s %10s %10s %9s %10s\n", "compressor", "pat", "inputs", "ms",
                      "memcpy ms", "x memcpy", "density");
          for (const Variant& v : Variants()) {
            if (!only.empty() && v.label.find(only) == std::string::npos) continue;
            // One set of nodes per input type, stepped in turn within every rep (interleaved:
            // a change of load hits every type alike). Node r's gradient: a window of the
            // pool, or (--dtypes) the local sum of its trainers' inputs of that type.
            const size_t T = types.size();
            std::vector<Nodes> node(T);
            std::vector<std::function<const float*(uint64_t, int)>> step_grad(T);
            for (size_t ti = 0; ti < T; ++ti) {
              const DType dt = types[ti];
              step_grad[ti] = [&, dt](uint64_t step, int r) -> const float* {
                if (!reduce) return grad(step, r);
                std::vector<float>& y = sums[r];
                y.resize(n);
                size_t bad = 0;
                if (IsHalf(dt)) {
                  const uint16_t* hs[kMaxL];
                  for (int t = 0; t < L; ++t) hs[t] = half_pool[dt].data() + window(step, r, t);
                  half::SumWidenScaled(dt, y.data(), nullptr, hs, L, 1.0f, n, true);
                } else {
                  const float* xs[kMaxL];
                  for (int t = 0; t < L; ++t) xs[t] = pool.data() + window(step, r, t);
                  (void)prims->SumScaledCheckFinite(y.data(), xs, L, 1.0f, n, &bad);
                }
                return y.data();
              };
              node[ti].nodes = nodes;
              node[ti].dtype = dt;
              const bool all_nodes = *CompressorPattern(v.name) == Pattern::kIndexUnion;
              for (int r = 0; r < (all_nodes ? nodes : 1); ++r) {
                auto made = MakeCompressor({v.name, d, v.params, r, nodes, n}, prims.get());
                if (!made.ok()) {
                  std::fprintf(stderr, "%s: %s\n", v.label.c_str(),
                               made.status().ToString().c_str());
                  std::exit(1);
                }
                node[ti].c.push_back(std::move(*made));
                node[ti].ef.push_back(std::make_unique<ErrorFeedback>(prims.get(), n));
              }
              node[ti].sel.resize(node[ti].c.size());
              node[ti].counts.assign(nodes, 0);
            }
            uint64_t step = 0;
            for (int w = 0; w < warm; ++w, ++step) {
              for (size_t ti = 0; ti < T; ++ti) node[ti].Step(step, step_grad[ti]);
            }
            std::vector<std::vector<double>> t(T);
            std::vector<double> tb, tn;
            std::vector<double> achieved(T, 0.0);
            const bool topk = v.name == "topk";
            for (int r = 0; r < reps; ++r, ++step) {
              tb.push_back(Ms(memcpy_fn));
              for (size_t ti = 0; ti < T; ++ti) {
                t[ti].push_back(node[ti].Step(step, step_grad[ti]));
                achieved[ti] += static_cast<double>(node[ti].sel[0].count()) / n / reps;
              }
              if (topk) {
                const float* g = grad(step, 0);
                tn.push_back(Ms([&] {
                  PlainTopKStep(plain_acc.data(), g, n, k, &mag, &plain_idx, &plain_val);
                }));
              }
            }
            for (size_t ti = 0; ti < T; ++ti) {
              CostRow row{n,
                          d,
                          threads,
                          v.label,
                          PatternName(node[ti].c[0]->pattern()),
                          Median(t[ti]),
                          Median(tb),
                          Median(t[ti]) / Median(tb),
                          achieved[ti],
                          0,
                          kind};
              row.dtype = DTypeName(types[ti]);
              const bool show_nth = topk && ti == 0;
              if (show_nth) row.nth_ms = Median(tn);
              std::printf("  %-20s %3s %8s %10.3f %10.3f %9.3f %10.5f", v.label.c_str(),
                          row.pattern.c_str(), row.dtype.c_str(), row.ms, row.memcpy_ms,
                          row.vs_memcpy, row.achieved);
              if (show_nth) {
                std::printf("   plain nth_element top-k %.2f ms: topk %.1fx faster", row.nth_ms,
                            row.nth_ms / row.ms);
              }
              std::printf("\n");
              std::fflush(stdout);
              rows.push_back(row);
            }
          }
        }
      }
    }
  }
  // Ratios to the heavy-tailed input's time, same configuration.
  for (CostRow& r : rows) {
    for (const CostRow& h : rows) {
      if (h.input == "heavy" && h.n == r.n && h.density == r.density && h.threads == r.threads &&
          h.label == r.label && h.dtype == r.dtype && h.ms > 0) {
        r.vs_heavy = r.ms / h.ms;
      }
    }
  }
  // Half rows: their time / the float32 row's, same compressor and configuration.
  for (CostRow& r : rows) {
    for (const CostRow& f : rows) {
      if (r.dtype != "float32" && f.dtype == "float32" && f.input == r.input && f.n == r.n &&
          f.density == r.density && f.threads == r.threads && f.label == r.label && f.ms > 0) {
        r.vs_float32 = r.ms / f.ms;
      }
    }
  }
  return rows;
}

// With several input kinds including heavy: per configuration, each kind's time / heavy's.
void PrintHeavyRatios(const std::vector<CostRow>& rows) {
  std::vector<std::string> kinds;
  for (const std::string& k : InputKinds()) {
    if (k != "heavy") kinds.push_back(k);
  }
  bool any = false;
  for (const CostRow& r : rows) any |= r.input != "heavy" && r.vs_heavy > 0;
  if (!any) return;
  std::vector<const CostRow*> heavy;
  for (const CostRow& r : rows) {
    if (r.input == "heavy") heavy.push_back(&r);
  }
  std::printf("\ntime / time on heavy-tailed input (same compressor, n, d, threads)\n");
  std::string last;
  for (const CostRow* h : heavy) {
    const std::string at = absl::StrFormat("n=%d d=%g threads=%d", h->n, h->density, h->threads);
    if (at != last) {
      std::printf("  %-20s %9s", at.c_str(), "heavy ms");
      for (const std::string& k : kinds) std::printf(" %10s", k.c_str());
      std::printf("\n");
      last = at;
    }
    const std::string label =
        h->dtype == "float32" ? h->label : absl::StrCat(h->label, " ", h->dtype);
    std::printf("  %-20s %9.2f", label.c_str(), h->ms);
    for (const std::string& k : kinds) {
      double v = 0;
      for (const CostRow& r : rows) {
        if (r.input == k && r.n == h->n && r.density == h->density && r.threads == h->threads &&
            r.label == h->label && r.dtype == h->dtype) {
          v = r.vs_heavy;
        }
      }
      if (v > 0) {
        std::printf(" %9.2fx", v);
      } else {
        std::printf(" %10s", "-");
      }
    }
    std::printf("\n");
  }
}

// With --dtypes: per configuration, each half type's time / float32's (same compressor).
void PrintHalfRatios(const std::vector<CostRow>& rows) {
  std::vector<std::string> halves;
  for (DType t : InputTypes()) {
    if (IsHalf(t)) halves.push_back(DTypeName(t));
  }
  if (halves.empty()) return;
  std::printf(
      "\ntime with half inputs / time with float32 inputs (same compressor, n, d, threads, "
      "input kind; local reduce + selection + error feedback)\n");
  std::string last;
  for (const CostRow& f : rows) {
    if (f.dtype != "float32") continue;
    const std::string at =
        absl::StrFormat("n=%d d=%g threads=%d input=%s", f.n, f.density, f.threads, f.input);
    if (at != last) {
      std::printf("  %-36s %10s", at.c_str(), "f32 ms");
      for (const std::string& h : halves) std::printf(" %10s", h.c_str());
      std::printf("\n");
      last = at;
    }
    std::printf("  %-36s %10.2f", f.label.c_str(), f.ms);
    for (const std::string& h : halves) {
      double v = 0;
      for (const CostRow& r : rows) {
        if (r.dtype == h && r.input == f.input && r.n == f.n && r.density == f.density &&
            r.threads == f.threads && r.label == f.label) {
          v = r.vs_float32;
        }
      }
      std::printf(" %9.3fx", v);
    }
    std::printf("\n");
  }
}

// ---- Part 2: compression-ratio error ----

// A source of per-(step, node) gradients.
class GradSource {
 public:
  virtual ~GradSource() = default;
  virtual size_t n() const = 0;
  virtual int steps() const = 0;
  // Fills grads[node] for `step` (all nodes at once; sources are read sequentially).
  virtual bool Next(std::vector<std::vector<float>>* grads) = 0;
  virtual std::string name() const = 0;
  // The densities to evaluate on this source.
  virtual std::vector<double> densities() const { return {0.001, 0.01}; }
};

// Slowly drifting synthetic sequence: g_t[i] = s_t * sigma_i * z, with a fixed heavy-tailed
// per-coordinate scale sigma_i (|Laplace|, 0.5% of coordinates 10x), z standard normal, fresh
// per step and node, and the global scale s_t = c exp(0.2 sin(2 pi t / T)) (at most about 0.42%
// change per step, within what the published controller can follow). c is calibrated so that
// 1 / (2 sqrt(k)) is the target quantile of |g| at t = 0 for the given density.
class SyntheticSource : public GradSource {
 public:
  SyntheticSource(size_t n, int nodes, int steps, double density)
      : n_(n), nodes_(nodes), steps_(steps), density_(density) {
    std::mt19937 gen(99);
    std::exponential_distribution<float> expo(1.0f);
    sigma_.resize(n);
    for (float& v : sigma_) v = expo(gen) * ((gen() % 1000) < 5 ? 10.0f : 1.0f);
    noise_.resize(3 * n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : noise_) v = normal(gen);
    std::vector<float> mag(n);
    for (size_t i = 0; i < n; ++i) mag[i] = std::fabs(sigma_[i] * noise_[i]);
    const size_t k = std::max<size_t>(1, static_cast<size_t>(density * n));
    std::nth_element(mag.begin(), mag.begin() + (k - 1), mag.end(), std::greater<float>());
    scale_ = 1.0f / (2.0f * std::sqrt(static_cast<float>(k))) / mag[k - 1];
  }
  size_t n() const override { return n_; }
  int steps() const override { return steps_; }
  std::string name() const override { return "synthetic_drift"; }
  std::vector<double> densities() const override { return {density_}; }
  bool Next(std::vector<std::vector<float>>* grads) override {
    const float s = scale_ * std::exp(0.2f * std::sin(2.0f * 3.14159265f * t_ / steps_));
    for (int r = 0; r < nodes_; ++r) {
      const float* z = noise_.data() + (static_cast<size_t>(t_) * 7919 + r * 104729) % (2 * n_);
      std::vector<float>& g = (*grads)[r];
      g.resize(n_);
      for (size_t i = 0; i < n_; ++i) g[i] = s * sigma_[i] * z[i];
    }
    ++t_;
    return true;
  }

 private:
  size_t n_;
  int nodes_, steps_, t_ = 0;
  double density_;
  float scale_;
  std::vector<float> sigma_, noise_;
};

// The real trace written by bench/make_grad_trace.py (format in its docstring).
class TraceSource : public GradSource {
 public:
  static std::unique_ptr<TraceSource> Open(const std::string& path, int nodes, int steps) {
    auto t = std::unique_ptr<TraceSource>(new TraceSource);
    t->in_.open(path, std::ios::binary);
    if (!t->in_) return nullptr;
    char magic[8];
    uint32_t version, workers, nsteps, dtype;
    uint64_t params, header;
    t->in_.read(magic, 8);
    t->in_.read(reinterpret_cast<char*>(&version), 4);
    t->in_.read(reinterpret_cast<char*>(&workers), 4);
    t->in_.read(reinterpret_cast<char*>(&nsteps), 4);
    t->in_.read(reinterpret_cast<char*>(&dtype), 4);
    t->in_.read(reinterpret_cast<char*>(&params), 8);
    t->in_.read(reinterpret_cast<char*>(&header), 8);
    if (!t->in_ || std::memcmp(magic, "SPXGRAD1", 8) != 0 || version != 1 || dtype != 1 ||
        static_cast<int>(workers) != nodes) {
      std::fprintf(stderr, "%s: not a %d-worker SPXGRAD1 float16 trace\n", path.c_str(), nodes);
      return nullptr;
    }
    t->n_ = params;
    t->nodes_ = nodes;
    t->steps_ = std::min<int>(steps, static_cast<int>(nsteps));
    t->half_.resize(params);
    t->path_ = path;
    return t;
  }
  size_t n() const override { return n_; }
  int steps() const override { return steps_; }
  std::string name() const override { return "real_trace_mlp_digits"; }
  bool Next(std::vector<std::vector<float>>* grads) override {
    for (int r = 0; r < nodes_; ++r) {
      float scale;
      in_.read(reinterpret_cast<char*>(&scale), 4);
      in_.read(reinterpret_cast<char*>(half_.data()), n_ * 2);
      if (!in_) return false;
      std::vector<float>& g = (*grads)[r];
      g.resize(n_);
      for (size_t i = 0; i < n_; ++i) g[i] = F16ToFloat(half_[i]) * scale;
    }
    return true;
  }

 private:
  TraceSource() = default;
  std::ifstream in_;
  std::string path_;
  size_t n_ = 0;
  int nodes_ = 0, steps_ = 0;
  std::vector<uint16_t> half_;
};

struct RatioRow {
  std::string input, compressor, control;
  double density;
  int steps, nodes;
  size_t n;
  double mean_abs_error, mean_ratio, select_ms;
};

// All configurations advance together over one pass of the source.
std::vector<RatioRow> RunRatio(GradSource* src, int nodes) {
  struct Config {
    std::string name, control;
    double d;
    std::vector<std::unique_ptr<Compressor>> c;
    std::vector<std::unique_ptr<ErrorFeedback>> ef;
    double err = 0, ratio = 0, select_ms = 0;
    int steps = 0;
  };
  std::unique_ptr<Primitives> prims = MakeCpuPrimitives(1);
  std::vector<Config> cfgs;
  const std::map<std::string, std::map<std::string, std::string>> controls = {
      {"reference", {{"threshold_control", "reference"}}},
      {"histogram", {{"threshold_control", "histogram"}}},
      {"histogram_untrimmed", {{"threshold_control", "histogram"}, {"histogram_trim", "false"}}},
  };
  for (const char* name : {"micro", "exdyna"}) {
    for (const auto& [control, params] : controls) {
      for (double d : src->densities()) {
        Config c{name, control, d, {}, {}};
        for (int r = 0; r < nodes; ++r) {
          auto made = MakeCompressor({name, d, params, r, nodes, src->n()}, prims.get());
          if (!made.ok()) {
            std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
            std::exit(1);
          }
          c.c.push_back(std::move(*made));
          c.ef.push_back(std::make_unique<ErrorFeedback>(prims.get(), src->n()));
        }
        cfgs.push_back(std::move(c));
      }
    }
  }
  std::vector<std::vector<float>> grads(nodes);
  std::vector<Selection> sel(nodes);
  for (int step = 0; step < src->steps(); ++step) {
    if (!src->Next(&grads)) {
      std::fprintf(stderr, "%s: ran out at step %d\n", src->name().c_str(), step);
      break;
    }
    for (Config& c : cfgs) {
      std::vector<uint64_t> counts(nodes);
      std::vector<uint32_t> uni;
      for (int r = 0; r < nodes; ++r) {
        c.select_ms +=
            Ms([&] { (void)c.ef[r]->Select(c.c[r].get(), step, grads[r].data(), &sel[r]); }) /
            nodes;
        counts[r] = sel[r].count();
        uni.insert(uni.end(), sel[r].idx.begin(), sel[r].idx.end());
      }
      std::sort(uni.begin(), uni.end());
      uni.erase(std::unique(uni.begin(), uni.end()), uni.end());
      for (int r = 0; r < nodes; ++r) (void)c.ef[r]->Complete(c.c[r].get(), step, {counts, uni});
      uint64_t total = 0;
      for (uint64_t x : counts) total += x;
      const double k = std::max(1.0, std::floor(c.d * src->n()));
      c.err += std::fabs(total / k - 1);
      c.ratio += total / k;
      c.steps++;
    }
  }
  std::vector<RatioRow> rows;
  for (Config& c : cfgs) {
    rows.push_back({src->name(), c.name, c.control, c.d, c.steps, nodes, src->n(),
                    c.err / std::max(1, c.steps), c.ratio / std::max(1, c.steps),
                    c.select_ms / std::max(1, c.steps)});
  }
  return rows;
}

std::string Json(const std::vector<CostRow>& cost, const std::vector<RatioRow>& ratio,
                 const std::vector<std::string>& goals) {
  std::string j = absl::StrCat(
      "{\n  \"simd_target\": \"", CpuPrimitivesTarget(), "\",\n  \"half_target\": \"",
      half::TargetName(), "\",\n  \"inputs\": [\"", absl::StrJoin(InputKinds(), "\", \""),
      "\"],\n  \"dtypes\": \"", absl::GetFlag(FLAGS_dtypes), "\",\n  \"local_reduce_inputs\": ",
      LocalReduceMode() ? absl::GetFlag(FLAGS_local_trainers) : 0,
      ",\n  \"reps\": ", absl::GetFlag(FLAGS_reps),
      ",\n  \"nodes_simulated\": ", absl::GetFlag(FLAGS_nodes), ",\n  \"cost\": [\n");
  for (size_t i = 0; i < cost.size(); ++i) {
    const CostRow& r = cost[i];
    absl::StrAppend(&j, absl::StrFormat("    {\"input\": \"%s\", \"n\": %d, \"density\": %g, "
                                        "\"threads\": %d, \"compressor\": \"%s\", \"pattern\": "
                                        "\"%s\", \"ms\": %.4f, \"memcpy_ms\": %.4f, \"vs_memcpy\": "
                                        "%.4f, \"achieved_density\": %.6f",
                                        r.input, r.n, r.density, r.threads, r.label, r.pattern,
                                        r.ms, r.memcpy_ms, r.vs_memcpy, r.achieved));
    absl::StrAppend(&j, absl::StrFormat(", \"dtype\": \"%s\"", r.dtype));
    if (r.vs_heavy > 0) absl::StrAppend(&j, absl::StrFormat(", \"vs_heavy\": %.3f", r.vs_heavy));
    if (r.vs_float32 > 0) {
      absl::StrAppend(&j, absl::StrFormat(", \"vs_float32\": %.4f", r.vs_float32));
    }
    if (r.nth_ms > 0) {
      absl::StrAppend(
          &j, absl::StrFormat(
                  ", \"plain_nth_element_topk_ms\": %.4f, \"speedup_vs_plain_nth_element\": %.3f",
                  r.nth_ms, r.nth_ms / r.ms));
    }
    absl::StrAppend(&j, "}", i + 1 < cost.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&j, "  ],\n  \"ratio_error\": [\n");
  for (size_t i = 0; i < ratio.size(); ++i) {
    const RatioRow& r = ratio[i];
    absl::StrAppend(
        &j, absl::StrFormat(
                "    {\"input\": \"%s\", \"n\": %d, \"nodes\": %d, \"steps\": %d, \"compressor\": "
                "\"%s\", "
                "\"threshold_control\": \"%s\", \"density\": %g, \"mean_abs_ratio_error\": %.5f, "
                "\"mean_ratio\": %.5f, \"select_ms_per_node_step\": %.4f}%s\n",
                r.input, r.n, r.nodes, r.steps, r.compressor, r.control, r.density,
                r.mean_abs_error, r.mean_ratio, r.select_ms, i + 1 < ratio.size() ? "," : ""));
  }
  absl::StrAppend(&j, "  ],\n  \"goals\": [\n");
  for (size_t i = 0; i < goals.size(); ++i) {
    absl::StrAppend(&j, "    \"", goals[i], "\"", i + 1 < goals.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&j, "  ]\n}\n");
  return j;
}

// The goals, evaluated on what was measured.
std::vector<std::string> Goals(const std::vector<CostRow>& cost,
                               const std::vector<RatioRow>& ratio) {
  std::vector<std::string> out;
  auto add = [&](bool ok, const std::string& what) {
    out.push_back(absl::StrCat(ok ? "PASS " : "MISS ", what));
  };
  auto base = [](const std::string& label) { return label.substr(0, label.find(':')); };
  // The memcpy goals are for the float32 step without a local reduce (--dtypes unset).
  for (const CostRow& r : LocalReduceMode() ? std::vector<CostRow>{} : cost) {
    const std::string at =
        absl::StrFormat("input=%s n=%d d=%g threads=%d", r.input, r.n, r.density, r.threads);
    const std::string b = base(r.label);
    if (r.threads == 1 && (r.label == "micro:reference" || r.label == "exdyna:reference" ||
                           r.label == "thresh" || r.label == "sage")) {
      add(r.vs_memcpy <= 1.0,
          absl::StrFormat("%s <= 1.0x memcpy at 1 thread (%s): %.2fx", r.label, at, r.vs_memcpy));
    }
    if (r.label == "topk" && r.nth_ms > 0) {
      add(r.nth_ms / r.ms >= 5,
          absl::StrFormat("topk >= 5x faster than nth_element (%s): %.1fx", at, r.nth_ms / r.ms));
    }
    if (b == "dgc" || b == "gaussiank" || b == "redsync" || b == "redsync_trim" ||
        b.rfind("sidco", 0) == 0) {
      add(r.vs_memcpy <= 3.0,
          absl::StrFormat("%s <= 3x memcpy (%s): %.2fx", r.label, at, r.vs_memcpy));
    }
  }
  // Issue 30: a half-input selection with error feedback costs no more per element than the
  // float32 one (same compressor and configuration, same run): per half type and configuration,
  // the median over compressors and the worst.
  std::map<std::string, std::vector<const CostRow*>> by_half;
  for (const CostRow& r : cost) {
    if (r.vs_float32 <= 0) continue;
    by_half[absl::StrFormat("%s inputs, input=%s n=%d d=%g threads=%d", r.dtype, r.input, r.n,
                            r.density, r.threads)]
        .push_back(&r);
  }
  for (auto& [key, rs] : by_half) {
    std::vector<double> v;
    const CostRow* worst = rs[0];
    for (const CostRow* r : rs) {
      v.push_back(r->vs_float32);
      if (r->vs_float32 > worst->vs_float32) worst = r;
    }
    add(Median(v) <= 1.0,
        absl::StrFormat("%s: median over %d compressors <= 1.0x the float32-input time: %.3fx "
                        "(worst %s %.3fx)",
                        key, v.size(), Median(v), worst->label, worst->vs_float32));
  }
  // Issue 12 item 4b: no input kind sends a compressor down a path 20x slower than heavy's.
  std::map<std::string, const CostRow*> worst;  // per kind and configuration
  for (const CostRow& r : cost) {
    if (r.input == "heavy" || r.vs_heavy <= 0) continue;
    const std::string key =
        absl::StrFormat("%s n=%d d=%g threads=%d", r.input, r.n, r.density, r.threads);
    if (worst[key] == nullptr || r.vs_heavy > worst[key]->vs_heavy) worst[key] = &r;
  }
  for (const auto& [key, r] : worst) {
    add(r->vs_heavy <= 20, absl::StrFormat("every compressor <= 20x its heavy-input time on %s: "
                                           "worst %s %.2fx",
                                           key, r->label, r->vs_heavy));
  }
  for (const RatioRow& h : ratio) {
    if (h.control != "histogram" || h.input != "real_trace_mlp_digits") continue;
    const double limit = h.density < 0.005 ? 0.05 : 0.02;
    add(h.mean_abs_error <= limit,
        absl::StrFormat("%s histogram |K/k-1| <= %g at d=%g on the real trace: %.4f", h.compressor,
                        limit, h.density, h.mean_abs_error));
    for (const RatioRow& ref : ratio) {
      if (ref.input == h.input && ref.compressor == h.compressor && ref.density == h.density &&
          ref.control == "reference") {
        add(h.select_ms <= 2 * ref.select_ms,
            absl::StrFormat(
                "%s histogram selection <= 2x reference at d=%g on the real trace: %.2fx",
                h.compressor, h.density, h.select_ms / ref.select_ms));
      }
    }
  }
  return out;
}

int Main() {
  std::vector<CostRow> cost;
  std::vector<RatioRow> ratio;
  std::printf("CPU primitives on %s\n", CpuPrimitivesTarget());
  if (absl::GetFlag(FLAGS_cost)) {
    cost = RunCost();
    PrintHeavyRatios(cost);
    PrintHalfRatios(cost);
  }
  if (absl::GetFlag(FLAGS_ratio)) {
    const int nodes = 4, steps = absl::GetFlag(FLAGS_ratio_steps);
    std::vector<std::unique_ptr<GradSource>> sources;
    for (double d : {0.001, 0.01}) {
      sources.push_back(std::make_unique<SyntheticSource>(
          static_cast<size_t>(absl::GetFlag(FLAGS_synthetic_n)), nodes, steps, d));
    }
    if (auto t = TraceSource::Open(absl::GetFlag(FLAGS_trace), nodes, steps)) {
      sources.push_back(std::move(t));
    } else {
      std::printf("\n(no real trace at %s: run bench/make_grad_trace.py; part 2b skipped)\n",
                  absl::GetFlag(FLAGS_trace).c_str());
    }
    for (auto& src : sources) {
      std::printf("\ncompression-ratio error, %s: n=%zu, %d nodes, %d steps, error feedback on\n",
                  src->name().c_str(), src->n(), nodes, src->steps());
      std::printf("  %-8s %-20s %7s %14s %11s %16s\n", "", "control", "d", "mean |K/k-1|",
                  "mean K/k", "select ms/node");
      for (const RatioRow& r : RunRatio(src.get(), nodes)) {
        std::printf("  %-8s %-20s %7g %14.4f %11.4f %16.4f\n", r.compressor.c_str(),
                    r.control.c_str(), r.density, r.mean_abs_error, r.mean_ratio, r.select_ms);
        ratio.push_back(r);
      }
    }
  }
  const std::vector<std::string> goals = Goals(cost, ratio);
  std::printf("\ngoals:\n");
  for (const std::string& g : goals) std::printf("  %s\n", g.c_str());
  const std::string path = absl::GetFlag(FLAGS_json_out);
  std::ofstream out(path);
  out << Json(cost, ratio, goals);
  std::printf("\nwrote %s\n", path.c_str());
  return out ? 0 : 1;
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return spex::Main();
}
