// oktopk_volume_sim: received elements per node per exchange, the all-gather exchange (pattern B)
// against the Ok-Topk exchange with global selection topk (daemon/engine/oktopk_exchange.h), on
// N simulated nodes: N threads over the in-process collective, each running the real exchange
// functions on its own residual. Only the volume is measured, not time (in-process copies are
// not a network).
//
// Per node and exchange: acc += gradient (the generator of bench/gathered_volume_sim.cc: a
// heavy-tailed per-coordinate scale shared by all nodes, a fresh normal window per (step, node));
// S = the k = max(1, d*n) largest |acc| (the topk compressor's rule); then
//  allgather: ExchangeSparseGather, the residual zeroed at S;
//  oktopk:    ExchangeOkTopk (global topk keeping k, exact every --recompute_every exchanges,
//             regions re-agreed every --rebalance_every), the residual zeroed at S and kept only.
// Received elements = (index, value) pairs from other nodes: allgather sum of the others' |S_i|;
// oktopk the reduce-scatter pairs from others plus the kept entries from other owners. One JSON
// object per (nodes, density, exchange) on stdout: p50 and max over the measured exchanges of the
// mean and the max over nodes, each also / k. bench/oktopk_volume.py runs it and plots.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "daemon/transport/inproc_collective.h"
#include "kernels/primitives.h"

using spex::bench::FlagList;

ABSL_FLAG(int64_t, elements, 1000000, "bucket size in floats");
ABSL_FLAG(std::string, nodes, "2,4,8,16,32,64", "comma-separated node counts");
ABSL_FLAG(std::string, densities, "0.001,0.01", "comma-separated densities (k = d * elements)");
ABSL_FLAG(std::string, exchanges, "allgather,oktopk", "comma-separated: allgather, oktopk");
ABSL_FLAG(int, warmup, 2, "exchanges before measuring");
ABSL_FLAG(int, steps, 40, "measured exchanges");
ABSL_FLAG(int, recompute_every, 32, "oktopk: exact global selection every this many exchanges");
ABSL_FLAG(int, rebalance_every, 64, "oktopk: regions re-agreed every this many exchanges");

