// The C++ client's calls (client.h): Hello, bucket registration and mapping, the doorbell and RPC
// exchanges, and the errors a trainer gets, each saying what to fix.
#include "client/client.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/contract/futex.h"
#include "proto/contract/socket_paths.h"

namespace spex {
namespace {

absl::Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

constexpr int64_t kWaitSliceNs = 100 * 1000 * 1000;

bool Fits(uint64_t offset, uint64_t bytes, uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

// Offsets from the daemon must also keep what lies there aligned (the header's futex words,
// the float slots); found by tests/fuzz/header_fuzz.
bool Aligned(uint64_t offset, size_t alignment) { return offset % alignment == 0; }

}  // namespace

absl::StatusOr<BucketView> ResolveBucketView(const v1::RegisterBucketResponse& resp,
                                             size_t elements, uint32_t local_rank,
                                             uint32_t local_size, void* host_base, size_t host_size,
                                             bool want_device, IpcHandleCache* cache,
                                             uint32_t dtype) {
  const auto& layout = resp.layout();
  const uint64_t bytes = static_cast<uint64_t>(elements) * (dtype == 0 ? sizeof(float) : 2);
  if (layout.elements() != elements ||
      !Fits(layout.header_offset(), sizeof(BucketHeader), host_size) ||
      !Aligned(layout.header_offset(), alignof(BucketHeader))) {
    return absl::InternalError(
        "RegisterBucket: the daemon described a layout that does not fit its buffer");
  }
  BucketView v;
  uint8_t* base = static_cast<uint8_t*>(host_base);
  v.header = reinterpret_cast<BucketHeader*>(base + layout.header_offset());
  if (v.header->magic != kBucketMagic || v.header->elements != elements ||
      v.header->slots != local_size) {
    return absl::FailedPreconditionError(
        "bucket segment has an unexpected layout: client and daemon versions differ");
  }
  if (v.header->dtype != dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket segment holds data type code ", v.header->dtype, ", this client registered ", dtype,
        ": client and daemon versions differ (an older spexd serves float32 only)"));
  }
  const bool device_reply = resp.has_device_buffer();
  if (device_reply != want_device) {
    return absl::FailedPreconditionError(want_device
                                             ? "RegisterBucket: this client asked for CUDA buffers "
                                               "(DEVICE_CUDA) but the daemon described a "
                                               "host buffer; start spexd with --device=cuda"
                                             : "RegisterBucket: the daemon described a CUDA buffer "
                                               "to a client that asked for host buffers");
  }
  if (!device_reply) {
    if (!Fits(layout.input_offset(), bytes, host_size) ||
        !Fits(layout.output_offset(), bytes, host_size) ||
        !Aligned(layout.input_offset(), alignof(float)) ||
        !Aligned(layout.output_offset(), alignof(float))) {
      return absl::InternalError(
          "RegisterBucket: the daemon described a layout that does not fit its buffer");
    }
    v.input = reinterpret_cast<float*>(base + layout.input_offset());
    v.output = reinterpret_cast<const float*>(base + layout.output_offset());
    return v;
  }
  if (cache == nullptr)
    return absl::InternalError("ResolveBucketView: device reply without an IPC handle cache");
  const auto& dl = resp.device_layout();
  absl::StatusOr<const IpcMapping*> mapping = cache->Attach(resp.device_buffer());
  if (!mapping.ok()) {
    return absl::Status(mapping.status().code(), absl::StrCat("bucket ", v.header->bucket_id, ": ",
                                                              mapping.status().message()));
  }
  const IpcMapping* m = *mapping;
  if (dl.elements() != elements || !Fits(dl.input_offset(), bytes, m->size) ||
      !Fits(dl.output_offset(), bytes, m->size) || !Aligned(dl.input_offset(), alignof(float)) ||
      !Aligned(dl.output_offset(), alignof(float))) {
    return absl::InternalError(
        "RegisterBucket: the daemon described a device layout that does not fit its buffer");
  }
  if (m->events.size() != static_cast<size_t>(local_size) + 1 || local_rank >= local_size) {
    return absl::InternalError(absl::StrCat(
        "RegisterBucket: the CUDA buffer has ", m->events.size(),
        " IPC events; expected one per local trainer plus the output (", local_size + 1, ")"));
  }
  uint8_t* dbase = static_cast<uint8_t*>(m->base);
  v.input = reinterpret_cast<float*>(dbase + dl.input_offset());
  v.output = reinterpret_cast<const float*>(dbase + dl.output_offset());
  v.device = m;
  return v;
}

