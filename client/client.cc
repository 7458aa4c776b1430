#include "client/client.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "daemon/memory/futex.h"
#include "daemon/util/paths.h"
#include "grpcpp/grpcpp.h"

namespace spex {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(what, ": ", s.error_message()));
}

constexpr int64_t kWaitSliceNs = 100 * 1000 * 1000;

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client());
  c->options_ = options;
  const std::string job = options.job.empty() ? DefaultJob() : options.job;
  c->socket_ = options.socket.empty() ? ClientSocketPath(job) : options.socket;
  if (access(c->socket_.c_str(), F_OK) != 0) {
    return absl::UnavailableError(absl::StrCat("no spexd socket at ", c->socket_,
                                               ": start the node's daemon first (mpirun ... spexd --socket=",
                                               c->socket_, "), or point SPEX_SOCKET at its socket"));
  }
  auto channel = grpc::CreateChannel("unix:" + c->socket_, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + absl::ToChronoSeconds(options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("spexd at ", c->socket_, " does not answer within ",
                                               absl::FormatDuration(options.connect_timeout),
                                               " (stale socket? start the daemon)"));
  }
  c->stub_ = v1::Spex::NewStub(channel);
  v1::HelloRequest req;
  req.set_job(options.job);
  req.set_local_rank(options.local_rank);
  req.set_local_size(options.local_size);
  req.set_device(v1::DEVICE_CPU);
  req.set_client(options.client_name);
  req.set_pid(getpid());
  req.set_protocol_version(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(options.connect_timeout));
  if (auto s = FromGrpc(c->stub_->Hello(&ctx, req, &c->hello_), "Hello"); !s.ok()) return s;
  if (!c->hello_.doorbell().has_shm()) return absl::InternalError("Hello: daemon sent no doorbell segment");
  auto bell = ShmMapping::Attach(c->hello_.doorbell().shm().name(), c->hello_.doorbell().shm().size());
  if (!bell.ok()) return bell.status();
  c->doorbell_mapping_ = std::move(*bell);
  c->doorbell_ = static_cast<DoorbellSegment*>(c->doorbell_mapping_->data());
  if (c->doorbell_->magic != kDoorbellMagic || c->doorbell_->version != kLayoutVersion) {
    return absl::FailedPreconditionError("doorbell segment has an unknown layout: client and daemon versions differ");
  }
  c->doorbell_->attached[options.local_rank].store(1);
  return c;
}

Client::~Client() { Goodbye().IgnoreError(); }

absl::Status Client::Goodbye() {
  if (said_goodbye_ || stub_ == nullptr) return absl::OkStatus();
  said_goodbye_ = true;
  v1::GoodbyeRequest req;
  req.set_session_id(hello_.session_id());
  v1::GoodbyeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return FromGrpc(stub_->Goodbye(&ctx, req, &resp), "Goodbye");
}

absl::StatusOr<Bucket*> Client::RegisterBucket(uint64_t id, size_t elements, const CompressorChoice& choice) {
  if (buckets_.count(id)) {
    return absl::AlreadyExistsError(absl::StrCat("bucket ", id, " is already registered by this client"));
  }
  v1::RegisterBucketRequest req;
  req.set_session_id(hello_.session_id());
  req.set_bucket_id(id);
  req.set_elements(elements);
  req.set_dtype(v1::DTYPE_FLOAT32);
  req.mutable_compressor()->set_name(choice.name);
  req.mutable_compressor()->set_density(choice.density);
  v1::RegisterBucketResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(options_.connect_timeout));
  if (auto s = FromGrpc(stub_->RegisterBucket(&ctx, req, &resp), "RegisterBucket"); !s.ok()) return s;
  const auto& shm = resp.buffer().shm();
  const auto& layout = resp.layout();
  if (layout.elements() != elements || layout.input_offset() + elements * 4 > shm.size() ||
      layout.output_offset() + elements * 4 > shm.size()) {
    return absl::InternalError("RegisterBucket: the daemon described a layout that does not fit its buffer");
  }
  auto mapping = ShmMapping::Attach(shm.name(), shm.size());
  if (!mapping.ok()) return mapping.status();
  auto b = std::make_unique<Bucket>();
  b->id_ = id;
  b->elements_ = elements;
  uint8_t* base = static_cast<uint8_t*>((*mapping)->data());
  b->header_ = reinterpret_cast<BucketHeader*>(base + layout.header_offset());
  if (b->header_->magic != kBucketMagic || b->header_->elements != elements) {
    return absl::FailedPreconditionError("bucket segment has an unexpected layout: client and daemon versions differ");
  }
  b->input_ = reinterpret_cast<float*>(base + layout.input_offset());
  b->output_ = reinterpret_cast<const float*>(base + layout.output_offset());
  b->next_step_ = resp.next_step();
  b->compressor_ = resp.compressor().name();
  b->density_ = resp.compressor().density();
  b->mapping_ = std::move(*mapping);
  b->header_->attached[options_.local_rank].store(1);
  Bucket* raw = b.get();
  buckets_[id] = std::move(b);
  return raw;
}

