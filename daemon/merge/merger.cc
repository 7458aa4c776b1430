// The Merger seam's common code (merger.h): the `none` merger, the config hash every node
// compares, the group limits and ready prefix the mergers share, the --merger flag parsing and
// the policy dispatch (MakeMerger) to the factories of mergers.h.
#include "daemon/merge/merger.h"

#include "absl/strings/str_cat.h"
#include "daemon/merge/merge_timing.h"
#include "daemon/merge/mergers.h"

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

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy, const MergeParams& params) {
  switch (policy) {
    case MergerPolicy::kNone:
      return MakeNoMerger();
    case MergerPolicy::kFixed: {
      FixedOptions o;
      o.threshold_bytes = params.fixed_threshold_bytes;
      o.cycle_ms = params.fixed_cycle_ms;
      o.limits = params.limits;
      return MakeFixedMerger(o);
    }
    case MergerPolicy::kOmgs: {
      OmgsOptions o;
      o.mode = params.omgs_mode;
      o.plan_step = params.plan_step;
      o.threshold_elements = params.omgs_threshold_elements;
      o.count = params.omgs_count;
      o.select_behind = params.omgs_select_behind;
      o.alpha_ns = params.merge_alpha_us * 1000;
      o.limits = params.limits;
      return MakeOmgsMerger(o);
    }
    case MergerPolicy::kRgmerge: {
      RgmergeOptions o;
      o.limits = params.limits;
      o.model = params.rgmerge_model;
      o.plan_step = params.plan_step;
      o.slack_ns = params.rgmerge_slack_us * 1000;
      o.equal_tail = params.rgmerge_equal_tail;
      o.select_behind = params.rgmerge_select_behind;
      o.alpha_ns = params.merge_alpha_us * 1000;
      o.linger_auto = params.rgmerge_linger_auto;
      if (params.rgmerge_linger_max_us < 0 || params.rgmerge_linger_max_us > kMaxLingerNs / 1000) {
        return absl::InvalidArgumentError(absl::StrCat("--rgmerge_linger_max_us must be in [0, ",
                                                       kMaxLingerNs / 1000, "]; got ",
                                                       params.rgmerge_linger_max_us));
      }
      o.linger_max_ns = params.rgmerge_linger_max_us * 1000;
      o.bind_late = params.rgmerge_bind_late;
      return MakeRgmergeMerger(o);
    }
  }
  return absl::InvalidArgumentError("--merger: unknown policy");
}

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