absl::Status MarkDeviceInputWritten(IpcHandleCache* cache, const BucketView& view,
                                    uint32_t local_rank, void* stream) {
  if (view.device == nullptr) return absl::OkStatus();
  return cache->RecordEvent(*view.device, static_cast<int>(local_rank), stream);
}

absl::Status AwaitDeviceOutput(IpcHandleCache* cache, const BucketView& view, uint32_t local_size,
                               void* stream) {
  if (view.device == nullptr) return absl::OkStatus();
  return cache->WaitEvent(*view.device, static_cast<int>(local_size), stream);
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::unique_ptr<Client> c(new Client());
  c->options_ = options;
  const std::string job = options.job.empty() ? DefaultJob() : options.job;
  c->socket_ = options.socket.empty() ? ClientSocketPath(job) : options.socket;
  if (access(c->socket_.c_str(), F_OK) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no spexd socket at ", c->socket_,
                     ": start the node's daemon first (mpirun ... spexd --socket=", c->socket_,
                     "), or point SPEX_SOCKET at its socket"));
  }
  // Gradients go only to a daemon of this user (or root, or $SPEX_TRUST_SERVER_UIDS) behind a
  // directory nobody else can change.
  if (absl::StatusOr<uid_t> server = CheckServerSocket(c->socket_); !server.ok()) {
    return server.status();
  }
  auto channel = grpc::CreateChannel("unix:" + c->socket_, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                 absl::ToChronoSeconds(options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("spexd at ", c->socket_, " does not answer within ",
                                               absl::FormatDuration(options.connect_timeout),
                                               ": it closes a connection at once when "
                                               "--max_connections are open already or when your "
                                               "uid may not connect (its log names the refused "
                                               "connection); else it is stuck or gone (restart "
                                               "the daemon)"));
  }
  c->stub_ = v1::Spex::NewStub(channel);
  v1::HelloRequest req;
  req.set_job(options.job);
  req.set_local_rank(options.local_rank);
  req.set_local_size(options.local_size);
  req.set_device(options.device == v1::DEVICE_CUDA ? v1::DEVICE_CUDA : v1::DEVICE_CPU);
  req.set_client(options.client_name);
  req.set_pid(getpid());
  req.set_protocol_version(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(options.connect_timeout));
  if (auto s = FromGrpc(c->stub_->Hello(&ctx, req, &c->hello_), "Hello"); !s.ok()) return s;
  if (options.device == v1::DEVICE_CUDA) {
    if (c->hello_.device() != v1::DEVICE_CUDA) {
      return absl::FailedPreconditionError(absl::StrCat(
          "spexd at ", c->socket_, " serves host buffers; CUDA buffers need --device=cuda"));
    }
    c->ipc_cache_ = std::make_unique<IpcHandleCache>(options.ipc_opener ? options.ipc_opener()
                                                                        : MakeCudaIpcOpener());
  }
  if (!c->hello_.doorbell().has_shm())
    return absl::InternalError("Hello: daemon sent no doorbell segment");
  auto bell =
      ShmMapping::Attach(c->hello_.doorbell().shm().name(), c->hello_.doorbell().shm().size());
  if (!bell.ok()) return bell.status();
  c->doorbell_mapping_ = std::move(*bell);
  c->doorbell_ = static_cast<DoorbellSegment*>(c->doorbell_mapping_->data());
  if (c->doorbell_->magic != kDoorbellMagic || c->doorbell_->version != kLayoutVersion) {
    return absl::FailedPreconditionError(
        "doorbell segment has an unknown layout: client and daemon versions differ");
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

absl::StatusOr<std::unique_ptr<SharedInputMemory>> SharedInputMemory::Create(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("SharedInputMemory needs at least one byte");
  const int fd = memfd_create("spex-input", MFD_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("memfd_create for a bucket's own input: ", std::strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("sizing a bucket's own input to ", bytes,
                                                     " bytes (ftruncate): ", std::strerror(e)));
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int e = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("mapping a bucket's own input of ", bytes, " bytes: ", std::strerror(e)));
  }
  return std::unique_ptr<SharedInputMemory>(new SharedInputMemory(fd, data, bytes));
}

