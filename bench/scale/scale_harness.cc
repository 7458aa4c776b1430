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
#include <chrono>
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
  std::string indices;           // an index file (bench/scale/record_selections.py resample)
  int a2a_flows = 0;             // oktopk_standin: see LinearAllToAllV (0: MPI_Alltoallv)
  // The sparse chunks' indices (daemon/engine/wire.h): u32 (the default here, as the cost model
  // counts them: 4 bytes an index) or delta (spexd's default, --wire_index_encoding).
  std::string index_encoding = "u32";
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
    } else if (const char* v = val("--a2a_flows=")) {
      a.a2a_flows = std::atoi(v);
    } else if (const char* v = val("--indices=")) {
      a.indices = v;
    } else if (const char* v = val("--index_encoding=")) {
      a.index_encoding = v;
    } else if (const char* v = val("--psgd=")) {
      if (std::sscanf(v, "%lu,%lu,%lu", &a.psgd[0], &a.psgd[1], &a.psgd[2]) != 3)
        Die("--psgd= takes three float counts: uncompressed,P,Q");
    } else {
      std::fprintf(stderr, "scale_harness: unknown argument %s\n", argv[i]);
      Die("arguments: --op= --n= --density= --steps= --wire= --control= --seed= --psgd= "
          "--indices= --a2a_flows= --index_encoding=");
    }
  }
  if (a.n == 0 || a.n > 0xffffffffull) Die("--n must be 1 .. 2^32-1 elements");
  if (!(a.density > 0 && a.density <= 1)) Die("--density must be in (0, 1]");
  if (a.steps < 1) Die("--steps must be >= 1");
  if (a.wire != "float32" && a.wire != "bfloat16" && a.wire != "float16")
    Die("--wire must be float32, bfloat16 or float16");
  if (a.index_encoding != "u32" && a.index_encoding != "delta")
    Die("--index_encoding must be u32 or delta");
  if (a.index_encoding == "delta" && a.op == "oktopk_standin")
    Die("--op=oktopk_standin counts uint32 indices only (--index_encoding=u32)");
  return a;
}

spex::DType WireType(const std::string& w) {
  return w == "bfloat16"  ? spex::DType::kBFloat16
         : w == "float16" ? spex::DType::kFloat16
                          : spex::DType::kFloat32;
}

// Node `node`'s selection from an index file (record_selections.py resample): b"SPXIDX01",
// uint32 nodes, uint32 0, uint64 n, uint64 offset[nodes + 1] in entries, then every node's
// sorted uint32 indices. Only this node's set is read.
std::vector<uint32_t> FileSelection(const Args& a, int node, int nodes) {
  FILE* f = std::fopen(a.indices.c_str(), "rb");
  if (f == nullptr) Die("--indices: cannot open the file");
  char magic[8];
  uint32_t file_nodes = 0, pad = 0;
  uint64_t n = 0;
  if (std::fread(magic, 1, 8, f) != 8 || std::memcmp(magic, "SPXIDX01", 8) != 0 ||
      std::fread(&file_nodes, 4, 1, f) != 1 || std::fread(&pad, 4, 1, f) != 1 ||
      std::fread(&n, 8, 1, f) != 1) {
    Die("--indices: not an index file (record_selections.py resample writes them)");
  }
  if (n != a.n) Die("--indices: the file's bucket size differs from --n");
  if (static_cast<int>(file_nodes) < nodes) Die("--indices: the file has fewer nodes than -np");
  uint64_t off[2];
  std::fseek(f, 24 + 8l * node, SEEK_SET);
  if (std::fread(off, 8, 2, f) != 2 || off[1] < off[0]) Die("--indices: bad offsets");
  std::vector<uint32_t> idx(off[1] - off[0]);
  std::fseek(f, static_cast<long>(24 + 8ull * (file_nodes + 1) + 4 * off[0]), SEEK_SET);
  if (!idx.empty() && std::fread(idx.data(), 4, idx.size(), f) != idx.size())
    Die("--indices: file too short");
  std::fclose(f);
  for (size_t j = 0; j < idx.size(); ++j) {
    if (idx[j] >= n || (j > 0 && idx[j] <= idx[j - 1]))
      Die("--indices: a node's indices are not sorted, distinct positions < n");
  }
  return idx;
}

