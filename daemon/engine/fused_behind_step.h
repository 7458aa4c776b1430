// The fused exchange of a merge group with selection behind (docs/merging.md 2.5; static plans
// only, --omgs_select / --rgmerge_select=behind): the group is exchanged as one bucket of the
// summed size. Its own file beside fused_step.h (selection ahead): it shares no code with the
// ahead path but the step's environment (step.h) and the sparse patterns (sparse_exchange.h).
//
// Tested as a step (tests/daemon/fused_step_test, FusedBehindTest) and run by the engine's wire
// stage for a static plan's pack of one compressor (Engine::BehindFor, Engine::RunPack;
// tests/daemon/merge_engine_test MergeEngineBehind).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/engine/step.h"

namespace spex {

// Selection behind (static plans only): the group is one virtual bucket for one compressor, with
// k = the compressor's count over the sum of the members' sizes. Each step gathers the members'
// residual + local sum (their own acc) into one contiguous accumulator, selects and exchanges it
// as one bucket, and hands each member its slice of the result and of the new residual (back in
// its own acc), so residuals stay with their buckets whatever group a bucket is in next; the
// compressor's own state (a threshold, a momentum) is the group's and starts afresh with a new
// group. A small member in a large group may get no entry at all (the difference to ahead).
struct BehindGroup {
  uint64_t group_id = 0;        // 1 << 63 | the first member's id (the wire's group_id)
  size_t elements = 0;          // the sum of the members' sizes (< 2^32: the wire's field)
  std::vector<uint64_t> ids;    // the members, in plan order
  std::vector<size_t> offsets;  // member i's slice starts here; offsets.back() == elements
  std::vector<float> acc, out;  // host: the group's accumulator (after a step: the residual)
                                // and result
  SparseState sparse;           // one compressor over `elements`
};

// The group state for `members` (ids and sizes, in plan order), with one compressor built from
// `spec` (its `elements` is set here to the sum). InvalidArgument: no members, a sum of 2^32 or
// more, or the compressor's own errors.
absl::StatusOr<std::unique_ptr<BehindGroup>> MakeBehindGroup(
    absl::Span<const BucketData* const> members, CompressorSpec spec, Primitives* prims);

// One exchange of the group, selection behind: each member's residual + local sum (reduced before
// the step, step.h) gathered into the group's accumulator, one Select over
// the whole of it, one exchange by the compressor's pattern (A or B, group_id = g->group_id), the
// residual update and Update on the group, and each member's slice of the result and residual
// copied back into its output and acc. Every item must be the group's member at its position
// (same id and size), at one step, on the host, with an accumulator, and not through Ok-Topk;
// otherwise every item fails with InvalidArgument before any collective. Records: each member's own
// selected and gathered counts and residual norm (of its slice); the group's wire bytes are
// attributed to its first member (one chunk carries them all).
void FusedBehindStep(const StepEnv& env, BehindGroup* g, absl::Span<StepItem> group,
                     const Lap& lap);

}  // namespace spex