SharedInputMemory::~SharedInputMemory() {
  munmap(data_, size_);
  close(fd_);
}

absl::StatusOr<Bucket*> Client::RegisterBucket(uint64_t id, size_t elements,
                                               const CompressorChoice& choice, v1::DataType dtype,
                                               const OwnInput* own_input) {
  uint32_t code = 0;  // the header's dtype code (layout.h)
  if (dtype == v1::DTYPE_BFLOAT16) {
    code = 1;
  } else if (dtype == v1::DTYPE_FLOAT16) {
    code = 2;
  } else if (dtype != v1::DTYPE_FLOAT32 && dtype != v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket ", id, ": data type ", static_cast<int>(dtype),
                     " is none of DTYPE_FLOAT32, DTYPE_BFLOAT16, DTYPE_FLOAT16"));
  }
  if (buckets_.count(id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("bucket ", id, " is already registered by this client"));
  }
  v1::RegisterBucketRequest req;
  req.set_session_id(hello_.session_id());
  req.set_bucket_id(id);
  req.set_elements(elements);
  req.set_dtype(code == 0 ? v1::DTYPE_FLOAT32 : dtype);
  if (options_.device == v1::DEVICE_CUDA && options_.cuda_device >= 0) {
    req.set_device_ordinal(options_.cuda_device);
  }
  if (own_input != nullptr) {
    if (options_.device == v1::DEVICE_CUDA) {
      return absl::InvalidArgumentError(
          absl::StrCat("bucket ", id,
                       ": own_input is for host buckets; this client asked spexd for CUDA "
                       "buffers (ClientOptions::device)"));
    }
    const uintptr_t at = reinterpret_cast<uintptr_t>(own_input->data);
    if (own_input->fd < 0 || at == 0 || at % (code == 0 ? sizeof(float) : 2) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bucket ", id, ": own_input needs the shared-memory file's descriptor (fd >= 0, got ",
          own_input->fd,
          ") and this process's address of the bucket's first element (data, aligned to the ",
          code == 0 ? 4 : 2, "-byte element)"));
    }
    req.mutable_own_input()->set_fd(own_input->fd);
    req.mutable_own_input()->set_offset(own_input->offset);
  }
  req.mutable_compressor()->set_name(choice.name);
  req.mutable_compressor()->set_density(choice.density);
  for (const auto& [key, value] : choice.params)
    (*req.mutable_compressor()->mutable_params())[key] = value;
  v1::RegisterBucketResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(options_.connect_timeout));
  if (auto s = FromGrpc(stub_->RegisterBucket(&ctx, req, &resp), "RegisterBucket"); !s.ok())
    return s;
  if (!resp.buffer().has_shm())
    return absl::InternalError("RegisterBucket: the daemon sent no shm segment");
  const auto& shm = resp.buffer().shm();
  auto mapping = ShmMapping::Attach(shm.name(), shm.size());
  if (!mapping.ok()) return mapping.status();
  absl::StatusOr<BucketView> view = ResolveBucketView(
      resp, elements, options_.local_rank, options_.local_size, (*mapping)->data(), shm.size(),
      ipc_cache_ != nullptr, ipc_cache_.get(), code);
  if (!view.ok()) return view.status();
  auto b = std::make_unique<Bucket>();
  b->id_ = id;
  b->elements_ = elements;
  b->dtype_ = code == 0 ? v1::DTYPE_FLOAT32 : dtype;
  b->view_ = *view;
  if (own_input != nullptr && resp.own_input()) {  // spexd reads our memory: input() is there
    b->view_.input = static_cast<float*>(own_input->data);
    b->own_input_ = true;
  }
  b->next_step_ = resp.next_step();
  b->compressor_ = resp.compressor().name();
  b->density_ = resp.compressor().density();
  b->mapping_ = std::move(*mapping);
  b->view_.header->attached[options_.local_rank].store(1);
  Bucket* raw = b.get();
  buckets_[id] = std::move(b);
  return raw;
}

