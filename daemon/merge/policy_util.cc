// The policy files' shared helpers (policy_util.h).
#include "daemon/merge/policy_util.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace spex {

uint64_t HashWords(const char* name, std::initializer_list<uint64_t> words) {
  uint64_t h = Fnv1a(kFnvOffset, name, std::char_traits<char>::length(name));
  for (uint64_t w : words) h = Fnv1a(h, &w, sizeof(w));
  return h;
}

absl::Status CheckLimits(const GroupLimits& limits) {
  if (limits.max_group_elements == 0) {
    return absl::InvalidArgumentError("--max_group_elements must be >= 1");
  }
  if (limits.window == 0 || limits.window > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--merge_window must be in [1, 64] (the agreement round carries 64 keys); got ",
        limits.window));
  }
  return absl::OkStatus();
}

}  // namespace spex
