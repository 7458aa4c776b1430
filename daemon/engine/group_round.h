// The agreement round of a merge group (issue 14): one tiny all-reduce (MAX) per group
// instead of one control round per bucket. It carries, for the whole group, what the per-bucket
// control round carries (the newest density change, whether any node could not read its
// trainers' inputs, a dead trainer, a non-finite input) and, per member, the key that the
// per-bucket round checks (id, step, size, compressor) plus the member's kind and the fp16 flag.
// It also carries the merger configuration (name, window W, max_group_elements and the merger's
// ConfigHash), each as an (x, ~x) pair, so nodes configured differently fail with
// FAILED_PRECONDITION naming what differs instead of hanging in mismatched collectives.
//
// Offers: with an agreed merger (fixed, rgmerge ready) every node offers r_i >= 1 leading
// candidates and the round returns m = min over nodes of r_i, the agreed ready prefix, which
// Merger::Pack then splits into groups with no further control collective. With a static plan
// (omgs) every node offers the plan group itself (`exact`): every node must offer the same
// length, or the round fails.
//
// The message has a fixed size (kGroupRoundMaxWindow keys), whatever W is, so that a node with a
// different W takes part in the same all-reduce and fails clearly. Every check is made on the
// maxed words, which are the same on every node, so every node returns the same verdict (the
// message names this node's view). The engine runs one per group with --merger other than
// `none` (Engine::ProcessGroup); `none` keeps one control round per bucket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "daemon/merge/merger.h"
#include "daemon/transport/collective.h"

namespace spex {

inline constexpr size_t kGroupRoundMaxWindow = 64;

// One candidate as the round checks it.
struct GroupMemberKey {
  uint64_t bucket_id = 0;
  uint64_t step = 0;
  uint64_t elements = 0;
  absl::string_view compressor;  // borrowed for the call
  MergeKind kind = MergeKind::kDense;
  bool fp16 = false;  // B values travel as float16 (--fp16_values)
};

// The hash the round compares for a member.
uint64_t GroupMemberHash(const GroupMemberKey& key);

// The merger configuration that must be identical on every node.
struct MergeConfig {
  absl::string_view merger;  // Merger::name()
  uint64_t window = kGroupRoundMaxWindow;
  uint64_t max_group_elements = 0;
  uint64_t config_hash = 0;  // Merger::ConfigHash()
  bool overlap = false;      // the groups' collectives run on the wire stage (--merge_overlap)
};

struct GroupRoundInput {
  MergeConfig config;
  // This node's offer: 1 .. config.window leading candidates, in canonical order.
  absl::Span<const GroupMemberKey> offer;
  // Static plan: the offer is the plan group; every node must offer the same length.
  bool exact = false;
  // As in Control (control_round.h), maxed over nodes.
  uint64_t density_key = 0;
  bool inputs_failed = false;
  uint64_t dead_trainer = 0;
  uint64_t nonfinite = 0;         // NonfiniteWord, or 0
  uint32_t nonfinite_member = 0;  // the offer position of the member it was seen in
  bool plan_due = false;          // MergePlanner::PlanDue at the head's step
};

struct GroupRoundResult {
  size_t agreed = 0;  // m: the minimum offer over nodes (the offer itself with one node)
  uint64_t density_key = 0;
  bool inputs_failed = false;
  uint64_t dead_trainer = 0;
  uint64_t nonfinite = 0;
  uint32_t nonfinite_member = 0;  // meaningful when nonfinite != 0
  bool plan_due = false;          // some node asked for the plan agreement: every node runs it
};

// Runs the round over `coll` (no communication with one node). Errors, the same on every node:
// InvalidArgument for a bad input (an empty offer, one longer than the window, a window outside
// 1..kGroupRoundMaxWindow: checked before the collective, so a caller must not reach the round
// with one); FAILED_PRECONDITION when the merger configuration differs (naming the part), when a
// member among the first m differs (naming this node's member), or, with `exact`, when the plan
// group's length differs; the collective's error when the all-reduce fails.
absl::Status RunGroupRound(Collective* coll, const GroupRoundInput& in, GroupRoundResult* out);

// The plan agreement of a measuring merger (docs/merging.md 2.6), run by every node right after a
// successful group round whose plan_due came out set, so every node issues it at the same point:
// two all-reduces (MAX). The first checks that every node passes the same bucket list (ids and
// sizes) and the same number of words; the second replaces `words` (this node's plan inputs) by
// their maximum over nodes. FAILED_PRECONDITION, the same on every node, when the lists differ
// (the second all-reduce is then skipped everywhere); the collective's error when one fails.
// No communication with one node.
absl::Status RunPlanAgreement(Collective* coll, absl::Span<const PlanBucket> buckets,
                              std::vector<uint64_t>* words);

}  // namespace spex
