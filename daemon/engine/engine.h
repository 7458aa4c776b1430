// The exchange engine of one node: the thin loop that wires the parts together. Trainer sessions
// (session_registry.h), buckets and their memory (bucket_table.h, bucket.h), the doorbell
// (doorbell.h), the canonical order (scheduler.h), the control round before every exchange
// (control_round.h), the dense and sparse steps (step.h) and the commit vote after every step
// (daemon/transport/agreement.h). One engine thread runs every exchange; the RPC threads of the
// service (daemon/service) call the public methods. It knows nothing of gRPC or MPI: it gets a
// Collective. A bucket's inputs and outputs around its step (the device path's events, the one
// rounding of a half output) are bucket_io.h's. Its code: engine.cc (life, loop, publishing),
// engine_bucket_exchange.cc and engine_group_exchange.cc (one exchange's stages, per bucket and
// per merge group, over the state in engine_passes.h), engine_wire_stage.cc (--merge_overlap:
// what the wire stage runs; its thread, slot and lock are wire_stage.h's WireStage),
// engine_requests.cc (the RPC threads' requests).
//
// One exchange: wait for the trainers' input events (device path) -> control round (order check,
// density changes, fallback vote, input failures) -> the step (dense or sparse) -> output event
// (device path) -> commit vote: a failure on any node after the control round fails the step
// on every node, and the bucket becomes kFailed (terminal) -> publish to the trainers.
//
// Devices: the engine works on bucket data only through the Primitives it is given and moves it
// only through the Collective it is given, so one code path serves both devices. The CPU path
// (no DevicePath) keeps each bucket in one host shm segment (header, input slots, output). The
// device path keeps the BucketHeader in host shm and the data in a buffer from the DevicePath's
// allocator; every compressor runs on the device's primitives.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/engine/bucket_io.h"
#include "daemon/engine/bucket_table.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/doorbell.h"
#include "daemon/engine/engine_options.h"
#include "daemon/engine/exchange_cost.h"
#include "daemon/engine/exchange_record.h"
#include "daemon/engine/fused_behind_step.h"
#include "daemon/engine/fused_step.h"
#include "daemon/engine/scheduler.h"
#include "daemon/engine/session_registry.h"
#include "daemon/engine/wire_stage.h"
#include "daemon/memory/device_memory.h"
#include "daemon/transport/collective.h"
#include "kernels/primitives.h"

