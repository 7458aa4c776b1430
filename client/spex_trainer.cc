// spex_trainer: a synthetic C++ trainer for spexd. Registers buckets of the given sizes (each
// with the compressor --compressors assigns it, round-robin, else --compressor, else the
// daemon's default), fills them every step with deterministic data, exchanges them and prints
// per-step timings.
//
// --verify checks every result:
//   * buckets whose compressor is dense (pattern D): the data are small integers (every sum is
//     exact in float) and every element must equal the exact average of all trainers of all
//     nodes.
//   * sparse buckets (any other compressor): every trainer regenerates the inputs of every
//     trainer of every node (the node count comes from the daemon's Hello) and replays the
//     whole cluster in a kernels/reference_cluster.h oracle, one per bucket, built with the
//     compressor name and density the daemon says it runs for the bucket (registration reply),
//     default parameters, error feedback per --error_feedback. Its result must match the
//     oracle's within a relative 1e-6 (plus 1e-6 of the bucket's largest magnitude: MPI may sum
//     the nodes' values in another order than the oracle). When the exchange's stats (the RPC
//     reply, or GetStats after a doorbell exchange) report this node's residual norm (nonzero,
//     pattern A or B), it must equal the norm of the oracle's residual(node) at the step it was
//     computed (relative 1e-5).
//   The oracle selects exactly what spexd selects only with the same Primitives implementation
//   and thread count: the trainer uses MakeCpuPrimitives(--threads) as spexd does, so pass the
//   daemon's --threads (both default to all cores; the tests run both with --threads=1; buckets
//   below 256k elements run on one thread anyway). Sparse buckets must be exchanged sparse every
//   step: run spexd with --dense_fallback=off (its `auto` probe exchanges dense every other
//   step, which the oracle cannot replay; the trainer then fails saying so). A sparse bucket the
//   daemon exchanges dense from step 0 on without a fallback (smaller than its
//   --min_sparse_elements) is checked against a dense oracle.
//
// --register_only=K registers K more buckets it never exchanges (a test of shutdown cleanup: their
// segments stay linked on the daemon while the other local trainers never attach them).
// --list_compressors prints the registered compressor names (kernels/compressor.h), one a line.
//
// --device=cuda asks the daemon for device buckets (spexd --device=cuda): every step the trainer
// fills a host copy of its input, copies it into its device slot on its own CUDA stream, and
// exchanges with that stream (the client records the input event there and makes the stream wait
// for the output event); --verify copies the device output back and checks it as above. Only a
// build with --config=cuda has it; elsewhere the flag is refused saying so.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"
#include "kernels/splitmix.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

ABSL_FLAG(std::string, socket, "", "spexd socket (default $SPEX_SOCKET or the default path)");
ABSL_FLAG(int, local_rank, 0, "this trainer's index on the node");
ABSL_FLAG(int, local_size, 1, "trainers on this node");
ABSL_FLAG(std::string, buckets, "1000,65536,1048576", "comma-separated bucket sizes (elements)");
ABSL_FLAG(int, steps, 10, "steps to run");
ABSL_FLAG(std::string, mode, "doorbell",
          "doorbell|rpc|alternate|overlap (alternate switches every step and bucket; overlap "
          "starts every bucket of a step on the doorbell path, then waits for them all, as "
          "PyTorch DDP's hook does)");
ABSL_FLAG(bool, verify, false,
          "check every result: dense buckets exactly (integer data), sparse buckets against a "
          "single-process oracle of the whole cluster (see the header of client/spex_trainer.cc)");
ABSL_FLAG(std::string, compressor, "", "compressor for every bucket (default: the daemon's)");
ABSL_FLAG(std::string, compressors, "",
          "comma-separated compressors assigned to the buckets round-robin (bucket b gets entry "
          "b % count); overrides --compressor");
ABSL_FLAG(double, density, 0, "target density (default: the daemon's)");
ABSL_FLAG(int, threads, 0,
          "--verify: worker threads of the oracle's CPU primitives; must equal spexd's --threads "
          "(0 = all cores, spexd's default) for the oracle to select exactly what spexd selects");
