// The Compressor base: argument and shape checks around every compressor's DoSelect/DoUpdate.
#include "kernels/compressor.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/compressors/state_blob.h"

namespace spex {

const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kIndexUnion:
      return "A";
    case Pattern::kSparseGather:
      return "B";
    case Pattern::kDense:
      return "D";
  }
  return "?";
}

Compressor::Compressor(const CompressorSpec& spec, Primitives* prims)
    : prims_(prims),
      name_(spec.name),
      node_rank_(spec.node_rank),
      node_count_(spec.node_count),
      n_(spec.elements),
      density_(spec.density) {}

absl::Status Compressor::SetDensity(double density) {
  if (!(density > 0 && density <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": density must be in (0, 1], got ", density));
  }
  density_ = density;
  return absl::OkStatus();
}

namespace {
StepContext Context(uint64_t step, uint64_t call, int rank, int count, size_t n, double density) {
  StepContext c;
  c.step = step;
  c.call = call;
  c.node_rank = rank;
  c.node_count = count;
  c.n = n;
  c.density = density;
  const double k = std::floor(density * static_cast<double>(n));
  c.k = k < 1 ? 1 : static_cast<size_t>(k);
  if (c.k > n) c.k = n;
  return c;
}
}  // namespace

absl::Status Compressor::Select(uint64_t step, float* acc, const float* add, bool zero_selected,
                                Selection* out) {
  if (acc == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": Select needs acc and out"));
  }
  if (zero_selected && pattern() == Pattern::kIndexUnion) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_,
        " uses pattern A: the caller zeroes acc at the gathered union after the exchange, "
        "so Select must be called with zero_selected = false"));
  }
  out->idx.clear();
  out->val.clear();
  out->all = false;
  for (float& s : out->scalars) s = 0;
  const StepContext ctx = Context(step, calls_, node_rank_, node_count_, n_, density_);
  absl::Status s = DoSelect(ctx, acc, add, zero_selected, out);
  ++calls_;
  return s;
}

absl::Status Compressor::Update(uint64_t step, const Gathered& g) {
  if (g.counts.size() != static_cast<size_t>(node_count_)) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": Update got ", g.counts.size(),
                                                   " counts for ", node_count_, " nodes"));
  }
  uint64_t total = 0;
  for (size_t r = 0; r < g.counts.size(); ++r) {
    if (g.counts[r] > n_) {  // also keeps the sum from wrapping (found by compressor_fuzz)
      return absl::InvalidArgumentError(absl::StrCat(name_, ": Update got count ", g.counts[r],
                                                     " for node ", r, ", more than the ", n_,
                                                     " elements"));
    }
    total += g.counts[r];
  }
  switch (pattern()) {
    case Pattern::kSparseGather:
      if (g.reduced) {
        if (g.indices.size() > total) {
          return absl::InvalidArgumentError(absl::StrCat(name_, ": the reduced entries are ",
                                                         g.indices.size(),
                                                         ", more than the counts' sum ", total));
        }
        for (size_t i = 1; i < g.indices.size(); ++i) {
          if (g.indices[i] <= g.indices[i - 1]) {
            return absl::InvalidArgumentError(absl::StrCat(
                name_, ": the reduced entries must be sorted and unique (position ", i, ")"));
          }
        }
      } else if (g.indices.size() != total) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": Update got ", g.indices.size(),
                                                       " indices but the counts sum to ", total));
      }
      break;
    case Pattern::kIndexUnion:
      if (g.indices.size() > total) {
        return absl::InvalidArgumentError(absl::StrCat(name_, ": the union has ", g.indices.size(),
                                                       " indices, more than the counts' sum ",
                                                       total));
      }
      for (size_t i = 1; i < g.indices.size(); ++i) {
        if (g.indices[i] <= g.indices[i - 1]) {
          return absl::InvalidArgumentError(
              absl::StrCat(name_, ": the union must be sorted and unique (position ", i, ")"));
        }
      }
      break;
    case Pattern::kDense:
      break;
  }
  for (size_t i = 0; i < g.indices.size(); ++i) {
    if (g.indices[i] >= n_) {
      return absl::InvalidArgumentError(absl::StrCat(name_, ": gathered index ", g.indices[i],
                                                     " is out of range for ", n_, " elements"));
    }
  }
  // The context of the step that was exchanged (call - 1 is the Select that produced it).
  const StepContext ctx =
      Context(step, calls_ == 0 ? 0 : calls_ - 1, node_rank_, node_count_, n_, density_);
  return DoUpdate(ctx, g);
}