namespace spex {

struct HelloResult {
  uint64_t session_id = 0;
  const ShmBuffer* doorbell = nullptr;
};

struct BucketGrant {
  const ShmBuffer* buffer = nullptr;  // host shm: the BucketHeader at offset 0 and, on the CPU
  uint64_t input_offset = 0;          // path, the data: this trainer's input slot and the output
  uint64_t output_offset = 0;         // (both 0 on the device path)
  // Device path: the buffer holding the data, and the slot and output offsets inside it.
  const SharedBuffer* device_buffer = nullptr;
  uint64_t device_input_offset = 0;
  uint64_t device_output_offset = 0;
  uint64_t elements = 0;
  std::string compressor;
  double density = 0;
  uint64_t next_step = 0;
  bool own_input = false;  // the daemon reads this trainer's input from its own memory
};

class Engine {
 public:
  // `prims` works on the buckets' data: host memory on the CPU path, device memory with a
  // `device` path (whose host_prims then serve the sparse exchange's wire messages). Start()
  // checks that the pieces fit.
  Engine(EngineOptions options, Collective* collective, Primitives* prims, DevicePath device = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  absl::Status Start();
  // Asks the engine thread to stop (also tells peers). Safe from any thread.
  void RequestStop();
  // Blocks until the engine thread stopped (after RequestStop or a peer's notice).
  void WaitStopped();
  // Waits at most `timeout` for the engine thread; false if it is still running (e.g. stuck in
  // a collective with a peer that left).
  bool JoinFor(absl::Duration timeout);
  bool stopping() const { return stop_.load(); }

  const EngineOptions& options() const { return options_; }
  // True when buckets' data lives on a device (the RegisterBucket grant has a device_buffer).
  bool device_buckets() const { return device_.allocator != nullptr; }
  int node_rank() const { return collective_->rank(); }
  int node_count() const { return collective_->size(); }
  const char* collective_name() const { return collective_->name(); }
  // The collective of the wire stage (--merge_overlap): the same nodes as the engine's, over
  // its own channel (MPI: a duplicated communicator), used by one thread at a time. Set before
  // Start(); every node must set one or none (the group round refuses a mix). Null (default):
  // every collective runs on the engine thread.
  void set_wire_collective(Collective* wire) { wire_coll_ = wire; }
  // Whether merge groups' collectives run on the wire stage (a merger, --merge_overlap and a
  // wire collective).
  bool overlapping() const {
    return wire_coll_ != nullptr && options_.merge_overlap &&
           options_.merger != MergerPolicy::kNone;
  }

  // `pid` and `uid`: the caller as the kernel saw it (the service passes SO_PEERCRED's), to
  // which the session is bound (CheckCaller).
  absl::StatusOr<HelloResult> Hello(const std::string& job, uint32_t local_rank,
                                    uint32_t local_size, uint32_t pid, const std::string& client,
                                    uint32_t uid = 0);
  // NOT_FOUND for an unknown session, PERMISSION_DENIED unless process `pid` of user `uid`
  // opened it.
  absl::Status CheckCaller(uint64_t session_id, uint32_t uid, uint32_t pid) const;
  absl::Status Goodbye(uint64_t session_id);
  // `device`: the GPU the trainer's bucket lives on (device path; -1: the home GPU); a GPU the
  // path does not serve is FailedPrecondition naming --devices (docs/design.md#multi-gpu).
  // `own_input` (CPU path, trainer_memory.h): the trainer's own memory as its input slot, mapped
  // read-only from the caller's descriptor; null: the trainer writes its slot. A trainer that
  // registers a bucket again must name the same memory (or none again).
  absl::StatusOr<BucketGrant> RegisterBucket(uint64_t session_id, uint64_t bucket_id,
                                             uint64_t elements, const std::string& compressor,
                                             double density,
                                             const std::map<std::string, std::string>& params = {},
                                             int device = -1,
                                             const TrainerInputSpec* own_input = nullptr);
  absl::Status UnregisterBucket(uint64_t session_id, uint64_t bucket_id);
  // Changes the target density of every sparse bucket; all nodes apply the newest change any
  // of them has seen at the same step. Returns this node's change counter.
  absl::StatusOr<uint64_t> SetDensity(double density);
  // The RPC path: marks this trainer's input for (bucket, step) written and waits until the
  // result is published or `deadline` passes.
  absl::StatusOr<ExchangeRecord> Exchange(uint64_t session_id, uint64_t bucket_id, uint64_t step,
                                          absl::Time deadline);

  // Checkpointing (checkpoint.h, docs/checkpoint.md; engine_checkpoint.cc): this node's state
  // of bucket `bucket_id` (residual, compressor state, density, the engine's choices, the step)
  // as a record, taken between steps. The session's trainer must have registered the bucket and
  // not handed in its next step (its ready word is the bucket's next step), so no step of the
  // bucket is in flight; FAILED_PRECONDITION naming the step otherwise, and for a failed bucket.
  // UNIMPLEMENTED under selection behind (--omgs_select / --rgmerge_select=behind), whose
  // groups share a compressor across buckets.
  absl::StatusOr<std::string> SaveBucketState(uint64_t session_id, uint64_t bucket_id);
  // Loads a record SaveBucketState wrote (on this node of an earlier run of the same world)
  // into the bucket, under the same conditions, before the bucket's exchanges reach the saved
  // step: the bucket continues exactly where the saved one was. Refusals (nothing changes):
  // DATA_LOSS for a corrupt or truncated record, FAILED_PRECONDITION naming what differs
  // (world, size, compressor, parameters, policies) as RestoreBucket's. `resize`: a record of
  // another world, whose residual is added as AddResizedBucket adds it (every old node's record
  // goes to every node of the new world); the bucket's compressor stays fresh and it is logged.
  absl::Status LoadBucketState(uint64_t session_id, uint64_t bucket_id, absl::string_view record,
                               bool resize = false);
  // Memory a checkpoint stream holds outside the buckets (a record being received, decoded or
  // sent, and the copy it is encoded from): charged against --max_session_bytes (the session's
  // buckets and streams) and --max_daemon_bytes (every bucket and stream of the node) before the
  // caller allocates it, RESOURCE_EXHAUSTED naming the flag when it does not fit; released by
  // ReleaseCheckpointBytes when the stream ends. Registrations count the streams' bytes too.
  absl::Status ReserveCheckpointBytes(uint64_t session_id, uint64_t bucket_id, uint64_t bytes);
  void ReleaseCheckpointBytes(uint64_t session_id, uint64_t bytes);
  uint64_t checkpoint_bytes() const;  // reserved now, every stream together
  // Tests only: SaveBucketState calls `hook` after taking its copy, before encoding it.
  void SetSaveCopiedHookForTest(std::function<void()> hook) { save_copied_hook_ = std::move(hook); }

  std::vector<BucketSummary> Buckets() const;
  std::vector<SessionSummary> Sessions() const;
  uint64_t total_exchanges() const;
  // Merge groups' local reduces not done again: a member an agreement round left for a later
  // group keeps its sum (ProcessGroup), counted per member per round (for tests and logs).
  uint64_t reduces_reused() const { return reduces_reused_.load(std::memory_order_relaxed); }
  // Names of /dev/shm segments currently linked (for tests and diagnostics).
  std::vector<std::string> LinkedSegments() const;

 private:
  // The engine thread: TakeWorkLocked -> DoWork (failed buckets, one exchange), or Idle.
  void Run();
  struct Work;  // one iteration's picks (engine_passes.h)
  // What the scheduler picks now (and the housekeeping before: unlinking, reaping, a new job).
  void TakeWorkLocked(DoorbellSegment* bell, Work& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes failed buckets and runs the picked exchange; false when there was nothing to do.
  bool DoWork(Work& w);
  // Waits for the doorbell (spinning first when configured) or the idle timeout.
  // `linger_until_ns` (> 0): an agreed merger lingers until then at most.
  void Idle(DoorbellSegment* bell, uint32_t seen, int64_t linger_until_ns = 0);
  // The state of one exchange as it goes through the stages below (engine_passes.h).
  struct BucketPass;
  struct GroupPass;
  struct WirePack;

  // One bucket (group.front()) on the per-bucket path (engine_bucket_exchange.cc), in stages:
  // GatherControl -> WaitAndReduce -> AgreeControl -> SkipNonfinite -> RunStep -> CommitVote ->
  // PublishPass.
  void Process(const std::vector<EngineBucket*>& group);
  // This node's control words: the density change, a dead trainer, the probes' timings.
  void GatherControl(BucketPass& x);
  // Device path: the trainers' input events (BucketIO); then the local reduce with the finite
  // check, whose non-finite word goes into the control round (unless the inputs failed).
  void WaitAndReduce(BucketPass& x);
  // The local reduce of every exchange, on both paths (WaitAndReduce, ReduceMember), before the
  // round: ReduceLocalChecked with the finite check where the bucket's policy needs it (a
  // dense bucket under propagate does not: its all-reduce carries NaN/Inf anyway). The steps
  // do none of their own (step.h). *first_bad: as ReduceLocalChecked's. `step` (the compute
  // step, base added; UINT64_MAX: none) asks a sparse bucket's compressor for the histogram its
  // selection would count (Compressor::PlanSumHistogram), which the sum then counts.
  absl::Status ReduceLocal(EngineBucket* b, bool half_in_output, size_t* first_bad,
                           uint64_t step = UINT64_MAX);
  // The control round's non-finite word for `first_bad` (0 when b->elements: none), naming the
  // trainer whose input it is (or the sum).
  uint64_t NonfiniteWordFor(const EngineBucket* b, size_t first_bad) const;
  // The control round, and the step's status from its maxed words (a dead trainer, another
  // node's failed inputs, this node's).
  absl::Status AgreeControl(BucketPass& x);
  // The non-finite policy after the round: true when the step is skipped (x.status says why, or
  // is the propagate fill's).
  bool SkipNonfinite(BucketPass& x);
  // The step itself: the density in effect, dense or sparse (fallback and all-reduce probes),
  // DenseStep / SparseStep, the probes' timings, the primitives' health.
  absl::Status RunStep(BucketPass& x);
  // BucketIO::StepDone (device path: the output, its event) and, after a step that ran, the
  // commit vote on every node.
  void CommitVote(BucketPass& x);
  // BucketIO::BeforePublish (the CPU path: a half output rounded), Publish and the observers.
  void PublishPass(BucketPass& x);
  // propagate on a sparse bucket: NaN across its output (the step is skipped).
  absl::Status FillNonfinite(EngineBucket* b);

  // A merge group (--merger other than none; engine_group_exchange.cc), in stages:
  // GatherGroupInputs -> ReduceGroup -> AgreeGroup -> ReturnUnagreed -> SkipNonfiniteMembers ->
  // PackAndHandOff (BuildPack, SendPack; the wire stage publishes each pack) -> PublishUnpacked.
  // `group` is the plan group (static plan) or this node's offer (`agreed`), `candidates` its
  // candidates.
  void ProcessGroup(const std::vector<EngineBucket*>& group,
                    const std::vector<MergeCandidate>& candidates, bool agreed);
  // The members offered (up to the window) and this node's words for the group round.
  void GatherGroupInputs(GroupPass& x);
  // Each offered member's local reduce with the finite check (or the sum an earlier round left);
  // a non-finite input shortens an agreed merger's offer.
  void ReduceGroup(GroupPass& x);
  // Member i's local reduce, or the sum an earlier round left in place; *first_bad as in
  // ReduceLocalChecked.
  absl::Status ReduceMember(GroupPass& x, size_t i, size_t* first_bad);
  // The group round: x.m members agreed and x.status (a failed round fails the head only).
  void AgreeGroup(GroupPass& x);
  // Members offered past the agreed m go back to waiting.
  void ReturnUnagreed(GroupPass& x);
  // Per agreed member: its status and whether it runs (the non-finite policy).
  void SkipNonfiniteMembers(GroupPass& x);
  // The density in effect, the plan agreement when due, the packs, each built and handed off.
  void PackAndHandOff(GroupPass& x);
  // Pack [first, first + len) of the agreed members: the ones that run, their items and records.
  std::unique_ptr<WirePack> BuildPack(GroupPass& x, size_t first, size_t len,
                                      const std::vector<double>& density);
  // The pack's local half (FusedExchange::Prepare unless it selects behind), the measuring
  // merger's observations, the hand-off. `local_since`: when this pack's local work began.
  void SendPack(GroupPass& x, std::unique_ptr<WirePack> p, uint64_t* local_since);
  // The members no pack publishes (skipped or failed), published here after the wire drained.
  void PublishUnpacked(GroupPass& x);

  // Hands `event` for an exchange of `elements` published with `code` to every observer: its
  // record, its span from `begin_ns`, and the publish phase from `publish_ns` to `end_ns`.
  void NotifyObservers(ExchangeEvent* event, const ExchangeRecord& rec, absl::StatusCode code,
                       bool terminal, uint64_t elements, uint64_t begin_ns, uint64_t publish_ns,
                       uint64_t end_ns);

  // The wire stage (--merge_overlap; engine_wire_stage.cc over wire_stage.h's WireStage). A
  // packed group prepared by the group pass (members reduced and selected,
  // FusedExchange::Prepare) goes to RunPack: on the wire thread when overlapping, inline
  // otherwise. At most one pack is on the wire while the engine thread prepares the next.
  // RunPack returns the commit vote (each member's result is already published).
  absl::Status RunPack(WirePack* p);  // the collectives, the commit vote, publishing
  void HandOff(std::unique_ptr<WirePack> p);
  // The wire stage's completion callback (wire thread, after wire_.Busy() cleared): wakes the
  // requests waiting on published_cv_ and the engine asleep on the doorbell.
  void WireDone();
  // When the last exchange (engine thread or wire stage) ended, `now` while a pack is on the
  // wire: an agreed merger's linger.
  int64_t LastExchangeEndLocked(int64_t now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A measuring merger's plan agreement (after a group round whose plan_due came out set, on
  // every node): the registered buckets, this node's inputs, RunPlanAgreement, InstallPlan (or
  // AbandonPlan when the nodes' buckets differ). `step` is the head's, `density` its density.
  void AgreePlan(uint64_t step, double density);
  // Selection behind: the pack's BehindGroup (kept per first member while its members, sizes
  // and compressor stay), or null when the pack is not eligible (it then selects ahead).
  BehindGroup* BehindFor(WirePack* p);
  // Waits until no pack is on the wire (before anything else touches buckets or collectives
  // in a way a pack in flight could see).
  void DrainWire();
  // Logs a WARNING once per episode when a group has waited more than 10 s for a member while
  // others were ready (`waiting`).
  void WarnSlowGroup(const std::vector<EngineBucket*>& group, bool waiting);
  // Publishes the sticky error of a failed bucket for its next step (no communication: every
  // node failed the bucket alike).
  void PublishFailed(EngineBucket* b);
  void Publish(EngineBucket* b, uint64_t step, const absl::Status& status,
               const ExchangeRecord& rec, bool terminal);
  void ApplyDensityLocked(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool UseSparse(EngineBucket* b, uint64_t step, const Control& control);
  // --sparse_allreduce=auto: sets the bucket's exchange for this sparse step (the probe's
  // alternation, or the choice once the probe is done).
  void ChooseSparseAllreduce(EngineBucket* b, const Control& control);
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RegisterBucket in stages (engine_requests.cc): ParseRegistration (the request alone, no
  // lock) -> FindOrCreateBucketLocked (the limits, a new bucket) -> CheckSameBucketLocked (an
  // existing bucket registered alike) -> AttachTrainerLocked (the trainer's slot) ->
  // GrantLocked (where the trainer finds its memory).
  struct BucketRequest;
  absl::Status ParseRegistration(uint64_t bucket_id, uint64_t elements,
                                 const std::string& compressor, double density,
                                 const std::map<std::string, std::string>& params, int device,
                                 BucketRequest* req) const;
  absl::StatusOr<EngineBucket*> FindOrCreateBucketLocked(const Session& session,
                                                         const BucketRequest& req, bool* created)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckSameBucketLocked(const EngineBucket& b, const BucketRequest& req,
                                     uint32_t rank) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Places local trainer `session`'s slot and counts it registered (a no-op when it is); the
  // bucket may have been replaced while an exchange finished (the one returned is current).
  absl::StatusOr<EngineBucket*> AttachTrainerLocked(Session* session, const BucketRequest& req,
                                                    EngineBucket* b, bool created_here)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BucketGrant GrantLocked(const EngineBucket& b, uint32_t rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SaveBucketState/LoadBucketState's common part: the session's bucket once it is between
  // steps for that trainer (waits for a publish in progress), or why not.
  absl::StatusOr<EngineBucket*> BucketBetweenStepsLocked(uint64_t session_id, uint64_t bucket_id,
                                                         const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The memory and count limits for `session` registering bucket `bucket_id` (`existing` when
  // another trainer created it already) of `dtype` on GPU `device` (-1: home; a buffer there
  // counts too); RESOURCE_EXHAUSTED naming the limit and its flag.
  absl::Status CheckLimitsLocked(const Session& session, const EngineBucket* existing,
                                 uint64_t bucket_id, uint64_t elements,
                                 const std::string& compressor, DType dtype, int device)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Notices trainers that died without Goodbye: frees their sessions and marks their local
  // ranks dead for the rest of the job (the steps they left fail on every node, naming them).
  void ReapDeadTrainersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeEverybody();

  const EngineOptions options_;
  std::string oktopk_key_;  // the control round's name of Ok-Topk with its flags (constructor)
  std::string auto_key_;    // ... and of auto ("auto " + oktopk_key_)
  // --auto_decide=model: the link the cost model uses, agreed by every node the first time a
  // bucket asks (exchange_choice.h: AgreeOnLink). Engine thread only.
  absl::StatusOr<LinkModel> model_link_ = absl::UnknownError("not measured");
  bool model_link_asked_ = false;
  Collective* const collective_;
  // The step's buckets still to come from the trainers, which collective_'s waits ask about
  // (Collective::SetComputeProbe). Filled under mu_ with each pick; read by the engine thread.
  PendingInputs pending_inputs_;
  Primitives* const prims_;  // the buckets' data (device memory on the device path)
  const DevicePath device_;
  const BucketIO io_;  // a bucket's inputs and outputs around its step (engine and wire threads)
  StepEnv env_;
  struct Limits {
    uint64_t bucket = 0, session = 0, daemon = 0;
  } limits_;  // resolved at Start()

  mutable absl::Mutex mu_;
  absl::CondVar published_cv_;  // signalled after every publish and on stop
  SessionRegistry sessions_ ABSL_GUARDED_BY(mu_);
  BucketTable buckets_ ABSL_GUARDED_BY(mu_);
  Doorbell doorbell_;  // segment() and Ring() from any thread; the rest under mu_
  std::unique_ptr<Scheduler> scheduler_ ABSL_GUARDED_BY(mu_);
  Merger* merger_ = nullptr;  // the scheduler's (set at Start); engine and wire threads
  bool reset_pending_ ABSL_GUARDED_BY(mu_) = false;   // every session left: drop the buckets
  uint64_t job_generation_ ABSL_GUARDED_BY(mu_) = 0;  // counts ResetLocked (a new job's buckets)
  bool processing_ ABSL_GUARDED_BY(mu_) = false;      // the engine thread is inside a step
  // When the last exchange on the engine thread ended; an agreed merger's linger counts from it
  // or the wire stage's last_done_ns(), whichever is later (LastExchangeEndLocked).
  int64_t last_exchange_end_ns_ ABSL_GUARDED_BY(mu_) = 0;
  Collective* wire_coll_ = nullptr;
  StepEnv wire_env_;  // env_ over wire_coll_
  // The wire stage (wire_stage.h): its own thread, slot and lock; runs RunPack. A bucket is not
  // erased while wire_.Busy() (as while processing_).
  WireStage wire_;
  uint64_t total_exchanges_ ABSL_GUARDED_BY(mu_) = 0;
  // Checkpoint streams' memory (ReserveCheckpointBytes): every stream's, and per session.
  uint64_t checkpoint_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, uint64_t> checkpoint_session_bytes_ ABSL_GUARDED_BY(mu_);
  std::function<void()> save_copied_hook_;
  uint64_t density_version_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t density_key_ ABSL_GUARDED_BY(mu_) = 0;          // this node's newest change
  uint64_t applied_density_key_ ABSL_GUARDED_BY(mu_) = 0;  // the change in effect
  uint64_t dead_mask_ ABSL_GUARDED_BY(mu_) = 0;  // local ranks whose trainer died (this job)
  uint64_t dead_word_[kMaxLocalTrainers] ABSL_GUARDED_BY(mu_) = {};  // DeadTrainerWord per rank
  uint64_t last_reap_ns_ = 0;                                        // engine thread only
  // Selection behind: per plan group's first member; engine thread (a pack on the wire uses
  // one, so an entry is replaced or dropped only after DrainWire).
  std::map<uint64_t, std::unique_ptr<BehindGroup>> behind_groups_;
  uint64_t behind_generation_ = 0;  // the job_generation_ behind_groups_ belong to (engine thread)
  FusedScratch fused_scratch_[2];   // alternate packs: one on the wire, one being prepared
  int next_scratch_ = 0;            // engine thread only
  uint64_t slow_since_ns_ = 0, slow_head_ = 0, slow_step_ = 0;  // engine thread only
  bool slow_warned_ = false;                                    // engine thread only

  std::atomic<uint64_t> reduces_reused_{0};  // written by the engine thread
  std::atomic<bool> stop_{false};
  absl::Mutex stopped_mu_;
  bool stopped_ ABSL_GUARDED_BY(stopped_mu_) = false;
  std::thread thread_;
};

}  // namespace spex
