// The fused exchange (daemon/engine/fused_step.h) over MPI, against the unmerged steps on the
// same inputs. Not a test by itself: mpi_fused_step_test.sh runs it under mpirun with 2 and 4
// ranks. Every rank checks, the verdicts are maxed, and rank 0 prints one line per check:
//   "mpi_fused_step: <check>: ok" or "mpi_fused_step: <check>: FAILED (<why>)".
// Checks (12 buckets: dense, micro, thresh (A), topk, dgc (B), and a sparse bucket exchanged
// densely; 4 steps each):
//  - dyadic data (every sum exact): every output and residual bit-identical;
//  - normal data: selections, residuals and B outputs bit-identical, D and A outputs within a
//    relative 1e-6 of the largest magnitude (MPI's summation order may depend on the message
//    length; the measured largest difference is printed).
// The unmerged side runs one control round and one step per bucket, the fused side one group
// round and one FusedStep, as the engine would.
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "daemon/engine/control_round.h"
#include "daemon/engine/fused_step.h"
#include "daemon/engine/group_round.h"
#include "daemon/transport/mpi_collective.h"
#include "kernels/compressor.h"

namespace spex {
namespace {

constexpr double kDensity = 0.01;

struct Spec {
  uint64_t id;
  size_t n;
  const char* compressor;  // "dense": a dense-only bucket
  MergeKind kind;
};

const Spec kSpecs[] = {
    {0, 20000, "topk", MergeKind::kPatternB},  {1, 4096, "dense", MergeKind::kDense},
    {2, 30000, "micro", MergeKind::kPatternA}, {3, 7001, "dgc", MergeKind::kPatternB},
    {4, 50000, "dense", MergeKind::kDense},    {5, 12000, "thresh", MergeKind::kPatternA},
    {6, 999, "topk", MergeKind::kPatternB},    {7, 25000, "dgc", MergeKind::kDense},
    {8, 16384, "micro", MergeKind::kPatternA}, {9, 40000, "topk", MergeKind::kPatternB},
    {10, 3000, "dense", MergeKind::kDense},    {11, 9000, "micro", MergeKind::kPatternA},
};

struct Bucket {
  Spec spec;
  std::vector<float> in, out, acc;
  BucketData data;
  std::unique_ptr<SparseState> sparse;
  ExchangeRecord rec;
};

std::vector<std::unique_ptr<Bucket>> MakeBuckets(int rank, int nodes, Primitives* prims) {
  std::vector<std::unique_ptr<Bucket>> out;
  for (const Spec& s : kSpecs) {
    auto b = std::make_unique<Bucket>();
    b->spec = s;
    b->in.assign(s.n, 0.0f);
    b->out.assign(s.n, 0.0f);
    b->acc.assign(s.n, 0.0f);
    b->data.id = s.id;
    b->data.elements = s.n;
    b->data.input[0] = b->in.data();
    b->data.output = b->out.data();
    b->data.acc = b->acc.data();
    if (std::string(s.compressor) != "dense") {
      CompressorSpec cs;
      cs.name = s.compressor;
      cs.density = kDensity;
      cs.node_rank = rank;
      cs.node_count = nodes;
      cs.elements = s.n;
      auto c = MakeCompressor(cs, prims);
      if (!c.ok()) {
        std::fprintf(stderr, "mpi_fused_step: %s\n", c.status().ToString().c_str());
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      b->sparse = std::make_unique<SparseState>();
      b->sparse->compressor = std::move(*c);
    }
    out.push_back(std::move(b));
  }
  return out;
}

void WriteInputs(Bucket* b, int rank, uint64_t step, bool dyadic) {
  std::mt19937 gen(static_cast<uint32_t>((rank * 131 + b->spec.id) * 1009 + step));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> integer(-4096, 4096);
  for (float& x : b->in)
    x = dyadic ? std::ldexp(static_cast<float>(integer(gen)), -8) : normal(gen);
}

StepItem Item(Bucket* b, uint64_t step) {
  StepItem item;
  item.data = &b->data;
  item.sparse = b->sparse.get();
  item.step = step;
  item.density = kDensity;
  item.rec = &b->rec;
  return item;
}

bool Fail(std::string* why, const std::string& what) {
  if (why->empty()) *why = what;
  return false;
}

// Unmerged: one control round and one step per bucket, as the engine runs them today.
absl::Status Unmerged(const StepEnv& env, std::vector<std::unique_ptr<Bucket>>& bs, uint64_t step) {
  for (auto& b : bs) {
    Control control;
    absl::Status s =
        RunControlRound(env.coll, {b->spec.id, step, b->spec.n, b->spec.compressor}, &control);
    if (!s.ok()) return s;
    StepItem item = Item(b.get(), step);
    ReduceForStep(env, item);
    if (b->spec.kind == MergeKind::kDense) {
      DenseStep(env, absl::MakeSpan(&item, 1), [](Phase) {});
    } else {
      SparseStep(env, absl::MakeSpan(&item, 1), [](Phase) {});
    }
    if (!item.status.ok()) return item.status;
  }
  return absl::OkStatus();
}

// Fused: one group round and one FusedStep for all of them.
absl::Status Fused(const StepEnv& env, std::vector<std::unique_ptr<Bucket>>& bs, uint64_t step,
                   FusedScratch* scratch) {
  std::vector<GroupMemberKey> keys;
  std::vector<StepItem> items;
  std::vector<MergeKind> kinds;
  for (auto& b : bs) {
    keys.push_back({b->spec.id, step, b->spec.n, b->spec.compressor, b->spec.kind, false});
    items.push_back(Item(b.get(), step));
    ReduceForStep(env, items.back());
    kinds.push_back(b->spec.kind);
  }
  GroupRoundInput in;
  in.config = {"rgmerge", kGroupRoundMaxWindow, uint64_t{16} << 20, 1};
  in.offer = keys;
  GroupRoundResult res;
  if (absl::Status s = RunGroupRound(env.coll, in, &res); !s.ok()) return s;
  if (res.agreed != bs.size()) return absl::InternalError("the round agreed on fewer buckets");
  FusedStep(env, absl::MakeSpan(items), kinds, scratch, [](Phase) {});
  for (const StepItem& item : items) {
    if (!item.status.ok()) return item.status;
  }
  return absl::OkStatus();
}

// Returns whether fused == unmerged under the rules above; *max_rel: the largest relative
// difference of a D or A output.
bool Equality(Collective* coll, Primitives* prims, bool dyadic, double* max_rel, std::string* why) {
  const int rank = coll->rank(), nodes = coll->size();
  StepEnv env;
  env.coll = coll;
  env.prims = env.host_prims = prims;
  env.residual_norm_every = 1;
  auto ref = MakeBuckets(rank, nodes, prims), fused = MakeBuckets(rank, nodes, prims);
  FusedScratch scratch;
  bool ok = true;
  *max_rel = 0;
  for (uint64_t step = 0; step < 4; ++step) {
    for (size_t i = 0; i < ref.size(); ++i) {
      WriteInputs(ref[i].get(), rank, step, dyadic);
      WriteInputs(fused[i].get(), rank, step, dyadic);
    }
    if (absl::Status s = Unmerged(env, ref, step); !s.ok()) return Fail(why, s.ToString());
    if (absl::Status s = Fused(env, fused, step, &scratch); !s.ok()) return Fail(why, s.ToString());
    for (size_t i = 0; i < ref.size(); ++i) {
      const Bucket &a = *ref[i], &b = *fused[i];
      const std::string at =
          "bucket " + std::to_string(a.spec.id) + " step " + std::to_string(step);
      const size_t bytes = a.spec.n * sizeof(float);
      if (std::memcmp(a.acc.data(), b.acc.data(), bytes) != 0) ok = Fail(why, at + ": residual");
      if (a.sparse && a.sparse->sel.idx != b.sparse->sel.idx) ok = Fail(why, at + ": selection");
      if (std::memcmp(a.out.data(), b.out.data(), bytes) == 0) continue;
      if (dyadic || a.spec.kind == MergeKind::kPatternB) {
        ok = Fail(why, at + ": output not bit-identical");
        continue;
      }
      double peak = 0, diff = 0;
      for (size_t j = 0; j < a.spec.n; ++j) {
        peak = std::max(peak, static_cast<double>(std::fabs(a.out[j])));
        diff = std::max(diff, static_cast<double>(std::fabs(a.out[j] - b.out[j])));
      }
      const double rel = peak > 0 ? diff / peak : diff;
      *max_rel = std::max(*max_rel, rel);
      if (rel > 1e-6) ok = Fail(why, at + ": output differs by " + std::to_string(rel));
    }
  }
  return ok;
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) {
  spex::PreferRingIallreduce();  // as spexd does
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failures = 0;
  {
    std::unique_ptr<spex::Primitives> prims = spex::MakeCpuPrimitives(1);
    spex::MpiCollective coll(MPI_COMM_WORLD, prims.get());
    for (bool dyadic : {true, false}) {
      std::string why;
      double max_rel = 0;
      int bad = spex::Equality(&coll, prims.get(), dyadic, &max_rel, &why) ? 0 : 1;
      if (bad) std::fprintf(stderr, "mpi_fused_step: rank %d: %s\n", rank, why.c_str());
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, &max_rel, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      failures += bad;
      if (rank == 0) {
        std::printf("mpi_fused_step: %s data, %d ranks: %s (largest relative D/A difference %g)\n",
                    dyadic ? "dyadic" : "normal", size,
                    bad ? "FAILED (see the ranks' messages)" : "ok", max_rel);
      }
    }
  }
  std::fflush(stdout);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
