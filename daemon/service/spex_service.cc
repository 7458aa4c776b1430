#include "daemon/service/spex_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/util/log.h"

namespace spex {
namespace {

grpc::Status Refuse(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// `requested` as a file of `dir`: a relative name goes under it, an absolute path must lie in
// it; no component may be "..". INVALID_ARGUMENT saying where timelines go otherwise.
absl::StatusOr<std::string> TimelineFile(const std::string& dir, const std::string& requested) {
  if (dir.empty()) {
    return absl::FailedPreconditionError(
        "this spexd records timelines at run time only into --timeline_dir, which it was not "
        "given; restart it with --timeline_dir=DIR (a directory of the daemon's user)");
  }
  std::string path = requested;
  const std::string prefix = dir.back() == '/' ? dir : dir + "/";
  if (path.empty() || path[0] != '/') path = prefix + path;
  const std::string rest = path.substr(std::min(path.size(), prefix.size()));
  // A file directly in the directory: no subdirectory, "." or "..".
  if (path.compare(0, prefix.size(), prefix) != 0 || rest.empty() || rest == "." || rest == ".." ||
      rest.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeline path '", requested.substr(0, 200), "' is not a file directly in ",
                     dir, " (--timeline_dir); give a file name (written there) or DIR/NAME"));
  }
  return path;
}

}  // namespace

SpexService::SpexService(Engine* engine, std::string version, PeerCred caller, Options options)
    : engine_(engine),
      version_(std::move(version)),
      peers_(nullptr),
      fixed_caller_(caller),
      options_(std::move(options)),
      timeline_(nullptr) {}

SpexService::~SpexService() {
  {
    absl::MutexLock lock(&watch_mu_);
    watch_stop_ = true;
    watch_cv_.Signal();
  }
  if (watcher_.joinable()) watcher_.join();
}

class SpexService::StreamSlot {
 public:
  explicit StreamSlot(SpexService* service) : service_(service) {}
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;
  ~StreamSlot() {
    if (watched_) {
      absl::MutexLock lock(&service_->watch_mu_);
      service_->watched_.erase(watch_id_);
    }
    Shrink(0);
    if (counted_) {
      service_->checkpoint_streams_.fetch_sub(1);
      service_->waiting_exchanges_.fetch_sub(1);
    }
  }
  // Charges `bytes` more of the record's memory to `session` (Engine::ReserveCheckpointBytes).
  absl::Status Charge(uint64_t session, uint64_t bucket, uint64_t bytes) {
    absl::Status s = service_->engine_->ReserveCheckpointBytes(session, bucket, bytes);
    if (!s.ok()) return s;
    session_ = session;
    bytes_ += bytes;
    return absl::OkStatus();
  }
  // Keeps only `bytes` of the charge.
  void Shrink(uint64_t bytes) {
    if (bytes >= bytes_) return;
    service_->engine_->ReleaseCheckpointBytes(session_, bytes_ - bytes);
    bytes_ = bytes;
  }
  // Why the stream ended early: its --checkpoint_stream_timeout passed (the watcher cancelled
  // it) or its client cancelled it; OK while neither.
  absl::Status Ended(grpc::ServerContext* ctx, const std::string& what) const {
    bool timed_out = false;
    if (watched_) {
      absl::MutexLock lock(&service_->watch_mu_);
      auto it = service_->watched_.find(watch_id_);
      timed_out = it != service_->watched_.end() && it->second.cancelled;
    }
    if (timed_out) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": the stream stayed open longer than --checkpoint_stream_timeout=",
                       absl::FormatDuration(service_->options_.checkpoint_stream_timeout),
                       " and was cancelled; send or read the record without pausing"));
    }
    if (ctx != nullptr && ctx->IsCancelled()) {
      return absl::CancelledError(absl::StrCat(what, ": the client cancelled the stream"));
    }
    return absl::OkStatus();
  }

 private:
  friend class SpexService;
  SpexService* const service_;
  bool counted_ = false;  // holds a stream slot and a thread slot
  bool watched_ = false;  // watch_id_ is in watched_
  uint64_t watch_id_ = 0;
  uint64_t session_ = 0, bytes_ = 0;  // the memory charged
};

