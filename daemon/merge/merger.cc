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

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(const std::string& name) {
  if (name == "none") return std::unique_ptr<Merger>(new NoMerger());
  if (name == "fixed" || name == "omgs" || name == "rgmerge") {
    return absl::UnimplementedError(absl::StrCat(
        "--merger=", name,
        " is not implemented yet; the only merger is 'none' (one exchange per bucket)"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown merger '", name, "'; accepted: none"));
}

}  // namespace spex
