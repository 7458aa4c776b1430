// The cost of the non-finite check in the sparse step (issue 16 item 3): one node's sparse step
// (local reduce, the compressor's selection, the exchange over a one-node collective, the
// residual update) on --n floats from --trainers local trainers, the way the engine runs it
// now (ReduceLocalChecked before the control round: residual + inputs into the second
// accumulator with the fused finite check, then the swap) against the way it ran before (the
// LocalReduce in place, unchecked: ReduceForStep without acc_next), and against the
// engine's path with the check turned off (the same reduce into acc_next, unchecked: what the
// check itself costs). The three paths run in one process on the same inputs, interleaved rep by
// rep (the order rotating), each with its own bucket state; their outputs and residuals are
// compared bit for bit after every rep. With one node the step has no network time, so the
// ratios are the check's largest relative cost. --json writes every step's times and ratios
// (bench/nonfinite_step_bench.py runs it pinned and plots them).
//
//   bazel build //bench:nonfinite_step_bench && bazel-bin/bench/nonfinite_step_bench --trainers=2
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_util.h"
#include "daemon/engine/step.h"
#include "daemon/transport/inproc_collective.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"

ABSL_FLAG(int64_t, n, 25557032, "floats per bucket (ResNet-50's gradient by default)");
ABSL_FLAG(int, trainers, 2, "local trainers (input slots) of the node");
ABSL_FLAG(std::string, compressor, "micro", "the bucket's compressor");
ABSL_FLAG(double, density, 0.01, "target density");
ABSL_FLAG(int, reps, 41, "timed steps per path (after one untimed warm-up step each)");
ABSL_FLAG(int, threads, 1, "CPU primitives' worker threads");
ABSL_FLAG(int, reduce_reps, 200,
          "then this many paired runs of the reduce alone (checked, check off), order alternating");
ABSL_FLAG(std::string, json, "", "if set, write the per-step times and ratios to this file");

namespace spex {
namespace {

using Clock = std::chrono::steady_clock;

// One bucket's memory and state, host memory.
struct Bucket {
  std::vector<float> output, acc, acc_next;
  BucketData data;
  SparseState state;
};

int Main() {
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_n));
  const int L = absl::GetFlag(FLAGS_trainers);
  const int reps = absl::GetFlag(FLAGS_reps);
  if (n == 0 || n > (1ull << 32) || L < 1 || L > static_cast<int>(kMaxLocalTrainers) || reps < 1) {
    std::fprintf(stderr, "need 0 < --n <= 2^32, 1 <= --trainers <= %u, --reps >= 1\n",
                 kMaxLocalTrainers);
    return 2;
  }
  std::unique_ptr<Primitives> prims = MakeCpuPrimitives(absl::GetFlag(FLAGS_threads));
  InProcessHub hub(1);
  std::unique_ptr<Collective> coll = hub.Connect(0);
  StepEnv env;
  env.coll = coll.get();
  env.prims = prims.get();
  env.host_prims = prims.get();
  env.local_trainers = L;
  env.error_feedback = true;
  env.residual_norm_every = 0;