namespace {
constexpr uint32_t kStateMagic = 0x53585053;  // "SPXS"
constexpr uint16_t kStateVersion = 1;
constexpr uint64_t kMaxStateCalls = uint64_t{1} << 48;

absl::Status NotSupported(const std::string& name) {
  return absl::UnimplementedError(
      absl::StrCat("checkpointing is not supported for ", name,
                   " (its controller state is not saved); restart it fresh instead"));
}
}  // namespace

absl::StatusOr<std::string> Compressor::SaveState() const {
  StateWriter own;
  if (!SaveOwnState(&own)) return NotSupported(name_);
  StateWriter w;
  w.Put<uint32_t>(kStateMagic);
  w.Put<uint16_t>(kStateVersion);
  w.PutString(name_);
  w.Put<uint64_t>(n_);
  w.Put<int32_t>(node_count_);
  w.Put<int32_t>(node_rank_);
  w.Put<double>(density_);
  w.Put<uint64_t>(calls_);
  w.PutString(own.bytes());
  w.Seal();
  return std::move(w.bytes());
}

absl::Status Compressor::LoadState(absl::string_view blob) {
  if (!SupportsState()) return NotSupported(name_);
  const std::string what = absl::StrCat(name_, " state: ");
  if (blob.size() < 8 + 6) {
    return absl::DataLossError(absl::StrCat(what, "truncated (", blob.size(), " bytes)"));
  }
  const absl::string_view body = SealedBody(blob);
  StateReader r(body);
  uint32_t magic = 0;
  uint16_t version = 0;
  r.Get(&magic);
  r.Get(&version);
  if (magic != kStateMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, "not a compressor state blob (bad magic)"));
  }
  if (version != kStateVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "saved in format version ", version, "; this build reads version ", kStateVersion));
  }
  if (!SealIntact(blob)) {
    return absl::DataLossError(
        absl::StrCat(what, "checksum mismatch: the blob is corrupt or truncated"));
  }
  std::string name, own;
  uint64_t n = 0, calls = 0;
  int32_t count = 0, rank = 0;
  double density = 0;
  r.GetString(&name, 256);
  r.Get(&n);
  r.Get(&count);
  r.Get(&rank);
  r.Get(&density);
  r.Get(&calls);
  r.GetString(&own, body.size());
  if (!r.ok() || r.left() != 0) {
    return absl::DataLossError(absl::StrCat(what, "malformed header"));
  }
  if (name != name_) {
    return absl::FailedPreconditionError(absl::StrCat(what, "the checkpoint is of compressor '",
                                                      name, "'; register the bucket with it"));
  }
  if (n != n_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, "the checkpoint is of a ", n, "-element bucket, this one has ", n_, " elements"));
  }
  if (count != node_count_ || rank != node_rank_) {
    return absl::FailedPreconditionError(absl::StrCat(what, "the checkpoint was saved by node ",
                                                      rank, " of ", count, ", this is node ",
                                                      node_rank_, " of ", node_count_));
  }
  if (!(density > 0 && density <= 1)) {
    return absl::DataLossError(absl::StrCat(what, "density ", density, " out of (0, 1]"));
  }
  // One call a step: no run reaches 2^48 (a checkpoint's step has the same bound).
  if (calls > kMaxStateCalls) {
    return absl::DataLossError(absl::StrCat(what, "call count ", calls, " beyond ", kMaxStateCalls,
                                            " (corrupt or forged)"));
  }
  StateReader own_reader(own);
  if (!LoadOwnState(own_reader) || !own_reader.ok() || own_reader.left() != 0) {
    return absl::DataLossError(absl::StrCat(what, "malformed compressor fields"));
  }
  density_ = density;
  calls_ = calls;
  return absl::OkStatus();
}

}  // namespace spex
