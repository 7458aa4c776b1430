// Cross-node agreement (agreement.h): every node reports whether its part succeeded and all leave
// with the same answer, so a check that fails on one node stops every node the same way.
#include "daemon/transport/agreement.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace spex {

absl::Status AgreeOnAllNodes(Collective* coll, const absl::Status& local, absl::string_view what) {
  if (coll->size() <= 1) return local;
  const uint64_t nodes = static_cast<uint64_t>(coll->size());
  const uint64_t rank = static_cast<uint64_t>(coll->rank());
  // v[0]: some node failed. v[1]: nodes - (lowest failed rank), so MAX picks the lowest rank.
  // v[2]: that node's code, carried as (rank-major) so MAX keeps the lowest rank's code.
  uint64_t v[3] = {0, 0, 0};
  if (!local.ok()) {
    v[0] = 1;
    v[1] = nodes - rank;
    v[2] = ((nodes - rank) << 32) | static_cast<uint32_t>(local.code());
  }
  if (absl::Status s = coll->AllReduce(v, 3, ElemType::kUint64, ReduceOp::kMax); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("agreeing on ", what, ": ", s.message()));
  }
  if (v[0] == 0) return absl::OkStatus();
  const uint64_t failed = nodes - v[1];
  // Every node knows now that some node failed and which: a second all-reduce (only on this
  // failure path) carries that node's message, the others contributing zeros, so MAX leaves its
  // bytes as they are.
  uint64_t text[kAgreementTextWords] = {};
  if (rank == failed) {
    const absl::string_view m = local.message();
    std::memcpy(text, m.data(), std::min(m.size(), sizeof(text) - 1));
  }
  if (absl::Status s =
          coll->AllReduce(text, kAgreementTextWords, ElemType::kUint64, ReduceOp::kMax);
      !s.ok()) {
    return local.ok()
               ? absl::Status(s.code(), absl::StrCat("agreeing on ", what, ": ", s.message()))
               : local;
  }
  if (!local.ok()) return local;
  const char* bytes = reinterpret_cast<const char*>(text);
  const absl::string_view reason(bytes, strnlen(bytes, sizeof(text) - 1));
  const bool cut = reason.size() == sizeof(text) - 1;
  const auto code = static_cast<absl::StatusCode>(static_cast<uint32_t>(v[2]));
  return absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                      absl::StrCat("node ", failed, " failed ", what, ": ",
                                   reason.empty() ? "(no message)" : reason, cut ? "..." : "",
                                   " (node ", failed, "'s words; see its log)"));
}

}  // namespace spex