absl::Status SpexService::OpenStream(grpc::ServerContext* ctx, const char* what, StreamSlot* slot) {
  const int streams = options_.max_checkpoint_streams;
  if (checkpoint_streams_.fetch_add(1) >= streams && streams > 0) {
    checkpoint_streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", streams,
        " checkpoint streams (SaveBucketState, LoadBucketState) are already open in this spexd "
        "(--max_checkpoint_streams=",
        streams,
        "): save or load fewer buckets at once, or restart spexd with a larger "
        "--max_checkpoint_streams"));
  }
  const int threads = options_.max_waiting_exchanges;
  if (waiting_exchanges_.fetch_add(1) >= threads && threads > 0) {
    waiting_exchanges_.fetch_sub(1);
    checkpoint_streams_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", threads,
        " calls (waiting Exchange calls and checkpoint streams) already hold threads in this "
        "spexd (--rpc_threads leaves ",
        threads, " threads for them): try again, or restart spexd with a larger --rpc_threads"));
  }
  slot->counted_ = true;
  if (ctx == nullptr) return absl::OkStatus();
  absl::MutexLock lock(&watch_mu_);
  slot->watch_id_ = next_watch_id_++;
  slot->watched_ = true;
  watched_[slot->watch_id_] = {ctx, absl::Now() + options_.checkpoint_stream_timeout};
  if (!watcher_.joinable()) watcher_ = std::thread([this] { WatchStreams(); });
  watch_cv_.Signal();
  return absl::OkStatus();
}

void SpexService::WatchStreams() {
  absl::MutexLock lock(&watch_mu_);
  while (!watch_stop_) {
    const absl::Time now = absl::Now();
    absl::Time next = absl::InfiniteFuture();
    for (auto& [id, w] : watched_) {
      if (w.cancelled) continue;
      if (w.deadline <= now) {
        // Ends the Read or Write the stream's thread is blocked in (both return false).
        w.cancelled = true;
        w.ctx->TryCancel();
        SPEX_LOG(WARNING) << "a checkpoint stream from " << w.ctx->peer()
                          << " stayed open longer than --checkpoint_stream_timeout="
                          << absl::FormatDuration(options_.checkpoint_stream_timeout)
                          << "; cancelled";
      } else {
        next = std::min(next, w.deadline);
      }
    }
    watch_cv_.WaitWithDeadline(&watch_mu_, next);
  }
}

absl::StatusOr<PeerCred> SpexService::Caller(grpc::ServerContext* ctx) const {
  if (fixed_caller_.has_value()) return *fixed_caller_;
  const std::string peer = ctx != nullptr ? ctx->peer() : std::string();
  std::optional<PeerCred> cred = peers_ != nullptr ? peers_->Lookup(peer) : std::nullopt;
  if (!cred.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat("spexd cannot tell who is calling (peer '",
                                                   peer.substr(0, 64),
                                                   "'): connect through its unix socket"));
  }
  return *cred;
}

absl::StatusOr<PeerCred> SpexService::OwnerCaller(grpc::ServerContext* ctx,
                                                  const char* what) const {
  absl::StatusOr<PeerCred> c = Caller(ctx);
  if (c.ok() && !PeerListener::Owner(c->uid)) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " is for the daemon's own user (uid ", geteuid(), ") and root; uid ",
                     c->uid, " may read stats only. Run your own spexd (see docs/security.md)"));
  }
  return c;
}

absl::Status SpexService::SessionCaller(grpc::ServerContext* ctx, uint64_t session_id) const {
  absl::StatusOr<PeerCred> c = Caller(ctx);
  if (!c.ok()) return c.status();
  return engine_->CheckCaller(session_id, c->uid, c->pid);
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

void ToProto(const ExchangeRecord& rec, v1::ExchangeStats* out) {
  out->set_bucket_id(rec.bucket_id);
  out->set_step(rec.step);
  out->set_compressor(rec.compressor);
  out->set_target_density(rec.target_density);
  out->set_achieved_density(rec.achieved_density);
  out->set_bytes_sent(rec.bytes_sent);
  out->set_bytes_received(rec.bytes_received);
  out->set_residual_norm(rec.residual_norm);
  out->set_total_seconds(rec.total_seconds);
  out->set_gathered_elements(rec.gathered_elements);
  out->set_selected_elements(rec.selected_elements);
  out->set_pattern(rec.pattern);
  out->set_sparse_allreduce(rec.sparse_allreduce);
  out->set_fell_back_to_dense(rec.fell_back_to_dense);
  out->set_residual_norm_step(rec.residual_norm_step);
  for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) {
    auto* ph = out->add_phases();
    ph->set_phase(PhaseName(static_cast<Phase>(p)));
    ph->set_seconds(rec.phase_seconds[p]);
    ph->set_cpu_seconds(rec.phase_cpu_seconds[p]);
  }
}

