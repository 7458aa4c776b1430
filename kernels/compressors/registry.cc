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
  // Runs on device primitives: its primitive outputs go to device scratch (Scratch in
  // primitives.h, used as compressors/device_scratch.h says), so nothing it hands the primitives is
  // host memory.
  bool device;
  // Can exchange over the Ok-Topk sparse all-reduce (--sparse_allreduce=oktopk): a pattern-B
  // compressor whose Update reads neither the per-node counts nor the per-node indices (none of
  // them overrides DoUpdate), so the owners' counts and the reduced union it gets there instead
  // change nothing. Pattern A sends indices only (its values are read at the union afterwards)
  // and cannot; dense has no selection.
  bool oktopk;
};

constexpr Entry kRegistry[] = {
    {"cltk", Pattern::kIndexUnion, MakeCltk, true, false},
    {"deft", Pattern::kIndexUnion, MakeDeft, true, false},
    {"dense", Pattern::kDense, MakeDense, false, false},
    {"dgc", Pattern::kSparseGather, MakeDgc, true, true},
    {"exdyna", Pattern::kIndexUnion, MakeExDyna, true, false},
    {"gaussiank", Pattern::kSparseGather, MakeGaussianK, true, true},
    {"gtopk", Pattern::kSparseGather, MakeGTopK, true, true},
    {"micro", Pattern::kIndexUnion, MakeMicro, true, false},
    {"randomk", Pattern::kSparseGather, MakeRandomK, true, true},
    {"redsync", Pattern::kSparseGather, MakeRedSync, true, true},
    {"redsync_trim", Pattern::kSparseGather, MakeRedSyncTrim, true, true},
    {"sage", Pattern::kSparseGather, MakeSage, true, true},
    {"sidco_e", Pattern::kSparseGather, MakeSidcoE, true, true},
    {"sidco_gp", Pattern::kSparseGather, MakeSidcoGP, true, true},
    {"sidco_p", Pattern::kSparseGather, MakeSidcoP, true, true},
    {"thresh", Pattern::kIndexUnion, MakeThresh, true, false},
    {"topk", Pattern::kSparseGather, MakeTopK, true, true},
    {"topk_union", Pattern::kIndexUnion, MakeTopKUnion, true, false},
};

const Entry* Find(const std::string& name) {
  for (const Entry& e : kRegistry) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

absl::Status UnknownName(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown compressor '", name, "'; accepted: ", absl::StrJoin(CompressorNames(), ", ")));
}

// The registry's names, sorted; with `flag`, only the entries that have it set.
std::vector<std::string> SortedNames(bool Entry::*flag = nullptr) {
  std::vector<std::string> names;
  for (const Entry& e : kRegistry) {
    if (flag == nullptr || e.*flag) names.emplace_back(e.name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<std::string> DeviceCompressorNames() { return SortedNames(&Entry::device); }

bool CompressorRunsOnDevice(const std::string& name) {
  const Entry* e = Find(name);
  return e != nullptr && e->device;
}

std::vector<std::string> OkTopkCompressorNames() { return SortedNames(&Entry::oktopk); }

bool CompressorCanUseOkTopk(const std::string& name) {
  const Entry* e = Find(name);
  return e != nullptr && e->oktopk;
}

std::vector<std::string> CompressorNames() { return SortedNames(); }

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
  if (prims->device() != Device::kCpu && !Find(spec.name)->device) {
    // Every sparse compressor runs on device scratch; only the dense entry (the engine
    // exchanges dense buckets without a compressor) is not marked for device primitives.
    return absl::UnimplementedError(absl::StrCat(
        spec.name,
        ": does not run on device (CUDA) primitives yet, only on host-memory "
        "primitives (CPU or reference); the compressors that run on device primitives: ",
        absl::StrJoin(DeviceCompressorNames(), ", ")));
  }
  if (spec.node_count < 1 || spec.node_rank < 0 || spec.node_rank >= spec.node_count) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": node rank ", spec.node_rank,
                                                   " must be in [0, node count ", spec.node_count,
                                                   ")"));
  }
  if (spec.elements == 0 || spec.elements > (uint64_t{1} << 32)) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.name, ": bucket size must be in [1, 2^32] elements, got ", spec.elements));
  }
  ParamReader r(spec.name, spec.params);
  std::unique_ptr<Compressor> c = Find(spec.name)->make(spec, prims, r);
  if (absl::Status s = r.Finish(); !s.ok()) return s;
  if (c == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(spec.name, ": cannot be built for ",
                                                   spec.node_count, " nodes and ", spec.elements,
                                                   " elements"));
  }
  return c;
}

}  // namespace spex