ABSL_FLAG(bool, error_feedback, true,
          "--verify: whether spexd runs with --error_feedback (must match)");
ABSL_FLAG(bool, list_compressors, false,
          "print the registered compressor names, one a line, and exit");
ABSL_FLAG(
    int, register_only, 0,
    "register this many extra buckets (ids after --buckets', 1000 elements each) and never "
    "exchange "
    "them: with one trainer doing it, their segments stay linked on the daemon (shutdown tests)");
ABSL_FLAG(std::string, arrival_us, "",
          "--mode=overlap: when each bucket's input is handed in, in microseconds from the step's "
          "start, one value per bucket (comma-separated, or @FILE with the values separated by "
          "commas or newlines), as backprop produces gradients; the trainer sleeps until then. "
          "Empty: every bucket at once");
ABSL_FLAG(int64_t, late_us, 0,
          "--arrival_us: added to every arrival of this trainer (a slow node, for skew)");
ABSL_FLAG(std::string, inputs, "constant",
          "without --verify: constant (every element node * local_size + rank + 1) or gradient "
          "(a gradient-like, heavy-tailed input, written once before the first step and kept)");
ABSL_FLAG(std::string, csv, "",
          "write per-step timings to this CSV file: node, local_rank, step, exchange_ms (the "
          "step: from its start to every result), last_start_ms (when the last bucket was "
          "handed in), start_ns (the step's start, CLOCK_MONOTONIC)");
ABSL_FLAG(bool, quiet, false, "print only the summary");
ABSL_FLAG(std::string, device, "cpu",
          "cpu: host buckets; cuda: device buckets from a daemon run with --device=cuda (needs a "
          "build with --config=cuda)");
ABSL_FLAG(int, cuda_device, -1,
          "--device=cuda: the GPU this trainer's buckets live on (it must be one of spexd's "
          "--devices); -1: the daemon's home GPU");

