// What the policy files of daemon/merge/ share (not part of the seam): the configuration hash
// over named words, the group limits' validation, greedy packing, and the two factories that a
// public factory of mergers.h dispatches to (omgs's mgs mode, rgmerge's model plan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/merge/merger.h"
#include "daemon/merge/mergers.h"

namespace spex {

// FNV-1a over `name` and then every word (a merger's ConfigHash()).
uint64_t HashWords(const char* name, std::initializer_list<uint64_t> words);

// InvalidArgument naming --max_group_elements or --merge_window when a limit is out of range.
absl::Status CheckLimits(const GroupLimits& limits);

// Greedy from the front: a new group starts where `fits(sum so far, next member's elements)`
// says the next member would not fit, or where ClampGroup (step, P, max_group_elements) cuts.
template <typename Fits>
std::vector<size_t> GreedyPack(absl::Span<const MergeCandidate> c, const GroupLimits& limits,
                               Fits fits) {
  std::vector<size_t> groups;
  size_t i = 0;
  while (i < c.size()) {
    const size_t legal = ClampGroup(c.subspan(i), c.size() - i, limits);
    uint64_t sum = c[i].elements;
    size_t n = 1;
    while (n < legal && fits(sum, c[i + n].elements)) {
      sum += c[i + n].elements;
      ++n;
    }
    groups.push_back(n);
    i += n;
  }
  return groups;
}

// omgs --omgs_mode=mgs (omgs_mgs_merger.cc), for options MakeOmgsMerger validated.
std::unique_ptr<Merger> NewOmgsMgsMerger(const OmgsOptions& options);
// rgmerge --rgmerge_plan=model (rgmerge_model_merger.cc) over `ready`, the ready merger of the
// same options (MakeRgmergeReadyMerger) it runs as until its plan takes effect.
std::unique_ptr<Merger> NewRgmergeModelMerger(const RgmergeOptions& options,
                                              std::unique_ptr<Merger> ready);

}  // namespace spex
