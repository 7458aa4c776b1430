// A C ABI over spex::ReferenceCluster (kernels/reference_cluster.h), for Python's ctypes:
// bench/scale/virtual_workers.py trains the main job's MLP with P virtual workers in one process
// and sends every step's gradients through the real compressors and error feedback of P
// simulated nodes (docs/scale.md#time-to-accuracy-at-scale). Built as a shared library by
// //bench/scale:reference_cluster_c (cc_binary, linkshared).
//
// Every call that can fail returns 0 on success and -1 on failure, with the message in err
// (NUL-terminated, cut to errlen bytes). Not thread-safe: one caller per handle.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"

namespace {

struct Handle {
  std::unique_ptr<spex::Primitives> prims;
  std::unique_ptr<spex::ReferenceCluster> cluster;
  int nodes = 1;
  int trainers = 1;
  size_t n = 0;
};

int Fail(const std::string& msg, char* err, int errlen) {
  if (err != nullptr && errlen > 0) {
    std::strncpy(err, msg.c_str(), static_cast<size_t>(errlen) - 1);
    err[errlen - 1] = '\0';
  }
  return -1;
}

}  // namespace

extern "C" {

// compressor: a registry name ("micro", "topk", "dense", ...); params: "key=value,key=value" or
// "" (the compressor's typed parameters, as spexd's --param); threads: the CPU primitives'
// workers (spexd --threads; 1 in the main job). Returns a handle or null (err says why).
void* spex_rc_create(const char* compressor, double density, const char* params, uint64_t elements,
                     int nodes, int trainers, int error_feedback, int threads, char* err,
                     int errlen) {
  if (compressor == nullptr || elements == 0) {
    Fail("spex_rc_create: need a compressor name and elements >= 1", err, errlen);
    return nullptr;
  }
  spex::CompressorSpec spec;
  spec.name = compressor;
  spec.density = density;
  spec.elements = elements;
  if (params != nullptr && params[0] != '\0') {
    for (absl::string_view kv : absl::StrSplit(params, ',', absl::SkipEmpty())) {
      std::vector<std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
      if (p.size() != 2) {
        Fail("spex_rc_create: parameter '" + std::string(kv) + "' is not key=value", err, errlen);
        return nullptr;
      }
      spec.params[p[0]] = p[1];
    }
  }
  auto h = std::make_unique<Handle>();
  h->prims = spex::MakeCpuPrimitives(threads);
  auto c =
      spex::ReferenceCluster::Create(spec, nodes, trainers, error_feedback != 0, h->prims.get());
  if (!c.ok()) {
    Fail(std::string(c.status().message()), err, errlen);
    return nullptr;
  }
  h->cluster = std::move(*c);
  h->nodes = nodes;
  h->trainers = trainers;
  h->n = elements;
  return h.release();
}

// One exchange: trainer t of node r reads inputs + (r * trainers + t) * stride (stride in floats,
// >= elements: the rows of a [nodes * trainers, stride] array, of which a bucket may be a column
// slice); out receives the elements averaged floats every trainer reads.
int spex_rc_step(void* handle, uint64_t step, const float* inputs, int64_t stride, float* out,
                 char* err, int errlen) {
  auto* h = static_cast<Handle*>(handle);
  if (h == nullptr || inputs == nullptr || out == nullptr) {
    return Fail("spex_rc_step: null handle, inputs or out", err, errlen);
  }
  if (stride < static_cast<int64_t>(h->n)) {
    return Fail("spex_rc_step: stride " + std::to_string(stride) + " below the bucket's " +
                    std::to_string(h->n) + " elements",
                err, errlen);
  }
  std::vector<std::vector<const float*>> in(h->nodes);
  for (int r = 0; r < h->nodes; ++r) {
    for (int t = 0; t < h->trainers; ++t) {
      in[r].push_back(inputs + static_cast<int64_t>(r * h->trainers + t) * stride);
    }
  }
  absl::Status s = h->cluster->Step(step, in, out);
  if (!s.ok()) return Fail(std::string(s.message()), err, errlen);
  return 0;
}

int spex_rc_set_density(void* handle, double density, char* err, int errlen) {
  auto* h = static_cast<Handle*>(handle);
  if (h == nullptr) return Fail("spex_rc_set_density: null handle", err, errlen);
  absl::Status s = h->cluster->SetDensity(density);
  if (!s.ok()) return Fail(std::string(s.message()), err, errlen);
  return 0;
}

// The last step's elements gathered (A: |union|; B: sum of counts; D: n) and per-node selected
// counts (counts: nodes entries).
uint64_t spex_rc_gathered(void* handle) {
  return static_cast<Handle*>(handle)->cluster->gathered();
}

void spex_rc_counts(void* handle, uint64_t* counts) {
  auto* h = static_cast<Handle*>(handle);
  const std::vector<uint64_t>& c = h->cluster->counts();
  for (size_t i = 0; i < c.size(); ++i) counts[i] = c[i];
}

// Node r's residual (elements floats) into out.
void spex_rc_residual(void* handle, int node, float* out) {
  auto* h = static_cast<Handle*>(handle);
  const std::vector<float>& r = h->cluster->residual(node);
  std::memcpy(out, r.data(), r.size() * sizeof(float));
}

// "A", "B" or "D": the compressor's pattern.
const char* spex_rc_pattern(void* handle) {
  return spex::PatternName(static_cast<Handle*>(handle)->cluster->pattern());
}

void spex_rc_destroy(void* handle) { delete static_cast<Handle*>(handle); }

}  // extern "C"
