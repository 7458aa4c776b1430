// sparse_exchange_trainer: the trainer side of bench/sparse_exchange_bench.py (issue 4 item 8).
// One process per node (local_size 1) talks to its node's spexd. For every density and every
// compressor in turn it opens a fresh session (so the daemons drop the previous bucket and start
// the next at step 0, all inside the same mpirun), registers one bucket of --elements floats with
// that compressor, and runs --warmup + --steps exchanges. Before each exchange it writes a new
// gradient-like input (untimed), then waits on a barrier shared with the other nodes' trainers
// (a small file every trainer maps), so every node rings at the same moment and the timed
// exchange does not include one node's data generation. After each exchange it reads the
// daemon's ExchangeStats of that step (GetStats, untimed). One JSON object per step on stdout.
// With --pair_dense (default) each session also holds a dense bucket of the same size, exchanged
// just before the compressor's in every step (same inputs), so dense is timed interleaved with
// every compressor under the same load ("paired_with" names the compressor it ran beside).
//
// Inputs: g_t[i] = c * sigma_i * z  with a fixed heavy-tailed per-coordinate scale sigma_i
// (Exp(1), 0.5% of coordinates x10; the same on every node, as data-parallel workers see the
// same "important" coordinates), z standard normal taken from a pool of 2n values at an offset
// that depends on (step, node). Large coordinates therefore persist between steps and nodes
// while the values change; |g| is heavy-tailed (quantile ratios printed to stderr). c is set per
// density so that 1 / (2 sqrt(k)) is the k-th largest |g| (where thresh, SAGE and the published
// MiCRO/ExDyna controller start), as bench/compressors_bench does.
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
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
#include "client/client.h"
#include "kernels/compressor.h"

using spex::bench::FlagList;

ABSL_FLAG(std::string, socket, "", "this node's spexd socket");
ABSL_FLAG(int64_t, elements, 25557032, "bucket size in floats");
ABSL_FLAG(std::string, densities, "0.001,0.01", "comma-separated target densities");
ABSL_FLAG(std::string, compressors, "dense,micro",
          "comma-separated compressors, run in this order");
ABSL_FLAG(int, warmup, 3, "untimed exchanges per configuration");
ABSL_FLAG(int, steps, 10, "timed exchanges per configuration");
ABSL_FLAG(std::string, barrier, "",
          "barrier file (>= 64 zero bytes) shared by every node's trainer");
ABSL_FLAG(int, parties, 1, "trainer processes on the barrier (= nodes)");
ABSL_FLAG(
    bool, pair_dense, true,
    "register a dense bucket beside each compressor's and exchange both every step (dense first)");
ABSL_FLAG(
    bool, pair_forced_sparse, false,
    "also hold a twin of each compressor's bucket registered with dense_fallback=off "
    "(always sparse; reported as compressor NAME_forced), exchanged right after it (before it "
    "with --forced_first): the daemon's --dense_fallback=auto against forced sparse in one "
    "session");
ABSL_FLAG(bool, forced_first, false,
          "with --pair_forced_sparse: register (and so exchange) the twin before the compressor's "
          "bucket");
ABSL_FLAG(std::string, sparse_allreduces, "",
          "comma-separated RegisterBucket sparse_allreduce= values (allgather, oktopk): each "
          "compressor runs once per value, its bucket registered with it; empty: one run with "
          "the daemon's --sparse_allreduce");
ABSL_FLAG(bool, list_compressors, false,
          "print the registered compressor names (one a line) and exit");