// This rank's selected positions (sorted, distinct): with --indices, this node's set of the
// file (real gradients' selections, skewed and partly shared between nodes); otherwise k, one
// random position in each of k equal strata of [0, n), different on every node.
std::vector<uint32_t> Selection(const Args& a, uint64_t k, int rank, int nodes) {
  if (!a.indices.empty()) return FileSelection(a, rank, nodes);
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

// SCALE_TRACE=1: rank 0 prints, after each MPI call of the stand-ins and peers, the wall time
// the simulator spent since the previous one and the simulated clock (where a slow simulation
// spends its time).
bool Trace() {
  static const bool on = [] {
    const char* t = std::getenv("SCALE_TRACE");
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return t != nullptr && *t == '1' && rank == 0;
  }();
  return on;
}

void CheckMpi(int rc, const char* what) {
  if (rc != MPI_SUCCESS) Die(what);
  if (Trace()) {
    static auto last = std::chrono::steady_clock::now();
    const auto now = std::chrono::steady_clock::now();
    std::fprintf(stderr, "scale_harness trace: %-24s wall %8.2f s, simulated clock %.6f s\n", what,
                 std::chrono::duration<double>(now - last).count(), MPI_Wtime());
    last = now;
  }
}

// SimGrid's `ompi` selector runs MPI_Alltoallv as the linear algorithm (every rank posts all
// P-1 sends and receives at once) at 4-63, 128-255 and from 1,024 ranks, pairwise otherwise
// (read from libsimgrid 3.32's alltoallv__ompi).
bool LinearAllToAllV(int nodes) {
  return (nodes >= 4 && nodes <= 63) || (nodes >= 128 && nodes <= 255) || nodes >= 1024;
}

// The linear all-to-all(v) with `flows` messages a rank instead of P-1: the destinations at
// shifts 1..P-1 cut into `flows` consecutive blocks, each block's bytes sent as one message to
// the block's first destination (and received alike from the rank that far behind). Every rank
// sends exactly its bytes, all at once, as the linear algorithm does; it receives the bytes
// of other ranks' blocks (equal to its own where the parts are even: the uniform selections).
// At 1,024 ranks the linear algorithm's million concurrent messages make SimGrid's bandwidth
// sharing the bottleneck of the simulation (docs/scale.md); 4 flows a rank make 4,096.
void GroupedAllToAllV(const uint8_t* send, const std::vector<int>& sc, const std::vector<int>& sd,
                      uint8_t* recv, size_t room, int flows, int rank, int nodes) {
  std::vector<MPI_Request> req;
  req.reserve(2 * flows);
  const int shifts = nodes - 1;
  for (int g = 0; g < flows; ++g) {
    const int lo = 1 + static_cast<int>(static_cast<int64_t>(g) * shifts / flows);
    const int hi = 1 + static_cast<int>(static_cast<int64_t>(g + 1) * shifts / flows);
    if (lo >= hi) continue;
    int bytes = 0;
    for (int d = lo; d < hi; ++d) bytes += sc[(rank + d) % nodes];
    const int to = (rank + lo) % nodes, from = (rank - lo + nodes) % nodes;
    req.emplace_back();
    MPI_Irecv(recv, static_cast<int>(room), MPI_BYTE, from, 77, MPI_COMM_WORLD, &req.back());
    req.emplace_back();
    MPI_Isend(send + sd[to], bytes, MPI_BYTE, to, 77, MPI_COMM_WORLD, &req.back());
  }
  CheckMpi(MPI_Waitall(static_cast<int>(req.size()), req.data(), MPI_STATUSES_IGNORE),
           "alltoallv(grouped)");
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
                       op == "oktopk_standin" || op == "union" || op == "union_standin";
  const bool peer_op = op == "ddp" || op == "ddp_fp16" || op == "powersgd";
  if (!spex_op && !peer_op) {
    Die("--op must be dense, dense_half, dense_half_standin, gather, gather_standin, oktopk, "
        "oktopk_standin, union, union_standin, ddp, ddp_fp16 or powersgd");
  }
  if (op == "dense_half" || op == "dense_half_standin") {
    if (wire == spex::DType::kFloat32) Die("--op=dense_half needs --wire=bfloat16 or float16");
  }

  // Inputs.
  std::vector<uint32_t> idx;
  std::vector<float> val;
  if (op == "gather" || op == "oktopk" || op == "union") {
    idx = Selection(a, k, rank, nodes);
    val = Values(idx.size(), rank, a.seed);
  }
  uint64_t union_size = 0;  // union_standin: the union of all nodes' selections
  uint64_t my_count = k;    // union_standin, gather_standin: this node's selected entries
  if (op == "union_standin" || op == "gather_standin") {
    if (!a.indices.empty()) my_count = FileSelection(a, rank, nodes).size();
    if (my_count > k) Die("--indices: a node selected more than density x n entries");
  }
  // The bytes of this node's index section as the real code writes it (wire.h: 4 an index, or
  // the delta form where it is smaller), for the stand-ins' chunks.
  const spex::IndexEncoding ienc =
      a.index_encoding == "delta" ? spex::IndexEncoding::kDelta : spex::IndexEncoding::kU32;
  uint64_t my_idx_bytes = 4 * my_count;
  if (ienc == spex::IndexEncoding::kDelta && (op == "union_standin" || op == "gather_standin"))
    my_idx_bytes = spex::IndexSectionBytes(Selection(a, k, rank, nodes), ienc);
  if (op == "union_standin") {
    // Rank 0 counts the union (a bitmap of n bits over every node's selection) and tells the
    // others, before the timed steps.
    if (rank == 0) {
      std::vector<uint64_t> bits((a.n + 63) / 64, 0);
      for (int r = 0; r < nodes; ++r) {
        for (uint32_t i : Selection(a, k, r, nodes)) bits[i >> 6] |= uint64_t{1} << (i & 63);
      }
      for (uint64_t w : bits) union_size += __builtin_popcountll(w);
    }
    MPI_Bcast(&union_size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  }
  std::unique_ptr<Shared> send, recv;
  std::vector<uint64_t> standin_parts;  // oktopk_standin: this node's selected entries by owner
  std::vector<uint64_t> standin_kept;   // oktopk_standin: the entries each owner keeps
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
  } else if (op == "union") {
    send = SEND_BUFFER(a.n * 4);  // `acc`, read at the union (shared, contents meaningless)
    recv = RECV_BUFFER(a.n * 4);  // `out`
  } else if (op == "gather_standin") {
    // Every node's chunk of k pairs (the code's ChunkBytes), gathered into one shared buffer.
    send = SEND_BUFFER(spex::ChunkBytes(k, IsHalf(wire)));
    recv = RECV_BUFFER(spex::ChunkBytes(k, IsHalf(wire)) * nodes);
  } else if (op == "union_standin") {
    // Every node's index-only chunk gathered, then the union's values all-reduced (float32, or
    // the half all-reduce's two collectives on ceil(union / P)-value chunks).
    const size_t most =
        std::max<size_t>(spex::ChunkBytes(k, false, true) * nodes, union_size * 4 + 64ull * nodes);
    send = SEND_BUFFER(most);
    recv = RECV_BUFFER(most);
  } else if (op == "oktopk_standin") {
    // The parts this node sends, by owner (its selection over equal regions), computed once; the
    // selection itself is not kept (1,024 nodes x k pairs would not fit).
    std::vector<uint32_t> sel = Selection(a, k, rank, nodes);
    // Rank 0, before the timed steps, reads every node's selection once (a bitmap of n bits
    // for their union) and derives (1) the regions the real code agrees in its first exchange
    // (Rebalance: every node offers the P-1 quantiles of its selection, the bounds are their
    // means; the timed steps make the same all-gather of the offers) and (2) the entries each
    // owner keeps: the real code keeps the global top k of the reduced entries (the union of
    // the selections in each region); with values independent of the positions an owner keeps
    // its share of the union, k x U_q / U. Both are broadcast.
    std::vector<uint32_t> bounds = spex::EqualRegions(static_cast<uint32_t>(a.n), nodes);
    standin_kept.assign(nodes, 0);
    std::vector<uint64_t> bits;
    if (rank == 0) {
      bits.assign((a.n + 63) / 64, 0);
      std::vector<uint64_t> sum(nodes > 1 ? nodes - 1 : 0, 0);
      for (int r = 0; r < nodes; ++r) {
        const std::vector<uint32_t> other = r == 0 ? sel : Selection(a, k, r, nodes);
        for (uint32_t i : other) bits[i >> 6] |= uint64_t{1} << (i & 63);
        for (int j = 1; j < nodes; ++j) {
          sum[j - 1] += other.size() >= static_cast<size_t>(nodes)
                            ? other[static_cast<size_t>(j) * other.size() / nodes]
                            : static_cast<uint32_t>(a.n * j / nodes);
        }
      }
      for (int j = 1; j < nodes; ++j) bounds[j] = static_cast<uint32_t>(sum[j - 1] / nodes);
    }
    MPI_Bcast(bounds.data(), nodes + 1, MPI_UINT32_T, 0, MPI_COMM_WORLD);
    standin_parts.assign(nodes, 0);
    int o = 0;
    for (uint32_t i : sel) {
      while (i >= bounds[o + 1]) ++o;
      ++standin_parts[o];
    }
    if (rank == 0) {
      std::vector<uint64_t> u(nodes, 0);
      uint64_t total = 0;
      for (int q = 0; q < nodes; ++q) {
        for (uint64_t i = bounds[q]; i < bounds[q + 1];) {
          if ((i & 63) == 0 && i + 64 <= bounds[q + 1]) {
            u[q] += __builtin_popcountll(bits[i >> 6]);
            i += 64;
          } else {
            u[q] += (bits[i >> 6] >> (i & 63)) & 1;
            ++i;
          }
        }
        total += u[q];
      }
      const uint64_t keep = std::min<uint64_t>(k, total);
      uint64_t given = 0;
      for (int q = 0; q < nodes && total > 0; ++q) {
        standin_kept[q] = static_cast<uint64_t>(static_cast<double>(keep) * u[q] / total);
        given += standin_kept[q];
      }
      for (int q = 0; given < keep; q = (q + 1) % nodes) {  // the rounding's remainder
        if (standin_kept[q] < u[q]) {
          ++standin_kept[q];
          ++given;
        }
      }
      union_size = total;
    }
    MPI_Bcast(standin_kept.data(), nodes, MPI_UINT64_T, 0, MPI_COMM_WORLD);
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

  // MpiCollective::AllGatherV's two calls: every node's byte count all-gathered as an int, then
  // the chunks (`mine` bytes of send into recv). Returns the bytes gathered, this node's included.
  auto allgatherv_standin = [&](int mine) {
    CheckMpi(MPI_Allgather(&mine, 1, MPI_INT, standin_counts.data(), 1, MPI_INT, MPI_COMM_WORLD),
             "allgather(counts)");
    int total = 0;
    for (int r = 0; r < nodes; ++r) {
      standin_displs[r] = total;
      total += standin_counts[r];
    }
    CheckMpi(MPI_Allgatherv(send->p, mine, MPI_BYTE, recv->p, standin_counts.data(),
                            standin_displs.data(), MPI_BYTE, MPI_COMM_WORLD),
             "allgatherv");
    return total;
  };
  // HalfAllReduceInPlace's two collectives on cb-byte chunks: the all-to-all, then the
  // all-gather of every owner's chunk. Returns the bytes each node sends (and receives).
  auto half_allreduce_standin = [&](int cb) {
    CheckMpi(MPI_Alltoall(send->p, cb, MPI_BYTE, recv->p, cb, MPI_BYTE, MPI_COMM_WORLD),
             "alltoall");
    CheckMpi(MPI_Allgather(send->p, cb, MPI_BYTE, recv->p, cb, MPI_BYTE, MPI_COMM_WORLD),
             "allgather");
    return 2ull * (nodes - 1) * cb;
  };
  // What the engine passes every sparse exchange of the bucket (group 1, the average's scale).
  auto sparse_args = [&](int step) {
    spex::SparseExchangeArgs args;
    args.group_id = 1;
    args.step = step;
    args.elements = static_cast<uint32_t>(a.n);
    args.scale = 1.0f / nodes;
    args.wire = wire;
    args.index_encoding = ienc;
    return args;
  };
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
      b.sent = b.received = half_allreduce_standin(static_cast<int>(c * 2));
    } else if (op == "gather") {
      const spex::SparseExchangeArgs args = sparse_args(step);
      spex::SparseExchangeResult res;
      Check(spex::ExchangeSparseGather(&coll, prims.get(), args, idx, val,
                                       static_cast<float*>(recv->p), &res),
            "gather");
      b.sent = res.bytes_sent;
      b.received = res.bytes_received;
    } else if (op == "union") {
      const spex::SparseExchangeArgs args = sparse_args(step);
      spex::SparseExchangeResult res;
      // acc is only read (args.keep_rounding is off).
      Check(spex::ExchangeIndexUnion(&coll, prims.get(), args, idx, static_cast<float*>(send->p),
                                     static_cast<float*>(recv->p), &res),
            "union");
      b.sent = res.bytes_sent;
      b.received = res.bytes_received;
      union_size = res.gathered_idx.size();
    } else if (op == "union_standin") {
      // ExchangeIndexUnion's MPI calls: AllGatherV of the index-only chunks (count, chunks),
      // then AverageUnionValues' all-reduce of the union's values.
      const int mine = static_cast<int>(sizeof(spex::ChunkHeader) + my_idx_bytes);
      b.sent = mine;
      b.received = allgatherv_standin(mine) - mine;
      if (nodes > 1 && union_size > 0) {
        if (IsHalf(wire)) {
          const uint64_t half =
              half_allreduce_standin(static_cast<int>((union_size + nodes - 1) / nodes * 2));
          b.sent += half;
          b.received += half;
        } else {
          CheckMpi(MPI_Allreduce(send->p, recv->p, static_cast<int>(union_size), MPI_FLOAT, MPI_SUM,
                                 MPI_COMM_WORLD),
                   "allreduce");
          b.sent += union_size * 4;
          b.received += union_size * 4;
        }
      }
    } else if (op == "gather_standin") {
      // MpiCollective::AllGatherV's two calls with ExchangeSparseGather's chunk sizes: every
      // node's count all-gathered as an int, then the chunks.
      const int mine = static_cast<int>(sizeof(spex::ChunkHeader) + my_idx_bytes +
                                        my_count * (IsHalf(wire) ? 2 : 4));
      b.sent = mine;
      b.received = allgatherv_standin(mine) - mine;
    } else if (op == "oktopk") {
      const spex::SparseExchangeArgs args = sparse_args(step);
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
      if (a.a2a_flows > 0 && a.a2a_flows < nodes - 1 && LinearAllToAllV(nodes)) {
        GroupedAllToAllV(static_cast<const uint8_t*>(send->p), sc, sd,
                         static_cast<uint8_t*>(recv->p), room, a.a2a_flows, rank, nodes);
      } else {
        CheckMpi(MPI_Alltoallv(send->p, sc.data(), sd.data(), MPI_BYTE, recv->p, rc.data(),
                               rd.data(), MPI_BYTE, MPI_COMM_WORLD),
                 "alltoallv");
      }
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
      int mine = static_cast<int>(spex::ChunkBytes(standin_kept[rank], false));
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
  // oktopk_standin: the selected entries every owner receives (its region's, from all nodes).
  std::vector<uint64_t> regions(op == "oktopk_standin" ? nodes : 0);
  if (op == "oktopk_standin") {
    MPI_Reduce(standin_parts.data(), regions.data(), nodes, MPI_UINT64_T, MPI_SUM, 0,
               MPI_COMM_WORLD);
  }
  if (rank == 0) {
    std::printf(
        "{\"op\": \"%s\", \"nodes\": %d, \"elements\": %lu, \"k\": %lu, \"selected\": %zu, "
        "\"wire\": \"%s\", \"control\": %s, \"bytes_sent\": %lu, \"bytes_received\": %lu, "
        "\"max_bytes_sent\": %lu, \"max_bytes_received\": %lu, \"union\": %lu, "
        "\"indices\": \"%s\", \"steps\": [",
        op.c_str(), nodes, a.n, k, idx.size(), a.wire.c_str(), a.control ? "true" : "false",
        bytes.sent, bytes.received, rb_max[0], rb_max[1], union_size,
        a.indices.empty() ? "uniform" : "file");
    for (size_t s = 0; s < phases.size(); ++s) {
      std::printf(
          "%s{\"control_s\": %.9g, \"exchange_s\": %.9g, \"vote_s\": %.9g, \"total_s\": %.9g}",
          s ? ", " : "", most[4 * s], most[4 * s + 1], most[4 * s + 2], most[4 * s + 3]);
    }
    std::printf("]");
    if (op == "oktopk_standin") {
      std::printf(", \"region_entries\": [");
      for (int q = 0; q < nodes; ++q) std::printf("%s%lu", q ? ", " : "", regions[q]);
      std::printf("], \"kept\": [");
      for (int q = 0; q < nodes; ++q) std::printf("%s%lu", q ? ", " : "", standin_kept[q]);
      std::printf("]");
    }
    std::printf("}\n");
    std::fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}
