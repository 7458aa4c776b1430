// spex_trainer: a synthetic C++ trainer for spexd. Registers buckets of the given sizes,
// fills them every step with deterministic data, exchanges them and prints per-step timings.
// With --verify the data are small integers (so every sum is exact in float) and every
// trainer checks that its result equals the exact average of all trainers of all nodes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/client.h"

ABSL_FLAG(std::string, socket, "", "spexd socket (default $SPEX_SOCKET or the default path)");
ABSL_FLAG(int, local_rank, 0, "this trainer's index on the node");
ABSL_FLAG(int, local_size, 1, "trainers on this node");
ABSL_FLAG(std::string, buckets, "1000,65536,1048576", "comma-separated bucket sizes (elements)");
ABSL_FLAG(int, steps, 10, "steps to run");
ABSL_FLAG(std::string, mode, "doorbell", "doorbell|rpc|alternate (alternate switches every step)");
ABSL_FLAG(bool, verify, false, "check every result against the exact average");
ABSL_FLAG(std::string, compressor, "", "compressor for every bucket (default: the daemon's)");
ABSL_FLAG(double, density, 0, "target density (default: the daemon's)");
ABSL_FLAG(std::string, csv, "", "write per-step timings to this CSV file");
ABSL_FLAG(bool, quiet, false, "print only the summary");

namespace {

// Deterministic integer-valued input in [-512, 511] for (node, trainer, bucket, step, i).
inline float Value(uint32_t node, uint32_t trainer, uint64_t bucket, uint64_t step, uint64_t i) {
  uint64_t x = (static_cast<uint64_t>(node) << 48) ^ (static_cast<uint64_t>(trainer) << 40) ^ (bucket << 32) ^
               (step << 24) ^ i;
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<float>(static_cast<int64_t>(x % 1024) - 512);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("spex_trainer: synthetic trainer for spexd (see README.md)");
  absl::ParseCommandLine(argc, argv);
  spex::ClientOptions opts;
  opts.socket = absl::GetFlag(FLAGS_socket);
  opts.local_rank = absl::GetFlag(FLAGS_local_rank);
  opts.local_size = absl::GetFlag(FLAGS_local_size);
  opts.client_name = "spex_trainer";
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "doorbell" && mode != "rpc" && mode != "alternate") {
    std::fprintf(stderr, "spex_trainer: --mode must be doorbell|rpc|alternate, got '%s'\n", mode.c_str());
    return 2;
  }
  std::vector<size_t> sizes;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_buckets), ',', absl::SkipEmpty())) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n == 0) {
      std::fprintf(stderr, "spex_trainer: bad bucket size '%s' in --buckets\n", std::string(part).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  auto client = spex::Client::Connect(opts);
  if (!client.ok()) {
    std::fprintf(stderr, "spex_trainer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  spex::Client& c = **client;
  const uint32_t node = c.node_rank(), nodes = c.node_count(), me = opts.local_rank, L = opts.local_size;
  std::vector<spex::Bucket*> buckets;
  for (size_t b = 0; b < sizes.size(); ++b) {
    auto bucket = c.RegisterBucket(b, sizes[b], {absl::GetFlag(FLAGS_compressor), absl::GetFlag(FLAGS_density)});
    if (!bucket.ok()) {
      std::fprintf(stderr, "spex_trainer: %s\n", bucket.status().ToString().c_str());
      return 1;
    }
    buckets.push_back(*bucket);
  }
  const bool verify = absl::GetFlag(FLAGS_verify);
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<double> step_ms;
  std::vector<float> expect;
  size_t mismatches = 0;
  std::ofstream csv;
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    csv.open(absl::GetFlag(FLAGS_csv));
    csv << "node,local_rank,step,exchange_ms\n";
  }
  for (int step = 0; step < steps; ++step) {
    for (size_t b = 0; b < buckets.size(); ++b) {
      auto in = buckets[b]->input();
      if (verify) {
        for (size_t i = 0; i < in.size(); ++i) in[i] = Value(node, me, b, step, i);
      } else {
        std::fill(in.begin(), in.end(), static_cast<float>(node * L + me + 1));
      }
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t b = 0; b < buckets.size(); ++b) {
      const bool rpc = mode == "rpc" || (mode == "alternate" && (step + b) % 2 == 1);
      absl::Status s = c.Exchange(buckets[b], rpc ? spex::ExchangeMode::kRpc : spex::ExchangeMode::kDoorbell);
      if (!s.ok()) {
        std::fprintf(stderr, "spex_trainer[node %u trainer %u]: step %d: %s\n", node, me, step, s.ToString().c_str());
        return 1;
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    step_ms.push_back(ms);
    if (csv.is_open()) csv << node << "," << me << "," << step << "," << ms << "\n";
    if (verify) {
      const float inv = 1.0f / static_cast<float>(nodes * L);
      for (size_t b = 0; b < buckets.size(); ++b) {
        auto out = buckets[b]->output();
        for (size_t i = 0; i < out.size(); ++i) {
          float sum = 0;  // integers below 2^24: exact in any order
          for (uint32_t n = 0; n < nodes; ++n) {
            for (uint32_t l = 0; l < L; ++l) sum += Value(n, l, b, step, i);
          }
          if (out[i] != sum * inv && mismatches++ < 5) {
            std::fprintf(stderr, "spex_trainer[node %u trainer %u]: bucket %zu step %d [%zu] = %g, want %g\n", node, me,
                         b, step, i, out[i], sum * inv);
          }
        }
      }
    }
    if (!quiet) {
      std::printf("node %u trainer %u step %d: %zu buckets exchanged in %.3f ms\n", node, me, step, buckets.size(), ms);
      std::fflush(stdout);
    }
  }
  std::printf("node %u trainer %u: %d steps, exchange p50 %.3f ms p99 %.3f ms%s\n", node, me, steps,
              Percentile(step_ms, 0.5), Percentile(step_ms, 0.99),
              verify ? (mismatches ? " VERIFY FAILED" : " verified exact") : "");
  if (mismatches) {
    std::fprintf(stderr, "spex_trainer[node %u trainer %u]: %zu mismatching elements\n", node, me, mismatches);
    return 1;
  }
  return 0;
}