grpc::Status SpexService::Hello(grpc::ServerContext* ctx, const v1::HelloRequest* req,
                                v1::HelloResponse* resp) {
  absl::StatusOr<PeerCred> caller = OwnerCaller(ctx, "opening a session");
  if (!caller.ok()) return Refuse(caller.status());
  if (req->protocol_version() > 1) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("client speaks protocol ", req->protocol_version(),
                                     "; this spexd speaks 1: upgrade the daemon"));
  }
  const bool device = engine_->device_buckets();
  if (req->device() == v1::DEVICE_CUDA && !device) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this spexd serves host (CPU) buffers; CUDA buffers need a daemon started "
                        "with --device=cuda");
  }
  if (req->device() == v1::DEVICE_CPU && device) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        "this spexd serves CUDA buffers (--device=cuda, or --device=auto found a GPU); a trainer "
        "asking for host buffers needs a daemon started with --device=cpu, or must ask for "
        "DEVICE_CUDA (C++: ClientOptions::device)");
  }
  // The pid in the request is the client's word; the kernel's is the one the session is bound
  // to and the one whose death frees it.
  auto hello = engine_->Hello(req->job(), req->local_rank(), req->local_size(), caller->pid,
                              req->client(), caller->uid);
  if (!hello.ok()) return ToGrpc(hello.status());
  resp->set_session_id(hello->session_id);
  resp->set_node_rank(engine_->node_rank());
  resp->set_node_count(engine_->node_count());
  resp->set_local_trainers(engine_->options().local_trainers);
  resp->mutable_defaults()->set_name(engine_->options().compressor);
  resp->mutable_defaults()->set_density(engine_->options().density);
  hello->doorbell->Describe(resp->mutable_doorbell());
  resp->set_spin_us(engine_->options().client_spin_us);
  resp->set_daemon_version(version_);
  resp->set_device(device ? v1::DEVICE_CUDA : v1::DEVICE_CPU);
  return grpc::Status::OK;
}

grpc::Status SpexService::RegisterBucket(grpc::ServerContext* ctx,
                                         const v1::RegisterBucketRequest* req,
                                         v1::RegisterBucketResponse* resp) {
  if (absl::Status s = SessionCaller(ctx, req->session_id()); !s.ok()) return Refuse(s);
  std::map<std::string, std::string> params(req->compressor().params().begin(),
                                            req->compressor().params().end());
  // The data type travels to the engine as the bucket's dtype parameter (engine_options.h).
  const char* dtype = nullptr;
  switch (req->dtype()) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT32:
      dtype = "float32";
      break;
    case v1::DTYPE_BFLOAT16:
      dtype = "bfloat16";
      break;
    case v1::DTYPE_FLOAT16:
      dtype = "float16";
      break;
    default:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("bucket ", req->bucket_id(), ": unknown data type ",
                                       static_cast<int>(req->dtype()),
                                       "; this spexd knows DTYPE_FLOAT32, DTYPE_BFLOAT16 and "
                                       "DTYPE_FLOAT16 (upgrade the daemon for newer types)"));
  }
  auto given = params.find("dtype");
  if (given != params.end() && given->second != dtype && !(req->dtype() == v1::DTYPE_UNSPECIFIED)) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("bucket ", req->bucket_id(), ": the request's dtype is ", dtype,
                     " but its parameter dtype=", given->second, "; set one of them"));
  }
  if (given == params.end() && req->dtype() != v1::DTYPE_UNSPECIFIED &&
      req->dtype() != v1::DTYPE_FLOAT32) {
    params["dtype"] = dtype;  // float32 is the default: absent, as from an older client
  }
  if (req->has_device_ordinal() && req->device_ordinal() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("device_ordinal must be a CUDA device ordinal (>= 0), got ",
                                     req->device_ordinal()));
  }
  TrainerInputSpec own;
  if (req->has_own_input()) {
    own.fd = req->own_input().fd();
    own.offset = req->own_input().offset();
  }
  auto grant = engine_->RegisterBucket(
      req->session_id(), req->bucket_id(), req->elements(), req->compressor().name(),
      req->compressor().density(), params, req->has_device_ordinal() ? req->device_ordinal() : -1,
      req->has_own_input() ? &own : nullptr);
  if (!grant.ok()) return ToGrpc(grant.status());
  resp->set_own_input(grant->own_input);
  grant->buffer->Describe(resp->mutable_buffer());
  auto* layout = resp->mutable_layout();
  layout->set_header_offset(0);
  layout->set_input_offset(grant->input_offset);
  layout->set_output_offset(grant->output_offset);
  layout->set_elements(grant->elements);
  if (grant->device_buffer != nullptr) {
    // The data lives in the device buffer; `layout` above locates only the header.
    grant->device_buffer->Describe(resp->mutable_device_buffer());
    auto* device_layout = resp->mutable_device_layout();
    device_layout->set_input_offset(grant->device_input_offset);
    device_layout->set_output_offset(grant->device_output_offset);
    device_layout->set_elements(grant->elements);
  }
  resp->mutable_compressor()->set_name(grant->compressor);
  resp->mutable_compressor()->set_density(grant->density);
  resp->set_next_step(grant->next_step);
  return grpc::Status::OK;
}

