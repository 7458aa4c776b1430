// What the dense and the sparse step see: the collaborators of one node (a Collective, the
// bucket memory's Primitives, host Primitives for wire messages) and, per bucket, its memory and
// its sparse state. The steps are written only against these, as gloo's algorithms see only a
// context and pairs; the engine owns scheduling, agreement and publishing.
//
// A step is given a group of buckets (today one per exchange: the merger is `none`). Lockstep:
// every node must issue the same collectives in the same order, so a step never returns early
// after a local failure once its collectives have begun: it goes on issuing them (with an empty
// contribution), records the first failure in the item's status, and the engine's commit vote
// (AgreeOnAllNodes) then fails the step on every node alike.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/engine/exchange_record.h"
#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/wire.h"
#include "daemon/transport/collective.h"
#include "kernels/compressor.h"
#include "kernels/half.h"
#include "kernels/primitives.h"
#include "proto/contract/layout.h"

namespace spex {

struct StepEnv {
  Collective* coll = nullptr;
  Primitives* prims = nullptr;       // the buckets' memory (device primitives on the GPU path)
  Primitives* host_prims = nullptr;  // host memory: the sparse exchange's wire messages
  int local_trainers = 1;
  bool error_feedback = true;
  bool fp16_values = false;  // a float32 bucket's sparse values as float16 (patterns A and B)
  IndexEncoding index_encoding = IndexEncoding::kDelta;  // --wire_index_encoding (wire.h)
  int residual_norm_every = 10;
};

// A bucket's memory, fixed after registration; every pointer is in StepEnv::prims' memory.
struct BucketData {
  uint64_t id = 0;
  size_t elements = 0;
  float* input[kMaxLocalTrainers] = {};  // the local trainers' input slots (float32 buckets)
  float* output = nullptr;  // a half bucket's: float32 staging, rounded into half_output
  // A bfloat16/float16 bucket (docs/dtypes.md): the trainers' input slots and the published
  // output are of `dtype` (input[] stays null); ReduceLocalChecked widens the inputs into
  // float32, the steps work on float32 (`output` is float32 staging: host memory on the CPU
  // path, device scratch on the device path), and the engine rounds `output` once into
  // `half_output` (RoundOutput: before publishing, and on the device path before the output
  // event). `wire`: the type of the values on the wire (dtype, or float32 with
  // wire_values=float32).
  DType dtype = DType::kFloat32;
  DType wire = DType::kFloat32;
  const uint16_t* half_input[kMaxLocalTrainers] = {};
  uint16_t* half_output = nullptr;
  // The dense half exchange wrote this step's result into half_output directly (`output` is
  // then stale): RoundOutput skips it. Reset by every step's ReduceLocalChecked.
  mutable bool half_output_ready = false;
  // ReduceLocalChecked rounded this step's local sum straight into half_output (a dense half
  // bucket whose wire is its type, on the host, several nodes, asked for by the caller):
  // DenseStep exchanges it there in place (HalfAllReduceInPlace) and `output` is not written.
  mutable bool half_sum_in_output = false;
  float* acc = nullptr;  // dense with L > 1: the local sum; sparse: residual + local sum
  // A sparse bucket on the host path with error feedback: where ReduceLocalChecked writes
  // residual + local sum, so the residual in acc survives a step that is skipped; the two swap
  // when the step goes ahead (CommitLocalSum). Null otherwise.
  float* acc_next = nullptr;
  bool on_device = false;
  Scratch* scratch = nullptr;  // device: uploads of indices and values (else null)
  // Set once a process shrank the bucket's shared segment under the daemon (segment_guard.h):
  // the inputs read since are zeros, so ReduceLocalChecked fails the step. Null: unguarded.
  const std::atomic<bool>* pulled = nullptr;
  // Local trainer r's own memory as its input (bucket.h BucketMemory::own_input): set once the
  // trainer shrank that file under the daemon, which fails the step like `pulled`. Null: r's
  // input is its slot in the segment (or unguarded).
  const std::atomic<bool>* input_pulled[kMaxLocalTrainers] = {};
};

// The type a sparse exchange's values travel as (asked for: a chunk whose values do not all fit
// goes as float32, wire.h ValuesWire): a half bucket's own type, float16 for a float32 bucket
// under --fp16_values, else float32.
inline DType SparseValuesWire(const StepEnv& env, const BucketData& b) {
  return IsHalf(b.wire) ? b.wire : env.fp16_values ? DType::kFloat16 : DType::kFloat32;
}

// A sparse bucket's state across steps (engine thread only).
struct SparseState {
  std::unique_ptr<Compressor> compressor;
  Selection sel;                  // reused every step
  std::vector<uint32_t> touched;  // output positions the last sparse step wrote
  bool output_dense = true;       // the output holds a dense result: zero it fully first
  bool oktopk = false;            // pattern B through ExchangeOkTopk (--sparse_allreduce=oktopk)
  OkTopkOptions oktopk_options;   // identical on every node; k is set per step from the density
  OkTopkState oktopk_state;       // threshold, regions, exchange count (identical on every node)
  double last_residual_norm = 0;
  uint64_t last_residual_norm_step = 0;
};

// One bucket's part in a step: in, the bucket and the density in effect; out, its record and
// the first failure.
struct StepItem {
  BucketData* data = nullptr;
  SparseState* sparse = nullptr;  // null: a dense-only bucket
  uint64_t step = 0;
  double density = 1.0;
  ExchangeRecord* rec = nullptr;
  // The first failure. The steps do no local reduce: the caller ran it before the step (the
  // engine's Engine::ReduceLocal, before the control round, then CommitLocalSum; elsewhere
  // ReduceForStep), and a failure of that reduce comes in here (the step still issues its
  // collectives, contributing nothing).
  absl::Status status;
  // Set by the fused steps: this member's Select time in ns (0 for a dense member).
  int64_t select_ns = 0;
};

// Closes the current phase of the exchange (adds the time since the previous lap to it).
using Lap = std::function<void(Phase)>;

// acc = sum of the local inputs (+ acc itself when add_to_acc). The order of additions (acc,
// then input 0, 1, ...) is the same on every path, so results are too.
absl::Status LocalReduce(const StepEnv& env, const BucketData& b, bool add_to_acc);

// The local reduce the engine runs on the host path once the inputs are ready and BEFORE the
// control round, so that every node learns of a NaN/+-Inf before any collective of the step (the
// non-finite policy). It mutates nothing a skipped step must keep, and fuses the finite check
// into its one pass (Primitives::SumScaledCheckFinite) when `check` is set:
//  - a sparse bucket (`sparse`): acc_next = acc (the residual) + the inputs with error
//    feedback, else acc = the inputs' sum;
//  - a dense-only bucket: output = the inputs' sum, times 1 / (nodes x local trainers) when that
//    is a power of two (exact; DenseStep then all-reduces the output in place).
//  - with `half_in_output`, a dense-only half bucket on the host whose wire is its type, on
//    several nodes: that sum rounded once into half_output instead (b.half_sum_in_output), the
//    float32 sum never stored (the finite check is on it all the same).
// *first_bad: the lowest index whose sum is NaN or +-Inf; b.elements when none or unchecked.
// `hist` (a sparse float32 bucket's checked sum on the host): the compressor's plan
// (Compressor::PlanSumHistogram), counted in the sum's pass and marked counted when it succeeds.
absl::Status ReduceLocalChecked(const StepEnv& env, const BucketData& b, bool sparse, bool check,
                                size_t* first_bad, bool half_in_output = false,
                                SumHistogram* hist = nullptr);
// The step goes ahead: residual + local sum becomes acc (a swap with acc_next, whose memory
// takes the next step's sum). No-op without acc_next.
void CommitLocalSum(BucketData* b);
// The local reduce every step expects done, for callers of the steps other than the engine
// (tests, benchmarks): ReduceLocalChecked (unchecked) and CommitLocalSum, or, for a sparse
// bucket with error feedback and no acc_next, LocalReduce adding to the residual in acc. A
// failure goes into item.status.
void ReduceForStep(const StepEnv& env, StepItem& item);
// The lowest local rank whose input is NaN or +-Inf at `index`, or -1 when all are finite there
// (their sum overflowed). The cold path after ReduceLocalChecked found one; on the device path
// it reads one float per trainer back to the host.
int NonfiniteInput(const StepEnv& env, const BucketData& b, size_t index);

// A pattern-D exchange's record of n elements on `nodes` nodes (bytes, counts, pattern), with
// values of `wire` on the wire.
void RecordDense(size_t n, int nodes, ExchangeRecord* rec, DType wire = DType::kFloat32);
// A half bucket: its float32 output rounded once into the published half output by `prims`
// (the bucket memory's: on the device path a device pass); a no-op for a float32 bucket and
// when the dense half exchange wrote the half output already. The engine calls it before
// publishing a step that went ahead (device path: before recording the output event).
absl::Status RoundOutput(Primitives* prims, BucketData& b);

// After a bucket's sparse exchange (SparseStep's, or a sparse member's of the fused step): the
// record, the residual cleared at the union (pattern A) or wholly without error feedback, the
// compressor's Update, the touched positions and the residual norm. `s` is the item's first
// failure so far (its incoming status included); the item's status becomes it.
struct SparseExchangeResult;
void FinishSparseExchange(const StepEnv& env, StepItem& item, absl::Status s,
                          SparseExchangeResult* res, const Lap& lap);

// Pattern D for every item: local sum (with the residual for sparse buckets), sum-all-reduce,
// scale by 1 / (nodes x local trainers); a sparse bucket's residual is cleared.
void DenseStep(const StepEnv& env, absl::Span<StepItem> group, const Lap& lap);

// The sparse exchange for every item: residual + local sum, the compressor's selection, the
// exchange by its pattern (A, or B: all-gather, or Ok-Topk where SparseState::oktopk), the
// residual update and the compressor's Update.
void SparseStep(const StepEnv& env, absl::Span<StepItem> group, const Lap& lap);

}  // namespace spex
