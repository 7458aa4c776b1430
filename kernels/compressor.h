// The Compressor seam (docs/design.md#seams): a gradient compressor (sparsifier) for one bucket or
// merge group. A compressor sees the node's accumulated buffer `acc` (residual + this step's local
// sum), picks what to send, and learns what every node gathered after the exchange. It holds only
// its own state (threshold, partition table, fitted parameters) and does all bulk work through
// Primitives (its selections are host vectors; on device primitives see MakeCompressor). Error
// feedback lives outside, in kernels/error_feedback.h. Algorithms, constants and defaults:
// docs/algorithms.md.
//
// One step on every node, in this order (the engine or ErrorFeedback drives it):
//   1. Select(step, acc, add, zero_selected, &sel)   acc += add (if given), then choose.
//   2. the exchange of sel by the compressor's pattern():
//      kIndexUnion  (A): all-gather of indices; every node then reads ITS OWN acc at the sorted,
//                   deduplicated union U, the values are summed over nodes (all-reduce);
//                   out[U] = sum / (nodes * local trainers). Select must be called with
//                   zero_selected = false; afterwards the CALLER zeroes acc at all of U
//                   (ErrorFeedback::Complete does), so the residual is acc minus what was sent.
//      kSparseGather(B): all-gather of (sel.idx, sel.val) with per-node counts, scatter-add of
//                   every node's pairs. Select with zero_selected = true zeroes acc at sel.idx
//                   itself (in the same pass where it can), which is the whole residual update.
//      kDense       (D): dense all-reduce of acc. sel.all is set; sel.val holds acc (copied);
//                   with zero_selected the compressor clears acc.
//   3. Update(step, gathered): per-node counts and the gathered indices (A: the union, B: every
//      node's indices in node order, or over the Ok-Topk exchange the union written with
//      Gathered::reduced), identical on every node, so controllers (MiCRO's threshold,
//      ExDyna's block allocation, DEFT's bins) advance with no extra communication.
//
// Determinism: the same spec (including `seed`), ranks and inputs give bit-identical selections
// for a given Primitives implementation and thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/primitives.h"

namespace spex {

class StateWriter;  // kernels/compressors/state_blob.h
class StateReader;

// Communication pattern (docs/algorithms.md#patterns).
enum class Pattern { kIndexUnion /*A*/, kSparseGather /*B*/, kDense /*D*/ };
const char* PatternName(Pattern p);  // "A", "B", "D"

// What to build. `params` are compressor-specific, typed and validated by MakeCompressor
// (e.g. {"threshold_control", "histogram"}, {"seed", "7"}).
struct CompressorSpec {
  std::string name;
  double density = 0.001;  // target fraction of elements sent, in (0, 1]
  std::map<std::string, std::string> params;
  int node_rank = 0;    // this node's rank among the daemons
  int node_count = 1;   // number of nodes (daemons), >= 1
  size_t elements = 0;  // bucket size n, 1 .. 2^32
};

// The per-step context a compressor works in (built by Select/Update from the spec, the step
// and the current density).
struct StepContext {
  uint64_t step = 0;  // the engine's step counter for this bucket (same on every node)
  uint64_t call = 0;  // how many Selects this compressor ran before this one (0 = first)
  int node_rank = 0;
  int node_count = 1;
  size_t n = 0;        // bucket size
  double density = 0;  // target density in effect for this step
  size_t k = 0;        // target count of the whole bucket over all nodes' exclusive shares:
                       // max(1, floor(density * n))
};

// One node's choice for one step.
struct Selection {
  std::vector<uint32_t> idx;  // ascending, unique, < n (empty when `all`)
  std::vector<float> val;     // acc at idx, read before any zeroing (pattern D: all of acc)
  bool all = false;           // pattern D: every position is sent
  // Compressor scalars for the wire header (informational), e.g. [0] = threshold used.
  float scalars[4] = {0, 0, 0, 0};
  size_t count() const { return all ? val.size() : idx.size(); }
};

// What every node gathered in one exchange (same on every node).
struct Gathered {
  absl::Span<const uint64_t> counts;   // per-node selected counts, node order (size node_count)
  absl::Span<const uint32_t> indices;  // A: sorted unique union; B: all nodes' idx concatenated
                                       // in node order (sum of counts); D: empty
  // B summed by the Ok-Topk exchange (--sparse_allreduce=oktopk): `indices` are the sorted,
  // unique positions written (at most the sum of counts), not every node's selection. Only
  // compressors whose Update reads neither (OkTopkCompressorNames) are given this.
  bool reduced = false;
};

// A magnitude histogram of acc that the step's local sum may count as it writes acc, saving the
// selection a pass over the range (Compressor::PlanSumHistogram).
struct SumHistogram {
  uint64_t step = 0;     // the step whose Select it is for
  HistogramRange range;  // what to count, into the compressor's own bins (zeroed by the plan)
  bool counted = false;  // set by the sum that counted it, for that step's acc
};

class Compressor {
 public:
  virtual ~Compressor() = default;

