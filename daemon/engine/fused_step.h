// The fused exchange of a merge group with selection ahead (issue 14): every member is
// reduced locally and, for a sparse member, selected by its own compressor from its own
// accumulator with its own k, exactly as the unmerged step does; only the transport is fused:
// at most one dense (D), one pattern-A and one pattern-B sub-exchange per group, always in that
// order, each over the members' concatenated (offset) index spaces. The results are split back
// per member, and residuals and the compressor's Update stay per member.
//
//   D  one AllReduceScaled over a host staging buffer holding the members' contributions back to
//      back (each exactly what DenseStep would send), then each slice copied to its output.
//   A  one AllGatherV of the members' index-only wire chunks (one per member, group_id = its
//      bucket id, in group order), the union per member, every member's acc at its union
//      concatenated into one float AllReduce (SUM), split, scaled, scatter-added.
//   B  one AllGatherV of the members' (index, value) wire chunks, one per member in group order;
//      every chunk of every node validated before anything is written, then per member the
//      scaled values scatter-added in node order.
//
// Equality with the unmerged exchange (DenseStep / SparseStep per bucket): selections, the
// gathered indices, the counts handed to Update, residuals and the sparse outputs are the same
// bit for bit on any Collective whose all-gather returns every node's bytes (all do): every
// element goes through the same operations in the same order. The dense outputs and A's summed
// values come from all-reduces over a longer message than the unmerged ones; they are the same
// bit for bit when the collective's per-element summation order does not depend on the message
// length, as InProcessCollective's (rank order) does; with MPI that order is the
// implementation's, so results can differ in the last bits there (exactly summable data, e.g.
// dyadic, matches anyway).
//
// The local reduce ran before the step (step.h: StepItem::status; the engine's before the group
// round), and a failure of it comes in as the item's status, as in DenseStep / SparseStep. B
// members go through the all-gather: a member whose bucket uses Ok-Topk (SparseState::oktopk) is
// refused.
//
// Lockstep: kinds are agreed by the group round, so every node issues the same sub-exchanges.
// A local failure of one member (a failing Select, a bucket on a device) still takes part in
// every collective with an empty or zero contribution and is recorded in that member's status;
// a malformed peer chunk is seen alike by every node, which all fail that sub-exchange's members
// with DATA_LOSS before its next collective. The engine's commit vote then fails the group
// everywhere alike.
//
// Tested as a step (tests/daemon/fused_step_test) and called by the engine for every packed
// group with --merger other than `none` (Engine::ProcessGroup; tests/daemon/merge_engine_test).
// Host-memory buckets only: a member on a device fails with Unimplemented (in lockstep; the
// engine refuses a merger with device buckets at Start). Selection behind: FusedBehindStep in
// fused_behind_step.h (the engine runs it for static plan groups with --omgs_select /
// --rgmerge_select=behind).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/engine/step.h"
#include "daemon/merge/merger.h"

namespace spex {

// Host buffers of the fused exchange, kept between calls so a steady state does not allocate
// (one per engine; engine thread only).
struct FusedScratch {
  std::vector<float> staging;  // D: the members' contributions back to back
  std::vector<uint8_t> send;   // A or B: this node's chunks
  std::vector<uint8_t> recv;   // A or B: every node's chunks
  std::vector<size_t> bytes;   // A or B: every node's byte count
  std::vector<float> values;   // A: the members' acc at their unions, back to back
};

// The fused exchange of `group` (in group order). kinds[i] is member i's kind at this step,
// identical on every node: D for a dense bucket or a sparse bucket exchanged densely this step
// (its residual is sent and cleared, as DenseStep does), A or B for a sparse bucket whose
// compressor has that pattern. A probing (P) member, a size mismatch between `group` and `kinds`,
// members at different steps, an A/B member without that compressor or one using Ok-Topk fails
// every member with InvalidArgument before any collective (agreed inputs: every node fails
// alike). Each member's record and status are
// filled as DenseStep / SparseStep fill them.
void FusedStep(const StepEnv& env, absl::Span<StepItem> group, absl::Span<const MergeKind> kinds,
               FusedScratch* scratch, const Lap& lap);

// FusedStep in its two halves, for the engine's overlap of one group's collectives with the
// next group's local work (--merge_overlap): Prepare is the local half (the static checks, every
// sparse member's reduce and Select, the dense members' contributions into the staging buffer;
// no collective), Exchange the wire half (the sub-exchanges' collectives, the split back,
// residual updates, Update, records). FusedStep(...) is Prepare then Exchange. Between the two,
// `group`'s items, their buckets and `scratch` must stay untouched by anyone else; Exchange may
// run on another thread, and its env.coll may be another collective over the same nodes (the
// engine's wire collective), as long as every node issues the same collectives on each in the
// same order. Exchange without a Prepare since the last Exchange does nothing.
class FusedExchange {
 public:
  FusedExchange();
  ~FusedExchange();
  FusedExchange(const FusedExchange&) = delete;
  FusedExchange& operator=(const FusedExchange&) = delete;

  void Prepare(const StepEnv& env, absl::Span<StepItem> group, absl::Span<const MergeKind> kinds,
               FusedScratch* scratch, const Lap& lap);
  void Exchange(const StepEnv& env, const Lap& lap);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace spex