namespace {

uint64_t Mix(uint32_t node, uint32_t trainer, uint64_t bucket, uint64_t step, uint64_t i) {
  uint64_t x = (static_cast<uint64_t>(node) << 48) ^ (static_cast<uint64_t>(trainer) << 40) ^
               (bucket << 32) ^ (step << 24) ^ i;
  return spex::SplitMix64(&x);
}

// Deterministic integer-valued input in [-512, 511] for (node, trainer, bucket, step, i).
inline float Value(uint32_t node, uint32_t trainer, uint64_t bucket, uint64_t step, uint64_t i) {
  return static_cast<float>(static_cast<int64_t>(Mix(node, trainer, bucket, step, i) % 1024) - 512);
}

// Deterministic, roughly Gaussian input (scale ~1e-3) with a slowly drifting per-position
// scale and a few persistently large positions, so thresholds see structure across steps.
inline float GradValue(uint32_t node, uint32_t trainer, uint64_t bucket, uint64_t step,
                       uint64_t i) {
  const uint64_t x = Mix(node, trainer, bucket, step, i);
  const double u1 = ((x & 0xffffffull) + 0.5) / 16777216.0,
               u2 = (((x >> 24) & 0xffffffull) + 0.5) / 16777216.0;
  const double g = std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  const double scale =
      1.0 + 4.0 * ((i * 2654435761u) % 97 == 0) + 0.5 * std::sin(i * 0.001 + step * 0.05);
  return static_cast<float>(g * scale * 1e-3);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

// --verify state of one sparse bucket.
struct Oracle {
  std::unique_ptr<spex::ReferenceCluster> cluster;
  std::string pattern;                // "A", "B" or "D" (what the daemon must report)
  std::vector<double> residual_norm;  // this node's residual norm after each step
};

// --device=cuda: the trainer's CUDA stream and, per bucket, host copies of its input and of the
// output. Without CUDA in the build every call fails, and Create refuses first.
class DeviceStaging {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceStaging>> Create(int gpu) {
#ifdef SPEX_HAVE_CUDA
    auto d = std::unique_ptr<DeviceStaging>(new DeviceStaging);
    if (cudaError_t e = cudaSetDevice(gpu); e != cudaSuccess) return Error("cudaSetDevice", e);
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return Error("cudaStreamCreate", e);
    }
    d->stream_ = stream;
    return d;
#else
    (void)gpu;
    return absl::FailedPreconditionError(
        "--device=cuda: spex_trainer was built without CUDA (build it with --config=cuda)");
#endif
  }
  ~DeviceStaging() {
#ifdef SPEX_HAVE_CUDA
    if (stream_ != nullptr) cudaStreamDestroy(Stream());
#endif
  }
  void* stream() const { return stream_; }
  // Copies `host` into the device slot, queued on the stream (the exchange is ordered after it).
  absl::Status Upload(float* device, const std::vector<float>& host) {
#ifdef SPEX_HAVE_CUDA
    if (cudaError_t e = cudaMemcpyAsync(device, host.data(), host.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, Stream());
        e != cudaSuccess) {
      return Error("cudaMemcpyAsync (input)", e);
    }
    return Sync();
#else
    return absl::UnimplementedError("built without CUDA");
#endif
  }
  // Copies the device output into `host` on the stream (which waits for the daemon's result).
  absl::Status Download(const float* device, std::vector<float>* host) {
#ifdef SPEX_HAVE_CUDA
    if (cudaError_t e = cudaMemcpyAsync(host->data(), device, host->size() * sizeof(float),
                                        cudaMemcpyDeviceToHost, Stream());
        e != cudaSuccess) {
      return Error("cudaMemcpyAsync (output)", e);
    }
    return Sync();
#else
    return absl::UnimplementedError("built without CUDA");
#endif
  }

 private:
#ifdef SPEX_HAVE_CUDA
  cudaStream_t Stream() const { return static_cast<cudaStream_t>(stream_); }
  absl::Status Sync() {
    if (cudaError_t e = cudaStreamSynchronize(Stream()); e != cudaSuccess) {
      return Error("cudaStreamSynchronize", e);
    }
    return absl::OkStatus();
  }
  static absl::Status Error(const char* what, cudaError_t e) {
    return absl::InternalError(std::string("--device=cuda: ") + what + ": " + cudaGetErrorName(e) +
                               " (" + cudaGetErrorString(e) + ")");
  }
#endif
  void* stream_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("spex_trainer: synthetic trainer for spexd (see README.md)");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_list_compressors)) {
    for (const std::string& name : spex::CompressorNames()) std::printf("%s\n", name.c_str());
    return 0;
  }
  spex::ClientOptions opts;
  opts.socket = absl::GetFlag(FLAGS_socket);
  opts.local_rank = absl::GetFlag(FLAGS_local_rank);
  opts.local_size = absl::GetFlag(FLAGS_local_size);
  opts.client_name = "spex_trainer";
  const std::string device = absl::GetFlag(FLAGS_device);
  if (device != "cpu" && device != "cuda") {
    std::fprintf(stderr, "spex_trainer: --device must be cpu|cuda, got '%s'\n", device.c_str());
    return 2;
  }
  if (device == "cuda") {
    if (auto probe = DeviceStaging::Create(0); !probe.ok()) {
      std::fprintf(stderr, "spex_trainer: %s\n", probe.status().ToString().c_str());
      return 2;
    }
    opts.device = spex::v1::DEVICE_CUDA;
    opts.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "doorbell" && mode != "rpc" && mode != "alternate" && mode != "overlap") {
    std::fprintf(stderr, "spex_trainer: --mode must be doorbell|rpc|alternate|overlap, got '%s'\n",
                 mode.c_str());
    return 2;
  }
  std::vector<size_t> sizes;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_buckets), ',', absl::SkipEmpty())) {
    uint64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n == 0) {
      std::fprintf(stderr, "spex_trainer: bad bucket size '%s' in --buckets\n",
                   std::string(part).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  // --arrival_us: the offsets, checked against the buckets.
  std::vector<int64_t> arrival_us;
  {
    std::string text = absl::GetFlag(FLAGS_arrival_us);
    if (!text.empty() && text[0] == '@') {
      std::ifstream f(text.substr(1));
      if (!f) {
        std::fprintf(stderr, "spex_trainer: --arrival_us: cannot read %s\n", text.c_str() + 1);
        return 2;
      }
      text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    for (absl::string_view part : absl::StrSplit(text, absl::ByAnyChar(",\n"), absl::SkipEmpty())) {
      int64_t us = 0;
      if (!absl::SimpleAtoi(part, &us) || us < 0) {
        std::fprintf(stderr, "spex_trainer: bad offset '%s' in --arrival_us (microseconds >= 0)\n",
                     std::string(part).c_str());
        return 2;
      }
      arrival_us.push_back(us);
    }
    if (!arrival_us.empty() && (arrival_us.size() != sizes.size() || mode != "overlap")) {
      std::fprintf(stderr,
                   "spex_trainer: --arrival_us needs --mode=overlap and one offset per bucket "
                   "(%zu given for %zu buckets)\n",
                   arrival_us.size(), sizes.size());
      return 2;
    }
  }
  const int64_t late_us = absl::GetFlag(FLAGS_late_us);
  const std::string inputs = absl::GetFlag(FLAGS_inputs);
  if (inputs != "constant" && inputs != "gradient") {
    std::fprintf(stderr, "spex_trainer: --inputs must be constant|gradient, got '%s'\n",
                 inputs.c_str());
    return 2;
  }
  std::vector<std::string> compressors =
      absl::StrSplit(absl::GetFlag(FLAGS_compressors), ',', absl::SkipEmpty());
  if (compressors.empty()) compressors.push_back(absl::GetFlag(FLAGS_compressor));
  auto client = spex::Client::Connect(opts);
  if (!client.ok()) {
    std::fprintf(stderr, "spex_trainer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  spex::Client& c = **client;
  const uint32_t node = c.node_rank(), nodes = c.node_count(), me = opts.local_rank,
                 local = opts.local_size;
  std::vector<spex::Bucket*> buckets;
  for (size_t b = 0; b < sizes.size(); ++b) {
    auto bucket = c.RegisterBucket(
        b, sizes[b], {compressors[b % compressors.size()], absl::GetFlag(FLAGS_density)});
    if (!bucket.ok()) {
      std::fprintf(stderr, "spex_trainer: %s\n", bucket.status().ToString().c_str());
      return 1;
    }
    buckets.push_back(*bucket);
  }
  // --device=cuda: one stream on the daemon's GPU and host copies of every bucket.
  std::unique_ptr<DeviceStaging> staging;
  std::vector<std::vector<float>> host_in, host_out;
  if (device == "cuda") {
    auto st = DeviceStaging::Create(buckets.front()->cuda_device());
    if (!st.ok()) {
      std::fprintf(stderr, "spex_trainer: %s\n", st.status().ToString().c_str());
      return 1;
    }
    staging = std::move(*st);
    for (spex::Bucket* bk : buckets) {
      host_in.emplace_back(bk->elements());
      host_out.emplace_back(bk->elements());
    }
  }
  void* const stream = staging ? staging->stream() : nullptr;
  // Where the trainer writes its input and reads the output: the bucket's own memory, or the host
  // copies of a device bucket.
  auto input_of = [&](size_t b) -> absl::Span<float> {
    return staging ? absl::Span<float>(host_in[b]) : buckets[b]->input();
  };
  auto output_of = [&](size_t b) -> absl::Span<const float> {
    return staging ? absl::Span<const float>(host_out[b]) : buckets[b]->output();
  };
  for (int e = 0; e < absl::GetFlag(FLAGS_register_only); ++e) {
    auto extra = c.RegisterBucket(sizes.size() + e, 1000, {"dense", 0});
    if (!extra.ok()) {
      std::fprintf(stderr, "spex_trainer: %s\n", extra.status().ToString().c_str());
      return 1;
    }
  }
  const bool verify = absl::GetFlag(FLAGS_verify);
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  const int steps = absl::GetFlag(FLAGS_steps);

  // --verify of sparse buckets: one oracle per bucket over the same primitives as spexd.
  std::unique_ptr<spex::Primitives> prims;
  std::vector<Oracle> oracles(buckets.size());  // cluster == nullptr: a dense bucket (exact check)
  size_t exact_buckets = 0, oracle_buckets = 0, norm_checks = 0;
  if (verify) {
    for (size_t b = 0; b < buckets.size(); ++b) {
      auto pattern = spex::CompressorPattern(buckets[b]->compressor());
      if (!pattern.ok()) {
        std::fprintf(stderr, "spex_trainer: bucket %zu: %s\n", b,
                     pattern.status().ToString().c_str());
        return 1;
      }
      if (*pattern == spex::Pattern::kDense) {
        ++exact_buckets;
        continue;
      }
      if (prims == nullptr) prims = spex::MakeCpuPrimitives(absl::GetFlag(FLAGS_threads));
      spex::CompressorSpec spec;
      spec.name = buckets[b]->compressor();
      spec.density = buckets[b]->density();
      spec.elements = buckets[b]->elements();
      auto cluster = spex::ReferenceCluster::Create(
          spec, nodes, local, absl::GetFlag(FLAGS_error_feedback), prims.get());
      if (!cluster.ok()) {
        std::fprintf(stderr, "spex_trainer: bucket %zu oracle: %s\n", b,
                     cluster.status().ToString().c_str());
        return 1;
      }
      oracles[b].cluster = std::move(*cluster);
      oracles[b].pattern = spex::PatternName(*pattern);
      ++oracle_buckets;
    }
  }
  std::vector<double> step_ms;
  std::vector<float> all_inputs, want;  // --verify scratch: every trainer's input of one bucket
  size_t mismatches = 0;
  std::ofstream csv;
  if (!absl::GetFlag(FLAGS_csv).empty()) {
    csv.open(absl::GetFlag(FLAGS_csv));
    csv << "node,local_rank,step,exchange_ms,last_start_ms,start_ns\n";
  }
  auto report = [&](const char* fmt, auto... args) {
    if (mismatches++ < 8) {
      std::fprintf(stderr, "spex_trainer[node %u trainer %u]: ", node, me);
      std::fprintf(stderr, fmt, args...);
      std::fprintf(stderr, "\n");
    }
  };
  for (int step = 0; step < steps; ++step) {
    for (size_t b = 0; b < buckets.size(); ++b) {
      auto in = input_of(b);
      if (verify && oracles[b].cluster != nullptr) {
        for (size_t i = 0; i < in.size(); ++i) in[i] = GradValue(node, me, b, step, i);
      } else if (verify) {
        for (size_t i = 0; i < in.size(); ++i) in[i] = Value(node, me, b, step, i);
      } else if (inputs == "gradient") {
        if (step == 0) {
          for (size_t i = 0; i < in.size(); ++i) in[i] = GradValue(node, me, b, 0, i);
        }
      } else {
        std::fill(in.begin(), in.end(), static_cast<float>(node * local + me + 1));
      }
      if (staging) {
        if (absl::Status s = staging->Upload(buckets[b]->input().data(), host_in[b]); !s.ok()) {
          std::fprintf(stderr, "spex_trainer[node %u trainer %u]: step %d: %s\n", node, me, step,
                       s.ToString().c_str());
          return 1;
        }
      }
    }
    std::vector<bool> via_rpc(buckets.size());
    const auto t0 = std::chrono::steady_clock::now();
    auto last_start = t0;
    for (size_t b = 0; b < buckets.size(); ++b) {
      if (!arrival_us.empty()) {
        std::this_thread::sleep_until(t0 + std::chrono::microseconds(arrival_us[b] + late_us));
      }
      last_start = std::chrono::steady_clock::now();
      const bool rpc = mode == "rpc" || (mode == "alternate" && (step + b) % 2 == 1);
      via_rpc[b] = rpc;
      absl::Status s =
          mode == "overlap"
              ? c.Start(buckets[b], stream)
              : c.Exchange(buckets[b],
                           rpc ? spex::ExchangeMode::kRpc : spex::ExchangeMode::kDoorbell, stream);
      if (!s.ok()) {
        std::fprintf(stderr, "spex_trainer[node %u trainer %u]: step %d: %s\n", node, me, step,
                     s.ToString().c_str());
        return 1;
      }
    }
    for (size_t b = 0; mode == "overlap" && b < buckets.size(); ++b) {
      if (absl::Status s = c.Wait(buckets[b], stream); !s.ok()) {
        std::fprintf(stderr, "spex_trainer[node %u trainer %u]: step %d: %s\n", node, me, step,
                     s.ToString().c_str());
        return 1;
      }
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    step_ms.push_back(ms);
    for (size_t b = 0; staging && verify && b < buckets.size(); ++b) {
      if (absl::Status s = staging->Download(buckets[b]->output().data(), &host_out[b]); !s.ok()) {
        std::fprintf(stderr, "spex_trainer[node %u trainer %u]: step %d: %s\n", node, me, step,
                     s.ToString().c_str());
        return 1;
      }
    }
    if (csv.is_open()) {
      csv << node << "," << me << "," << step << "," << ms << ","
          << std::chrono::duration<double, std::milli>(last_start - t0).count() << ","
          << std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count()
          << "\n";
    }
    if (verify) {
      // The daemon's record of this step for every sparse bucket: the RPC reply, or GetStats
      // (polled: the record is stored just after the result is published).
      std::vector<spex::v1::ExchangeStats> stats(buckets.size());
      std::vector<bool> have(buckets.size());
      for (size_t b = 0; b < buckets.size(); ++b) {
        if (oracles[b].cluster != nullptr && via_rpc[b]) {
          stats[b] = buckets[b]->last_rpc_stats();
          have[b] = stats[b].step() == static_cast<uint64_t>(step);
        }
      }
      for (int attempt = 0; attempt < 400; ++attempt) {
        bool missing = false;
        for (size_t b = 0; b < buckets.size(); ++b)
          missing |= oracles[b].cluster != nullptr && !have[b];
        if (!missing) break;
        if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        auto resp = c.Stats();
        if (!resp.ok()) {
          std::fprintf(stderr, "spex_trainer[node %u trainer %u]: %s\n", node, me,
                       resp.status().ToString().c_str());
          return 1;
        }
        for (const auto& bs : resp->buckets()) {
          const uint64_t b = bs.bucket_id();
          if (b < buckets.size() && !have[b] && bs.has_last() &&
              bs.last().step() == static_cast<uint64_t>(step)) {
            stats[b] = bs.last();
            have[b] = true;
          }
        }
      }
      const float inv = 1.0f / static_cast<float>(nodes * local);
      for (size_t b = 0; b < buckets.size(); ++b) {
        auto out = output_of(b);
        Oracle& o = oracles[b];
        if (o.cluster == nullptr) {
          for (size_t i = 0; i < out.size(); ++i) {
            float sum = 0;  // integers below 2^24: exact in any order
            for (uint32_t n = 0; n < nodes; ++n) {
              for (uint32_t l = 0; l < local; ++l) sum += Value(n, l, b, step, i);
            }
            if (out[i] != sum * inv) {
              report("bucket %zu (%s) step %d [%zu] = %g, want %g", b,
                     buckets[b]->compressor().c_str(), step, i, out[i], sum * inv);
            }
          }
          continue;
        }
        const std::string& name = buckets[b]->compressor();
        if (!have[b]) {
          report("bucket %zu (%s) step %d: no exchange stats for this step from the daemon", b,
                 name.c_str(), step);
          continue;
        }
        const spex::v1::ExchangeStats& st = stats[b];
        if (st.pattern() == "D" && o.pattern != "D") {
          if (st.fell_back_to_dense()) {
            report(
                "bucket %zu (%s) step %d was exchanged dense (dense-fallback probe): --verify of "
                "sparse "
                "compressors needs spexd --dense_fallback=off",
                b, name.c_str(), step);
            continue;
          }
          if (step != 0) {
            report("bucket %zu (%s) step %d exchanged dense after sparse steps", b, name.c_str(),
                   step);
            continue;
          }
          // Below spexd's --min_sparse_elements: always dense; replay it as such.
          spex::CompressorSpec spec;
          spec.name = "dense";
          spec.elements = buckets[b]->elements();
          auto dense = spex::ReferenceCluster::Create(spec, nodes, local, true, prims.get());
          if (!dense.ok()) {
            report("bucket %zu dense oracle: %s", b, dense.status().ToString().c_str());
            continue;
          }
          o.cluster = std::move(*dense);
          o.pattern = "D";
        } else if (st.pattern() != o.pattern) {
          report("bucket %zu (%s) step %d: the daemon reports pattern %s, the oracle runs %s", b,
                 name.c_str(), step, st.pattern().c_str(), o.pattern.c_str());
          continue;
        }
        const size_t n = buckets[b]->elements();
        all_inputs.resize(static_cast<size_t>(nodes) * local * n);
        std::vector<std::vector<const float*>> ptrs(nodes);
        for (uint32_t r = 0; r < nodes; ++r) {
          for (uint32_t t = 0; t < local; ++t) {
            float* p = all_inputs.data() + (static_cast<size_t>(r) * local + t) * n;
            for (size_t i = 0; i < n; ++i) p[i] = GradValue(r, t, b, step, i);
            ptrs[r].push_back(p);
          }
        }
        want.resize(n);
        if (absl::Status s = o.cluster->Step(step, ptrs, want.data()); !s.ok()) {
          report("bucket %zu (%s) step %d: oracle: %s", b, name.c_str(), step,
                 s.ToString().c_str());
          continue;
        }
        float max_abs = 0;
        for (float w : want) max_abs = std::max(max_abs, std::abs(w));
        size_t wrong = 0, first = n;
        for (size_t i = 0; i < n; ++i) {
          if (!(std::abs(out[i] - want[i]) <= 1e-6f * (std::abs(want[i]) + max_abs))) {
            if (wrong++ == 0) first = i;
          }
        }
        if (wrong) {
          report(
              "bucket %zu (%s) step %d: %zu of %zu elements differ from the oracle, first [%zu] = "
              "%.9g, want %.9g",
              b, name.c_str(), step, wrong, n, first, out[first], want[first]);
        }
        if (o.pattern == "D") continue;
        const std::vector<float>& res = o.cluster->residual(static_cast<int>(node));
        o.residual_norm.push_back(std::sqrt(prims->Moments(res.data(), n, -1.0f).sum_sq));
        // A norm of exactly 0 means "not computed" (--residual_norm_every=0) unless the oracle's is
        // 0 too.
        const uint64_t at = st.residual_norm_step();
        if (at < o.residual_norm.size() && (st.residual_norm() != 0 || o.residual_norm[at] == 0)) {
          const double w = o.residual_norm[at];
          ++norm_checks;
          if (!(std::abs(st.residual_norm() - w) <= 1e-5 * (1e-9 + w))) {
            report("bucket %zu (%s) step %d: residual norm (of step %llu) %.9g, the oracle's %.9g",
                   b, name.c_str(), step, static_cast<unsigned long long>(at), st.residual_norm(),
                   w);
          }
        }
      }
    }
    if (!quiet) {
      std::printf("node %u trainer %u step %d: %zu buckets exchanged in %.3f ms\n", node, me, step,
                  buckets.size(), ms);
      std::fflush(stdout);
    }
  }
  std::string verdict;
  if (verify && mismatches) {
    verdict = " VERIFY FAILED";
  } else if (verify && oracle_buckets == 0) {
    verdict = " verified exact";
  } else if (verify) {
    verdict = " verified: " + std::to_string(exact_buckets) + " dense buckets exact, " +
              std::to_string(oracle_buckets) + " sparse buckets against the oracle, " +
              std::to_string(norm_checks) + " residual norms";
  }
  std::printf("node %u trainer %u: %d steps, exchange p50 %.3f ms p99 %.3f ms%s\n", node, me, steps,
              Percentile(step_ms, 0.5), Percentile(step_ms, 0.99), verdict.c_str());
  if (mismatches) {
    std::fprintf(stderr, "spex_trainer[node %u trainer %u]: %zu verification failures\n", node, me,
                 mismatches);
    return 1;
  }
  return 0;
}
