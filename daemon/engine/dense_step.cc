// Pattern D (see step.h), and the local reduces.
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/half_exchange.h"
#include "daemon/engine/step.h"

namespace spex {
namespace {

bool PowerOfTwo(int x) { return (x & (x - 1)) == 0; }

}  // namespace

absl::Status LocalReduce(const StepEnv& env, const BucketData& b, bool add_to_acc) {
  const size_t n = b.elements;
  if (IsHalf(b.dtype)) {  // on the bucket's device (kernels/half.h's pass on the host)
    return env.prims->SumWidenHalf(b.dtype, b.acc, add_to_acc ? b.acc : nullptr, b.half_input,
                                   env.local_trainers, 1.0f, n, nullptr);
  }
  if (!add_to_acc) return env.prims->SumScaled(b.acc, b.input, env.local_trainers, 1.0f, n);
  for (int r = 0; r < env.local_trainers; ++r) env.prims->Accumulate(b.acc, b.input[r], n);
  return absl::OkStatus();
}

absl::Status ReduceLocalChecked(const StepEnv& env, const BucketData& b, bool sparse, bool check,
                                size_t* first_bad, bool half_in_output, SumHistogram* hist) {
  const int local = env.local_trainers, N = env.coll->size();
  const size_t n = b.elements;
  *first_bad = n;
  const float* xs[kMaxLocalTrainers + 1];
  int count = 0;
  float* y;
  float scale = 1.0f;
  if (sparse && b.acc_next != nullptr) {
    xs[count++] = b.acc;  // the residual first: the rounding of LocalReduce(add_to_acc)
    y = b.acc_next;
  } else if (sparse) {
    y = b.acc;
  } else {
    y = b.output;
    if (PowerOfTwo(N * local)) scale = 1.0f / static_cast<float>(N * local);
  }
  absl::Status s;
  b.half_output_ready = false;  // a new step's result comes
  b.half_sum_in_output =
      half_in_output && !sparse && IsHalf(b.dtype) && b.wire == b.dtype && !b.on_device && N > 1;
  if (b.half_sum_in_output) {
    // Rounded as HalfAllReduceScaled would round it, in the same pass as the sum and the check:
    // no float32 staging and no separate narrowing pass (kernels/half.h SumWidenNarrow).
    const size_t bad =
        half::SumWidenNarrow(b.dtype, b.half_output, nullptr, b.half_input, local, scale, n, check);
    if (check) *first_bad = bad;
  } else if (IsHalf(b.dtype)) {
    // The trainers' half inputs widened and summed in float32, in the order of the float32
    // path (the residual first), in one pass (kernels/half.h; on the device, half.cu).
    s = env.prims->SumWidenHalf(b.dtype, y, count > 0 ? xs[0] : nullptr, b.half_input, local, scale,
                                n, check ? first_bad : nullptr);
  } else {
    for (int r = 0; r < local; ++r) xs[count++] = b.input[r];
    if (check && sparse && hist != nullptr && !b.on_device) {
      s = env.prims->SumScaledCheckFiniteHistogram(y, xs, count, scale, n, first_bad, hist->range);
      hist->counted = s.ok();
    } else {
      s = check ? env.prims->SumScaledCheckFinite(y, xs, count, scale, n, first_bad)
                : env.prims->SumScaled(y, xs, count, scale, n);
    }
  }
  if (b.pulled != nullptr && b.pulled->load(std::memory_order_acquire)) {
    return absl::DataLossError(absl::StrCat(
        "bucket ", b.id,
        ": a process of this node shrank the bucket's shared segment (ftruncate) while spexd "
        "used it; its inputs are gone, so every step of this bucket fails. End the job and find "
        "the trainer that truncated /dev/shm memory (spexd serves the next job)"));
  }
  for (int r = 0; r < local; ++r) {
    if (b.input_pulled[r] != nullptr && b.input_pulled[r]->load(std::memory_order_acquire)) {
      return absl::DataLossError(absl::StrCat(
          "bucket ", b.id, ": local trainer ", r,
          " shrank the memory it handed spexd as its input (own_input) while spexd read it; its "
          "inputs are gone, so every step of this bucket fails. Do not resize or truncate a "
          "bucket's memory while it is registered"));
    }
  }
  return s;
}

void CommitLocalSum(BucketData* b) {
  if (b->acc_next != nullptr) std::swap(b->acc, b->acc_next);
}

void ReduceForStep(const StepEnv& env, StepItem& item) {
  BucketData& b = *item.data;
  const bool sparse = item.sparse != nullptr;
  absl::Status s;
  if (sparse && env.error_feedback && b.acc_next == nullptr) {
    s = LocalReduce(env, b, /*add_to_acc=*/true);
  } else {
    size_t first_bad;
    s = ReduceLocalChecked(env, b, sparse, /*check=*/false, &first_bad);
    if (s.ok()) CommitLocalSum(&b);
  }
  if (item.status.ok()) item.status = s;
}

int NonfiniteInput(const StepEnv& env, const BucketData& b, size_t index) {
  for (int r = 0; r < env.local_trainers; ++r) {
    float v = 0;
    if (IsHalf(b.dtype)) {
      uint16_t h = 0;
      if (!b.on_device) {
        h = b.half_input[r][index];
      } else if (!env.prims->CopyToHost(&h, b.half_input[r] + index, sizeof(h)).ok()) {
        return -1;
      }
      v = HalfToFloat(b.dtype, h);
    } else if (b.on_device) {  // one float from the trainer's device slot
      if (!env.prims->CopyToHost(&v, b.input[r] + index, sizeof(v)).ok()) return -1;
    } else {
      v = b.input[r][index];
    }
    if (!std::isfinite(v)) return r;
  }
  return -1;
}

void RecordDense(size_t n, int nodes, ExchangeRecord* rec, DType wire) {
  // A ring all-reduce's traffic per node: 2 (N - 1) / N of the buffer each way (so is the half
  // exchange's reduce-scatter and all-gather, half_exchange.h).
  rec->bytes_sent = rec->bytes_received = DenseWireBytes(n, nodes, wire);
  rec->gathered_elements = rec->selected_elements = n;
  rec->pattern = "D";
}

void DenseStep(const StepEnv& env, absl::Span<StepItem> group, const Lap& lap) {
  const int local = env.local_trainers, N = env.coll->size();
  for (StepItem& item : group) {
    BucketData& b = *item.data;
    const size_t n = b.elements;
    float scale = 1.0f / static_cast<float>(N * local);
    absl::Status s;
    // The local sum, reduced before the step (its failure, if any, is item.status): acc for a
    // sparse bucket (committed; going dense this step, it sends everything, residual included),
    // else the output, scaled already when N * local is a power of two (exact, barring subnormal
    // results: the collective then reduces in place with scale 1, no separate scaling pass and
    // no copy of the send buffer inside MPI_Allreduce).
    const float* src = item.sparse != nullptr ? b.acc : b.output;
    if (item.sparse == nullptr && PowerOfTwo(N * local)) scale = 1.0f;
    lap(Phase::kReduceLocal);
    // Issued even after a local failure (lockstep); the commit vote fails the step everywhere.
    // A half bucket: half values on the wire, and the result straight into the trainers' half
    // output (a sparse bucket's float32 output is kept too: its next sparse step reads it).
    // On the device path the half values are rounded and widened on the device, and only they
    // cross to the host and back (HalfAllReduceScaledOnDevice).
    const bool direct = IsHalf(b.wire) && N > 1 && b.wire == b.dtype && item.sparse == nullptr;
    absl::Status c;
    if (b.half_sum_in_output) {
      // The local sum is in the trainers' half output already, rounded: exchanged there.
      c = HalfAllReduceInPlace(env.coll, b.wire, b.half_output, n, scale);
    } else if (IsHalf(b.wire) && N > 1) {
      float* recv = direct ? nullptr : b.output;
      uint16_t* half_out = direct ? b.half_output : nullptr;
      c = b.on_device
              ? HalfAllReduceScaledOnDevice(env.coll, env.prims, b.scratch, b.wire, src, recv, n,
                                            scale, nullptr, half_out)
              : HalfAllReduceScaled(env.coll, b.wire, src, recv, n, scale, nullptr, half_out);
    } else {
      c = env.coll->AllReduceScaled(src, b.output, n, scale);
    }
    if (c.ok() && s.ok() && item.sparse != nullptr && IsHalf(b.wire) && N > 1 &&
        !std::isfinite(env.prims->AccumulateMoments(b.output, nullptr, n, -1.0f, false).sum)) {
      // A sparse bucket's residual and local sum are finite (checked), so a non-finite result
      // is the unscaled sum of some node narrowed past the type's range (or an average past
      // it). Every node holds the same result and decides alike: the residual goes again as
      // float32, scaled first (as DDP divides before it sums), never as an infinity.
      env.prims->Scale(b.acc, scale, n);
      c = env.coll->AllReduceScaled(b.acc, b.output, n, 1.0f);
    }
    b.half_output_ready = direct && c.ok();
    if (s.ok()) s = c;
    lap(Phase::kCollective);
    if (item.sparse != nullptr) {  // nothing left behind
      if (absl::Status f = env.prims->Fill(b.acc, 0.0f, n); s.ok()) s = f;
      item.sparse->output_dense = true;
      item.sparse->touched.clear();
    }
    RecordDense(n, N, item.rec, b.wire);
    if (item.status.ok()) item.status = s;
  }
}

absl::Status RoundOutput(Primitives* prims, BucketData& b) {
  if (b.half_output_ready) {  // the dense half exchange wrote it already
    b.half_output_ready = false;
    return absl::OkStatus();
  }
  if (!IsHalf(b.dtype)) return absl::OkStatus();
  return prims->NarrowHalf(b.dtype, b.output, b.half_output, b.elements);
}

}  // namespace spex