  // Gradient-like inputs: a persistent per-position scale times uniform noise, in a pool a bit
  // longer than the bucket; each step reads it from another offset (fresh values per position
  // without regenerating 25M floats per trainer per step).
  constexpr size_t kSlack = 4096;
  std::vector<std::vector<float>> pool(L, std::vector<float>(n + kSlack));
  uint32_t x = 12345;
  for (int r = 0; r < L; ++r) {
    for (size_t i = 0; i < n + kSlack; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      const float scale = (i * 2654435761u) % 97 == 0 ? 5e-3f : 1e-3f;
      pool[r][i] = scale * (static_cast<float>(x >> 8) * (1.0f / 16777216.0f) - 0.5f);
    }
  }
  // 0: before (in place, unchecked: ReduceForStep), 1: now (checked, before the round), 2: now with
  // the check off (the same reduce into acc_next, before the round, unchecked).
  constexpr int kPaths = 3;
  Bucket paths[kPaths];
  for (int p = 0; p < kPaths; ++p) {
    Bucket& b = paths[p];
    b.output.assign(n, 0.0f);
    b.acc.assign(n, 0.0f);
    b.data.id = 1;
    b.data.elements = n;
    b.data.output = b.output.data();
    b.data.acc = b.acc.data();
    if (p >= 1) {
      b.acc_next.assign(n, 0.0f);
      b.data.acc_next = b.acc_next.data();
    }
    CompressorSpec spec;
    spec.name = absl::GetFlag(FLAGS_compressor);
    spec.density = absl::GetFlag(FLAGS_density);
    spec.elements = n;
    absl::StatusOr<std::unique_ptr<Compressor>> c = MakeCompressor(spec, prims.get());
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
      return 2;
    }
    if ((*c)->pattern() == Pattern::kDense) {
      std::fprintf(stderr, "--compressor=%s exchanges dense; pick a sparse one\n",
                   spec.name.c_str());
      return 2;
    }
    b.state.compressor = std::move(*c);
  }
  // Per path, per timed step: the milliseconds of each phase (the reduce, the selection, the
  // exchange, the residual update) as the step's laps close them.
  std::vector<double> phase_ms[kPaths][kPhaseCount];
  Clock::time_point last;
  int cur = 0;
  bool timed = false;
  const Lap lap = [&](Phase ph) {
    const Clock::time_point now = Clock::now();
    if (timed) {
      phase_ms[cur][static_cast<int>(ph)].push_back(
          std::chrono::duration<double, std::milli>(now - last).count());
    }
    last = now;
  };
  auto step = [&](int p, uint64_t s) -> double {
    Bucket& b = paths[p];
    ExchangeRecord rec;
    StepItem item{&b.data, &b.state, s, absl::GetFlag(FLAGS_density), &rec, {}};
    cur = p;
    timed = s > 0;
    const auto t0 = Clock::now();
    last = t0;
    if (p >= 1) {
      size_t first_bad = n;
      item.status = ReduceLocalChecked(env, b.data, /*sparse=*/true, /*check=*/p == 1, &first_bad);
      if (first_bad < n) std::fprintf(stderr, "unexpected non-finite value at %zu\n", first_bad);
      CommitLocalSum(&b.data);
    } else {
      ReduceForStep(env, item);  // in place, unchecked
    }
    lap(Phase::kReduceLocal);  // the step's own reduce lap then adds ~0
    SparseStep(env, absl::MakeSpan(&item, 1), lap);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!item.status.ok()) {
      std::fprintf(stderr, "step %llu: %s\n", static_cast<unsigned long long>(s),
                   item.status.ToString().c_str());
      std::exit(1);
    }
    return ms;
  };
  std::vector<double> ms[kPaths];
  for (int s = 0; s <= reps; ++s) {
    for (int r = 0; r < L; ++r) {
      const float* in = pool[r].data() + (static_cast<size_t>(s) * 131 + r * 977) % kSlack;
      for (Bucket& b : paths) b.data.input[r] = const_cast<float*>(in);
    }
    double t[kPaths];
    for (int k = 0; k < kPaths; ++k) {  // rotate which path runs first
      const int p = (s + k) % kPaths;
      t[p] = step(p, s);
    }
    for (int p = 1; p < kPaths; ++p) {
      if (std::memcmp(paths[0].output.data(), paths[p].output.data(), n * sizeof(float)) != 0 ||
          std::memcmp(paths[0].data.acc, paths[p].data.acc, n * sizeof(float)) != 0) {
        std::fprintf(stderr, "step %d: path %d's output or residual differs from path 0's\n", s, p);
        return 1;
      }
    }
    if (s == 0) continue;  // warm-up
    for (int p = 0; p < kPaths; ++p) ms[p].push_back(t[p]);
  }
  // All paths do the same work at the same step (same data, same selections), so the ratio of
  // a pair is the least noisy figure on a shared machine: its median and quartiles over the steps.
  struct Quartiles {
    double q1, median, q3;
  };
  auto quartiles = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return Quartiles{v[v.size() / 4], v[v.size() / 2], v[(3 * v.size()) / 4]};
  };
  auto ratios = [&](int num, int den) {
    std::vector<double> r;
    for (size_t j = 0; j < ms[num].size(); ++j) r.push_back(ms[num][j] / ms[den][j]);
    return r;
  };
  const std::vector<double> vs_before = ratios(1, 0), vs_off = ratios(1, 2);
  const Quartiles qb = quartiles(vs_before), qo = quartiles(vs_off);
  // The reduce alone, the check's cost without the rest of the step's noise: the engine's
  // reduce into acc_next (written, never committed here) with and without the check, paired.
  std::vector<double> reduce_ratio;
  for (int j = 0; j < absl::GetFlag(FLAGS_reduce_reps); ++j) {
    double t[2];
    for (int k = 0; k < 2; ++k) {
      const int c = (j + k) % 2;  // 0: checked, 1: check off
      size_t first_bad = n;
      const auto t0 = Clock::now();
      const absl::Status st = ReduceLocalChecked(env, paths[1 + c].data, /*sparse=*/true,
                                                 /*check=*/c == 0, &first_bad);
      t[c] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (!st.ok() || first_bad < n) {
        std::fprintf(stderr, "reduce: %s, first bad %zu\n", st.ToString().c_str(), first_bad);
        return 1;
      }
    }
    reduce_ratio.push_back(t[0] / t[1]);
  }
  const Quartiles qr = reduce_ratio.empty() ? Quartiles{0, 0, 0} : quartiles(reduce_ratio);
  std::printf(
      "sparse step, %s @ %g, n = %zu, %d local trainers, %d thread(s), %d reps:\n"
      "  before (in-step reduce, unchecked)          %9.2f ms (median)\n"
      "  now (checked reduce into acc_next, swap)    %9.2f ms (median)\n"
      "  now, check off (same reduce, unchecked)     %9.2f ms (median)\n"
      "  time ratio now / before, paired by step     %9.3f (median; quartiles %.3f-%.3f)\n"
      "  time ratio now / check off, paired by step  %9.3f (median; quartiles %.3f-%.3f)\n"
      "  reduce alone, checked / check off, paired   %9.3f (median; quartiles %.3f-%.3f; %zu "
      "pairs)\n"
      "outputs and residuals bit-identical every step\n",
      absl::GetFlag(FLAGS_compressor).c_str(), absl::GetFlag(FLAGS_density), n, L,
      absl::GetFlag(FLAGS_threads), reps, bench::Median(ms[0]), bench::Median(ms[1]),
      bench::Median(ms[2]), qb.median, qb.q1, qb.q3, qo.median, qo.q1, qo.q3, qr.median, qr.q1,
      qr.q3, reduce_ratio.size());
  std::printf(
      "phases (ms)      median: before   now  check off     min: before   now  check off\n");
  // The engine-style paths lap kReduceLocal twice (their own reduce, then the step's empty one):
  // summed per step.
  std::vector<double> phases[kPaths][kPhaseCount];
  for (int p = 0; p < kPaths; ++p) {
    for (int i = 0; i < kPhaseCount; ++i) phases[p][i] = phase_ms[p][i];
    std::vector<double>& red = phases[p][static_cast<int>(Phase::kReduceLocal)];
    if (red.size() == 2 * ms[p].size()) {
      std::vector<double> summed;
      for (size_t j = 0; j + 1 < red.size(); j += 2) summed.push_back(red[j] + red[j + 1]);
      red = summed;
    }
  }
  const Phase kShown[] = {Phase::kReduceLocal, Phase::kCompress, Phase::kCollective,
                          Phase::kDecode};
  for (Phase ph : kShown) {
    const int i = static_cast<int>(ph);
    std::printf("  %-20s %9.2f %9.2f %9.2f    %9.2f %9.2f %9.2f\n", PhaseName(ph),
                bench::Median(phases[0][i]), bench::Median(phases[1][i]),
                bench::Median(phases[2][i]),
                *std::min_element(phases[0][i].begin(), phases[0][i].end()),
                *std::min_element(phases[1][i].begin(), phases[1][i].end()),
                *std::min_element(phases[2][i].begin(), phases[2][i].end()));
  }
  const std::string json = absl::GetFlag(FLAGS_json);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write --json=%s\n", json.c_str());
      return 2;
    }
    auto list = [&](const std::vector<double>& v) {
      std::string out = "[";
      for (size_t j = 0; j < v.size(); ++j) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "%s%.4f", j ? ", " : "", v[j]);
        out += buf;
      }
      return out + "]";
    };
    const int red = static_cast<int>(Phase::kReduceLocal);
    std::fprintf(f,
                 "{\"compressor\": \"%s\", \"density\": %g, \"n\": %zu, \"trainers\": %d, "
                 "\"threads\": %d, \"reps\": %d,\n"
                 " \"step_ms\": {\"before\": %s,\n  \"checked\": %s,\n  \"check_off\": %s},\n"
                 " \"reduce_ms\": {\"before\": %s,\n  \"checked\": %s,\n  \"check_off\": %s},\n"
                 " \"ratio_checked_vs_before\": {\"q1\": %.4f, \"median\": %.4f, \"q3\": %.4f},\n"
                 " \"ratio_checked_vs_check_off\": {\"q1\": %.4f, \"median\": %.4f, \"q3\": "
                 "%.4f},\n \"reduce_ratio_checked_vs_check_off\": %s}\n",
                 absl::GetFlag(FLAGS_compressor).c_str(), absl::GetFlag(FLAGS_density), n, L,
                 absl::GetFlag(FLAGS_threads), reps, list(ms[0]).c_str(), list(ms[1]).c_str(),
                 list(ms[2]).c_str(), list(phases[0][red]).c_str(), list(phases[1][red]).c_str(),
                 list(phases[2][red]).c_str(), qb.q1, qb.median, qb.q3, qo.q1, qo.median, qo.q3,
                 list(reduce_ratio).c_str());
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return spex::Main();
}
