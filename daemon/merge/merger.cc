// The Merger seam's common code (merger.h): the `none` merger, the config hash every node
// compares, the group limits and ready prefix the mergers share, and the --merger flag parsing.
#include "daemon/merge/merger.h"

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

class NoMerger : public Merger {
 public:
  const char* name() const override { return "none"; }
  uint64_t ConfigHash() const override { return Fnv1a(kFnvOffset, "none", 4); }
  size_t NextGroup(absl::Span<const MergeCandidate> candidates) override {
    return candidates.empty() ? 0 : 1;
  }
};

}  // namespace

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

size_t ClampGroup(absl::Span<const MergeCandidate> c, size_t want, const GroupLimits& limits) {
  if (c.empty()) return 0;
  // A probing head keeps its own single-bucket exchange (its timings and deciding vote).
  if (c[0].kind == MergeKind::kProbe || want <= 1) return 1;
  uint64_t sum = c[0].elements;
  size_t n = 1;
  while (n < want && n < c.size()) {
    const MergeCandidate& next = c[n];
    if (next.step != c[0].step || next.kind == MergeKind::kProbe) break;
    if (sum + next.elements > limits.max_group_elements) break;
    sum += next.elements;
    ++n;
  }
  return n;
}

size_t ReadyPrefix(absl::Span<const MergeCandidate> c, size_t window) {
  size_t n = 0;
  while (n < c.size() && n < window && c[n].ready && c[n].step == c[0].step &&
         c[n].kind != MergeKind::kProbe) {
    ++n;
  }
  return n;
}

size_t Merger::Offer(absl::Span<const MergeCandidate> candidates, int64_t /*now_ns*/,
                     int64_t* /*deadline_ns*/) {
  return ReadyPrefix(candidates, GroupLimits().window);
}

std::vector<size_t> Merger::Pack(absl::Span<const MergeCandidate> agreed) {
  return std::vector<size_t>(agreed.size(), 1);
}

constexpr struct {
  const char* name;
  MergerPolicy policy;
} kPolicies[] = {{"none", MergerPolicy::kNone},
                 {"fixed", MergerPolicy::kFixed},
                 {"omgs", MergerPolicy::kOmgs},
                 {"rgmerge", MergerPolicy::kRgmerge}};

bool AbslParseFlag(absl::string_view text, MergerPolicy* out, std::string* error) {
  for (const auto& p : kPolicies) {
    if (text == p.name) {
      *out = p.policy;
      return true;
    }
  }
  *error = absl::StrCat("unknown merger '", text.substr(0, 64),
                        "'; accepted: none, fixed, omgs, rgmerge");
  return false;
}

std::string AbslUnparseFlag(MergerPolicy v) {
  for (const auto& p : kPolicies) {
    if (p.policy == v) return p.name;
  }
  return "none";
}

std::unique_ptr<Merger> MakeNoMerger() { return std::unique_ptr<Merger>(new NoMerger()); }

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy) {
  return MakeMerger(policy, MergeParams());
}

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(const std::string& name) {
  MergerPolicy policy;
  std::string error;
  if (!AbslParseFlag(name, &policy, &error)) return absl::InvalidArgumentError(error);
  return MakeMerger(policy);
}

}  // namespace spex
