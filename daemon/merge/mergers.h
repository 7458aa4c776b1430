// The mergers of docs/merging.md 3-5, as objects behind the Merger seam (merger.h): their options
// and factories, each defined in its policy's file (fixed_merger.cc, omgs_merger.cc with
// omgs_mgs_merger.cc, rgmerge_ready_merger.cc, rgmerge_model_merger.cc). They are tested on their
// own (tests/daemon/merger_test) and run by the engine (--merger, MakeMerger(policy,
// MergeParams); tests/daemon/merge_engine_test).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/merge/merger.h"

namespace spex {

// `fixed`: Horovod tensor fusion (docs/merging.md 3), an agreed merger. Defaults: Horovod's
// older pair, 64 MiB / 5 ms (Horovod >= 0.21 uses 128 MiB / 1 ms).
struct FixedOptions {
  uint64_t threshold_bytes = uint64_t{64} << 20;  // --fixed_threshold_bytes; 0 = no fusion
  int64_t cycle_ms = 5;                           // --fixed_cycle_ms
  GroupLimits limits;
};
absl::StatusOr<std::unique_ptr<Merger>> MakeFixedMerger(const FixedOptions& options);

// `omgs` (docs/merging.md 4), a static plan: threshold and count here; mgs (4.3) measures first
// and plans with daemon/merge/mgs_plan.h.
struct OmgsOptions {
  OmgsMode mode = OmgsMode::kThreshold;  // --omgs_mode
  uint64_t threshold_elements = 8192;    // --omgs_threshold_elements
  uint64_t count = 10;                   // --omgs_count
  bool select_behind = true;             // --omgs_select=behind (OMGS's own placement)
  uint64_t plan_step = 22;               // mgs: --merge_plan_step
  int64_t alpha_ns = 0;                  // mgs: --merge_alpha_us (0: measured)
  GroupLimits limits;
};
absl::StatusOr<std::unique_ptr<Merger>> MakeOmgsMerger(const OmgsOptions& options);

// `rgmerge`. --rgmerge_plan=ready (docs/merging.md 5.1), an agreed merger: offer the ready prefix
// (at once, or after a short linger with --rgmerge_linger=auto), pack greedily under
// max_group_elements. --rgmerge_plan=model (5.2): runs as `ready` while it measures (per bucket the
// backward gap g_b from the trainers' ready stamps and the Select time sigma_b, medians of the last
// 16 steps; alpha and beta from a least-squares fit of the packs' wire time against the bytes this
// node received, SAFusion's 3.78 ms and 1 ns/B while no fit exists); at the first group of step
// plan_step every node agrees on the inputs (their maximum over nodes), computes RgmergeModelPlan
// from them and, from the next step on, runs that plan as a static one (ConfigHash() then covers
// the plan).
struct RgmergeOptions {
  GroupLimits limits;
  bool model = false;          // --rgmerge_plan=model
  uint64_t plan_step = 22;     // --merge_plan_step: S_plan (default 2 * probe_steps + 16)
  int64_t slack_ns = 0;        // --rgmerge_slack_us, in ns
  bool equal_tail = true;      // --rgmerge_equal_tail
  bool select_behind = false;  // --rgmerge_select=behind: the plan's groups (model only)
  int64_t alpha_ns = 0;        // --merge_alpha_us: a fixed start-up (0: measured)
  // --rgmerge_linger=auto (docs/merging.md 5.1; with model, while it runs as ready): when the
  // engine has been idle for at least alpha and the next bucket of the head's step is expected
  // within alpha (its predecessor's ready stamp plus its backward gap, an EWMA of this node's
  // gaps), offer nothing and wait for it until that arrival plus a tenth of the gap, at most
  // linger_max_ns in all per head. alpha: --merge_alpha_us, else a least-squares fit of this
  // node's packs' wire time against their bytes, SAFusion's 3.78 ms before one exists. Local
  // only: nodes may differ, and the group round still takes the minimum offer.
  bool linger_auto = false;
  int64_t linger_max_ns = 2000000;  // --rgmerge_linger_max_us, in ns
  // --rgmerge_bind=late (with --merge_overlap; with model, while it runs as ready): while a pack
  // is on the wire, offer nothing until the moment a round started now would end its local work
  // (round, local reduce, selection) as that pack's wire half ends, so each group takes what
  // became ready while the previous one was on the wire (docs/merging.md 5.1) instead of what
  // was ready when it was handed over. Both times are estimated from least-squares lines over
  // this node's newest 32 packs (local time and wire time against elements); with fewer than 4
  // of each, or once the estimate has passed, it offers at once. A wire that ends rings the
  // doorbell, so it never waits past the wire. Local only: nodes may differ.
  bool bind_late = false;
};
absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeReadyMerger(const RgmergeOptions& options);
// Either plan, by options.model.
absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeMerger(const RgmergeOptions& options);

}  // namespace spex