absl::Status Client::Exchange(Bucket* b, ExchangeMode mode, void* stream) {
  if (mode == ExchangeMode::kDoorbell) {
    // A step started before (by Start, or by an Exchange whose wait timed out) is waited for
    // again, not marked ready twice.
    if (!b->started_) {
      if (absl::Status s = Start(b, stream); !s.ok()) return s;
    }
    return Wait(b, stream);
  }
  if (b->started_) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucket ", b->id_, ": step ", b->next_step_, " was started; Wait for it"));
  }
  const uint64_t step = b->next_step_;
  absl::Status s = MarkDeviceInputWritten(ipc_cache_.get(), b->view_, options_.local_rank, stream);
  if (s.ok()) s = ExchangeRpc(b, step);
  if (s.ok()) s = AwaitDeviceOutput(ipc_cache_.get(), b->view_, options_.local_size, stream);
  FinishStep(b, step, s);
  return s;
}

void Client::FinishStep(Bucket* b, uint64_t step, const absl::Status& s) {
  // A published step is consumed even when it failed (a non-finite step under nonfinite=error
  // goes on with the next one); one never published (a timeout, a shutdown) is retried as the
  // same step, and one started stays started, so a later Wait waits for it again.
  if (s.ok() || b->view_.header->published.load() == static_cast<uint32_t>(step + 1)) {
    b->next_step_ = step + 1;
    b->started_ = false;
  }
}

absl::Status Client::Start(Bucket* b, void* stream) {
  if (b->started_) {
    return absl::FailedPreconditionError(absl::StrCat("bucket ", b->id_, ": step ", b->next_step_,
                                                      " was already started; Wait for it first"));
  }
  const uint64_t step = b->next_step_;
  if (absl::Status s =
          MarkDeviceInputWritten(ipc_cache_.get(), b->view_, options_.local_rank, stream);
      !s.ok()) {
    return s;
  }
  auto& ready = b->view_.header->ready[options_.local_rank];
  ready.ready_ns.store(MonotonicNanos(), std::memory_order_relaxed);  // the merger's timings
  ready.value.store(step + 1, std::memory_order_seq_cst);
  doorbell_->ring.fetch_add(1);
  if (doorbell_->engine_sleeping.load()) FutexWake(&doorbell_->ring);
  b->started_ = true;
  return absl::OkStatus();
}

absl::Status Client::Wait(Bucket* b, void* stream) {
  if (!b->started_) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucket ", b->id_, ": step ", b->next_step_, " was not started; Start it"));
  }
  const uint64_t step = b->next_step_;
  absl::Status s = WaitPublished(b, step);
  if (s.ok() && b->view_.header->status.load() != 0) s = ExchangeRpc(b, step);  // the message
  if (s.ok()) s = AwaitDeviceOutput(ipc_cache_.get(), b->view_, options_.local_size, stream);
  FinishStep(b, step, s);
  return s;
}