grpc::Status SpexService::UnregisterBucket(grpc::ServerContext* ctx,
                                           const v1::UnregisterBucketRequest* req,
                                           v1::UnregisterBucketResponse*) {
  if (absl::Status s = SessionCaller(ctx, req->session_id()); !s.ok()) return Refuse(s);
  return ToGrpc(engine_->UnregisterBucket(req->session_id(), req->bucket_id()));
}

grpc::Status SpexService::SetDensity(grpc::ServerContext* ctx, const v1::SetDensityRequest* req,
                                     v1::SetDensityResponse* resp) {
  // It changes every job's density on every node: the daemon's user (its trainers, spexctl).
  absl::StatusOr<PeerCred> caller = OwnerCaller(ctx, "SetDensity");
  if (!caller.ok()) return Refuse(caller.status());
  auto version = engine_->SetDensity(req->density());
  if (!version.ok()) return ToGrpc(version.status());
  resp->set_version(*version);
  return grpc::Status::OK;
}

grpc::Status SpexService::Exchange(grpc::ServerContext* ctx, const v1::ExchangeRequest* req,
                                   v1::ExchangeResponse* resp) {
  if (absl::Status s = SessionCaller(ctx, req->session_id()); !s.ok()) return Refuse(s);
  // A waiting call holds one of the server's threads: never longer than --max_exchange_wait,
  // and never so many at once that short calls find no thread (gRPC would refuse those, and
  // everyone's, with a bare "Server Threadpool Exhausted").
  const int limit = options_.max_waiting_exchanges;
  if (waiting_exchanges_.fetch_add(1) >= limit && limit > 0) {
    waiting_exchanges_.fetch_sub(1);
    return ToGrpc(absl::ResourceExhaustedError(absl::StrCat(
        limit,
        " calls (waiting Exchange calls and checkpoint streams) already hold threads in this "
        "spexd (--rpc_threads leaves ",
        limit,
        " threads for them): wait for a result before asking for the next one, use the doorbell "
        "path (mode='doorbell'), or restart spexd with a larger --rpc_threads")));
  }
  const auto deadline = ctx->deadline();
  const absl::Time bound = absl::Now() + options_.max_exchange_wait;
  absl::Time until = bound;
  if (deadline < std::chrono::system_clock::now() + std::chrono::hours(24 * 365)) {
    until = std::min(until, absl::FromChrono(deadline));
  }
  auto rec = engine_->Exchange(req->session_id(), req->bucket_id(), req->step(), until);
  waiting_exchanges_.fetch_sub(1);
  if (!rec.ok() && rec.status().code() == absl::StatusCode::kDeadlineExceeded && until == bound) {
    return ToGrpc(absl::DeadlineExceededError(absl::StrCat(
        rec.status().message(),
        " (spexd --max_exchange_wait=", absl::FormatDuration(options_.max_exchange_wait),
        " bounds one Exchange call's wait, whatever the client's deadline; call Exchange again "
        "for the same step to keep waiting)")));
  }
  if (!rec.ok()) return ToGrpc(rec.status());
  ToProto(*rec, resp->mutable_stats());
  return grpc::Status::OK;
}

