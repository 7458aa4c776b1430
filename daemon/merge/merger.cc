#include "daemon/merge/merger.h"

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

class NoMerger : public Merger {
 public:
  const char* name() const override { return "none"; }
  size_t NextGroup(absl::Span<const MergeCandidate> candidates) override {
    return candidates.empty() ? 0 : 1;
  }
};

}  // namespace

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
                        "'; accepted: none (fixed, omgs, rgmerge are planned)");
  return false;
}

std::string AbslUnparseFlag(MergerPolicy v) {
  for (const auto& p : kPolicies) {
    if (p.policy == v) return p.name;
  }
  return "none";
}

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy) {
  if (policy == MergerPolicy::kNone) return std::unique_ptr<Merger>(new NoMerger());
  return absl::UnimplementedError(
      absl::StrCat("--merger=", AbslUnparseFlag(policy),
                   " is not implemented yet; the only merger is 'none' (one exchange per bucket)"));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(const std::string& name) {
  MergerPolicy policy;
  std::string error;
  if (!AbslParseFlag(name, &policy, &error)) return absl::InvalidArgumentError(error);
  return MakeMerger(policy);
}

}  // namespace spex
