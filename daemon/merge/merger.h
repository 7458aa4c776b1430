// The merging seam (docs/design.md#seams, docs/merging.md 2.2): a Merger decides which buckets are
// fused into one exchange. The engine hands it the buckets every local trainer registered, in the
// canonical order (ascending next step, then bucket id: the same on every node).
//
// Two families:
//   static plan  NextGroup(C) returns the length of the plan group that starts at C[0], from ids,
//                sizes and kinds only (never from `ready`); the engine waits for every member.
//   agreed       Offer(C, now) returns 0 (linger until *deadline_ns or a doorbell ring) or r >= 1,
//                how many leading candidates this node offers; the offer MAY depend on local
//                timing. The agreement round takes the minimum m over nodes and Pack(C[0..m))
//                splits it into groups as a pure function of ids, sizes, kinds and the
//                configuration, so every node forms the same groups from the same m.
// Every group obeys GroupRules: one step, a probing (P) bucket alone, at most max_group_elements
// unless a single bucket is larger on its own.
//
// Three jobs, three interfaces: Merger groups (every merger), MergeMeter takes local timings
// (Merger::meter(): rgmerge's linger and late binding, and the planning mergers) and MergePlanner
// agrees on a plan computed from them (Merger::planner(): rgmerge's model, omgs's mgs); a merger
// without a side returns null for it.
//
// Implemented here: none (static, one bucket per exchange) and the policy dispatch; in
// mergers.h the factories of fixed, omgs (threshold, count, mgs) and rgmerge (ready, and model:
// agreed while it measures, then the static plan of rgmerge_model.h), one file per policy
// (fixed_merger.cc, omgs_merger.cc, omgs_mgs_merger.cc, rgmerge_ready_merger.cc,
// rgmerge_model_merger.cc) over the timing machinery of merge_timing.h and the plan table of
// plan_table.h. The group agreement round and the fused exchange are daemon/engine/group_round.h,
// fused_step.h and fused_behind_step.h, and the engine runs the groups
// (engine_group_exchange.cc, Engine::ProcessGroup).
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

// A bucket's kind at its step (docs/merging.md 2.1), identical on every node.
enum class MergeKind : uint8_t {
  kDense = 0,     // D: dense bucket, or sparse bucket in dense mode
  kPatternA = 1,  // A: sparse, index-union codec
  kPatternB = 2,  // B: sparse, gather codec
  kProbe = 3,     // P: sparse bucket still probing; always exchanged alone
};

struct MergeCandidate {
  uint64_t bucket_id = 0;
  uint64_t step = 0;  // the bucket's next step
  uint64_t elements = 0;
  bool ready = false;  // every local trainer has signalled this step
  MergeKind kind = MergeKind::kDense;
  // When it became ready on this node: the latest local trainer's ready_ns stamp
  // (CLOCK_MONOTONIC); 0 when not ready or the trainers do not stamp. Local timing: an agreed
  // merger's Offer may read it (rgmerge's linger), Pack and NextGroup never do.
  int64_t ready_ns = 0;
};

// Limits shared by every merger; must be identical on all nodes (they enter the config hash).
struct GroupLimits {
  uint64_t max_group_elements = uint64_t{16} << 20;  // 16 Mi elements = 64 MiB of fp32
  size_t window = 64;                                // W: candidates one round may cover
};

// The longest prefix of `c` no longer than `want` that is a legal group under `limits`: never
// crosses the head's step, a P bucket only alone, at most max_group_elements (a single bucket
// larger on its own is allowed). Returns >= 1 for a non-empty `c`, 0 for an empty one.
size_t ClampGroup(absl::Span<const MergeCandidate> c, size_t want, const GroupLimits& limits);

// How many leading candidates an agreed merger may offer (docs/merging.md 2.3): locally ready,
// at the head's step, not P, within the first `window`. 0 when the head itself is not offerable.
size_t ReadyPrefix(absl::Span<const MergeCandidate> c, size_t window);

