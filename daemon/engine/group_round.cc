// The merge group's agreement round and a measuring merger's plan agreement (group_round.h):
// packing the words, the all-reduces and the verdicts every node reaches alike.
#include "daemon/engine/group_round.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

// The wire layout of the round. A value x that must be equal on every node travels as the pair
// (x, ~x): maxed over nodes, the pair is still (x, ~x) exactly when every node sent the same x.
enum Word : size_t {
  kMinOffer,  // W_max - r: its maximum gives the minimum offer
  kMaxOffer,  // r: its maximum gives the maximum offer (static plans: must equal the minimum)
  kDensityKey,
  kInputsFailed,
  kDeadTrainer,
  kNonfinite,
  kNonfiniteMember,  // (node + 1) << 32 | member: maxed alike with kNonfinite (node first)
  kMergerName,
  kNotMergerName,
  kWindow,
  kNotWindow,
  kMaxGroupElements,
  kNotMaxGroupElements,
  kConfigHash,
  kNotConfigHash,
  kPlanDue,  // a node's merger asks for the plan agreement after this round
  kKeys,     // kGroupRoundMaxWindow keys, then their complements
};
constexpr size_t kWords = kKeys + 2 * kGroupRoundMaxWindow;
// Folded into the configuration hash when the groups' collectives run on the wire stage.
constexpr uint64_t kOverlapBit = 0x9e3779b97f4a7c15ull;

uint64_t StringHash(absl::string_view s) { return Fnv1a(kFnvOffset, s.data(), s.size()); }

const char* KindName(MergeKind k) {
  switch (k) {
    case MergeKind::kDense:
      return "D";
    case MergeKind::kPatternA:
      return "A";
    case MergeKind::kPatternB:
      return "B";
    case MergeKind::kProbe:
      return "P";
  }
  return "?";
}

bool Differs(const uint64_t* v, size_t w) { return v[w] != ~v[w + 1]; }

}  // namespace

uint64_t GroupMemberHash(const GroupMemberKey& key) {
  const uint64_t name = StringHash(key.compressor);
  const uint64_t words[] = {
      key.bucket_id,     key.step, key.elements, name, static_cast<uint64_t>(key.kind),
      key.fp16 ? 1u : 0u};
  return Fnv1a(kFnvOffset, words, sizeof(words));
}

