// The scale harness (docs/scale.md): spex's own exchange code, compiled unmodified with SimGrid's
// smpicxx by bench/scale/build.sh, run by smpirun on a simulated cluster of P nodes. spexd itself
// cannot run under SMPI (its engine thread, futex waits and gRPC would freeze the simulation), so
// each rank calls what the engine calls for one bucket from its main thread: the control round
// (RunControlRound), the exchange (MpiCollective::AllReduceScaled, HalfAllReduceInPlace,
// ExchangeSparseGather, ExchangeOkTopk) and the commit vote (AgreeOnAllNodes), and reports the
// simulated time of each. Peers (DDP's all-reduce in float32 and fp16 bytes, PowerSGD's three
// all-reduces) make the MPI calls those make, and stand-ins make the same MPI calls with the same
// byte counts as the real code where its memory grows as P^2 (pattern B keeps every node's chunk
// on every node) or its in-place buffers would be copied per rank by SMPI.
//
// Output: one JSON object on stdout from rank 0. Simulated times are the slowest rank's.
#include <mpi.h>
#include <smpi/smpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/half_exchange.h"
#include "daemon/engine/oktopk_exchange.h"
#include "daemon/engine/sparse_exchange.h"
#include "daemon/engine/wire.h"
#include "daemon/transport/agreement.h"
#include "daemon/transport/mpi_collective.h"
#include "kernels/reference/reference_primitives.h"
#include "kernels/splitmix.h"

namespace {

struct Args {
  std::string op = "dense";
  uint64_t n = 1 << 20;
  double density = 0.01;
  int steps = 1;
  std::string wire = "float32";  // float32 | bfloat16 | float16 (sparse values, dense_half type)
  bool control = true;           // control round and commit vote around spex's exchanges
  uint64_t seed = 1;
  uint64_t psgd[3] = {0, 0, 0};  // powersgd: uncompressed, P and Q floats
};

void Die(const char* what) {
  std::fprintf(stderr, "scale_harness: %s\n", what);
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto val = [&](const char* key) -> const char* {
      const size_t len = std::strlen(key);
      return s.compare(0, len, key) == 0 ? s.c_str() + len : nullptr;
    };
    if (const char* v = val("--op=")) {
      a.op = v;
    } else if (const char* v = val("--n=")) {
      a.n = std::strtoull(v, nullptr, 10);
    } else if (const char* v = val("--density=")) {
      a.density = std::strtod(v, nullptr);
    } else if (const char* v = val("--steps=")) {
      a.steps = std::atoi(v);
    } else if (const char* v = val("--wire=")) {
      a.wire = v;
    } else if (const char* v = val("--control=")) {
      a.control = std::atoi(v) != 0;
    } else if (const char* v = val("--seed=")) {
      a.seed = std::strtoull(v, nullptr, 10);
    } else if (const char* v = val("--psgd=")) {
      if (std::sscanf(v, "%lu,%lu,%lu", &a.psgd[0], &a.psgd[1], &a.psgd[2]) != 3)
        Die("--psgd= takes three float counts: uncompressed,P,Q");
    } else {
      std::fprintf(stderr, "scale_harness: unknown argument %s\n", argv[i]);
      Die("arguments: --op= --n= --density= --steps= --wire= --control= --seed= --psgd=");
    }
  }
  if (a.n == 0 || a.n > 0xffffffffull) Die("--n must be 1 .. 2^32-1 elements");
  if (!(a.density > 0 && a.density <= 1)) Die("--density must be in (0, 1]");
  if (a.steps < 1) Die("--steps must be >= 1");
  if (a.wire != "float32" && a.wire != "bfloat16" && a.wire != "float16")
    Die("--wire must be float32, bfloat16 or float16");
  return a;
}

spex::DType WireType(const std::string& w) {
  return w == "bfloat16"  ? spex::DType::kBFloat16
         : w == "float16" ? spex::DType::kFloat16
                          : spex::DType::kFloat32;
}

