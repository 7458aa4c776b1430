// The index section of sparse wire chunks (daemon/engine/wire.h, docs/algorithms.md#wire): bytes
// per selected index and encode / decode time of the delta form (varint gaps) against uint32
// indices, for ascending index sets at several densities: uniform (every position kept with
// probability d), clustered (runs of neighbours, as row-wise selections give), and real (the top
// d x n magnitudes of a recorded gradient, bench/make_grad_trace.py, when --trace is given).
// Times are of EncodeIndexChunk and DecodeIndexChunk (the pattern A chunk), median of --reps.
// Writes one JSON object (stdout, or --out).
//
//   bazel build -c opt //bench:wire_index_bench
//   bazel-bin/bench/wire_index_bench --elements=10270000 --densities=0.1,0.01,0.001 \
//       [--trace=/tmp/spex_grad_trace.bin] [--out=bench/results/wire_index.json]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_util.h"
#include "daemon/engine/wire.h"
#include "kernels/half.h"

namespace spex {
namespace {

struct Options {
  uint64_t elements = 10270000;  // the MLP's bucket in the main job
  std::vector<double> densities = {0.1, 0.01, 0.001};
  int reps = 15;
  std::string trace;
  std::string out;
};

std::vector<uint32_t> Uniform(uint64_t n, double d, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::geometric_distribution<uint64_t> gap(d);  // positions skipped before the next kept one
  std::vector<uint32_t> idx;
  for (uint64_t i = gap(gen); i < n; i += 1 + gap(gen)) idx.push_back(static_cast<uint32_t>(i));
  return idx;
}

// Runs of mean length 16 with gaps of 0 or 1 inside (3 of 4 neighbours kept), the runs placed
// with geometric spacing so that the density is about d.
std::vector<uint32_t> Clustered(uint64_t n, double d, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::geometric_distribution<uint64_t> run_len(1.0 / 16);
  std::bernoulli_distribution skip(0.25);
  const double per_run = 16 * 1.25;  // positions a run spans
  std::geometric_distribution<uint64_t> between(std::min(1.0, d * per_run / 16));
  std::vector<uint32_t> idx;
  uint64_t i = between(gen);
  while (i < n) {
    const uint64_t len = 1 + run_len(gen);
    for (uint64_t j = 0; j < len && i < n; ++j) {
      idx.push_back(static_cast<uint32_t>(i));
      i += 1 + (skip(gen) ? 1 : 0);
    }
    i += between(gen) * 16;
  }
  return idx;
}

// The top d x params magnitudes of worker 0's gradient at the trace's last step, ascending.
bool Real(const std::string& path, double d, std::vector<uint32_t>* idx, uint64_t* params) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[8];
  uint32_t version, workers, steps, dtype;
  uint64_t n, header;
  bool ok = std::fread(magic, 1, 8, f) == 8 && std::memcmp(magic, "SPXGRAD1", 8) == 0 &&
            std::fread(&version, 4, 1, f) == 1 && std::fread(&workers, 4, 1, f) == 1 &&
            std::fread(&steps, 4, 1, f) == 1 && std::fread(&dtype, 4, 1, f) == 1 &&
            std::fread(&n, 8, 1, f) == 1 && std::fread(&header, 8, 1, f) == 1 && dtype == 1 &&
            steps > 0 && workers > 0;
  std::vector<uint16_t> g(ok ? n : 0);
  if (ok) {
    const uint64_t record = 4 + 2 * n;
    ok = std::fseek(f, static_cast<long>(header + record * (uint64_t{steps - 1} * workers) + 4),
                    SEEK_SET) == 0 &&
         std::fread(g.data(), 2, n, f) == n;
  }
  std::fclose(f);
  if (!ok) return false;
  std::vector<float> mag(n);
  for (uint64_t i = 0; i < n; ++i) mag[i] = std::abs(HalfToFloat(DType::kFloat16, g[i]));
  const uint64_t k = std::max<uint64_t>(1, static_cast<uint64_t>(d * n));
  std::vector<uint32_t> order(n);
  for (uint64_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  std::nth_element(
      order.begin(), order.begin() + (k - 1), order.end(),
      [&](uint32_t a, uint32_t b) { return mag[a] > mag[b] || (mag[a] == mag[b] && a < b); });
  idx->assign(order.begin(), order.begin() + k);
  std::sort(idx->begin(), idx->end());
  *params = n;
  return true;
}

template <typename F>
double MedianNs(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
  }
  return bench::Median(t);
}

std::string Measure(const std::string& kind, double d, uint64_t n, const std::vector<uint32_t>& idx,
                    int reps) {
  const size_t k = idx.size();
  std::string row = absl::StrCat("{\"set\": \"", kind, "\", \"density\": ", d,
                                 ", \"elements\": ", n, ", \"count\": ", k);
  double ns[2][2];  // [u32, delta][encode, decode]
  size_t bytes[2];
  uint64_t sink = 0;
  for (int e = 0; e < 2; ++e) {
    const IndexEncoding enc = e == 0 ? IndexEncoding::kU32 : IndexEncoding::kDelta;
    std::vector<uint8_t> buf;
    buf.reserve(48 + 4 * k + 8);
    ns[e][0] = MedianNs(reps, [&] {
      buf.clear();
      EncodeIndexChunk(1, 2, static_cast<uint32_t>(n), idx, nullptr, &buf, enc);
    });
    bytes[e] = buf.size();
    // At an odd offset the uint32 form is copied too (a chunk after a float16 one): time both
    // forms where the indices are used in place (aligned), the common case.
    ns[e][1] = MedianNs(reps, [&] {
      auto d2 = DecodeIndexChunk(buf.data(), buf.size(), 1, 2, static_cast<uint32_t>(n), 0);
      if (!d2.ok()) {
        std::fprintf(stderr, "%s\n", d2.status().ToString().c_str());
        std::exit(1);
      }
      sink += d2->idx[d2->header.count / 2];
    });
  }
  if (sink == 1) std::fprintf(stderr, " ");
  auto per = [&](double v) { return k ? v / k : 0.0; };
  absl::StrAppend(
      &row, ", \"u32_bytes\": ", bytes[0], ", \"delta_bytes\": ", bytes[1],
      ", \"u32_bytes_per_index\": ", per(bytes[0] - 48.0),
      ", \"delta_bytes_per_index\": ", per(bytes[1] - 48.0),
      ", \"chunk_bytes_ratio\": ", static_cast<double>(bytes[1]) / bytes[0],
      ", \"u32_encode_ns_per_index\": ", per(ns[0][0]),
      ", \"delta_encode_ns_per_index\": ", per(ns[1][0]),
      ", \"u32_decode_ns_per_index\": ", per(ns[0][1]),
      ", \"delta_decode_ns_per_index\": ", per(ns[1][1]), ", \"delta_encode_ms\": ", ns[1][0] / 1e6,
      ", \"delta_decode_ms\": ", ns[1][1] / 1e6, ", \"encode_time_ratio\": ", ns[1][0] / ns[0][0],
      ", \"decode_time_ratio\": ", ns[1][1] / ns[0][1], "}");
  std::fprintf(stderr,
               "%-9s d=%-6g count %-8zu bytes/index u32 %.3f delta %.3f  encode ns/index "
               "u32 %.3f delta %.3f  decode ns/index u32 %.3f delta %.3f\n",
               kind.c_str(), d, k, per(bytes[0] - 48.0), per(bytes[1] - 48.0), per(ns[0][0]),
               per(ns[1][0]), per(ns[0][1]), per(ns[1][1]));
  return row;
}

int Main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t len = std::strlen(key);
      return s.compare(0, len, key) == 0 ? s.c_str() + len : nullptr;
    };
    if (const char* v = val("--elements=")) {
      o.elements = std::strtoull(v, nullptr, 10);
    } else if (const char* v = val("--densities=")) {
      o.densities = bench::FlagList<double>(v);
    } else if (const char* v = val("--reps=")) {
      o.reps = std::atoi(v);
    } else if (const char* v = val("--trace=")) {
      o.trace = v;
    } else if (const char* v = val("--out=")) {
      o.out = v;
    } else {
      std::fprintf(stderr,
                   "wire_index_bench: unknown argument %s (--elements= --densities= "
                   "--reps= --trace= --out=)\n",
                   s.c_str());
      return 2;
    }
  }
  if (o.elements < 2 || o.elements > 0xfffffffeull || o.reps < 1) {
    std::fprintf(stderr, "wire_index_bench: --elements in [2, 2^32-2], --reps >= 1\n");
    return 2;
  }
  std::vector<std::string> rows;
  for (double d : o.densities) {
    rows.push_back(Measure("uniform", d, o.elements, Uniform(o.elements, d, 7), o.reps));
    rows.push_back(Measure("clustered", d, o.elements, Clustered(o.elements, d, 7), o.reps));
    if (!o.trace.empty()) {
      std::vector<uint32_t> idx;
      uint64_t params = 0;
      if (!Real(o.trace, d, &idx, &params)) {
        std::fprintf(stderr, "wire_index_bench: cannot read the trace %s\n", o.trace.c_str());
        return 2;
      }
      rows.push_back(Measure("real_topk", d, params, idx, o.reps));
    }
  }
  std::string json = absl::StrCat("{\"bench\": \"wire_index\", \"reps\": ", o.reps,
                                  ", \"trace\": \"", o.trace, "\", \"rows\": [\n  ");
  for (size_t i = 0; i < rows.size(); ++i) absl::StrAppend(&json, i ? ",\n  " : "", rows[i]);
  absl::StrAppend(&json, "\n]}\n");
  if (o.out.empty()) {
    std::fputs(json.c_str(), stdout);
  } else {
    FILE* f = std::fopen(o.out.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "wire_index_bench: cannot write %s\n", o.out.c_str());
      return 2;
    }
    std::fputs(json.c_str(), f);
    std::fclose(f);
  }
  return 0;
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) { return spex::Main(argc, argv); }
