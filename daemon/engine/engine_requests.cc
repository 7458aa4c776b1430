// The engine's requests from the RPC threads: sessions, registration, density changes, the
// Exchange call, and the stats. Each takes the engine's mutex; none runs a collective.
#include <sys/statvfs.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/control_round.h"
#include "daemon/engine/engine.h"
#include "daemon/util/log.h"
#include "proto/contract/futex.h"

namespace spex {
namespace {

std::string Bytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrCat(absl::SixDigits(b / double(1ull << 30)), " GiB");
  if (b >= (1ull << 20)) return absl::StrCat(absl::SixDigits(b / double(1ull << 20)), " MiB");
  return absl::StrCat(b, " bytes");
}

// Every string a request carries is short; errors quote a prefix only.
absl::Status CheckRequestString(absl::string_view what, absl::string_view s) {
  if (s.size() <= kMaxRequestString) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " ", QuotePrefix(s), " is longer than ", kMaxRequestString, " bytes"));
}

absl::Status CheckParams(const std::map<std::string, std::string>& params) {
  if (params.size() > kMaxRequestParams) {
    return absl::InvalidArgumentError(absl::StrCat(
        params.size(), " compressor parameters, at most ", kMaxRequestParams, " are accepted"));
  }
  for (const auto& [k, v] : params) {
    if (absl::Status s = CheckRequestString("compressor parameter name", k); !s.ok()) return s;
    if (absl::Status s =
            CheckRequestString(absl::StrCat("parameter ", QuotePrefix(k), "'s value"), v);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HelloResult> Engine::Hello(const std::string& job, uint32_t local_rank,
                                          uint32_t local_size, uint32_t pid,
                                          const std::string& client, uint32_t uid) {
  if (stop_) return absl::UnavailableError("spexd is shutting down");
  if (absl::Status s = CheckRequestString("job", job); !s.ok()) return s;
  if (absl::Status s = CheckRequestString("client", client); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Open(job, local_rank, local_size, pid, client, uid);
  if (!session.ok()) return session.status();
  absl::StatusOr<const ShmBuffer*> bell = doorbell_.ForTrainer(local_rank);
  if (!bell.ok()) {
    sessions_.Close((*session)->id).IgnoreError();
    return bell.status();
  }
  return HelloResult{(*session)->id, *bell};
}

absl::Status Engine::CheckCaller(uint64_t session_id, uint32_t uid, uint32_t pid) const {
  absl::MutexLock lock(&mu_);
  return sessions_.CheckOwner(session_id, uid, pid);
}

absl::Status Engine::Goodbye(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = sessions_.Close(session_id); !s.ok()) return s;
  if (sessions_.empty() && !buckets_.empty()) {
    reset_pending_ = true;  // dropped at the next job's first registration; stats stay until then
  }
  return absl::OkStatus();
}

// What a registration asks for, once checked without the engine's lock (ParseRegistration).
struct Engine::BucketRequest {
  uint64_t bucket_id = 0;
  uint64_t elements = 0;
  std::string compressor;  // the request's, or --compressor when it named none
  double density = 0;      // the request's, or --density when it gave 0
  bool compressor_given = false, density_given = false;
  std::map<std::string, std::string> cparams;  // the compressor's parameters
  BucketPolicy policy;                         // the bucket's engine options among them
  bool other_params = false;  // parameters beyond the data type (they must match the bucket's)
  int device = -1;
  const TrainerInputSpec* own_input = nullptr;  // zero-copy input (trainer_memory.h)
};

absl::StatusOr<BucketGrant> Engine::RegisterBucket(uint64_t session_id, uint64_t bucket_id,
                                                   uint64_t elements, const std::string& compressor,
                                                   double density,
                                                   const std::map<std::string, std::string>& params,
                                                   int device, const TrainerInputSpec* own_input) {
  if (stop_) return absl::UnavailableError("spexd is shutting down");
  BucketRequest req;
  if (absl::Status s =
          ParseRegistration(bucket_id, elements, compressor, density, params, device, &req);
      !s.ok()) {
    return s;
  }
  if (own_input != nullptr && device_buckets()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id,
        ": own_input (the trainer's own memory as its input) is for host buckets; this spexd "
        "keeps buckets on a GPU (--device=cuda): register without own_input"));
  }
  req.own_input = own_input;
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Get(session_id);
  if (!session.ok()) return session.status();
  // The previous job's buckets (kept until now so their stats stay visible) make way for a
  // new job once the engine is between exchanges.
  if (reset_pending_) {
    while ((processing_ || wire_.Busy()) && !stop_) published_cv_.Wait(&mu_);
    // Another trainer's registration may have reset (and registered) while this one waited.
    if (reset_pending_) ResetLocked();
  }
  bool created_here = false;
  absl::StatusOr<EngineBucket*> b = FindOrCreateBucketLocked(**session, req, &created_here);
  if (!b.ok()) return b.status();
  if (absl::Status s = CheckSameBucketLocked(**b, req, (*session)->local_rank); !s.ok()) return s;
  b = AttachTrainerLocked(*session, req, *b, created_here);
  if (!b.ok()) return b.status();
  doorbell_.Ring();  // a newly complete registration can change the canonical order
  return GrantLocked(**b, (*session)->local_rank);
}

absl::Status Engine::ParseRegistration(uint64_t bucket_id, uint64_t elements,
                                       const std::string& compressor, double density,
                                       const std::map<std::string, std::string>& params, int device,
                                       BucketRequest* req) const {
  if (absl::Status s = CheckRequestString("compressor", compressor); !s.ok()) return s;
  if (absl::Status s = CheckParams(params); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket_id, ": ", s.message()));
  }
  req->bucket_id = bucket_id;
  req->elements = elements;
  req->device = device;
  // The bucket's engine options (nonfinite=...) travel among the compressor's parameters.
  if (absl::Status s = SplitBucketParams(options_, params, &req->cparams, &req->policy); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket_id, ": ", s.message()));
  }
  req->compressor_given = !compressor.empty();
  req->density_given = density != 0;
  req->compressor = req->compressor_given ? compressor : options_.compressor;
  req->density = req->density_given ? density : options_.density;
  // The data type alone does not ask for the other parameters to match (CheckSameBucketLocked).
  req->other_params = std::any_of(params.begin(), params.end(),
                                  [](const auto& kv) { return kv.first != kBucketParamDType; });
  if (!options_.compressor_factory || req->compressor == "dense") {
    if (absl::Status s = ValidateCompressor(req->compressor, req->density, req->cparams); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket_id, ": ", s.message()));
    }
  }
  // A bucket that asks for Ok-Topk itself is checked here, before the size, so that a
  // validation request (0 elements, the clients' validate_compressor) gets the refusal too;
  // the daemon-wide flag is checked when the compressor is built (small buckets go dense).
  if (req->policy.sparse_allreduce_param) {
    absl::StatusOr<Pattern> pattern = CompressorPattern(req->compressor);
    if (pattern.ok() && *pattern != Pattern::kDense) {
      if (absl::Status s = CheckSparseAllreduce(req->policy.sparse_allreduce,
                                                /*from_param=*/true, req->compressor);
          !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("bucket ", bucket_id, ": ", s.message()));
      }
    }
  }
  if (IsHalf(req->policy.dtype) && options_.merger != MergerPolicy::kNone) {
    // Merged half buckets: the fused exchange carries one value type for the whole group, so a
    // half member's values travel as float32 (as wire_values=float32: nothing rounded on the
    // wire, the result rounded once at publish). The device path does not merge them yet.
    if (device_buckets()) {
      return absl::UnimplementedError(
          absl::StrCat("bucket ", bucket_id, ": ", DTypeName(req->policy.dtype),
                       " buckets on the device path are not merged yet (spexd runs with --merger=",
                       AbslUnparseFlag(options_.merger),
                       "): run spexd with --merger=none, or register float32 buckets"));
    }
    req->policy.wire_float32 = true;
  }
  if (elements == 0 || elements >= (1ull << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket ", bucket_id, ": elements must be in 1..2^32-1, got ", elements));
  }
  // A GPU this daemon does not serve is refused before anything is allocated.
  if (absl::Status s = buckets_.CheckDevice(device); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("bucket ", bucket_id, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineBucket*> Engine::FindOrCreateBucketLocked(const Session& session,
                                                               const BucketRequest& req,
                                                               bool* created) {
  EngineBucket* b = buckets_.Find(req.bucket_id);
  if (b == nullptr || !(b->out.registered_mask & (1ull << session.local_rank))) {
    if (absl::Status s = CheckLimitsLocked(session, b, req.bucket_id, req.elements, req.compressor,
                                           req.policy.dtype, req.device);
        !s.ok()) {
      return s;
    }
  }
  if (b != nullptr) return b;
  absl::StatusOr<EngineBucket*> made = buckets_.Create(
      {req.bucket_id, req.elements, req.compressor, req.density, req.cparams, req.policy});
  if (made.ok()) *created = true;
  return made;
}

absl::Status Engine::CheckSameBucketLocked(const EngineBucket& b, const BucketRequest& req,
                                           uint32_t rank) const {
  const uint64_t bucket_id = req.bucket_id;
  if (b.elements != req.elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id, " is registered with ", b.elements, " elements; this request says ",
        req.elements, ". Every trainer must register a bucket id with the same size"));
  }
  if (req.policy.dtype != b.policy.dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id, " is registered as ", DTypeName(b.policy.dtype),
        "; this request says ", DTypeName(req.policy.dtype),
        ". Every trainer must register a bucket id with the same data type (a mixed-precision "
        "model: convert it to one type, or keep each type's tensors in buckets of their own)"));
  }
  if ((req.compressor_given && req.compressor != b.compressor) ||
      (req.density_given && req.density != b.out.density)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id, " is registered with compressor ", b.compressor, " at density ",
        b.out.density, "; this request asks for ", req.compressor, " at ", req.density));
  }
  if (req.other_params && (req.cparams != b.params || req.policy != b.policy)) {
    const BucketPolicy& p = req.policy;
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id, " is registered with other parameters than this request's (",
        kBucketParamNonfinite, "=", AbslUnparseFlag(b.policy.nonfinite), " ",
        kBucketParamSparseAllreduce, "=", AbslUnparseFlag(b.policy.sparse_allreduce), " ",
        kBucketParamDenseFallback, "=", AbslUnparseFlag(b.policy.dense_fallback), " there, ",
        kBucketParamNonfinite, "=", AbslUnparseFlag(p.nonfinite), " ", kBucketParamSparseAllreduce,
        "=", AbslUnparseFlag(p.sparse_allreduce), " ", kBucketParamDenseFallback, "=",
        AbslUnparseFlag(p.dense_fallback),
        " here, or a compressor parameter): every trainer must register a bucket alike"));
  }
  const uint64_t bit = 1ull << rank;
  if (b.mem.shm->unlinked() && !(b.out.registered_mask & bit)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket ", bucket_id,
        "'s buffer was already attached by every local trainer and unlinked; a restarted "
        "trainer cannot rejoin a running job: restart all trainers of this node"));
  }
  if (b.out.registered_mask & bit) {
    const int now_on = b.mem.remote[rank] != nullptr ? b.mem.remote_device[rank] : device_.home;
    if (b.mem.data != nullptr && req.device >= 0 && req.device != now_on) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", bucket_id, " is registered by local trainer ", rank, " on GPU ", now_on,
          "; this request says GPU ", req.device, ". Unregister it first to move it"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineBucket*> Engine::AttachTrainerLocked(Session* session,
                                                          const BucketRequest& req, EngineBucket* b,
                                                          bool created_here) {
  const uint32_t rank = session->local_rank;
  const uint64_t bit = 1ull << rank;
  // The trainer's own memory, mapped before anything changes (a failure leaves no trace).
  std::unique_ptr<TrainerMemory> own;
  if (req.own_input != nullptr) {
    const uint64_t bytes = b->elements * DTypeSize(b->mem.view.dtype);
    absl::StatusOr<std::unique_ptr<TrainerMemory>> mapped =
        TrainerMemory::Map(session->pidfd, session->pid, session->uid, *req.own_input, bytes);
    if (!mapped.ok()) {
      if (created_here) buckets_.Erase(req.bucket_id);  // nothing else holds it yet
      return absl::Status(mapped.status().code(),
                          absl::StrCat("bucket ", req.bucket_id, ": ", mapped.status().message()));
    }
    own = std::move(*mapped);
  }
  if (b->out.registered_mask & bit) {  // registered again: nothing changes, if alike
    const TrainerMemory* had = b->mem.own_input[rank].get();
    if ((had == nullptr) != (own == nullptr) || (had != nullptr && !had->Same(*own))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "bucket ", req.bucket_id, " is registered by local trainer ", rank,
          had != nullptr ? " with its own memory as input" : " with its input in the slot",
          "; this request names ", own == nullptr ? "no own_input" : "other memory as own_input",
          ". Unregister it first to change where its input lives"));
    }
    return b;
  }
  // Several GPUs: the trainer's buffer on its own GPU, made before it counts as registered
  // (an exchange of the bucket may still be finishing after its last unregistration).
  while (b->out.state == BucketState::kExchanging && !stop_) published_cv_.Wait(&mu_);
  b = buckets_.Find(req.bucket_id);
  if (b == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("bucket ", req.bucket_id, " was removed meanwhile; register it again"));
  }
  if (absl::Status s = buckets_.PlaceSlot(b, rank, req.device); !s.ok()) {
    if (created_here) buckets_.Erase(req.bucket_id);  // nothing else holds it yet
    return s;
  }
  buckets_.PlaceOwnInput(b, rank, std::move(own));
  b->out.registered_mask |= bit;
  ++b->out.registrations;
  session->buckets++;
  session->bytes +=
      buckets_.Footprint(b->elements, b->ex.sparse != nullptr) + buckets_.SlotRemoteBytes(*b, rank);
  if (b->out.registered_mask == (1ull << options_.local_trainers) - 1 &&
      b->out.state == BucketState::kRegistering) {
    b->MoveTo(BucketState::kWaiting);
  }
  return b;
}