namespace {

struct Barrier {
  std::atomic<uint32_t> count;
  std::atomic<uint32_t> generation;
};

Barrier* MapBarrier(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR);
  if (fd < 0) return nullptr;
  void* p = mmap(nullptr, 64, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return p == MAP_FAILED ? nullptr : static_cast<Barrier*>(p);
}

// A futex on the shared generation word (not FUTEX_PRIVATE: the processes map the same file).
long Futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

// The waiters sleep in the kernel: with more processes than cores (4 emulated hosts on 2), a
// waiter that spun or yielded would take the core from the daemons and from the trainer still
// writing its input, and every step would pay for it.
void Wait(Barrier* b, int parties) {
  if (b == nullptr || parties <= 1) return;
  const uint32_t gen = b->generation.load();
  if (b->count.fetch_add(1) + 1 == static_cast<uint32_t>(parties)) {
    b->count.store(0);
    b->generation.fetch_add(1);
    Futex(&b->generation, FUTEX_WAKE, INT32_MAX);
    return;
  }
  // FUTEX_WAIT returns at once if the word has moved on (the last party came in between).
  while (b->generation.load() == gen) Futex(&b->generation, FUTEX_WAIT, gen);
}

double Seconds(const spex::v1::ExchangeStats& s, const std::string& phase) {
  for (const auto& p : s.phases()) {
    if (p.phase() == phase) return p.seconds();
  }
  return 0;
}

// The daemon thread's CPU time over a phase (0 from an older daemon).
double CpuSeconds(const spex::v1::ExchangeStats& s, const std::string& phase) {
  for (const auto& p : s.phases()) {
    if (p.phase() == phase) return p.cpu_seconds();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_list_compressors)) {
    for (const std::string& name : spex::CompressorNames()) std::printf("%s\n", name.c_str());
    return 0;
  }
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_elements));
  const int parties = absl::GetFlag(FLAGS_parties);
  Barrier* barrier = nullptr;
  if (!absl::GetFlag(FLAGS_barrier).empty()) {
    barrier = MapBarrier(absl::GetFlag(FLAGS_barrier));
    if (barrier == nullptr) {
      std::perror("barrier file");
      return 1;
    }
  }
  // Who am I? A first session tells the node rank (and checks the daemon is there).
  spex::ClientOptions opts;
  opts.socket = absl::GetFlag(FLAGS_socket);
  opts.client_name = "sparse_exchange_trainer";
  uint32_t node = 0, nodes = 1;
  {
    auto c = spex::Client::Connect(opts);
    if (!c.ok()) {
      std::fprintf(stderr, "sparse_exchange_trainer: %s\n", c.status().ToString().c_str());
      return 1;
    }
    node = (*c)->node_rank();
    nodes = (*c)->node_count();
  }
  std::vector<float> sigma(n), pool(2 * n);
  {
    std::mt19937 common(99), mine(1000 + node);
    std::exponential_distribution<float> expo(1.0f);
    for (float& v : sigma) v = expo(common) * ((common() % 1000) < 5 ? 10.0f : 1.0f);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : pool) v = normal(mine);
  }
  auto offset = [&](uint64_t step) { return (step * 1000003ull + node * 7777777ull) % n; };
  std::vector<float> mag(n);
  for (size_t i = 0; i < n; ++i) mag[i] = std::fabs(sigma[i] * pool[offset(0) + i]);
  auto quantile = [&](double q) {  // q-quantile of |g| at step 0 (mag is permuted)
    const size_t r = static_cast<size_t>(q * (n - 1));
    std::nth_element(mag.begin(), mag.begin() + r, mag.end());
    return mag[r];
  };
  if (node == 0) {
    const double q90 = quantile(0.9), q99 = quantile(0.99), q999 = quantile(0.999);
    std::fprintf(stderr, "input |g|: q99/q90 %.2f, q999/q99 %.2f (Gaussian: 1.57, 1.28)\n",
                 q99 / q90, q999 / q99);
  }
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  uint64_t bucket_id = 0;
  for (double d : FlagList<double>(absl::GetFlag(FLAGS_densities))) {
    const size_t k = std::max<size_t>(1, static_cast<size_t>(d * n));
    const float kth = quantile(1.0 - static_cast<double>(k) / n);
    const float scale = static_cast<float>(1.0 / (2.0 * std::sqrt(static_cast<double>(k)))) / kth;
    std::vector<std::string> modes = FlagList<std::string>(absl::GetFlag(FLAGS_sparse_allreduces));
    if (modes.empty()) modes.push_back("");
    for (const std::string& name : FlagList<std::string>(absl::GetFlag(FLAGS_compressors))) {
      for (const std::string& mode : modes) {
        Wait(barrier, parties);  // every node's previous session is gone
        auto client = spex::Client::Connect(opts);
        if (!client.ok()) {
          std::fprintf(stderr, "sparse_exchange_trainer: %s\n", client.status().ToString().c_str());
          return 1;
        }
        // With --pair_dense, a dense bucket (lower id: exchanged first in each step) runs beside
        // the compressor's, so every step times dense and the compressor back to back.
        std::vector<std::pair<std::string, spex::Bucket*>> runs;
        // Buckets are exchanged in id order (the daemon's canonical order), so the order of
        // registration is the order in every step; --forced_first puts the twin before.
        const bool forced_first = absl::GetFlag(FLAGS_forced_first);
        const std::string first = forced_first ? name + "_forced" : name;
        const std::string second = forced_first ? name : name + "_forced";
        const std::string order[3] = {"dense", first, second};
        for (int k = 0; k < 3; ++k) {
          const std::string& which = order[k];
          // The paired dense bucket (--compressors=dense alone: just the one dense bucket).
          if (k == 0 && (name == "dense" || !absl::GetFlag(FLAGS_pair_dense))) continue;
          const bool forced = which == name + "_forced";
          if (forced && (name == "dense" || !absl::GetFlag(FLAGS_pair_forced_sparse))) continue;
          spex::CompressorChoice choice{forced ? name : which, d, {}};
          if (which != "dense" && !mode.empty()) choice.params["sparse_allreduce"] = mode;
          if (forced) choice.params["dense_fallback"] = "off";
          auto bucket = (*client)->RegisterBucket(bucket_id++, n, choice);
          if (!bucket.ok()) {
            std::fprintf(stderr, "sparse_exchange_trainer: %s: %s\n", which.c_str(),
                         bucket.status().ToString().c_str());
            return 1;
          }
          runs.emplace_back(which, *bucket);
        }
        for (int step = 0; step < warmup + steps; ++step) {
          for (size_t b = 0; b < runs.size(); ++b) {
            spex::Bucket* bucket = runs[b].second;
            const std::string& what = runs[b].first;
            float* in = bucket->input().data();
            const float* z = pool.data() + offset(step);
            for (size_t i = 0; i < n; ++i) in[i] = scale * sigma[i] * z[i];
            Wait(barrier, parties);
            const auto t0 = std::chrono::steady_clock::now();
            absl::Status s = (*client)->Exchange(bucket);
            const auto t1 = std::chrono::steady_clock::now();
            const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
            // CLOCK_MONOTONIC (as Python's time.monotonic): where the exchange lay in time.
            const auto ns = [](std::chrono::steady_clock::time_point t) {
              return static_cast<long long>(
                  std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch())
                      .count());
            };
            if (!s.ok()) {
              std::fprintf(stderr, "sparse_exchange_trainer[node %u] %s step %d: %s\n", node,
                           name.c_str(), step, s.ToString().c_str());
              return 1;
            }
            // The daemon wakes the trainer before it files the step's record: ask until it is
            // there.
            auto stats = (*client)->Stats();
            for (int tries = 0; tries < 2000 && stats.ok() &&
                                stats->buckets_size() == static_cast<int>(runs.size()) &&
                                (stats->buckets(b).exchanges() <= static_cast<uint64_t>(step) ||
                                 stats->buckets(b).last().step() != static_cast<uint64_t>(step));
                 ++tries) {
              usleep(500);
              stats = (*client)->Stats();
            }
            if (!stats.ok() || stats->buckets_size() != static_cast<int>(runs.size()) ||
                stats->buckets(b).last().step() != static_cast<uint64_t>(step)) {
              std::fprintf(stderr, "sparse_exchange_trainer: GetStats: %s\n",
                           stats.status().ToString().c_str());
              return 1;
            }
            const spex::v1::ExchangeStats& e = stats->buckets(b).last();
            std::printf(
                "{\"node\":%u,\"nodes\":%u,\"elements\":%zu,\"density\":%g,\"compressor\":\"%s\","
                "\"step\":%d,\"t0_ns\":%lld,\"t1_ns\":%lld,"
                "\"warmup\":%s,\"exchange_ms\":%.4f,\"daemon_total_ms\":%.4f,\"collective_ms\":%."
                "4f,\"collective_cpu_ms\":%.4f,"
                "\"reduce_local_ms\":%.4f,\"compress_ms\":%.4f,\"decode_ms\":%.4f,\"publish_ms\":%."
                "4f,"
                "\"paired_with\":\"%s\",\"pattern\":\"%s\",\"achieved_density\":%.7f,\"selected\":%"
                "llu,\"gathered\":%llu,"
                "\"bytes_sent\":%llu,\"bytes_received\":%llu,\"fell_back_to_dense\":%s,\"stats_"
                "step\":%llu,\"sparse_allreduce\":\"%s\",\"bucket\":%llu}\n",
                node, nodes, n, d, what.c_str(), step, ns(t0), ns(t1),
                step < warmup ? "true" : "false", ms, e.total_seconds() * 1e3,
                Seconds(e, "collective") * 1e3, CpuSeconds(e, "collective") * 1e3,
                Seconds(e, "reduce_local") * 1e3, Seconds(e, "compress") * 1e3,
                Seconds(e, "decode") * 1e3, Seconds(e, "publish") * 1e3, name.c_str(),
                e.pattern().c_str(), e.achieved_density(),
                static_cast<unsigned long long>(e.selected_elements()),
                static_cast<unsigned long long>(e.gathered_elements()),
                static_cast<unsigned long long>(e.bytes_sent()),
                static_cast<unsigned long long>(e.bytes_received()),
                e.fell_back_to_dense() ? "true" : "false",
                static_cast<unsigned long long>(e.step()), what == "dense" ? "" : mode.c_str(),
                static_cast<unsigned long long>(bucket->id()));
            std::fflush(stdout);
          }
        }
        if (absl::Status s = (*client)->Goodbye(); !s.ok()) {
          std::fprintf(stderr, "sparse_exchange_trainer: Goodbye: %s\n", s.ToString().c_str());
          return 1;
        }
      }
    }
  }
  return 0;
}