absl::Status Client::WaitPublished(Bucket* b, uint64_t step) {
  auto& published = b->view_.header->published;
  const uint32_t want = static_cast<uint32_t>(step + 1);
  const uint64_t start = MonotonicNanos();
  const uint64_t spin_until = start + hello_.spin_us() * 1000ull;
  while (MonotonicNanos() < spin_until) {
    if (published.load(std::memory_order_acquire) == want) return absl::OkStatus();
    CpuRelax();
  }
  const uint64_t limit = start + absl::ToInt64Nanoseconds(options_.exchange_timeout);
  b->view_.header->waiters.fetch_add(1);
  absl::Status result = absl::OkStatus();
  while (true) {
    const uint32_t cur = published.load();
    if (cur == want) break;
    if (doorbell_->shutdown.load()) {
      result = absl::UnavailableError(absl::StrCat("spexd at ", socket_,
                                                   " shut down during the exchange of bucket ",
                                                   b->id_, " step ", step));
      break;
    }
    const uint64_t now = MonotonicNanos();
    if (now >= limit) {
      result = absl::DeadlineExceededError(
          absl::StrCat("bucket ", b->id_, " step ", step, " not published within ",
                       absl::FormatDuration(options_.exchange_timeout),
                       ": are all local trainers and all nodes exchanging the same buckets? "
                       "(spexctl stats shows progress)"));
      break;
    }
    FutexWait(&published, cur, std::min<int64_t>(kWaitSliceNs, limit - now));
  }
  b->view_.header->waiters.fetch_sub(1);
  return result;
}

absl::Status Client::ExchangeRpc(Bucket* b, uint64_t step) {
  v1::ExchangeRequest req;
  req.set_session_id(hello_.session_id());
  req.set_bucket_id(b->id_);
  req.set_step(step);
  v1::ExchangeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(options_.exchange_timeout));
  absl::Status s =
      FromGrpc(stub_->Exchange(&ctx, req, &resp), absl::StrCat("Exchange(bucket ", b->id_, ")"));
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

absl::StatusOr<std::string> Client::SaveBucketState(const Bucket& bucket) {
  v1::SaveBucketStateRequest req;
  req.set_session_id(hello_.session_id());
  req.set_bucket_id(bucket.id());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  std::unique_ptr<grpc::ClientReader<v1::BucketStateChunk>> reader =
      stub_->SaveBucketState(&ctx, req);
  std::string record;
  v1::BucketStateChunk chunk;
  while (reader->Read(&chunk)) {
    if (record.empty()) record.reserve(chunk.total_bytes());
    record.append(chunk.data());
  }
  const std::string what = absl::StrCat("SaveBucketState(bucket ", bucket.id(), ")");
  if (auto s = FromGrpc(reader->Finish(), what); !s.ok()) return s;
  if (record.size() != chunk.total_bytes()) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", record.size(), " of ", chunk.total_bytes(), " bytes came"));
  }
  return record;
}

absl::Status Client::LoadBucketState(const Bucket& bucket, absl::string_view record) {
  constexpr size_t kChunk = size_t{1} << 19;  // the service's kStateChunkBytes
  v1::LoadBucketStateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  std::unique_ptr<grpc::ClientWriter<v1::BucketStateChunk>> writer =
      stub_->LoadBucketState(&ctx, &resp);
  v1::BucketStateChunk chunk;
  chunk.set_session_id(hello_.session_id());
  chunk.set_bucket_id(bucket.id());
  chunk.set_total_bytes(record.size());
  size_t at = 0;
  do {
    const size_t n = std::min(kChunk, record.size() - at);
    chunk.set_data(record.data() + at, n);
    if (!writer->Write(chunk)) break;  // the daemon answered early: Finish says why
    at += n;
  } while (at < record.size());
  writer->WritesDone();
  return FromGrpc(writer->Finish(), absl::StrCat("LoadBucketState(bucket ", bucket.id(), ")"));
}

}  // namespace spex
