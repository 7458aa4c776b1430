// The merging seam (docs/design.md#seams): the Merger decides which ready buckets are fused into
// one exchange. The engine hands it the buckets every local trainer registered, in the canonical
// order (ascending next step, then bucket id: the same on every node), and exchanges the group it
// returns. Implementations:
//   none      one bucket per exchange (the first candidate).
// Planned (refused with a clear error until implemented): fixed (Horovod-style tensor fusion),
// omgs, rgmerge.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace spex {

struct MergeCandidate {
  uint64_t bucket_id = 0;
  uint64_t step = 0;  // the bucket's next step
  uint64_t elements = 0;
  bool ready = false;  // every local trainer has signalled this step
};

class Merger {
 public:
  virtual ~Merger() = default;
  virtual const char* name() const = 0;
  // Candidates in canonical order (non-empty). Returns how many of the first candidates form
  // the next exchange (>= 1). The engine runs the group once all of its buckets are ready; the
  // choice may depend only on what every node sees alike (ids, steps, sizes), never on `ready`
  // timing, or the nodes would disagree.
  virtual size_t NextGroup(absl::Span<const MergeCandidate> candidates) = 0;
};

// --merger. Only kNone is implemented; the others are refused by MakeMerger (Unimplemented).
enum class MergerPolicy { kNone, kFixed, kOmgs, kRgmerge };
bool AbslParseFlag(absl::string_view text, MergerPolicy* out, std::string* error);
std::string AbslUnparseFlag(MergerPolicy v);

// The policy's merger; Unimplemented naming the one that exists for the planned ones.
absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy);
// By name (the flag spelling); InvalidArgument naming the accepted names for an unknown one.
absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(const std::string& name);

}  // namespace spex