// This rank's k selected positions (sorted, distinct): one random position in each of k equal
// strata of [0, n), different on every node. (Selections of real gradients, skewed and partly
// shared between nodes, are not simulated yet.)
std::vector<uint32_t> Selection(const Args& a, uint64_t k, int rank) {
  std::vector<uint32_t> idx;
  idx.reserve(k);
  const double stride = static_cast<double>(a.n) / k;
  uint64_t state = spex::StepSeed(a.seed, rank, 0);
  for (uint64_t j = 0; j < k; ++j) {
    const uint64_t s = spex::SplitMix64(&state);
    const double u = (s >> 11) * (1.0 / 9007199254740992.0);
    uint64_t i = static_cast<uint64_t>((j + u) * stride);
    if (i >= a.n) i = a.n - 1;
    if (!idx.empty() && i <= idx.back()) i = idx.back() + 1;
    if (i >= a.n) break;
    idx.push_back(static_cast<uint32_t>(i));
  }
  return idx;
}

std::vector<float> Values(size_t m, int rank, uint64_t seed) {
  std::vector<float> v(m);
  uint64_t state = spex::StepSeed(seed, rank, 1);
  for (size_t j = 0; j < m; ++j) {
    const uint64_t s = spex::SplitMix64(&state);
    v[j] = static_cast<float>((static_cast<int64_t>(s >> 40) - (1 << 23)) * 1e-7);
  }
  return v;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "scale_harness: %s: %s\n", what, s.ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
}

void CheckMpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) Die(what);
}

struct Phase {
  double control = 0, exchange = 0, vote = 0;
};

struct Bytes {
  uint64_t sent = 0, received = 0;
};