absl::Status RunGroupRound(Collective* coll, const GroupRoundInput& in, GroupRoundResult* out) {
  const MergeConfig& cfg = in.config;
  const size_t r = in.offer.size();
  if (cfg.window == 0 || cfg.window > kGroupRoundMaxWindow) {
    return absl::InvalidArgumentError(absl::StrCat("group round: the merge window must be in [1, ",
                                                   kGroupRoundMaxWindow, "]; got ", cfg.window));
  }
  if (r == 0 || r > cfg.window) {
    return absl::InvalidArgumentError(absl::StrCat("group round: this node offers ", r,
                                                   " buckets; an offer holds 1 to ", cfg.window));
  }
  std::vector<uint64_t> v(kWords, 0);
  v[kMinOffer] = kGroupRoundMaxWindow - r;
  v[kMaxOffer] = r;
  v[kDensityKey] = in.density_key;
  v[kInputsFailed] = in.inputs_failed ? 1 : 0;
  v[kDeadTrainer] = in.dead_trainer;
  v[kPlanDue] = in.plan_due ? 1 : 0;
  if (in.nonfinite != 0) {
    v[kNonfinite] = in.nonfinite;
    v[kNonfiniteMember] = (static_cast<uint64_t>(coll->rank() + 1) << 32) | in.nonfinite_member;
  }
  const uint64_t name = StringHash(cfg.merger);
  const uint64_t pairs[][2] = {{kMergerName, name},
                               {kWindow, cfg.window},
                               {kMaxGroupElements, cfg.max_group_elements},
                               {kConfigHash, cfg.config_hash ^ (cfg.overlap ? kOverlapBit : 0)}};
  for (const auto& [w, x] : pairs) {
    v[w] = x;
    v[w + 1] = ~x;
  }
  for (size_t j = 0; j < r; ++j) {
    const uint64_t h = GroupMemberHash(in.offer[j]);
    v[kKeys + j] = h;
    v[kKeys + kGroupRoundMaxWindow + j] = ~h;
  }
  if (coll->size() > 1) {
    if (absl::Status s = coll->AllReduce(v.data(), kWords, ElemType::kUint64, ReduceOp::kMax);
        !s.ok()) {
      return s;
    }
  }
  // The configuration first: with a different one, nothing else can be compared.
  const char* differs = nullptr;
  std::string mine;
  if (Differs(v.data(), kMergerName)) {
    differs = "the merger (--merger)";
    mine = std::string(cfg.merger);
  } else if (Differs(v.data(), kWindow)) {
    differs = "the merge window W";
    mine = absl::StrCat(cfg.window);
  } else if (Differs(v.data(), kMaxGroupElements)) {
    differs = "max_group_elements";
    mine = absl::StrCat(cfg.max_group_elements);
  } else if (Differs(v.data(), kConfigHash)) {
    differs = "the merger's parameters (its flags, or --merge_overlap)";
    mine = absl::StrCat(cfg.merger, " with configuration hash ", cfg.config_hash,
                        cfg.overlap ? ", overlap on" : ", overlap off");
  }
  if (differs != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("merger configuration differs between nodes: ", differs,
                     " is not the same on every node "
                     "(this node: ",
                     mine, "). Start every spexd with the same --merger and merger flags"));
  }
  const size_t m = kGroupRoundMaxWindow - v[kMinOffer];
  const size_t max_offer = v[kMaxOffer];
  if (in.exact && m != max_offer) {
    return absl::FailedPreconditionError(absl::StrCat(
        "merge plan differs between nodes: the ", cfg.merger, " plan group starting at bucket ",
        in.offer[0].bucket_id, " step ", in.offer[0].step, " has ", r,
        " buckets on this node, but between ", m, " and ", max_offer,
        " over the nodes. Every node must register the same buckets (same ids and sizes)"));
  }
  for (size_t j = 0; j < m; ++j) {
    if (v[kKeys + j] == ~v[kKeys + kGroupRoundMaxWindow + j]) continue;
    const GroupMemberKey& k = in.offer[j];
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket order differs between nodes: member ", j, " of the group is bucket ", k.bucket_id,
        " step ", k.step, " (", k.elements, " elements, compressor ", k.compressor, ", kind ",
        KindName(k.kind), k.fp16 ? ", fp16 values" : "",
        ") on this node but a different bucket, step, size, compressor, kind or value format on "
        "another node. Every node must register the same buckets (same ids, sizes and "
        "compressors) and exchange them in the same order"));
  }
  out->agreed = m;
  out->density_key = v[kDensityKey];
  out->inputs_failed = v[kInputsFailed] != 0;
  out->dead_trainer = v[kDeadTrainer];
  out->plan_due = v[kPlanDue] != 0;
  out->nonfinite = v[kNonfinite];
  out->nonfinite_member =
      v[kNonfinite] != 0 ? static_cast<uint32_t>(v[kNonfiniteMember] & 0xffffffffu) : 0;
  return absl::OkStatus();
}

absl::Status RunPlanAgreement(Collective* coll, absl::Span<const PlanBucket> buckets,
                              std::vector<uint64_t>* words) {
  if (coll->size() <= 1) return absl::OkStatus();
  uint64_t h = kFnvOffset;
  for (const PlanBucket& b : buckets) {
    h = Fnv1a(h, &b.bucket_id, sizeof(b.bucket_id));
    h = Fnv1a(h, &b.elements, sizeof(b.elements));
    const uint64_t kind = static_cast<uint64_t>(b.kind);
    h = Fnv1a(h, &kind, sizeof(kind));
  }
  const uint64_t n = words->size();
  uint64_t head[] = {buckets.size(), ~uint64_t{buckets.size()}, h, ~h, n, ~n};
  if (absl::Status s = coll->AllReduce(head, 6, ElemType::kUint64, ReduceOp::kMax); !s.ok()) {
    return s;
  }
  if (Differs(head, 0) || Differs(head, 2) || Differs(head, 4)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "merge plan agreement: the registered buckets (ids, sizes, kinds) differ between nodes "
        "(this node has ",
        buckets.size(), " buckets, ids ", buckets.empty() ? 0 : buckets.front().bucket_id, "..",
        buckets.empty() ? 0 : buckets.back().bucket_id,
        "); every node must register the same buckets (same ids and sizes) before the plan "
        "step"));
  }
  if (n == 0) return absl::OkStatus();
  return coll->AllReduce(words->data(), words->size(), ElemType::kUint64, ReduceOp::kMax);
}

}  // namespace spex