absl::Status Client::Exchange(Bucket* b, ExchangeMode mode) {
  const uint64_t step = b->next_step_;
  absl::Status s;
  if (mode == ExchangeMode::kRpc) {
    s = ExchangeRpc(b, step);
  } else {
    b->header_->ready[options_.local_rank].value.store(step + 1, std::memory_order_seq_cst);
    doorbell_->ring.fetch_add(1);
    if (doorbell_->engine_sleeping.load()) FutexWake(&doorbell_->ring);
    s = WaitPublished(b, step);
    if (s.ok() && b->header_->status.load() != 0) s = ExchangeRpc(b, step);  // fetches the message
  }
  if (s.ok()) b->next_step_ = step + 1;
  return s;
}

absl::Status Client::WaitPublished(Bucket* b, uint64_t step) {
  auto& published = b->header_->published;
  const uint32_t want = static_cast<uint32_t>(step + 1);
  const uint64_t start = MonotonicNanos();
  const uint64_t spin_until = start + hello_.spin_us() * 1000ull;
  while (MonotonicNanos() < spin_until) {
    if (published.load(std::memory_order_acquire) == want) return absl::OkStatus();
    CpuRelax();
  }
  const uint64_t limit = start + absl::ToInt64Nanoseconds(options_.exchange_timeout);
  b->header_->waiters.fetch_add(1);
  absl::Status result = absl::OkStatus();
  while (true) {
    const uint32_t cur = published.load();
    if (cur == want) break;
    if (doorbell_->shutdown.load()) {
      result = absl::UnavailableError(absl::StrCat("spexd at ", socket_, " shut down during the exchange of bucket ",
                                                   b->id_, " step ", step));
      break;
    }
    const uint64_t now = MonotonicNanos();
    if (now >= limit) {
      result = absl::DeadlineExceededError(absl::StrCat(
          "bucket ", b->id_, " step ", step, " not published within ", absl::FormatDuration(options_.exchange_timeout),
          ": are all local trainers and all nodes exchanging the same buckets? (spexctl stats shows progress)"));
      break;
    }
    FutexWait(&published, cur, std::min<int64_t>(kWaitSliceNs, limit - now));
  }
  b->header_->waiters.fetch_sub(1);
  return result;
}

absl::Status Client::ExchangeRpc(Bucket* b, uint64_t step) {
  v1::ExchangeRequest req;
  req.set_session_id(hello_.session_id());
  req.set_bucket_id(b->id_);
  req.set_step(step);
  v1::ExchangeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(options_.exchange_timeout));
  absl::Status s = FromGrpc(stub_->Exchange(&ctx, req, &resp), absl::StrCat("Exchange(bucket ", b->id_, ")"));
  if (s.ok()) b->last_stats_ = resp.stats();
  return s;
}

absl::StatusOr<v1::GetStatsResponse> Client::Stats() {
  v1::GetStatsRequest req;
  req.set_session_id(hello_.session_id());
  v1::GetStatsResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (auto s = FromGrpc(stub_->GetStats(&ctx, req, &resp), "GetStats"); !s.ok()) return s;
  return resp;
}

}  // namespace spex