BucketGrant Engine::GrantLocked(const EngineBucket& b, uint32_t rank) const {
  BucketGrant grant;
  grant.buffer = b.mem.shm.get();
  const uint64_t elements = b.elements;
  const size_t eb = DTypeSize(b.mem.view.dtype);
  if (b.mem.remote[rank] != nullptr) {
    grant.device_buffer = b.mem.remote[rank].get();
    grant.device_input_offset = DeviceInputOffset(elements, 0, eb);
    grant.device_output_offset = DeviceOutputOffset(elements, 1, eb);
  } else if (b.mem.data != nullptr) {
    grant.device_buffer = b.mem.data.get();
    grant.device_input_offset = DeviceInputOffset(elements, rank, eb);
    grant.device_output_offset = DeviceOutputOffset(elements, options_.local_trainers, eb);
  } else {
    grant.input_offset = InputOffset(elements, rank, eb);
    grant.output_offset = OutputOffset(elements, options_.local_trainers, eb);
  }
  grant.elements = elements;
  grant.compressor = b.compressor;
  grant.density = b.out.density;
  grant.next_step = b.mem.header->ready[rank].value.load();
  grant.own_input = b.mem.own_input[rank] != nullptr;
  return grant;
}

absl::Status Engine::CheckLimitsLocked(const Session& session, const EngineBucket* existing,
                                       uint64_t bucket_id, uint64_t elements,
                                       const std::string& compressor, DType dtype, int device) {
  if (session.buckets >= static_cast<uint32_t>(options_.max_buckets_per_session)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bucket ", bucket_id, ": this session already registered ", session.buckets,
        " buckets, the limit (--max_buckets_per_session) is ", options_.max_buckets_per_session,
        "; merge small tensors into larger buckets or raise the limit"));
  }
  const bool sparse = buckets_.SparseCandidate(compressor, elements);
  const uint64_t footprint =
      existing != nullptr ? buckets_.Footprint(existing->elements, existing->ex.sparse != nullptr)
                          : buckets_.Footprint(elements, sparse);
  // Several GPUs: this trainer's buffer on its own GPU counts, on every limit, like the home
  // GPU's memory (docs/design.md#multi-gpu); a buffer it left there on an earlier registration
  // is reused and exists already.
  const uint64_t remote = buckets_.RemoteBytes(elements, dtype, device);
  const uint32_t rank = session.local_rank;
  const bool remote_exists = existing != nullptr && remote > 0 &&
                             existing->mem.remote[rank] != nullptr &&
                             existing->mem.remote_device[rank] == device;
  uint64_t others_remote = 0;  // the other trainers' buffers of this bucket on other GPUs
  for (uint32_t s = 0; existing != nullptr && s < kMaxLocalTrainers; ++s) {
    if (s != rank) others_remote += buckets_.SlotRemoteBytes(*existing, s);
  }
  const uint64_t need = footprint + remote;
  auto over = [&](const char* what, const char* flag, uint64_t have, uint64_t limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bucket ", bucket_id, " (", elements, " elements) needs ", Bytes(need),
        remote > 0 ? absl::StrCat(" (", Bytes(remote), " of it on GPU ", device, ")") : "", "; ",
        what, " ", have ? absl::StrCat("already holds ", Bytes(have), " and ") : "", "may hold ",
        Bytes(limit), " (", flag, "). Use smaller buckets or raise ", flag));
  };
  if (need + others_remote > limits_.bucket) {
    return over("a bucket", "--max_bucket_bytes", others_remote, limits_.bucket);
  }
  // Checkpoint streams in flight hold memory too (ReserveCheckpointBytes).
  auto streams = checkpoint_session_bytes_.find(session.id);
  const uint64_t session_bytes =
      session.bytes + (streams == checkpoint_session_bytes_.end() ? 0 : streams->second);
  if (session_bytes + need > limits_.session) {
    return over("this session", "--max_session_bytes", session_bytes, limits_.session);
  }
  // An existing bucket's home memory exists already; only a new buffer on another GPU is new.
  const uint64_t added = existing != nullptr ? (remote_exists ? 0 : remote) : need;
  const uint64_t total = buckets_.TotalBytes() + checkpoint_bytes_;
  if (added > 0 && total + added > limits_.daemon) {
    return over("this daemon", "--max_daemon_bytes", total, limits_.daemon);
  }
  if (existing != nullptr) return absl::OkStatus();
  struct statvfs v;
  const uint64_t shm = buckets_.ShmBytes(elements);
  if (statvfs("/dev/shm", &v) == 0 && shm > static_cast<uint64_t>(v.f_bavail) * v.f_frsize) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "bucket ", bucket_id, " (", elements, " elements) needs ", Bytes(shm),
        " of shared memory, /dev/shm has ", Bytes(static_cast<uint64_t>(v.f_bavail) * v.f_frsize),
        " free; free /dev/shm or use smaller buckets"));
  }
  return absl::OkStatus();
}