// Measuring (docs/merging.md 2.6), implemented by the mergers that read local timings
// (rgmerge's linger and late binding, and the mergers that measure before they plan). The engine
// reports to Merger::meter() when it is not null. Every method is thread-safe: the wire thread
// reports too. The stage timings (ExchangeIdleSince, PackHandedOff, PackDone) default to nothing,
// for a meter that does not read them.
class MergeMeter {
 public:
  virtual ~MergeMeter() = default;
  // Whether the engine reports members and exchanges now (ObserveMember, ObserveExchange; a
  // merger that plans stops asking once its plan agreement ran). The other reports always come.
  virtual bool measures() const = 0;
  // A member's timings at `step`: when it became ready on this node (the latest trainer's
  // ready_ns stamp, CLOCK_MONOTONIC) and its Select time (0 for a dense member).
  virtual void ObserveMember(uint64_t bucket_id, uint64_t step, int64_t ready_ns,
                             int64_t select_ns) = 0;
  // A pack's wire half (every sub-exchange of it): the bytes this node received and how long
  // it took.
  virtual void ObserveExchange(uint64_t bytes, int64_t ns) = 0;
  // When this node's last exchange ended (`now` while one is on the wire). The scheduler tells
  // an agreed merger before every Offer (rgmerge's linger and late binding read it).
  virtual void ExchangeIdleSince(int64_t /*ns*/) {}
  // With --merge_overlap, local timings of the engine's two stages (rgmerge's --rgmerge_bind=late
  // reads them). PackHandedOff (engine thread): a pack of `elements` goes on the wire at
  // `wire_start_ns`, after its local work took `local_ns` (for a round's first pack the round
  // itself, the local reduce and Prepare; for a later pack of the same round its Prepare).
  // PackDone (wire thread): a pack's wire half took `wire_ns`.
  virtual void PackHandedOff(uint64_t /*elements*/, int64_t /*local_ns*/,
                             int64_t /*wire_start_ns*/) {}
  virtual void PackDone(uint64_t /*elements*/, int64_t /*wire_ns*/) {}
};

// A registered bucket as a plan sees it (canonical order: ascending id).
struct PlanBucket {
  uint64_t bucket_id = 0;
  uint64_t elements = 0;
  MergeKind kind = MergeKind::kDense;  // its kind when the plan is agreed
};

// What a plan computed from agreed inputs also depends on, identical on every node.
struct PlanContext {
  int nodes = 1;
  double density = 0.01;  // the head bucket's agreed target density
};

// Plan agreement (docs/merging.md 2.6), implemented by the mergers that measure before they plan
// (rgmerge --rgmerge_plan=model, omgs --omgs_mode=mgs). The engine runs the agreement
// (Engine::AgreePlan) through Merger::planner() when it is not null. Engine thread only.
class MergePlanner {
 public:
  virtual ~MergePlanner() = default;
  // Whether the group round of a head at `step` asks for the plan agreement (every node runs it
  // when any asks, after that round).
  virtual bool PlanDue(uint64_t step) const = 0;
  // This node's plan inputs for `buckets` as integer words; the agreement takes their maximum
  // over nodes (the slowest node's timings) and hands the same words to InstallPlan everywhere.
  virtual std::vector<uint64_t> PlanInputs(absl::Span<const PlanBucket> buckets) = 0;
  // Computes the plan from the agreed words; it takes effect at step `step` + 1. The same
  // inputs on every node give the same plan (integer arithmetic), and the merger's ConfigHash()
  // covers it.
  virtual void InstallPlan(absl::Span<const PlanBucket> buckets, absl::Span<const uint64_t> agreed,
                           uint64_t step, const PlanContext& ctx) = 0;
  // The agreement failed alike on every node (`why`): no plan, the merger keeps running agreed.
  virtual void AbandonPlan(const std::string& why) = 0;
  // The installed plan for logs ("group lengths ..., inputs ..."); empty without one.
  virtual std::string PlanSummary() const = 0;
};

