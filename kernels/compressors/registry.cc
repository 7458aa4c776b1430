// The compressor registry: name -> pattern and factory, spec validation, MakeCompressor.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/compressor.h"
#include "kernels/compressors/factories.h"

namespace spex {
namespace {

struct Entry {
  const char* name;
  Pattern pattern;
  CompressorFactory make;
};

constexpr Entry kRegistry[] = {
    {"cltk", Pattern::kIndexUnion, MakeCltk},
    {"deft", Pattern::kIndexUnion, MakeDeft},
    {"dense", Pattern::kDense, MakeDense},
    {"dgc", Pattern::kSparseGather, MakeDgc},
    {"exdyna", Pattern::kIndexUnion, MakeExDyna},
    {"gaussiank", Pattern::kSparseGather, MakeGaussianK},
    {"gtopk", Pattern::kSparseGather, MakeGTopK},
    {"micro", Pattern::kIndexUnion, MakeMicro},
    {"randomk", Pattern::kSparseGather, MakeRandomK},
    {"redsync", Pattern::kSparseGather, MakeRedSync},
    {"redsync_trim", Pattern::kSparseGather, MakeRedSyncTrim},
    {"sage", Pattern::kSparseGather, MakeSage},
    {"sidco_e", Pattern::kSparseGather, MakeSidcoE},
    {"sidco_gp", Pattern::kSparseGather, MakeSidcoGP},
    {"sidco_p", Pattern::kSparseGather, MakeSidcoP},
    {"thresh", Pattern::kIndexUnion, MakeThresh},
    {"topk", Pattern::kSparseGather, MakeTopK},
    {"topk_union", Pattern::kIndexUnion, MakeTopKUnion},
};

const Entry* Find(const std::string& name) {
  for (const Entry& e : kRegistry) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

absl::Status UnknownName(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat("unknown compressor '", name,
                                                 "'; accepted: ", absl::StrJoin(CompressorNames(), ", ")));
}

}  // namespace

std::vector<std::string> CompressorNames() {
  std::vector<std::string> names;
  for (const Entry& e : kRegistry) names.emplace_back(e.name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<Pattern> CompressorPattern(const std::string& name) {
  const Entry* e = Find(name);
  if (e == nullptr) return UnknownName(name);
  return e->pattern;
}

absl::Status ValidateCompressor(const std::string& name, double density,
                                const std::map<std::string, std::string>& params) {
  const Entry* e = Find(name);
  if (e == nullptr) return UnknownName(name);
  if (!(density > 0 && density <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": density must be in (0, 1], got ", density));
  }
  CompressorSpec spec;
  spec.name = name;
  spec.density = density;
  spec.params = params;
  ParamReader r(name, params);
  e->make(spec, nullptr, r);
  return r.Finish();
}

absl::StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorSpec& spec,
                                                           Primitives* prims) {
  if (absl::Status s = ValidateCompressor(spec.name, spec.density, spec.params); !s.ok()) return s;
  if (prims == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": no primitives given"));
  }
  if (prims->device() != Device::kCpu) {
    // Selections, histograms, samples and candidate lists live in host vectors and are handed to
    // the primitives as output buffers; device primitives need device scratch (not done yet).
    return absl::UnimplementedError(absl::StrCat(
        spec.name, ": compressors run on host-memory primitives only (CPU or reference); device "
                   "(CUDA) primitives need device scratch buffers, which are not implemented"));
  }
  if (spec.node_count < 1 || spec.node_rank < 0 || spec.node_rank >= spec.node_count) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": node rank ", spec.node_rank,
                                                   " must be in [0, node count ",
                                                   spec.node_count, ")"));
  }
  if (spec.elements == 0 || spec.elements > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, ": bucket size must be in [1, 2^32] elements, got ", spec.elements));
  }
  ParamReader r(spec.name, spec.params);
  std::unique_ptr<Compressor> c = Find(spec.name)->make(spec, prims, r);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (c == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec.name, ": cannot be built for ", spec.node_count, " nodes and ",
                     spec.elements, " elements"));
  }
  return c;
}

}  // namespace spex
