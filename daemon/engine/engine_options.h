// What an Engine is configured with: typed values, checked once (spexd builds them from its flags
// in daemon/config.cc; tests fill them directly). The enumerations parse from the flag spellings
// (AbslParseFlag), so a bad value fails at flag parsing with the flag's name.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "daemon/engine/observer.h"
#include "daemon/engine/wire.h"
#include "daemon/merge/merger.h"
#include "kernels/compressor.h"
#include "kernels/half.h"
#include "kernels/primitives.h"

namespace spex {

// --dense_fallback. kAuto: a sparse bucket exchanges dense where that is faster, by --auto_decide
// (the cost model, or alternating sparse and dense exchanges for 2 x probe_steps steps, then
// every node keeps the faster); kOff: always sparse.
enum class DenseFallback { kAuto, kOff };
bool AbslParseFlag(absl::string_view text, DenseFallback* out, std::string* error);
std::string AbslUnparseFlag(DenseFallback v);

// --nonfinite: what a step does when some trainer of some node handed in a NaN or +-Inf (the
// fused check of the local reduce finds it; the control round tells every node before any
// collective of the step). Under both, the residual and the compressor's state stay exactly as
// before the step. kPropagate: every trainer's output is non-finite (a dense bucket: the
// all-reduce's NaN/Inf at the positions an input had one; a sparse bucket: NaN across the
// bucket) and the exchange returns OK, so a loss scaler skips the step. kError: the exchange
// fails with INVALID_ARGUMENT naming the trainer and the first bad index; the next step works.
enum class NonfinitePolicy { kPropagate, kError };
bool AbslParseFlag(absl::string_view text, NonfinitePolicy* out, std::string* error);
std::string AbslUnparseFlag(NonfinitePolicy v);

// --sparse_allreduce: how a pattern-B bucket's selections are summed over the nodes.
// kAllGather: every node's (index, value) chunk is all-gathered (pattern B). kOkTopk: the Ok-Topk
// sparse reduce-scatter by index region and an all-gatherv of the reduced entries
// (daemon/engine/oktopk_exchange.h, global selection "all": the same result bit for bit), for the
// compressors of OkTopkCompressorNames(). kAuto: such a bucket takes the faster by --auto_decide
// (the cost model's pick, or its first 2 x probe_steps sparse exchanges alternate the two and
// every node then keeps the one the slowest node found faster: Engine::ChooseSparseAllreduce);
// buckets of the other sparse compressors keep their exchange.
enum class SparseAllreduce { kAllGather, kOkTopk, kAuto };
bool AbslParseFlag(absl::string_view text, SparseAllreduce* out, std::string* error);
std::string AbslUnparseFlag(SparseAllreduce v);

// --auto_decide: how --dense_fallback=auto and --sparse_allreduce=auto choose. kModel: from the
// cost model of the link, P, n and k at the bucket's first exchange (exchange_choice.h), probing
// where the model has no term for the bucket; kProbe: always by probing (above).
enum class AutoDecide { kModel, kProbe };
bool AbslParseFlag(absl::string_view text, AutoDecide* out, std::string* error);
std::string AbslUnparseFlag(AutoDecide v);

// --oktopk_global: Ok-Topk's global selection (with --sparse_allreduce=oktopk). kTopk (default):
// about k = max(1, floor(density x elements)) of the summed entries are kept (exactly the k
// largest |sum| every --oktopk_recompute_every exchanges, a threshold in between), the entries a
// node selected that were not kept stay in its residual: a node receives about 2k(P-1)/P pairs.
// kAll: every summed entry is kept, the result is the all-gather exchange's bit for bit (a check
// mode; it receives more than the all-gather).
enum class OkTopkSelect { kTopk, kAll };
bool AbslParseFlag(absl::string_view text, OkTopkSelect* out, std::string* error);
std::string AbslUnparseFlag(OkTopkSelect v);

// Builds a bucket's compressor on the bucket's primitives (device primitives on the device
// path). A null result means the bucket exchanges dense. Empty = MakeCompressor (the library).
using CompressorFactory = std::function<absl::StatusOr<std::unique_ptr<Compressor>>(
    const CompressorSpec& spec, Primitives* prims)>;

struct EngineOptions {
  int local_trainers = 1;
  std::string job = "";                              // when set, Hello must name the same job
  std::string compressor = "dense";                  // default per bucket
  double density = 0.01;                             // default per bucket
  absl::Duration register_wait = absl::Seconds(30);  // Exchange waits this long for the
                                                     // other local trainers to register
  int engine_spin_us = 0;                            // engine spins this long before sleeping
  int client_spin_us = 0;                            // advertised to trainers in Hello
  std::string shm_tag = "spex";                      // goes into shm names
  bool error_feedback = true;            // keep what a sparse step did not send for later steps
  uint64_t min_sparse_elements = 16384;  // smaller buckets always go dense
  DenseFallback dense_fallback = DenseFallback::kAuto;
  int probe_steps = 3;  // kAuto: sparse and dense steps each measured
  // --auto_decide. spexd's flag defaults to kModel; options filled directly (the engine tests)
  // keep probing unless they ask for the model.
  AutoDecide auto_decide = AutoDecide::kProbe;
  double link_gbps = 0;        // --link_gbps: the link's rate for the model; 0: measured
  double link_latency_us = 5;  // --link_latency_us: one message's latency, with link_gbps > 0
  bool fp16_values = false;    // sparse values of float32 buckets as float16 (A, B, Ok-Topk)
  IndexEncoding index_encoding = IndexEncoding::kDelta;            // --wire_index_encoding (wire.h)
  SparseAllreduce sparse_allreduce = SparseAllreduce::kAllGather;  // pattern B's exchange
  OkTopkSelect oktopk_global = OkTopkSelect::kTopk;                // --oktopk_global
  int oktopk_recompute_every = 32;  // exact global top-k every this many exchanges (tau_g)
  int oktopk_rebalance_every = 64;  // regions re-agreed every this many exchanges (tau_r); 0 never
  int residual_norm_every = 10;     // steps between residual-norm computations (0: never)
  MergerPolicy merger = MergerPolicy::kNone;  // which ready buckets share one exchange
  MergeParams merge;                          // the merger's parameters (--merge_window, ...)
  // --merge_overlap: with a merger, one group's collectives run on a second thread (over the
  // engine's wire collective, Engine::set_wire_collective) while the engine thread runs the next
  // group's round, local reduce and selection. Off, or without a wire collective: one thread.
  bool merge_overlap = true;
  // A merge group whose other members are ready and that still waits for one this long gets a
  // WARNING in the log (once per group and step) and ExchangeObserver::OnSlowGroup.
  absl::Duration slow_group_warning = absl::Seconds(10);
  // --nonfinite: what a step does where a trainer handed in a NaN/+-Inf (every bucket alike).
  NonfinitePolicy nonfinite = NonfinitePolicy::kPropagate;
  // Memory limits, checked at registration before anything is allocated; 0 = derived from the
  // machine at Start() (DefaultMemoryLimit). A request over one gets RESOURCE_EXHAUSTED naming
  // the limit and its flag. A bucket's bytes: its shared segment (header, L input slots,
  // output) plus its accumulator (two for a sparse bucket with error feedback on the CPU path:
  // step.h acc_next), and for a sparse bucket 2 x 4 bytes per element of selection and
  // compressor state (an upper estimate).
  uint64_t max_bucket_bytes = 0;       // --max_bucket_bytes
  uint64_t max_session_bytes = 0;      // --max_session_bytes: the buckets one trainer registered
  uint64_t max_daemon_bytes = 0;       // --max_daemon_bytes: every bucket of this node
  int max_buckets_per_session = 4096;  // --max_buckets_per_session
  // Builds a bucket's compressor; empty = MakeCompressor. Tests plug in theirs.
  CompressorFactory compressor_factory;
  // Out-of-band stop notices between nodes (MPI: PeerNotice). Both optional.
  std::function<void()> announce_stop;
  std::function<bool(int*)> peer_stopped;
  // Called by the engine thread at least every 50 ms while it is healthy (between exchanges
  // and after each), never while it is inside a collective; spexd feeds the systemd watchdog
  // from it. Optional.
  std::function<void()> heartbeat;
  // Told about every published exchange, on the engine thread (metrics, timeline). Owned by the
  // caller; they outlive the engine.
  std::vector<ExchangeObserver*> observers;
};

// Half the machine's physical memory, and no more than /dev/shm can hold (its free space now).
uint64_t DefaultMemoryLimit();

// Request strings (job, client, compressor and parameter names and values) are at most this
// long; an error quotes at most kQuotedPrefix bytes of a caller's string (QuotePrefix).
inline constexpr size_t kMaxRequestString = 256;
inline constexpr size_t kMaxRequestParams = 64;
inline constexpr size_t kQuotedPrefix = 32;
// 'abc' for a short string; 'first 32 bytes...' (N bytes) for a long one.
std::string QuotePrefix(absl::string_view s);

// The checks every engine makes at Start(): InvalidArgument naming the option (as its spexd
// flag) for a value out of range.
absl::Status ValidateEngineOptions(const EngineOptions& o);

// Whether a sparse bucket with `compressor` can use o.sparse_allreduce: always with allgather
// and auto (a compressor that cannot use Ok-Topk keeps its own exchange); with oktopk only a
// compressor of OkTopkCompressorNames(). InvalidArgument naming the compressors that can.
absl::Status CheckSparseAllreduce(const EngineOptions& o, const std::string& compressor);
// The same for one bucket's choice (`from_param`: its sparse_allreduce parameter set it).
absl::Status CheckSparseAllreduce(SparseAllreduce mode, bool from_param,
                                  const std::string& compressor);

// Per-bucket engine options a trainer may set among RegisterBucket's compressor parameters; they
// override the daemon's flag for that bucket and are not handed to the compressor.
//   nonfinite = propagate | error              (spexd --nonfinite)
//   sparse_allreduce = allgather | oktopk      (spexd --sparse_allreduce; oktopk with the
//                                              daemon's --oktopk_* flags)
inline constexpr char kBucketParamNonfinite[] = "nonfinite";
inline constexpr char kBucketParamSparseAllreduce[] = "sparse_allreduce";
inline constexpr char kBucketParamDenseFallback[] = "dense_fallback";
//   dtype = float32 | bfloat16 | float16       (the bucket's data type: RegisterBucketRequest's
//                                              dtype field sets it; docs/dtypes.md)
//   wire_values = native | float32             (a half bucket's values on the wire: its own
//                                              type, or float32)
inline constexpr char kBucketParamDType[] = "dtype";
inline constexpr char kBucketParamWireValues[] = "wire_values";
struct BucketPolicy {
  DType dtype = DType::kFloat32;
  bool wire_float32 = false;  // wire_values=float32 on a half bucket
  // The type of the values on the wire (float32 for a float32 bucket).
  DType wire() const { return wire_float32 ? DType::kFloat32 : dtype; }
  NonfinitePolicy nonfinite = NonfinitePolicy::kPropagate;
  SparseAllreduce sparse_allreduce = SparseAllreduce::kAllGather;
  bool sparse_allreduce_param = false;  // set by the bucket's parameter (else the flag's)
  DenseFallback dense_fallback = DenseFallback::kAuto;
  bool operator==(const BucketPolicy& o) const {
    return nonfinite == o.nonfinite && sparse_allreduce == o.sparse_allreduce &&
           dense_fallback == o.dense_fallback && dtype == o.dtype && wire_float32 == o.wire_float32;
  }
  bool operator!=(const BucketPolicy& o) const { return !(*this == o); }
};

// Splits a request's parameters into the compressor's (`compressor_params`) and the bucket's
// engine options (`policy`, starting from the daemon's flags in `o`). InvalidArgument naming the
// parameter and its accepted values for a bad value.
absl::Status SplitBucketParams(const EngineOptions& o,
                               const std::map<std::string, std::string>& params,
                               std::map<std::string, std::string>* compressor_params,
                               BucketPolicy* policy);

}  // namespace spex