// Grouping: which buckets the next exchange fuses.
class Merger {
 public:
  virtual ~Merger() = default;
  virtual const char* name() const = 0;
  // True for agreed mergers (Offer/Pack), false for static plans (NextGroup).
  virtual bool agreed() const { return false; }
  // Selection behind (docs/merging.md 2.5): a static plan group whose members are all sparse
  // buckets of one compressor (same name, parameters and density, not Ok-Topk) is exchanged as one
  // bucket of the summed size (FusedBehindStep); any other group selects ahead.
  virtual bool behind() const { return false; }
  // Which family runs a group whose head is at `step`: a merger that measures before it plans
  // (rgmerge --rgmerge_plan=model) is agreed until its plan takes effect, static from then on.
  // The answer depends only on agreed data (the head's step, the agreed plan).
  virtual bool AgreedAt(uint64_t /*step*/) const { return agreed(); }
  // Hash of the merger's name and every parameter that must match across nodes (carried as
  // cfg/~cfg in the agreement round so differently configured nodes fail clearly).
  virtual uint64_t ConfigHash() const = 0;

  // Static plans. Candidates in canonical order (non-empty); returns the plan group's length
  // (>= 1). Depends only on ids, steps, sizes and kinds, never on `ready`.
  virtual size_t NextGroup(absl::Span<const MergeCandidate> candidates) = 0;

  // Agreed mergers. Default: offer the ready prefix at once / one bucket per group.
  virtual size_t Offer(absl::Span<const MergeCandidate> candidates, int64_t now_ns,
                       int64_t* deadline_ns);
  // Group lengths (each >= 1) that sum to agreed.size(). Pure in its inputs and configuration.
  virtual std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed);

  // The merger's measuring and plan agreement sides; null (the default) for a merger without
  // one. The same pointer for the merger's whole life (the wire thread reads meter()).
  virtual MergeMeter* meter() { return nullptr; }
  virtual MergePlanner* planner() { return nullptr; }
};

// --merger (the mergers are in mergers.h; the engine runs their groups, engine_group_exchange.cc).
enum class MergerPolicy { kNone, kFixed, kOmgs, kRgmerge };
// --omgs_mode (docs/merging.md 4): threshold, count, or OMGS-SGD's adaptive rule on measurements
// (mgs).
enum class OmgsMode { kThreshold, kCount, kMgs };

// Every merger's parameters in one place (spexd's flags; MakeMerger validates them, naming the
// flag). Only the chosen merger's fields are used.
struct MergeParams {
  GroupLimits limits;                                   // --merge_window, --max_group_elements
  uint64_t fixed_threshold_bytes = uint64_t{64} << 20;  // --fixed_threshold_bytes
  int64_t fixed_cycle_ms = 5;                           // --fixed_cycle_ms
  OmgsMode omgs_mode = OmgsMode::kThreshold;            // --omgs_mode (--omgs_count > 0: count)
  uint64_t omgs_threshold_elements = 8192;              // --omgs_threshold_elements
  uint64_t omgs_count = 10;                             // --omgs_count
  bool omgs_select_behind = true;                       // --omgs_select=behind (default)
  bool rgmerge_select_behind = false;                   // --rgmerge_select=behind (model only)
  bool rgmerge_model = false;                           // --rgmerge_plan=model
  uint64_t plan_step = 22;           // --merge_plan_step (S_plan) of rgmerge's model and omgs's mgs
  int64_t rgmerge_slack_us = 0;      // --rgmerge_slack_us
  int64_t merge_alpha_us = 0;        // --merge_alpha_us (0: measured)
  bool rgmerge_equal_tail = true;    // --rgmerge_equal_tail
  bool rgmerge_linger_auto = false;  // --rgmerge_linger=auto
  int64_t rgmerge_linger_max_us = 2000;  // --rgmerge_linger_max_us
  bool rgmerge_bind_late = false;        // --rgmerge_bind=late
};
bool AbslParseFlag(absl::string_view text, MergerPolicy* out, std::string* error);
std::string AbslUnparseFlag(MergerPolicy v);

// 64-bit FNV-1a, the hash of group keys and configuration hashes.
uint64_t Fnv1a(uint64_t h, const void* data, size_t n);
inline constexpr uint64_t kFnvOffset = 14695981039346656037ull;

// The policy's merger with `params` (merger.cc, through mergers.h's factories); InvalidArgument
// naming the flag for a bad one.
absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy, const MergeParams& params);
// `none`: one bucket per exchange.
std::unique_ptr<Merger> MakeNoMerger();
// With the default parameters.
absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy);
// By name (the flag spelling); InvalidArgument naming the accepted names for an unknown one.
absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(const std::string& name);

}  // namespace spex
