// Pattern D (see step.h).
#include "absl/strings/str_cat.h"
#include "daemon/engine/step.h"

namespace spex {

absl::Status LocalReduce(const StepEnv& env, const BucketData& b, bool add_to_acc) {
  const size_t n = b.elements;
  if (!add_to_acc) return env.prims->SumScaled(b.acc, b.input, env.local_trainers, 1.0f, n);
  for (int r = 0; r < env.local_trainers; ++r) env.prims->Accumulate(b.acc, b.input[r], n);
  return absl::OkStatus();
}

void DenseStep(const StepEnv& env, absl::Span<StepItem> group, const Lap& lap) {
  const int L = env.local_trainers, N = env.coll->size();
  for (StepItem& item : group) {
    BucketData& b = *item.data;
    const size_t n = b.elements;
    const float* src = b.input[0];
    float scale = 1.0f / static_cast<float>(N * L);
    absl::Status s;
    if (item.sparse != nullptr) {
      // A sparse bucket going dense this step sends everything, residual included.
      s = LocalReduce(env, b, env.error_feedback);
      src = b.acc;
    } else if (((N * L) & (N * L - 1)) == 0) {
      // N * L a power of two: scaling is exact (barring subnormal results), so sum(scale * x)
      // == scale * sum(x) bit for bit. One fused pass writes the scaled local sum into the
      // output, and the collective reduces in place: no separate scaling pass, and no copy of
      // the send buffer inside MPI_Allreduce.
      s = env.prims->SumScaled(b.output, b.input, L, scale, n);
      src = b.output;
      scale = 1.0f;
    } else if (L > 1) {
      s = LocalReduce(env, b, false);
      src = b.acc;
    }
    lap(Phase::kReduceLocal);
    // Issued even after a local failure (lockstep); the commit vote fails the step everywhere.
    absl::Status c = env.coll->AllReduceScaled(src, b.output, n, scale);
    if (s.ok()) s = c;
    lap(Phase::kCollective);
    if (item.sparse != nullptr) {  // nothing left behind
      if (absl::Status f = env.prims->Fill(b.acc, 0.0f, n); s.ok()) s = f;
      item.sparse->output_dense = true;
      item.sparse->touched.clear();
    }
    ExchangeRecord& rec = *item.rec;
    rec.bytes_sent = rec.bytes_received = N > 1 ? 2 * n * sizeof(float) * (N - 1) / N : 0;
    rec.gathered_elements = rec.selected_elements = n;
    rec.pattern = "D";
    if (item.status.ok()) item.status = s;
  }
}

}  // namespace spex