grpc::Status SpexService::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*,
                                   v1::GetStatsResponse* resp) {
  if (absl::StatusOr<PeerCred> c = Caller(ctx); !c.ok()) return Refuse(c.status());
  resp->set_node_rank(engine_->node_rank());
  resp->set_node_count(engine_->node_count());
  resp->set_exchanges(engine_->total_exchanges());
  resp->set_collective(engine_->collective_name());
  resp->set_sessions(engine_->Sessions().size());
  for (const BucketSummary& b : engine_->Buckets()) {
    auto* out = resp->add_buckets();
    out->set_bucket_id(b.bucket_id);
    out->set_elements(b.elements);
    out->set_compressor(b.compressor);
    out->set_dtype(b.dtype);
    out->set_exchanges(b.exchanges);
    out->set_bytes_sent_total(b.bytes_sent_total);
    out->set_bytes_received_total(b.bytes_received_total);
    out->set_state(b.state);
    out->set_exchange_choice(b.exchange_choice);
    if (b.exchanges) ToProto(b.last, out->mutable_last());
    for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) {
      auto* ph = out->add_mean_phases();
      ph->set_phase(PhaseName(static_cast<Phase>(p)));
      ph->set_seconds(b.mean_phase_seconds[p]);
      ph->set_cpu_seconds(b.mean_phase_cpu_seconds[p]);
    }
  }
  return grpc::Status::OK;
}

grpc::Status SpexService::ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest*,
                                       v1::ListSessionsResponse* resp) {
  absl::StatusOr<PeerCred> caller = Caller(ctx);
  if (!caller.ok()) return Refuse(caller.status());
  for (const SessionSummary& s : engine_->Sessions()) {
    auto* out = resp->add_sessions();
    // A session's id and pid go to its own user (and root) only: an id is half of what a
    // request needs, and other users have no business with the pids.
    if (caller->uid == 0 || caller->uid == s.uid) {
      out->set_session_id(s.session_id);
      out->set_pid(s.pid);
    }
    out->set_local_rank(s.local_rank);
    out->set_client(s.client);
    out->set_buckets(s.buckets);
    out->set_age_seconds(s.age_seconds);
  }
  return grpc::Status::OK;
}

grpc::Status SpexService::Goodbye(grpc::ServerContext* ctx, const v1::GoodbyeRequest* req,
                                  v1::GoodbyeResponse*) {
  if (absl::Status s = SessionCaller(ctx, req->session_id()); !s.ok()) return Refuse(s);
  return ToGrpc(engine_->Goodbye(req->session_id()));
}

grpc::Status SpexService::StartTimeline(grpc::ServerContext* ctx,
                                        const v1::StartTimelineRequest* req,
                                        v1::TimelineResponse* resp) {
  absl::StatusOr<PeerCred> caller = OwnerCaller(ctx, "recording a timeline");
  if (!caller.ok()) return Refuse(caller.status());
  if (timeline_ == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this daemon records no timeline");
  }
  absl::StatusOr<std::string> path = TimelineFile(options_.timeline_dir, req->path());
  if (!path.ok()) return Refuse(path.status());
  // The RPC never replaces a file nor follows a symlink, writes mode 0600 and stops growing at
  // --timeline_max_bytes.
  if (absl::Status s = timeline_->Start(*path, /*overwrite=*/false, options_.timeline_max_bytes);
      !s.ok()) {
    return ToGrpc(s);
  }
  resp->set_path(timeline_->path());
  resp->set_recording(true);
  return grpc::Status::OK;
}

grpc::Status SpexService::StopTimeline(grpc::ServerContext* ctx, const v1::StopTimelineRequest*,
                                       v1::TimelineResponse* resp) {
  absl::StatusOr<PeerCred> caller = OwnerCaller(ctx, "stopping a timeline");
  if (!caller.ok()) return Refuse(caller.status());
  if (timeline_ == nullptr) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this daemon records no timeline");
  }
  absl::StatusOr<uint64_t> written = timeline_->Stop();
  if (!written.ok()) return ToGrpc(written.status());
  resp->set_path(timeline_->path());
  resp->set_recording(false);
  resp->set_exchanges(*written);
  return grpc::Status::OK;
}