// A buffer every rank shares (SMPI_SHARED_MALLOC: one physical copy, contents meaningless): the
// payloads whose values do not matter for the simulated time. SMPI keys a shared block by its
// call site, so each buffer has its own macro expansion (SEND_BUFFER, RECV_BUFFER).
struct Shared {
  explicit Shared(void* block) : p(block) {}
  ~Shared() { SMPI_SHARED_FREE(p); }
  void* p;
};
#define SEND_BUFFER(bytes) std::make_unique<Shared>(SMPI_SHARED_MALLOC(std::max<size_t>(bytes, 64)))
#define RECV_BUFFER(bytes) std::make_unique<Shared>(SMPI_SHARED_MALLOC(std::max<size_t>(bytes, 64)))

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, nodes = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nodes);
  const Args a = Parse(argc, argv);
  const uint64_t k = std::max<uint64_t>(1, static_cast<uint64_t>(std::floor(a.density * a.n)));
  const spex::DType wire = WireType(a.wire);
  spex::MpiCollective coll(MPI_COMM_WORLD);
  std::unique_ptr<spex::Primitives> prims = spex::MakeReferencePrimitives();

  const std::string& op = a.op;
  const bool spex_op = op == "dense" || op == "dense_half" || op == "dense_half_standin" ||
                       op == "gather" || op == "gather_standin" || op == "oktopk" ||
                       op == "oktopk_standin";
  const bool peer_op = op == "ddp" || op == "ddp_fp16" || op == "powersgd";
  if (!spex_op && !peer_op) {
    Die("--op must be dense, dense_half, dense_half_standin, gather, gather_standin, oktopk, "
        "oktopk_standin, ddp, ddp_fp16 or powersgd");
  }
  if (op == "dense_half" || op == "dense_half_standin") {
    if (wire == spex::DType::kFloat32) Die("--op=dense_half needs --wire=bfloat16 or float16");
  }

  // Inputs.
  std::vector<uint32_t> idx;
  std::vector<float> val;
  if (op == "gather" || op == "oktopk") {
    idx = Selection(a, k, rank);
    val = Values(idx.size(), rank, a.seed);
  }
  std::unique_ptr<Shared> send, recv;
  std::vector<uint64_t> standin_parts;  // oktopk_standin: this node's selected entries by owner
  const size_t c = (a.n + nodes - 1) / nodes;  // dense_half's chunk (the code's ChunkValues)
  if (op == "dense" || op == "ddp") {
    send = SEND_BUFFER(a.n * 4);
    recv = RECV_BUFFER(a.n * 4);
  } else if (op == "ddp_fp16") {
    send = SEND_BUFFER(a.n * 2);
    recv = RECV_BUFFER(a.n * 2);
  } else if (op == "dense_half") {
    send = SEND_BUFFER(c * nodes * 2);
  } else if (op == "dense_half_standin") {
    send = SEND_BUFFER(c * nodes * 2);
    recv = RECV_BUFFER(c * nodes * 2);
  } else if (op == "gather" || op == "oktopk") {
    recv = RECV_BUFFER(a.n * 4);  // `out`: the sum lands here (shared, unread)
  } else if (op == "gather_standin") {
    // Every node's chunk of k pairs (the code's ChunkBytes), gathered into one shared buffer.
    send = SEND_BUFFER(spex::ChunkBytes(k, IsHalf(wire)));
    recv = RECV_BUFFER(spex::ChunkBytes(k, IsHalf(wire)) * nodes);
  } else if (op == "oktopk_standin") {
    // The parts this node sends, by owner (its selection over equal regions), computed once; the
    // selection itself is not kept (1,024 nodes x k pairs would not fit).
    std::vector<uint32_t> sel = Selection(a, k, rank);
    const std::vector<uint32_t> bounds = spex::EqualRegions(static_cast<uint32_t>(a.n), nodes);
    standin_parts.assign(nodes, 0);
    int o = 0;
    for (uint32_t i : sel) {
      while (i >= bounds[o + 1]) ++o;
      ++standin_parts[o];
    }
    const size_t most = 4 * spex::ChunkBytes(k, IsHalf(wire)) + 64ull * nodes;
    send = SEND_BUFFER(most);
    recv = RECV_BUFFER(most);
  } else if (op == "powersgd") {
    const uint64_t most = std::max({a.psgd[0], a.psgd[1], a.psgd[2]});
    send = SEND_BUFFER(most * 4);
    recv = RECV_BUFFER(most * 4);
  }

  spex::OkTopkState ok_state;
  spex::OkTopkOptions ok_opts;
  ok_opts.global = spex::OkTopkGlobal::kTopk;
  ok_opts.k = k;
  ok_opts.recompute_every = 32;  // spexd's --oktopk_recompute_every and
  ok_opts.rebalance_every = 64;  // --oktopk_rebalance_every defaults

  std::vector<Phase> phases;
  Bytes bytes;
  std::vector<int> standin_counts(nodes), standin_displs(nodes);

  for (int step = 0; step < a.steps; ++step) {
    Phase ph;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    spex::Control control;
    if (spex_op && a.control) {
      spex::ExchangeKey key;
      key.bucket_id = 1;
      key.step = step;
      key.elements = a.n;
      key.compressor = op;
      key.sparse_allreduce = op == "oktopk" ? "oktopk" : "allgather";
      Check(spex::RunControlRound(&coll, key, &control), "control round");
    }
    const double t1 = MPI_Wtime();
    Bytes b;
    if (op == "dense") {
      Check(coll.AllReduceScaled(static_cast<float*>(send->p), static_cast<float*>(recv->p), a.n,
                                 1.0f),
            "dense");
      b.sent = b.received = spex::DenseWireBytes(a.n, nodes, spex::DType::kFloat32);
    } else if (op == "dense_half") {
      spex::HalfAllReduceBytes hb;
      Check(spex::HalfAllReduceInPlace(&coll, wire, static_cast<uint16_t*>(send->p), a.n,
                                       1.0f / nodes, &hb),
            "dense_half");
      b.sent = hb.sent;
      b.received = hb.received;
    } else if (op == "dense_half_standin") {
      // HalfAllReduceInPlace's two collectives: an all-to-all of c-value chunks, then the
      // all-gather of every owner's chunk (in place there; separate buffers here).
      auto* s = static_cast<uint8_t*>(send->p);
      auto* r = static_cast<uint8_t*>(recv->p);
      const int cb = static_cast<int>(c * 2);
      CheckMpi(MPI_Alltoall(s, cb, MPI_BYTE, r, cb, MPI_BYTE, MPI_COMM_WORLD), "alltoall");
      CheckMpi(MPI_Allgather(s, cb, MPI_BYTE, r, cb, MPI_BYTE, MPI_COMM_WORLD), "allgather");
      b.sent = b.received = 2ull * (nodes - 1) * cb;
    } else if (op == "gather") {
      spex::SparseExchangeArgs args;
      args.group_id = 1;
      args.step = step;
      args.elements = static_cast<uint32_t>(a.n);
      args.scale = 1.0f / nodes;
      args.wire = wire;
      spex::SparseExchangeResult res;
      Check(spex::ExchangeSparseGather(&coll, prims.get(), args, idx, val,
                                       static_cast<float*>(recv->p), &res),
            "gather");
      b.sent = res.bytes_sent;
      b.received = res.bytes_received;
    } else if (op == "gather_standin") {
      // MpiCollective::AllGatherV's two calls with ExchangeSparseGather's chunk sizes: every
      // node's count all-gathered as an int, then the chunks.
      int mine = static_cast<int>(spex::ChunkBytes(k, IsHalf(wire)));
      CheckMpi(MPI_Allgather(&mine, 1, MPI_INT, standin_counts.data(), 1, MPI_INT, MPI_COMM_WORLD),
               "allgather(counts)");
      int total = 0;
      for (int r = 0; r < nodes; ++r) {
        standin_displs[r] = total;
        total += standin_counts[r];
      }
      auto* all = static_cast<uint8_t*>(recv->p);
      CheckMpi(MPI_Allgatherv(send->p, mine, MPI_BYTE, all, standin_counts.data(),
                              standin_displs.data(), MPI_BYTE, MPI_COMM_WORLD),
               "allgatherv");
      b.sent = mine;
      b.received = total - mine;
    } else if (op == "oktopk") {
      spex::SparseExchangeArgs args;
      args.group_id = 1;
      args.step = step;
      args.elements = static_cast<uint32_t>(a.n);
      args.scale = 1.0f / nodes;
      args.wire = wire;
      spex::OkTopkResult res;
      Check(spex::ExchangeOkTopk(&coll, prims.get(), args, ok_opts, &ok_state, idx, val,
                                 static_cast<float*>(recv->p), &res),
            "oktopk");
      b.sent = res.bytes_sent;
      b.received = res.bytes_received;
    } else if (op == "oktopk_standin") {
      // ExchangeOkTopk's collectives (MpiCollective's MPI calls) with this node's parts by equal
      // regions and k / P kept entries per owner: the regions' re-agreement every 64 exchanges,
      // the block sizes and the parts (MPI_Alltoall, MPI_Alltoallv), the flags all-reduce, the
      // exact selection's 4 histogram all-reduces and tie counts every 32, the kept entries.
      const bool f16 = IsHalf(wire);
      if (step % 64 == 0 && nodes > 1) {
        std::vector<uint32_t> offer(nodes - 1), all(static_cast<size_t>(nodes) * (nodes - 1));
        CheckMpi(MPI_Allgather(offer.data(), (nodes - 1) * 4, MPI_BYTE, all.data(), (nodes - 1) * 4,
                               MPI_BYTE, MPI_COMM_WORLD),
                 "allgather(regions)");
      }
      std::vector<int> sc(nodes), sd(nodes), rc(nodes), rd(nodes);
      int total = 0;
      for (int q = 0; q < nodes; ++q) {
        sc[q] = static_cast<int>(spex::ChunkBytes(standin_parts[q], f16));
        sd[q] = total;
        total += sc[q];
        if (q != rank) b.sent += sc[q];
      }
      CheckMpi(MPI_Alltoall(sc.data(), 1, MPI_INT, rc.data(), 1, MPI_INT, MPI_COMM_WORLD),
               "alltoall(counts)");
      int rtotal = 0;
      for (int q = 0; q < nodes; ++q) {
        rd[q] = rtotal;
        rtotal += rc[q];
        if (q != rank) b.received += rc[q];
      }
      const size_t room = 4 * spex::ChunkBytes(k, f16) + 64ull * nodes;
      if (static_cast<size_t>(total) > room || static_cast<size_t>(rtotal) > room)
        Die("oktopk_standin: parts beyond the stand-in's buffers");
      CheckMpi(MPI_Alltoallv(send->p, sc.data(), sd.data(), MPI_BYTE, recv->p, rc.data(), rd.data(),
                             MPI_BYTE, MPI_COMM_WORLD),
               "alltoallv");
      std::vector<int64_t> flags(nodes + 1, 0);
      CheckMpi(MPI_Allreduce(MPI_IN_PLACE, flags.data(), nodes + 1, MPI_INT64_T, MPI_SUM,
                             MPI_COMM_WORLD),
               "allreduce(flags)");
      if (step % 32 == 0) {
        std::vector<uint64_t> h(256, 0);
        for (int round = 0; round < 4; ++round) {
          CheckMpi(
              MPI_Allreduce(MPI_IN_PLACE, h.data(), 256, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD),
              "allreduce(histogram)");
        }
        uint64_t mine = 0;
        std::vector<uint64_t> ties(nodes);
        CheckMpi(MPI_Allgather(&mine, 8, MPI_BYTE, ties.data(), 8, MPI_BYTE, MPI_COMM_WORLD),
                 "allgather(ties)");
      }
      const uint64_t kept = k / nodes + (static_cast<uint64_t>(rank) < k % nodes ? 1 : 0);
      int mine = static_cast<int>(spex::ChunkBytes(kept, false));
      CheckMpi(MPI_Allgather(&mine, 1, MPI_INT, standin_counts.data(), 1, MPI_INT, MPI_COMM_WORLD),
               "allgather(counts)");
      int gtotal = 0;
      for (int r = 0; r < nodes; ++r) {
        standin_displs[r] = gtotal;
        gtotal += standin_counts[r];
      }
      if (static_cast<size_t>(gtotal) > room)
        Die("oktopk_standin: kept entries beyond the buffers");
      CheckMpi(MPI_Allgatherv(send->p, mine, MPI_BYTE, recv->p, standin_counts.data(),
                              standin_displs.data(), MPI_BYTE, MPI_COMM_WORLD),
               "allgatherv(kept)");
      b.sent += mine;
      b.received += gtotal - mine;
    } else if (op == "ddp") {
      CheckMpi(MPI_Allreduce(send->p, recv->p, static_cast<int>(a.n), MPI_FLOAT, MPI_SUM,
                             MPI_COMM_WORLD),
               "allreduce");
      b.sent = b.received = spex::DenseWireBytes(a.n, nodes, spex::DType::kFloat32);
    } else if (op == "ddp_fp16") {
      CheckMpi(MPI_Allreduce(send->p, recv->p, static_cast<int>(a.n), MPI_SHORT, MPI_SUM,
                             MPI_COMM_WORLD),
               "allreduce");
      b.sent = b.received = spex::DenseWireBytes(a.n, nodes, spex::DType::kFloat16);
    } else if (op == "powersgd") {
      // PyTorch's PowerSGD hook per bucket: the 1-D tensors all-reduced uncompressed, then all
      // P matrices in one all-reduce and all Q matrices in another.
      for (uint64_t m : a.psgd) {
        if (m == 0) continue;
        CheckMpi(MPI_Allreduce(send->p, recv->p, static_cast<int>(m), MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD),
                 "allreduce");
        b.sent += spex::DenseWireBytes(m, nodes, spex::DType::kFloat32);
      }
      b.received = b.sent;
    }
    const double t2 = MPI_Wtime();
    if (spex_op && a.control) Check(spex::AgreeOnAllNodes(&coll, absl::OkStatus(), "step"), "vote");
    const double t3 = MPI_Wtime();
    ph.control = t1 - t0;
    ph.exchange = t2 - t1;
    ph.vote = t3 - t2;
    phases.push_back(ph);
    if (step == 0) bytes = b;
  }

  // The slowest rank's phases (each phase ends at a collective's completion on that rank), and
  // the slowest rank's whole step: a rank that finishes its exchange early waits in the vote, so
  // the phases' maxima add up to more than the step when the exchange is unbalanced.
  std::vector<double> mine, most(4 * phases.size());
  for (const Phase& p : phases)
    mine.insert(mine.end(), {p.control, p.exchange, p.vote, p.control + p.exchange + p.vote});
  MPI_Reduce(mine.data(), most.data(), static_cast<int>(mine.size()), MPI_DOUBLE, MPI_MAX, 0,
             MPI_COMM_WORLD);
  uint64_t rb[2] = {bytes.sent, bytes.received}, rb_max[2] = {0, 0};
  MPI_Reduce(rb, rb_max, 2, MPI_UINT64_T, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "{\"op\": \"%s\", \"nodes\": %d, \"elements\": %lu, \"k\": %lu, \"selected\": %zu, "
        "\"wire\": \"%s\", \"control\": %s, \"bytes_sent\": %lu, \"bytes_received\": %lu, "
        "\"max_bytes_sent\": %lu, \"max_bytes_received\": %lu, \"steps\": [",
        op.c_str(), nodes, a.n, k, idx.size(), a.wire.c_str(), a.control ? "true" : "false",
        bytes.sent, bytes.received, rb_max[0], rb_max[1]);
    for (size_t s = 0; s < phases.size(); ++s) {
      std::printf(
          "%s{\"control_s\": %.9g, \"exchange_s\": %.9g, \"vote_s\": %.9g, \"total_s\": %.9g}",
          s ? ", " : "", most[4 * s], most[4 * s + 1], most[4 * s + 2], most[4 * s + 3]);
    }
    std::printf("]}\n");
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
