// Grouping logic of the mergers of MERGING.md 3-5.1, as pure objects behind the Merger seam.
// They are tested on their own (tests/daemon/merger_test) and run by the engine (--merger,
// MakeMerger(policy, MergeParams); tests/daemon/merge_engine_test).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "daemon/merge/merger.h"

namespace spex {

// `fixed`: Horovod tensor fusion (MERGING.md 3), an agreed merger. Defaults are the pair of
// ALGORITHMS.md decision 9, 64 MiB / 5 ms (Horovod >= 0.21 uses 128 MiB / 1 ms).
struct FixedOptions {
  uint64_t threshold_bytes = uint64_t{64} << 20;  // --fixed_threshold_bytes; 0 = no fusion
  int64_t cycle_ms = 5;                           // --fixed_cycle_ms
  GroupLimits limits;
};
absl::StatusOr<std::unique_ptr<Merger>> MakeFixedMerger(const FixedOptions& options);

// `omgs` (MERGING.md 4.1, 4.2), a static plan. mgs (4.3) is refused (Unimplemented).
enum class OmgsMode { kThreshold, kCount, kMgs };
struct OmgsOptions {
  OmgsMode mode = OmgsMode::kThreshold;  // --omgs_mode
  uint64_t threshold_elements = 8192;    // --omgs_threshold_elements
  uint64_t count = 10;                   // --omgs_count
  GroupLimits limits;
};
absl::StatusOr<std::unique_ptr<Merger>> MakeOmgsMerger(const OmgsOptions& options);

// `rgmerge --rgmerge_plan=ready` (MERGING.md 5.1, linger off), an agreed merger: offer the ready
// prefix at once, pack greedily under max_group_elements.
struct RgmergeOptions {
  GroupLimits limits;
};
absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeReadyMerger(const RgmergeOptions& options);

}  // namespace spex