grpc::Status SpexService::SaveBucketState(grpc::ServerContext* ctx,
                                          const v1::SaveBucketStateRequest* req,
                                          grpc::ServerWriter<v1::BucketStateChunk>* writer) {
  if (absl::Status s = SessionCaller(ctx, req->session_id()); !s.ok()) return Refuse(s);
  const std::string what = absl::StrCat("bucket ", req->bucket_id(), ": SaveBucketState");
  // The slot before anything is copied: the stream holds a thread until its client has read
  // the whole record, and the record's memory until then.
  StreamSlot slot(this);
  if (absl::Status s = OpenStream(ctx, what.c_str(), &slot); !s.ok()) return Refuse(s);
  uint64_t elements = 0;
  for (const BucketSummary& b : engine_->Buckets()) {
    if (b.bucket_id == req->bucket_id()) elements = b.elements;
  }
  // The copy and the encoded record exist together for a moment: at most the bound a loaded
  // record has (below) each. An unregistered bucket is the engine's NOT_FOUND.
  if (elements > 0) {
    if (absl::Status s =
            slot.Charge(req->session_id(), req->bucket_id(), 2 * (8 * elements + kStateChunkBytes));
        !s.ok()) {
      return ToGrpc(s);
    }
  }
  absl::StatusOr<std::string> record =
      engine_->SaveBucketState(req->session_id(), req->bucket_id());
  if (!record.ok()) return ToGrpc(record.status());
  slot.Shrink(record->size());  // the copy is gone; the record stays until it is sent
  v1::BucketStateChunk chunk;
  chunk.set_session_id(req->session_id());
  chunk.set_bucket_id(req->bucket_id());
  chunk.set_total_bytes(record->size());
  size_t at = 0;
  do {
    const size_t n = std::min(kStateChunkBytes, record->size() - at);
    chunk.set_data(record->data() + at, n);
    if (!writer->Write(chunk)) {
      absl::Status s = slot.Ended(ctx, what);
      return ToGrpc(s.ok() ? absl::CancelledError(
                                 absl::StrCat(what, ": the client stopped reading the record"))
                           : s);
    }
    at += n;
  } while (at < record->size());
  return grpc::Status::OK;
}

grpc::Status SpexService::LoadBucketState(grpc::ServerContext* ctx,
                                          grpc::ServerReader<v1::BucketStateChunk>* reader,
                                          v1::LoadBucketStateResponse*) {
  // Before the first Read, which waits for the client: a monitor (--allow_uids) could otherwise
  // hold a server thread per stream for as long as it likes.
  if (absl::StatusOr<PeerCred> c = OwnerCaller(ctx, "LoadBucketState"); !c.ok()) {
    return Refuse(c.status());
  }
  // A slot and a deadline before the first Read: a stalled stream holds a thread until then.
  StreamSlot slot(this);
  if (absl::Status s = OpenStream(ctx, "LoadBucketState", &slot); !s.ok()) return Refuse(s);
  v1::BucketStateChunk chunk;
  if (!reader->Read(&chunk)) {
    if (absl::Status s = slot.Ended(ctx, "LoadBucketState"); !s.ok()) return ToGrpc(s);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "LoadBucketState: no chunk came; send the record SaveBucketState gave");
  }
  const uint64_t session = chunk.session_id(), bucket = chunk.bucket_id();
  const uint64_t total = chunk.total_bytes();
  const bool resize = chunk.resize();
  if (absl::Status s = SessionCaller(ctx, session); !s.ok()) return Refuse(s);
  // A record is the residual (4 bytes an element) and small state: more than twice that for the
  // registered bucket is not one of its records, and is refused before anything is kept.
  uint64_t limit = 0;
  for (const BucketSummary& b : engine_->Buckets()) {
    if (b.bucket_id == bucket) limit = 8 * b.elements + kStateChunkBytes;
  }
  if (limit == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("bucket ", bucket,
                                     " is not registered; call RegisterBucket "
                                     "before LoadBucketState"));
  }
  if (total > limit) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("bucket ", bucket, ": a record of ", total,
                                     " bytes is too large for this bucket (at most ", limit,
                                     "); it is not a checkpoint of a bucket of this size"));
  }
  // The record and its decoded copy, charged before the first byte is kept.
  if (absl::Status s = slot.Charge(session, bucket, 2 * total); !s.ok()) return ToGrpc(s);
  std::string record;
  record.reserve(total);
  do {
    if (chunk.session_id() != session || chunk.bucket_id() != bucket ||
        chunk.total_bytes() != total || chunk.resize() != resize ||
        chunk.data().size() > kStateChunkBytes || record.size() + chunk.data().size() > total) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("bucket ", bucket,
                                       ": malformed LoadBucketState stream at byte ", record.size(),
                                       " (every chunk carries the same session, bucket, total and "
                                       "resize, "
                                       "at most 512 KiB of data, no more than the total)"));
    }
    record.append(chunk.data());
  } while (reader->Read(&chunk));
  if (absl::Status s = slot.Ended(ctx, absl::StrCat("bucket ", bucket, ": LoadBucketState"));
      !s.ok()) {
    return ToGrpc(s);
  }
  if (record.size() != total) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS,
                        absl::StrCat("bucket ", bucket, ": the record ended after ", record.size(),
                                     " of ", total, " bytes (truncated)"));
  }
  return ToGrpc(engine_->LoadBucketState(session, bucket, record, resize));
}

}  // namespace spex