absl::Status Engine::ReserveCheckpointBytes(uint64_t session_id, uint64_t bucket_id,
                                            uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Get(session_id);
  if (!session.ok()) return session.status();
  uint64_t& mine = checkpoint_session_bytes_[session_id];
  auto over = [&](const char* what, const char* flag, uint64_t have, uint64_t limit) {
    if (mine == 0) checkpoint_session_bytes_.erase(session_id);
    return absl::ResourceExhaustedError(
        absl::StrCat("bucket ", bucket_id, ": a checkpoint stream needs ", Bytes(bytes), "; ", what,
                     " already holds ", Bytes(have), " and may hold ", Bytes(limit), " (", flag,
                     "). Save or load fewer buckets at once, unregister buckets or raise ", flag));
  };
  const uint64_t session_bytes = (*session)->bytes + mine;
  if (session_bytes + bytes > limits_.session) {
    return over("this session", "--max_session_bytes", session_bytes, limits_.session);
  }
  const uint64_t total = buckets_.TotalBytes() + checkpoint_bytes_;
  if (total + bytes > limits_.daemon) {
    return over("this daemon", "--max_daemon_bytes", total, limits_.daemon);
  }
  mine += bytes;
  checkpoint_bytes_ += bytes;
  return absl::OkStatus();
}