namespace {

struct Inputs {
  size_t n;
  std::vector<float> sigma, pool;
  uint64_t Offset(uint64_t step, int node) const {
    return (step * 1000003ull + node * 7777777ull) % n;
  }
};

// Indices of the k largest |acc| (ties to the smaller index), ascending; `mag` is scratch.
void TopK(const std::vector<float>& acc, size_t k, std::vector<float>* mag,
          std::vector<uint32_t>* idx) {
  const size_t n = acc.size();
  mag->resize(n);
  for (size_t i = 0; i < n; ++i) (*mag)[i] = std::fabs(acc[i]);
  std::nth_element(mag->begin(), mag->begin() + (n - k), mag->end());
  const float t = (*mag)[n - k];
  idx->clear();
  size_t above = 0;
  for (size_t i = 0; i < n; ++i) above += std::fabs(acc[i]) > t ? 1 : 0;
  size_t ties = k - above;
  for (uint32_t i = 0; i < n; ++i) {
    const float m = std::fabs(acc[i]);
    if (m > t || (m == t && ties > 0 && ties--)) idx->push_back(i);
  }
}

struct Sample {
  double mean = 0, max = 0;  // over nodes
  double control_bytes = 0;
  double kept = 0;
  bool exact = false;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Inputs in;
  in.n = static_cast<size_t>(absl::GetFlag(FLAGS_elements));
  in.sigma.resize(in.n);
  in.pool.resize(2 * in.n);
  {
    std::mt19937 gen(99);
    std::exponential_distribution<float> expo(1.0f);
    for (float& v : in.sigma) v = expo(gen) * ((gen() % 1000) < 5 ? 10.0f : 1.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : in.pool) v = normal(gen);
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  for (double d : FlagList<double>(absl::GetFlag(FLAGS_densities))) {
    const size_t k = std::max<size_t>(1, static_cast<size_t>(d * in.n));
    for (int nodes : FlagList<int>(absl::GetFlag(FLAGS_nodes))) {
      for (const std::string& ex : FlagList<std::string>(absl::GetFlag(FLAGS_exchanges))) {
        if (ex != "allgather" && ex != "oktopk") {
          std::fprintf(stderr, "oktopk_volume_sim: --exchanges takes allgather,oktopk, not %s\n",
                       ex.c_str());
          return 1;
        }
        const bool ok = ex == "oktopk";
        spex::OkTopkOptions opts;
        opts.global = spex::OkTopkGlobal::kTopk;
        opts.k = k;
        opts.recompute_every = absl::GetFlag(FLAGS_recompute_every);
        opts.rebalance_every = absl::GetFlag(FLAGS_rebalance_every);
        // received[step][node]
        std::vector<std::vector<double>> received(steps, std::vector<double>(nodes, 0));
        std::vector<Sample> samples(steps);
        spex::InProcessHub hub(nodes, absl::Minutes(10));
        absl::Mutex mu;
        std::string error;
        std::vector<std::thread> threads;
        for (int rank = 0; rank < nodes; ++rank) {
          threads.emplace_back([&, rank] {
            std::unique_ptr<spex::Collective> coll = hub.Connect(rank);
            std::unique_ptr<spex::Primitives> prims = spex::MakeCpuPrimitives(1);
            std::vector<float> acc(in.n, 0.0f), out(in.n, 0.0f), mag;
            std::vector<uint32_t> idx, touched;
            std::vector<float> val;
            spex::OkTopkState state;
            for (int s = 0; s < warmup + steps; ++s) {
              const float* z = in.pool.data() + in.Offset(s, rank);
              for (size_t i = 0; i < in.n; ++i) acc[i] += 0.01f * in.sigma[i] * z[i];
              TopK(acc, k, &mag, &idx);
              val.clear();
              for (uint32_t i : idx) val.push_back(acc[i]);
              for (uint32_t i : touched) out[i] = 0.0f;
              spex::SparseExchangeArgs args;
              args.step = s;
              args.elements = static_cast<uint32_t>(in.n);
              args.scale = 1.0f / nodes;
              absl::Status st;
              double got = 0;
              if (ok) {
                spex::OkTopkResult res;
                st = spex::ExchangeOkTopk(coll.get(), prims.get(), args, opts, &state, idx, val,
                                          out.data(), &res);
                if (st.ok()) {
                  got = static_cast<double>(res.rs_received + res.ag_received);
                  for (uint32_t i : res.my_kept) acc[i] = 0.0f;
                  touched = res.touched;
                  if (s >= warmup && rank == 0) {
                    samples[s - warmup].control_bytes = static_cast<double>(res.control_bytes);
                    samples[s - warmup].kept = static_cast<double>(res.touched.size());
                    samples[s - warmup].exact = res.exact;
                  }
                }
              } else {
                spex::SparseExchangeResult res;
                st = spex::ExchangeSparseGather(coll.get(), prims.get(), args, idx, val, out.data(),
                                                &res);
                if (st.ok()) {
                  for (int q = 0; q < nodes; ++q) {
                    if (q != rank) got += static_cast<double>(res.counts[q]);
                  }
                  for (uint32_t i : idx) acc[i] = 0.0f;
                  touched = res.touched;
                }
              }
              if (!st.ok()) {
                absl::MutexLock lock(&mu);
                if (error.empty()) error = st.ToString();
                return;
              }
              if (s >= warmup) received[s - warmup][rank] = got;
            }
          });
        }
        for (std::thread& t : threads) t.join();
        if (!error.empty()) {
          std::fprintf(stderr, "oktopk_volume_sim: %s, %d nodes, d=%g: %s\n", ex.c_str(), nodes, d,
                       error.c_str());
          return 1;
        }
        std::vector<double> means, maxes;
        for (int s = 0; s < steps; ++s) {
          double sum = 0, mx = 0;
          for (double v : received[s]) {
            sum += v;
            mx = std::max(mx, v);
          }
          means.push_back(sum / nodes);
          maxes.push_back(mx);
        }
        // Exact and reused-threshold exchanges apart (oktopk): the kept count's spread.
        double kept_min = 1e300, kept_max = 0, control = 0;
        int exact = 0;
        for (const Sample& smp : samples) {
          if (ok) {
            kept_min = std::min(kept_min, smp.kept);
            kept_max = std::max(kept_max, smp.kept);
          }
          control = std::max(control, smp.control_bytes);
          exact += smp.exact ? 1 : 0;
        }
        std::vector<double> sorted_means = means, sorted_maxes = maxes;
        std::sort(sorted_means.begin(), sorted_means.end());
        std::sort(sorted_maxes.begin(), sorted_maxes.end());
        double avg = 0;
        for (double m : means) avg += m / steps;
        const double kd = static_cast<double>(k);
        std::printf(
            "{\"source\":\"simulator\",\"exchange\":\"%s\",\"nodes\":%d,\"elements\":%zu,"
            "\"density\":%g,\"k\":%zu,\"steps\":%d,\"exact_steps\":%d,"
            "\"received_mean_over_k\":%.4f,\"received_p50_over_k\":%.4f,"
            "\"received_node_max_p50_over_k\":%.4f,\"received_node_max_max_over_k\":%.4f,"
            "\"kept_min_over_k\":%.4f,\"kept_max_over_k\":%.4f,\"control_bytes_max\":%.0f}\n",
            ex.c_str(), nodes, in.n, d, k, steps, exact, avg / kd, sorted_means[steps / 2] / kd,
            sorted_maxes[steps / 2] / kd, sorted_maxes.back() / kd, ok ? kept_min / kd : 0.0,
            ok ? kept_max / kd : 0.0, control);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