  const std::string& name() const { return name_; }
  virtual Pattern pattern() const = 0;
  int node_rank() const { return node_rank_; }
  int node_count() const { return node_count_; }
  size_t elements() const { return n_; }
  double density() const { return density_; }

  // Changes the target density from the next Select on (run-time control, taken at a step
  // boundary on every node at once). InvalidArgument unless 0 < density <= 1.
  absl::Status SetDensity(double density);

  // acc (n floats) += add (n floats) when add is non-null, then selects into *out (its vectors
  // are reused across steps). zero_selected: see the pattern contract above (must be false for
  // pattern A). Errors: null acc, zero_selected with pattern A.
  absl::Status Select(uint64_t step, float* acc, const float* add, bool zero_selected,
                      Selection* out);

  // Before the local sum that writes step `step`'s acc: the histogram that Select(step) would
  // count first, for that sum to count as it writes acc (the engine's CPU path does:
  // Primitives::SumScaledCheckFiniteHistogram), then set `counted`. Null where the compressor
  // has none (the default) or runs on device primitives. Select uses the counts only when
  // `counted` is set for its step and range and it is given no `add`; otherwise it counts as
  // without a plan, so a plan left unused or a step skipped changes nothing.
  virtual SumHistogram* PlanSumHistogram(uint64_t step) { return nullptr; }

  // After the exchange of `step`. Validates the shapes (counts per node, index bounds, union
  // sorted for A, sum of counts for B) before the compressor sees them.
  absl::Status Update(uint64_t step, const Gathered& gathered);

  // Checkpointing: everything this compressor carries from one step to the next (its call
  // count, density and controller state: thresholds, layouts, stage counts) as a versioned
  // byte blob, taken between steps. LoadState on a compressor built from the same spec
  // (name, parameters, elements, node rank and count) makes it continue bit-identically to the
  // one saved. LoadState errors (nothing is changed): a blob of another compressor, bucket
  // size, node count or rank, another version, or a truncated or corrupt blob, each named.
  // Unimplemented "checkpointing is not supported for <name>" where a compressor has no
  // SaveOwnState.
  absl::StatusOr<std::string> SaveState() const;
  absl::Status LoadState(absl::string_view blob);
  bool SupportsState() const { return SaveOwnState(nullptr); }

 protected:
  Compressor(const CompressorSpec& spec, Primitives* prims);

  virtual absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add,
                                bool zero_selected, Selection* out) = 0;
  virtual absl::Status DoUpdate(const StepContext& ctx, const Gathered& gathered) {
    return absl::OkStatus();
  }

  // A compressor's own part of the saved state. SaveOwnState(nullptr) answers whether it is
  // supported (false, the default: not supported); with a writer it appends its fields.
  // LoadOwnState reads them back and returns false on a short or out-of-range blob, changing
  // nothing it has not validated first.
  virtual bool SaveOwnState(StateWriter* w) const { return false; }
  virtual bool LoadOwnState(StateReader& r) { return false; }

  Primitives* prims_;

 private:
  std::string name_;
  int node_rank_;
  int node_count_;
  size_t n_;
  double density_;
  uint64_t calls_ = 0;
};

// Builds a compressor by name. Unknown name, bad density, bad rank/count/elements, an unknown
// parameter or a bad value give InvalidArgument naming what is accepted. Every compressor runs
// on host-memory primitives (CPU or reference); those of DeviceCompressorNames() also on device
// (CUDA) primitives, with their bulk work on the device and their small results (selection,
// histogram, samples) copied back; the others give Unimplemented on device primitives.
absl::StatusOr<std::unique_ptr<Compressor>> MakeCompressor(const CompressorSpec& spec,
                                                           Primitives* prims);

// The registered names that run on device primitives, sorted; whether `name` is one of them.
std::vector<std::string> DeviceCompressorNames();
bool CompressorRunsOnDevice(const std::string& name);

// The registered names that can exchange over the Ok-Topk sparse all-reduce
// (--sparse_allreduce=oktopk, docs/algorithms.md#oktopk), sorted: the pattern-B compressors,
// whose Update reads nothing of the gathered counts and indices, so the owners' counts and the
// reduced union that exchange reports serve as well as every node's selection. Whether `name`
// is one of them.
std::vector<std::string> OkTopkCompressorNames();
bool CompressorCanUseOkTopk(const std::string& name);

// Checks a name, density and parameters without building (for registration-time errors).
absl::Status ValidateCompressor(const std::string& name, double density,
                                const std::map<std::string, std::string>& params);

// Every registered name, sorted.
std::vector<std::string> CompressorNames();

// Pattern of a registered name (InvalidArgument for an unknown one).
absl::StatusOr<Pattern> CompressorPattern(const std::string& name);

}  // namespace spex