void Engine::ReleaseCheckpointBytes(uint64_t session_id, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  checkpoint_bytes_ -= std::min(checkpoint_bytes_, bytes);
  auto it = checkpoint_session_bytes_.find(session_id);
  if (it == checkpoint_session_bytes_.end()) return;
  it->second -= std::min(it->second, bytes);
  if (it->second == 0) checkpoint_session_bytes_.erase(it);
}

uint64_t Engine::checkpoint_bytes() const {
  absl::MutexLock lock(&mu_);
  return checkpoint_bytes_;
}

absl::Status Engine::UnregisterBucket(uint64_t session_id, uint64_t bucket_id) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Get(session_id);
  if (!session.ok()) return session.status();
  const uint64_t bit = 1ull << (*session)->local_rank;
  EngineBucket* b = buckets_.Find(bucket_id);
  if (b == nullptr || !(b->out.registered_mask & bit)) {
    return absl::NotFoundError(
        absl::StrCat("bucket ", bucket_id, " is not registered by this session"));
  }
  // Leaves the schedule at once (the mask is no longer full). Its memory goes when no trainer
  // holds it any more and the engine is not inside it.
  b->out.registered_mask &= ~bit;
  ++b->out.registrations;
  (*session)->buckets--;
  (*session)->bytes -= buckets_.Footprint(b->elements, b->ex.sparse != nullptr) +
                       buckets_.SlotRemoteBytes(*b, (*session)->local_rank);
  if (b->out.state == BucketState::kWaiting) b->MoveTo(BucketState::kRegistering);
  if (b->out.registered_mask == 0) {
    while ((processing_ || wire_.Busy()) && !stop_) published_cv_.Wait(&mu_);
    buckets_.Erase(bucket_id);
  }
  doorbell_.Ring();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Engine::SetDensity(double density) {
  if (!(density > 0 && density <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("density must be in (0, 1], got ", density));
  }
  absl::MutexLock lock(&mu_);
  density_version_ = std::max(density_version_, applied_density_key_ >> 32) + 1;
  density_key_ = DensityKey(density_version_, static_cast<float>(density));
  doorbell_.Ring();
  return density_version_;
}

absl::StatusOr<ExchangeRecord> Engine::Exchange(uint64_t session_id, uint64_t bucket_id,
                                                uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Session*> session = sessions_.Get(session_id);
  if (!session.ok()) return session.status();
  const uint32_t rank = (*session)->local_rank;
  const uint64_t bit = 1ull << rank;
  EngineBucket* b = buckets_.Find(bucket_id);
  if (b == nullptr || !(b->out.registered_mask & bit)) {
    std::vector<uint64_t> known;
    for (const auto& [id, other] : buckets_.all()) {
      if (other->out.registered_mask & bit) known.push_back(id);
    }
    return absl::NotFoundError(absl::StrCat("bucket ", bucket_id,
                                            " is not registered by this session; call "
                                            "RegisterBucket first (registered: [",
                                            absl::StrJoin(known, ","), "])"));
  }
  auto& ready = b->mem.header->ready[rank].value;
  const uint64_t marked = ready.load();
  if (step + 1 == marked || step < b->out.completed) {
    // Already submitted (doorbell path or a retried RPC): fall through to wait or report.
  } else if (marked == step) {
    b->mem.header->ready[rank].ready_ns.store(MonotonicNanos(), std::memory_order_relaxed);
    ready.store(step + 1);
    doorbell_.Ring();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket_id, ": exchange for step ",
                                                   step, " but this trainer's next step is ",
                                                   marked));
  }
  const uint64_t full = (1ull << options_.local_trainers) - 1;
  const absl::Time register_deadline = absl::Now() + options_.register_wait;
  auto done = [&] { return b->out.completed > step || stop_.load(); };
  while (!done()) {
    const bool all_registered = b->out.registered_mask == full;
    const absl::Time until = all_registered ? deadline : std::min(deadline, register_deadline);
    if (published_cv_.WaitWithDeadline(&mu_, until) && !done()) {
      // Which deadline passed: the registration's, or the call's (client or --max_exchange_wait).
      if (b->out.registered_mask != full && absl::Now() >= register_deadline) {
        const int have = __builtin_popcountll(b->out.registered_mask);
        return absl::FailedPreconditionError(absl::StrCat(
            "bucket ", bucket_id, ": only ", have, " of ", options_.local_trainers,
            " local trainers registered it within ", absl::FormatDuration(options_.register_wait),
            "; start every trainer of this node (spexd --local_trainers=", options_.local_trainers,
            ")"));
      }
      if (absl::Now() >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < options_.local_trainers; ++r) {
          if (b->mem.header->ready[r].value.load() <= step) missing.push_back(r);
        }
        return absl::DeadlineExceededError(absl::StrCat(
            "bucket ", bucket_id, " step ", step, " not complete before the deadline; ",
            missing.empty()
                ? std::string(
                      "all local trainers are in, waiting for other nodes or earlier buckets")
                : absl::StrCat("waiting for local trainers [", absl::StrJoin(missing, ","), "]")));
      }
    }
  }
  if (b->out.completed <= step) return absl::UnavailableError("spexd is shutting down");
  if (b->out.error_step == step ||
      (b->out.state == BucketState::kFailed && step >= b->out.error_step)) {
    return b->out.error;
  }
  if (b->out.last.step != step) {
    return absl::OutOfRangeError(
        absl::StrCat("bucket ", bucket_id, " step ", step, " completed long ago"));
  }
  return b->out.last;
}

std::vector<BucketSummary> Engine::Buckets() const {
  absl::MutexLock lock(&mu_);
  std::vector<BucketSummary> out;
  for (const auto& [id, b] : buckets_.all()) out.push_back(b->Summary());
  return out;
}

std::vector<SessionSummary> Engine::Sessions() const {
  absl::MutexLock lock(&mu_);
  return sessions_.Summaries(absl::Now());
}

uint64_t Engine::total_exchanges() const {
  absl::MutexLock lock(&mu_);
  return total_exchanges_;
}

std::vector<std::string> Engine::LinkedSegments() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out = doorbell_.LinkedSegments();
  for (std::string& name : buckets_.LinkedSegments()) out.push_back(std::move(name));
  return out;
}

}  // namespace spex
