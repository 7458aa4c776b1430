#include "daemon/engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/sparse_exchange.h"
#include "daemon/memory/futex.h"
#include "daemon/util/log.h"

namespace spex {

const char* PhaseName(Phase p) {
  static const char* const kNames[] = {"wait_local", "reduce_local", "compress",
                                       "collective", "decode",       "publish"};
  return kNames[static_cast<int>(p)];
}

struct Engine::Session {
  uint64_t id = 0;
  uint32_t local_rank = 0;
  uint32_t pid = 0;
  std::string client;
  absl::Time opened;
  uint32_t buckets = 0;
};

struct Engine::Bucket {
  uint64_t id = 0;
  uint64_t elements = 0;
  std::string compressor;
  double density = 0;
  std::unique_ptr<ShmBuffer> shm;      // the BucketHeader; on the CPU path also the data
  std::unique_ptr<SharedBuffer> data;  // device path: input slots and output
  BucketHeader* header = nullptr;
  float* input[kMaxLocalTrainers] = {};  // in prims_' memory (host or device)
  float* output = nullptr;
  uint64_t registered_mask = 0;
  std::map<std::string, std::string> params;
  // Engine thread only:
  // dense: local sum (L > 1); sparse: residual + local sum. In prims_' memory: acc_host's
  // storage on the CPU path, acc_device's on the device path.
  float* acc = nullptr;
  std::vector<float> acc_host;  // CPU path: acc. Device path (staged sparse): acc's staging copy
  std::unique_ptr<DeviceArray> acc_device;
  std::vector<float> out_host;   // device path (staged sparse): the output's staging copy
  std::unique_ptr<Codec> codec;  // null: dense
  // Device path: the codec runs on prims_ (a compressor of DeviceCompressorNames()), so the
  // sparse step works on the device's acc and output with no staging copies; `scratch` holds
  // the indices and values it uploads there.
  bool codec_on_device = false;
  std::unique_ptr<ScratchSlots> scratch;
  CodecSelection sel;             // the codec's selection, reused every step
  std::vector<uint32_t> touched;  // output positions the last sparse step wrote
  bool output_dense = true;       // the output holds a dense result (zero it fully before sparse)
  enum class Mode { kProbe, kSparse, kDense } mode = Mode::kProbe;
  uint64_t probe_sparse_ns = 0, probe_dense_ns = 0;
  uint64_t next_step = 0;
  // Guarded by mu_:
  uint64_t completed = 0;  // steps published
  uint64_t error_step = UINT64_MAX;
  absl::Status error;
  uint64_t exchanges = 0;
  ExchangeRecord last;
  double phase_sum[static_cast<int>(Phase::kCount)] = {};
};

namespace {

constexpr int64_t kIdleWaitNs = 50 * 1000 * 1000;  // engine re-checks peers/stop this often

uint64_t RandomSessionId() {
  absl::BitGen gen;
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(gen);
  return id;
}

}  // namespace

Engine::Engine(EngineOptions options, Collective* collective, Primitives* prims, DevicePath device)
    : options_(std::move(options)),
      collective_(collective),
      prims_(prims),
      device_(device),
      host_prims_(device.host_prims != nullptr ? device.host_prims : prims) {}

Engine::~Engine() {
  RequestStop();
  if (thread_.joinable()) thread_.join();
}

absl::Status Engine::Start() {
  if (options_.local_trainers < 1 ||
      options_.local_trainers > static_cast<int>(kMaxLocalTrainers)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--local_trainers must be in 1..", kMaxLocalTrainers, ", got ", options_.local_trainers));
  }
  if (!options_.codec_factory) {
    if (absl::Status s = ValidateCodec(options_.compressor, options_.density, {}); !s.ok())
      return s;
  }
  {
    auto merger = MakeMerger(options_.merger);
    if (!merger.ok()) return merger.status();
    merger_ = std::move(*merger);
  }
  if (options_.dense_fallback != "auto" && options_.dense_fallback != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--dense_fallback must be auto|off, got '", options_.dense_fallback, "'"));
  }
  if (device_buckets()) {
    if (device_.ordering == nullptr || device_.host_prims == nullptr) {
      return absl::InvalidArgumentError(
          "engine device path: an allocator needs its slot ordering and host primitives too");
    }
    if (device_.host_prims->device() != Device::kCpu) {
      return absl::InvalidArgumentError(
          "engine device path: host_prims must be CPU primitives (the compressors and the sparse "
          "exchange run in host memory)");
    }
    if (device_.allocator->device() != prims_->device()) {
      return absl::InvalidArgumentError(
          "engine device path: the allocator's device differs from the primitives' device; build "
          "both for the same device (spexd: --device)");
    }
  } else if (prims_->device() != Device::kCpu) {
    return absl::InvalidArgumentError(
        "engine: device primitives need a device path (allocator, ordering, host primitives); "
        "without one buckets are host memory");
  }
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = NewDoorbellLocked(); !s.ok()) return s;
  }
  running_ = true;
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

absl::Status Engine::NewDoorbellLocked() {
  auto shm = ShmBuffer::Create(kPageBytes, options_.shm_tag + "-bell");
  if (!shm.ok()) return shm.status();
  auto* seg = new ((*shm)->data()) DoorbellSegment();
  seg->magic = kDoorbellMagic;
  seg->version = kLayoutVersion;
  doorbells_.push_back(std::move(*shm));
  DoorbellSegment* old = doorbell_.exchange(seg);
  if (old != nullptr) {
    // Wake the engine so it starts waiting on the new segment.
    old->ring.fetch_add(1);
    FutexWake(&old->ring);
  }
  return absl::OkStatus();
}

void Engine::Ring() {
  DoorbellSegment* bell = doorbell();
  if (bell == nullptr) return;
  bell->ring.fetch_add(1);
  if (bell->engine_sleeping.load()) FutexWake(&bell->ring);
}

void Engine::RequestStop() {
  if (stop_.exchange(true)) return;
  WakeEverybody();
}

void Engine::WakeEverybody() {
  absl::MutexLock lock(&mu_);
  for (auto& shm : doorbells_) {
    auto* seg = static_cast<DoorbellSegment*>(shm->data());
    seg->shutdown.store(1);
    seg->ring.fetch_add(1);
    FutexWake(&seg->ring);
  }
  for (auto& [id, b] : buckets_) FutexWake(&b->header->published);
  published_cv_.SignalAll();
}

void Engine::WaitStopped() {
  absl::MutexLock lock(&stopped_mu_);
  stopped_mu_.Await(absl::Condition(&stopped_));
}

bool Engine::JoinFor(absl::Duration timeout) {
  {
    absl::MutexLock lock(&stopped_mu_);
    if (!stopped_mu_.AwaitWithTimeout(absl::Condition(&stopped_), timeout)) return false;
  }
  if (thread_.joinable()) thread_.join();
  return true;
}

absl::StatusOr<HelloResult> Engine::Hello(const std::string& job, uint32_t local_rank,
                                          uint32_t local_size, uint32_t pid,
                                          const std::string& client) {
  if (stop_) return absl::UnavailableError("spexd is shutting down");
  if (!options_.job.empty() && job != options_.job) {
    return absl::FailedPreconditionError(absl::StrCat("this spexd serves job '", options_.job,
                                                      "', the trainer says job '", job, "'"));
  }
  if (local_size != static_cast<uint32_t>(options_.local_trainers)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this spexd expects ", options_.local_trainers,
        " local trainers (--local_trainers), the trainer says local_size=", local_size,
        "; start the daemon with --local_trainers=", local_size, " or fix the trainer"));
  }
  if (local_rank >= local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("local_rank ", local_rank, " must be < local_size ", local_size));
  }
  absl::MutexLock lock(&mu_);
  for (const auto& [id, s] : sessions_) {
    if (s->local_rank == local_rank) {
      return absl::AlreadyExistsError(
          absl::StrCat("local_rank ", local_rank, " is held by session ", id, " (pid ", s->pid,
                       "); each trainer of a node needs its own local_rank"));
    }
  }
  DoorbellSegment* bell = doorbell();
  if (static_cast<ShmBuffer*>(doorbells_.back().get())->unlinked() ||
      bell->attached[local_rank].load()) {
    // Every trainer of the previous generation attached (and the name is gone): new segment.
    if (absl::Status s = NewDoorbellLocked(); !s.ok()) return s;
  }
  auto session = std::make_unique<Session>();
  session->id = RandomSessionId();
  session->local_rank = local_rank;
  session->pid = pid;
  session->client = client;
  session->opened = absl::Now();
  HelloResult result{session->id, doorbells_.back().get()};
  SPEX_LOG(INFO) << "session " << session->id << " opened: local_rank " << local_rank << " pid "
                 << pid << " (" << client << ")";
  sessions_[session->id] = std::move(session);
  return result;
}

absl::Status Engine::Goodbye(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrCat("no session ", session_id));
  SPEX_LOG(INFO) << "session " << session_id << " (local_rank " << it->second->local_rank
                 << ") closed";
  sessions_.erase(it);
  if (sessions_.empty() && !buckets_.empty()) {
    reset_pending_ = true;  // dropped at the next job's first registration; stats stay until then
  }
  return absl::OkStatus();
}

absl::StatusOr<BucketGrant> Engine::RegisterBucket(
    uint64_t session_id, uint64_t bucket_id, uint64_t elements, const std::string& compressor_in,
    double density_in, const std::map<std::string, std::string>& params) {
  if (stop_) return absl::UnavailableError("spexd is shutting down");
  const std::string compressor = compressor_in.empty() ? options_.compressor : compressor_in;
  const double density = density_in == 0 ? options_.density : density_in;
  if (!options_.codec_factory || compressor == "dense") {
    if (absl::Status s = ValidateCodec(compressor, density, params); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket_id, ": ", s.message()));
    }
  }
  if (elements == 0 || elements >= (1ull << 32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucket ", bucket_id, ": elements must be in 1..2^32-1, got ", elements));
  }
  absl::MutexLock lock(&mu_);
  auto sit = sessions_.find(session_id);
  if (sit == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id, "; call Hello first"));
  }
  const uint32_t rank = sit->second->local_rank;
  // The previous job's buckets (kept until now so their stats stay visible) make way for a
  // new job once the engine is between exchanges.
  if (reset_pending_) {
    while (processing_ && !stop_) published_cv_.Wait(&mu_);
    ResetLocked();
  }
  auto& slot = buckets_[bucket_id];
  if (slot == nullptr) {
    absl::StatusOr<std::unique_ptr<Bucket>> b =
        NewBucket(bucket_id, elements, compressor, density, params);
    if (!b.ok()) {
      buckets_.erase(bucket_id);
      return b.status();
    }
    slot = std::move(*b);
  }
  Bucket& b = *slot;
  if (b.elements != elements) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id, " is registered with ", b.elements, " elements; this request says ",
        elements, ". Every trainer must register a bucket id with the same size"));
  }
  if ((!compressor_in.empty() && compressor != b.compressor) ||
      (density_in != 0 && density != b.density) || (!params.empty() && params != b.params)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bucket ", bucket_id, " is registered with compressor ", b.compressor, " at density ",
        b.density, "; this request asks for ", compressor, " at ", density));
  }
  if (b.shm->unlinked() && !(b.registered_mask & (1ull << rank))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bucket ", bucket_id,
        "'s buffer was already attached by every local trainer and unlinked; a restarted "
        "trainer cannot rejoin a running job: restart all trainers of this node"));
  }
  if (!(b.registered_mask & (1ull << rank))) {
    b.registered_mask |= 1ull << rank;
    sit->second->buckets++;
  }
  Ring();  // a newly complete registration can change the canonical order
  BucketGrant grant;
  grant.buffer = b.shm.get();
  if (b.data != nullptr) {
    grant.device_buffer = b.data.get();
    grant.device_input_offset = DeviceInputOffset(elements, rank);
    grant.device_output_offset = DeviceOutputOffset(elements, options_.local_trainers);
  } else {
    grant.input_offset = InputOffset(elements, rank);
    grant.output_offset = OutputOffset(elements, options_.local_trainers);
  }
  grant.elements = elements;
  grant.compressor = b.compressor;
  grant.density = b.density;
  grant.next_step = b.header->ready[rank].value.load();
  return grant;
}

absl::StatusOr<std::unique_ptr<Engine::Bucket>> Engine::NewBucket(
    uint64_t bucket_id, uint64_t elements, const std::string& compressor, double density,
    const std::map<std::string, std::string>& params) {
  const uint32_t slots = options_.local_trainers;
  const std::string tag = absl::StrCat(options_.shm_tag, "-b", bucket_id);
  auto b = std::make_unique<Bucket>();
  b->id = bucket_id;
  b->elements = elements;
  b->compressor = compressor;
  b->density = density;
  b->params = params;
  // CPU path: one shm segment, header then data. Device path: the header alone in shm (the
  // doorbell counters stay host memory), the data in the allocator's buffer.
  const bool device = device_buckets();
  auto shm = ShmBuffer::Create(device ? kPageBytes : BucketBytes(elements, slots), tag);
  if (!shm.ok()) return shm.status();
  b->shm = std::move(*shm);
  uint8_t* base = static_cast<uint8_t*>(b->shm->data());
  b->header = new (base) BucketHeader();
  b->header->magic = kBucketMagic;
  b->header->version = kLayoutVersion;
  b->header->bucket_id = bucket_id;
  b->header->elements = elements;
  b->header->slots = slots;
  b->header->slot_stride = SlotStride(elements);
  if (device) {
    auto data = device_.allocator->AllocateBucket(DeviceBucketBytes(elements, slots), slots + 1);
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat("bucket ", bucket_id, " (", elements,
                                       " elements): ", data.status().message()));
    }
    b->data = std::move(*data);
    if (b->data->size() < DeviceBucketBytes(elements, slots)) {
      return absl::InternalError(
          absl::StrCat("bucket ", bucket_id, ": the allocator returned ", b->data->size(),
                       " bytes, ", DeviceBucketBytes(elements, slots), " were asked for"));
    }
    uint8_t* dbase = static_cast<uint8_t*>(b->data->data());
    for (uint32_t r = 0; r < slots; ++r) {
      b->input[r] = reinterpret_cast<float*>(dbase + DeviceInputOffset(elements, r));
    }
    b->output = reinterpret_cast<float*>(dbase + DeviceOutputOffset(elements, slots));
  } else {
    for (uint32_t r = 0; r < slots; ++r) {
      b->input[r] = reinterpret_cast<float*>(base + InputOffset(elements, r));
    }
    b->output = reinterpret_cast<float*>(base + OutputOffset(elements, slots));
  }
  if (compressor != "dense" && elements >= options_.min_sparse_elements) {
    // The compressors run on the bucket's memory: on the CPU path prims_ (which is host_prims_),
    // on the device path prims_ (every registered compressor runs on device primitives). Only a
    // test's codec_factory runs on host_prims_ over staged host copies of acc and the output.
    CodecSpec spec{compressor, density, params, collective_->rank(), collective_->size(), elements};
    b->codec_on_device = device && !options_.codec_factory && CompressorRunsOnDevice(compressor);
    Primitives* codec_prims = b->codec_on_device ? prims_ : host_prims_;
    auto codec = options_.codec_factory ? options_.codec_factory(spec, host_prims_)
                                        : MakeCodec(spec, codec_prims);
    if (!codec.ok()) return codec.status();
    b->codec = std::move(*codec);
    if (b->codec_on_device) b->scratch = std::make_unique<ScratchSlots>(prims_);
    b->mode = options_.dense_fallback == "auto" ? Bucket::Mode::kProbe : Bucket::Mode::kSparse;
  }
  if (slots > 1 || b->codec != nullptr) {
    if (device) {
      auto acc = device_.allocator->AllocateScratch(elements * sizeof(float));
      if (!acc.ok()) return acc.status();
      b->acc_device = std::move(*acc);
      b->acc = static_cast<float*>(b->acc_device->data());
      if (b->codec != nullptr && !b->codec_on_device) {
        b->acc_host.assign(elements, 0.0f);
        b->out_host.assign(elements, 0.0f);
      }
    } else {
      b->acc_host.assign(elements, 0.0f);
      b->acc = b->acc_host.data();
    }
  }
  return b;
}

absl::Status Engine::UnregisterBucket(uint64_t session_id, uint64_t bucket_id) {
  absl::MutexLock lock(&mu_);
  auto sit = sessions_.find(session_id);
  if (sit == sessions_.end())
    return absl::NotFoundError(absl::StrCat("no session ", session_id, "; call Hello first"));
  const uint32_t rank = sit->second->local_rank;
  auto bit = buckets_.find(bucket_id);
  if (bit == buckets_.end() || !(bit->second->registered_mask & (1ull << rank))) {
    return absl::NotFoundError(
        absl::StrCat("bucket ", bucket_id, " is not registered by this session"));
  }
  Bucket* b = bit->second.get();
  // Leaves the schedule at once (the mask is no longer full). Its memory goes when no trainer
  // holds it any more and the engine is not inside it.
  b->registered_mask &= ~(1ull << rank);
  sit->second->buckets--;
  if (b->registered_mask == 0) {
    while (processing_ && !stop_) published_cv_.Wait(&mu_);
    buckets_.erase(bit);
  }
  Ring();
  return absl::OkStatus();
}

absl::StatusOr<ExchangeRecord> Engine::Exchange(uint64_t session_id, uint64_t bucket_id,
                                                uint64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto sit = sessions_.find(session_id);
  if (sit == sessions_.end())
    return absl::NotFoundError(absl::StrCat("no session ", session_id, "; call Hello first"));
  const uint32_t rank = sit->second->local_rank;
  auto bit = buckets_.find(bucket_id);
  if (bit == buckets_.end() || !(bit->second->registered_mask & (1ull << rank))) {
    std::vector<uint64_t> known;
    for (const auto& [id, b] : buckets_) {
      if (b->registered_mask & (1ull << rank)) known.push_back(id);
    }
    return absl::NotFoundError(absl::StrCat("bucket ", bucket_id,
                                            " is not registered by this session; call "
                                            "RegisterBucket first (registered: [",
                                            absl::StrJoin(known, ","), "])"));
  }
  Bucket* b = bit->second.get();
  auto& ready = b->header->ready[rank].value;
  const uint64_t marked = ready.load();
  if (step + 1 == marked || step < b->completed) {
    // Already submitted (doorbell path or a retried RPC): fall through to wait or report.
  } else if (marked == step) {
    ready.store(step + 1);
    Ring();
  } else {
    return absl::InvalidArgumentError(absl::StrCat("bucket ", bucket_id, ": exchange for step ",
                                                   step, " but this trainer's next step is ",
                                                   marked));
  }
  const uint64_t full = (1ull << options_.local_trainers) - 1;
  const absl::Time register_deadline = absl::Now() + options_.register_wait;
  auto done = [&] { return b->completed > step || stop_.load(); };
  while (!done()) {
    const bool all_registered = b->registered_mask == full;
    const absl::Time until = all_registered ? deadline : std::min(deadline, register_deadline);
    if (published_cv_.WaitWithDeadline(&mu_, until) && !done()) {
      if (b->registered_mask != full) {
        int have = __builtin_popcountll(b->registered_mask);
        return absl::FailedPreconditionError(absl::StrCat(
            "bucket ", bucket_id, ": only ", have, " of ", options_.local_trainers,
            " local trainers registered it within ", absl::FormatDuration(options_.register_wait),
            "; start every trainer of this node (spexd --local_trainers=", options_.local_trainers,
            ")"));
      }
      if (absl::Now() >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < options_.local_trainers; ++r) {
          if (b->header->ready[r].value.load() <= step) missing.push_back(r);
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
  if (b->completed <= step) return absl::UnavailableError("spexd is shutting down");
  if (b->error_step == step) return b->error;
  if (b->last.step != step) {
    return absl::OutOfRangeError(
        absl::StrCat("bucket ", bucket_id, " step ", step, " completed long ago"));
  }
  return b->last;
}

Engine::Bucket* Engine::PickNextLocked() {
  // Candidates in the canonical order: ascending (next step, bucket id) over the buckets every
  // local trainer registered. The merger picks the group to exchange from its head.
  const uint64_t full = (1ull << options_.local_trainers) - 1;
  std::vector<Bucket*> order;
  for (auto& [id, b] : buckets_) {
    if (b->registered_mask == full) order.push_back(b.get());
  }
  if (order.empty()) return nullptr;
  std::stable_sort(order.begin(), order.end(),  // buckets_ iterates in id order
                   [](const Bucket* a, const Bucket* b) { return a->next_step < b->next_step; });
  candidates_.clear();
  for (const Bucket* b : order) {
    candidates_.push_back({b->id, b->next_step, b->elements, LocallyReady(*b)});
  }
  const size_t group = merger_->NextGroup(candidates_);
  if (group != 1) {
    // Fused exchanges need a merge-group buffer and wire id; only `none` exists so far.
    SPEX_LOG(ERROR) << "merger " << merger_->name() << " returned a group of " << group
                    << " buckets; fused exchanges are not implemented, exchanging one";
  }
  return order.front();
}

bool Engine::LocallyReady(const Bucket& b) const {
  for (int r = 0; r < options_.local_trainers; ++r) {
    if (b.header->ready[r].value.load(std::memory_order_acquire) <= b.next_step) return false;
  }
  return true;
}

void Engine::UnlinkAttachedLocked() {
  for (auto& [id, b] : buckets_) {
    if (b->shm->unlinked()) continue;
    bool all = true;
    for (int r = 0; r < options_.local_trainers && all; ++r)
      all = b->header->attached[r].load() != 0;
    if (!all) continue;
    b->shm->Unlink().IgnoreError();
    if (b->data != nullptr) b->data->Unlink().IgnoreError();
  }
  ShmBuffer* bell = doorbells_.back().get();
  if (!bell->unlinked()) {
    auto* seg = static_cast<DoorbellSegment*>(bell->data());
    bool all = true;
    for (int r = 0; r < options_.local_trainers && all; ++r) all = seg->attached[r].load() != 0;
    if (all) bell->Unlink().IgnoreError();
  }
}

void Engine::ResetLocked() {
  SPEX_LOG(INFO) << "new job: dropping the previous job's " << buckets_.size() << " buckets";
  buckets_.clear();
  reset_pending_ = false;
  published_cv_.SignalAll();
}

void Engine::Run() {
  SPEX_LOG(DEBUG) << "engine thread started";
  bool announced = false;
  while (true) {
    if (stop_.load()) {
      if (!announced && options_.announce_stop) options_.announce_stop();
      announced = true;
      break;
    }
    DoorbellSegment* bell = doorbell();
    const uint32_t seen = bell->ring.load();
    Bucket* next = nullptr;
    bool run = false;
    {
      absl::MutexLock lock(&mu_);
      UnlinkAttachedLocked();
      next = reset_pending_ ? nullptr : PickNextLocked();
      processing_ = run = next != nullptr && LocallyReady(*next);
    }
    if (run) {
      Process(next);  // Publish clears processing_
      continue;
    }
    // Nothing to do: spin a little, then sleep on the doorbell.
    const uint64_t spin_until =
        MonotonicNanos() + static_cast<uint64_t>(options_.engine_spin_us) * 1000;
    bool rang = false;
    while (options_.engine_spin_us > 0 && MonotonicNanos() < spin_until) {
      if (bell->ring.load(std::memory_order_relaxed) != seen || stop_.load()) {
        rang = true;
        break;
      }
      CpuRelax();
    }
    if (!rang) {
      bell->engine_sleeping.store(1);
      if (bell->ring.load() == seen && !stop_.load()) FutexWait(&bell->ring, seen, kIdleWaitNs);
      bell->engine_sleeping.store(0);
    }
    int who = -1;
    if (options_.peer_stopped && options_.peer_stopped(&who)) {
      SPEX_LOG(INFO) << "node " << who << " is stopping; stopping this node too";
      announced = true;  // every node hears from the first one that stopped
      stop_.store(true);
      WakeEverybody();
    }
  }
  {
    absl::MutexLock lock(&stopped_mu_);
    stopped_ = true;
  }
  SPEX_LOG(DEBUG) << "engine thread stopped";
}

absl::Status Engine::Agree(const Bucket& b, uint64_t step, Control* c) {
  // One tiny all-reduce (MAX) per exchange. (x, ~x) maxed over nodes equals (x, ~x) on every
  // node iff all nodes agree on x: a check that every node exchanges the same (bucket, step,
  // size). The same all-reduce carries the newest density change any node has seen, and the
  // probe timings of the dense fallback, so run-time decisions need no extra round trip.
  uint64_t name_hash = 0xcbf29ce484222325ull;  // FNV-1a of the compressor name
  for (unsigned char ch : b.compressor) name_hash = (name_hash ^ ch) * 0x100000001b3ull;
  uint64_t v[12] = {b.id,           step,         b.elements,  ~b.id,     ~step,      ~b.elements,
                    c->density_key, c->sparse_us, c->dense_us, name_hash, ~name_hash, c->failed};
  if (collective_->size() > 1) {
    absl::Status s = collective_->AllReduce(v, 12, ElemType::kUint64, ReduceOp::kMax);
    if (!s.ok()) return s;
  }
  if (v[0] != ~v[3] || v[1] != ~v[4] || v[2] != ~v[5]) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucket order differs between nodes: this node exchanged bucket ", b.id,
                     " step ", step, " (", b.elements,
                     " elements) while another node exchanged a different bucket, step or size. "
                     "Every node must register the "
                     "same buckets (same ids and sizes) and exchange them in the same order"));
  }
  if (v[9] != ~v[10]) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucket ", b.id, " uses compressor ", b.compressor,
                     " on this node but another compressor on another node; "
                     "every node must register a bucket with the same compressor (check "
                     "--compressor and the trainers' "
                     "per-bucket settings)"));
  }
  c->density_key = v[6];
  c->sparse_us = v[7];
  c->dense_us = v[8];
  c->failed = v[11];
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Engine::SetDensity(double density) {
  if (!(density > 0 && density <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("density must be in (0, 1], got ", density));
  }
  absl::MutexLock lock(&mu_);
  density_version_ = std::max(density_version_, applied_density_key_ >> 32) + 1;
  const float d = static_cast<float>(density);
  uint32_t bits;
  std::memcpy(&bits, &d, 4);
  density_key_ = (density_version_ << 32) | bits;
  Ring();
  return density_version_;
}

void Engine::ApplyDensityLocked(uint64_t key) {
  if (key <= applied_density_key_) return;
  applied_density_key_ = key;
  density_version_ = std::max(density_version_, key >> 32);
  const uint32_t bits = static_cast<uint32_t>(key);
  float d;
  std::memcpy(&d, &bits, 4);
  SPEX_LOG(INFO) << "target density is now " << d << " (change " << (key >> 32) << ")";
  for (auto& [id, bucket] : buckets_) {
    if (bucket->compressor != "dense") bucket->density = d;
  }
}

void Engine::Process(Bucket* b) {
  const uint64_t step = b->next_step;
  ExchangeRecord rec;
  rec.bucket_id = b->id;
  rec.step = step;
  rec.compressor = b->compressor;
  rec.target_density = 1.0;
  rec.achieved_density = 1.0;
  const uint64_t t0 = MonotonicNanos();
  uint64_t t = t0;
  auto lap = [&](Phase p) {
    const uint64_t now = MonotonicNanos();
    rec.phase_seconds[static_cast<int>(p)] += (now - t) * 1e-9;
    t = now;
  };
  Control control;
  {
    absl::MutexLock lock(&mu_);
    control.density_key = density_key_;
  }
  if (b->codec != nullptr && b->mode == Bucket::Mode::kProbe &&
      step == 2 * static_cast<uint64_t>(options_.probe_steps)) {
    control.sparse_us = b->probe_sparse_ns / 1000;
    control.dense_us = b->probe_dense_ns / 1000;
  }
  // Device path: the trainers' device writes must be visible before anything reads the inputs.
  // A node that cannot wait for them says so in the control all-reduce, so every node skips
  // the step's collectives alike instead of leaving its peers inside one.
  const absl::Status inputs = WaitInputs(b);
  lap(Phase::kWaitLocal);
  control.failed = inputs.ok() ? 0 : 1;
  absl::Status status = Agree(*b, step, &control);
  if (status.ok() && !inputs.ok()) status = inputs;
  if (status.ok() && control.failed != 0) {
    status =
        absl::UnavailableError(absl::StrCat("bucket ", b->id, " step ", step,
                                            ": another node could not read its trainers' inputs "
                                            "(device event failure); see that node's log"));
  }
  if (status.ok()) {
    absl::MutexLock lock(&mu_);
    ApplyDensityLocked(control.density_key);
  }
  lap(Phase::kCollective);
  if (status.ok()) {
    const bool sparse = b->codec != nullptr && UseSparse(b, step, control);
    const uint64_t t_work = MonotonicNanos();
    status = sparse ? SparseStep(b, step, &rec, lap) : DenseStep(b, &rec, lap);
    if (b->mode == Bucket::Mode::kProbe)
      (sparse ? b->probe_sparse_ns : b->probe_dense_ns) += MonotonicNanos() - t_work;
    rec.fell_back_to_dense = b->codec != nullptr && !sparse;
  }
  if (status.ok()) {
    // Device calls without a Status result (Accumulate, Scale) report failures here.
    if (absl::Status health = prims_->Health(); !health.ok()) {
      status =
          absl::Status(health.code(), absl::StrCat("device primitives failed: ", health.message()));
    }
  }
  // Device path: the output event marks the result written (recorded on failure too, so no
  // trainer waits on a stale record); then Publish tells the trainers.
  if (absl::Status recorded = RecordOutput(b); status.ok()) status = recorded;
  rec.total_seconds = (MonotonicNanos() - t0) * 1e-9;
  Publish(b, step, status, rec);
}

// Dense-fallback policy (DESIGN.md "Never slower than dense"): a sparse bucket first
// alternates sparse and dense exchanges for 2 * probe_steps steps, then every node adopts the
// faster, judged on the slowest node's timings (carried by the control all-reduce of the
// deciding step, so all nodes decide alike).
bool Engine::UseSparse(Bucket* b, uint64_t step, const Control& control) {
  if (b->mode == Bucket::Mode::kSparse) return true;
  if (b->mode == Bucket::Mode::kDense) return false;
  const uint64_t window = 2 * static_cast<uint64_t>(options_.probe_steps);
  if (step < window) return step % 2 == 0;
  b->mode = control.sparse_us < control.dense_us ? Bucket::Mode::kSparse : Bucket::Mode::kDense;
  SPEX_LOG(INFO) << "bucket " << b->id << ": " << b->compressor << " took "
                 << control.sparse_us / options_.probe_steps << " us per exchange, dense "
                 << control.dense_us / options_.probe_steps << " us: going "
                 << (b->mode == Bucket::Mode::kSparse ? "sparse" : "dense");
  return b->mode == Bucket::Mode::kSparse;
}

absl::Status Engine::WaitInputs(Bucket* b) {
  if (device_.ordering == nullptr || b->data == nullptr) return absl::OkStatus();
  for (int r = 0; r < options_.local_trainers; ++r) {
    if (absl::Status s = device_.ordering->WaitInput(b->data.get(), r); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("bucket ", b->id, ": waiting for local trainer ",
                                                 r, "'s input event: ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::RecordOutput(Bucket* b) {
  if (device_.ordering == nullptr || b->data == nullptr) return absl::OkStatus();
  absl::Status s = device_.ordering->RecordOutput(b->data.get(), options_.local_trainers);
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("bucket ", b->id, ": recording the output event: ", s.message()));
}

// acc = sum of the local inputs (+ acc itself when add_to_acc), in prims_' memory. The order
// of additions (acc, then input 0, 1, ...) is the same on every path, so results are too.
absl::Status Engine::LocalReduce(Bucket* b, bool add_to_acc) {
  const size_t n = b->elements;
  if (!add_to_acc) return prims_->SumScaled(b->acc, b->input, options_.local_trainers, 1.0f, n);
  for (int r = 0; r < options_.local_trainers; ++r) prims_->Accumulate(b->acc, b->input[r], n);
  return absl::OkStatus();
}

absl::Status Engine::DenseStep(Bucket* b, ExchangeRecord* rec,
                               const std::function<void(Phase)>& lap) {
  const int L = options_.local_trainers, N = collective_->size();
  const size_t n = b->elements;
  const float* src = b->input[0];
  float scale = 1.0f / static_cast<float>(N * L);
  absl::Status s;
  if (b->codec != nullptr) {
    // A sparse bucket going dense this step sends everything, residual included.
    s = LocalReduce(b, options_.error_feedback);
    src = b->acc;
  } else if (((N * L) & (N * L - 1)) == 0) {
    // N * L a power of two: scaling is exact (barring subnormal results), so sum(scale * x) ==
    // scale * sum(x) bit for bit.
    // One fused pass writes the scaled local sum into the output, and the collective reduces
    // in place: no separate scaling pass, and no copy of the send buffer inside MPI_Allreduce.
    s = prims_->SumScaled(b->output, b->input, L, scale, n);
    src = b->output;
    scale = 1.0f;
  } else if (L > 1) {
    s = LocalReduce(b, false);
    src = b->acc;
  }
  if (!s.ok()) return s;
  lap(Phase::kReduceLocal);
  // Device path: src and output are device memory, reduced by the device's collective (NCCL).
  s = collective_->AllReduceScaled(src, b->output, n, scale);
  lap(Phase::kCollective);
  if (b->codec != nullptr) {  // nothing left behind
    if (absl::Status f = prims_->Fill(b->acc, 0.0f, n); s.ok()) s = f;
  }
  b->output_dense = true;
  b->touched.clear();
  rec->bytes_sent = rec->bytes_received = N > 1 ? 2 * n * sizeof(float) * (N - 1) / N : 0;
  rec->gathered_elements = rec->selected_elements = n;
  rec->pattern = "D";
  return s;
}

// The sparse step. The sparse exchange (wire chunks, index union) works in host memory with
// host_prims_. On the CPU path acc and the output are host memory and nothing is copied. On the
// device path, a codec that runs on the device (codec_on_device) selects from the device's acc
// directly (copying back only its selection), and the exchange reads acc at the union and adds
// into the output on the device (uploading indices and values: DeviceSide), so nothing is
// staged. The other codecs run on host copies, each copy explicit and counted:
//   1. acc (device: residual + local sum) -> acc_host, for the compressor;
//   2. out_host (the exchange's result, exact at every position) -> the device output;
//   3. with error feedback, acc_host (now the residual: acc minus what was sent) -> acc, where
//      the next step adds its local sum.
// The reduction of the trainers' inputs, the dense steps and the residual's home stay on the
// device.
absl::Status Engine::SparseStep(Bucket* b, uint64_t step, ExchangeRecord* rec,
                                const std::function<void(Phase)>& lap) {
  const int L = options_.local_trainers, N = collective_->size();
  const size_t n = b->elements;
  const bool staged = b->data != nullptr && !b->codec_on_device;
  float* const acc = staged ? b->acc_host.data() : b->acc;  // in `mem`'s memory from here on
  float* const out = staged ? b->out_host.data() : b->output;
  Primitives* const mem = b->codec_on_device ? prims_ : host_prims_;
  DeviceSide device_side{prims_, b->scratch.get()};
  const DeviceSide* const dev = b->codec_on_device ? &device_side : nullptr;
  // x[idx] = 0 for host indices idx, in `mem`'s memory (uploaded to slot 2 on the device).
  auto zero_at = [&](float* x, const std::vector<uint32_t>& idx) -> absl::Status {
    if (dev == nullptr || idx.empty()) return mem->ZeroAt(x, n, idx.data(), idx.size());
    absl::StatusOr<void*> d = b->scratch->Upload(2, idx.data(), idx.size() * 4);
    if (!d.ok()) return d.status();
    return prims_->ZeroAt(x, n, static_cast<const uint32_t*>(*d), idx.size());
  };
  // acc = residual + local sum (error feedback), or just the local sum.
  absl::Status s = LocalReduce(b, options_.error_feedback);
  if (!s.ok()) return s;
  if (staged) {
    s = prims_->CopyToHost(acc, b->acc, n * sizeof(float));  // staging copy 1
    if (!s.ok()) return s;
  }
  lap(Phase::kReduceLocal);
  const WirePattern pattern = b->codec->pattern();
  s = b->codec->SetDensity(b->density);
  if (!s.ok()) return s;
  CodecSelection& sel = b->sel;
  s = b->codec->Select(acc, n, step, pattern == WirePattern::kSparseGather, &sel);
  if (!s.ok()) return s;
  lap(Phase::kCompress);
  // The output holds last step's result: zero only the positions written then.
  if (b->output_dense) {
    s = mem->Fill(out, 0.0f, n);
    b->output_dense = false;
  } else if (!b->touched.empty()) {
    s = zero_at(out, b->touched);
  }
  if (!s.ok()) return s;
  SparseExchangeArgs args;
  args.group_id = b->id;
  args.step = step;
  args.elements = static_cast<uint32_t>(n);
  args.scale = 1.0f / static_cast<float>(N * L);
  args.fp16 = options_.fp16_values;
  std::memcpy(args.scalars, sel.scalars, sizeof(args.scalars));
  SparseExchangeResult res;
  s = pattern == WirePattern::kIndexUnion
          ? ExchangeIndexUnion(collective_, host_prims_, args, sel.idx, acc, out, &res, dev)
          : ExchangeSparseGather(collective_, host_prims_, args, sel.idx, sel.val, out, &res, dev);
  if (!s.ok()) return s;
  if (staged) {
    s = prims_->CopyFromHost(b->output, out, n * sizeof(float));  // staging copy 2
    if (!s.ok()) return s;
  }
  lap(Phase::kCollective);
  if (pattern == WirePattern::kIndexUnion) {
    // Every node zeroes its residual at the whole union: all of it was sent.
    s = zero_at(acc, res.gathered_idx);
    if (!s.ok()) return s;
  }
  if (!options_.error_feedback) {
    s = mem->Fill(acc, 0.0f, n);
  } else if (staged) {
    s = prims_->CopyFromHost(b->acc, acc, n * sizeof(float));  // staging copy 3
  }
  if (!s.ok()) return s;
  s = b->codec->Update(step, res.counts, res.gathered_idx);
  b->touched = std::move(res.touched);
  lap(Phase::kDecode);
  rec->pattern = PatternName(pattern);
  rec->target_density = b->density;
  rec->selected_elements = sel.idx.size();
  rec->achieved_density = static_cast<double>(sel.idx.size()) / n;
  rec->gathered_elements =
      pattern == WirePattern::kIndexUnion ? b->touched.size() : res.gathered_idx.size();
  rec->bytes_sent = res.bytes_sent;
  rec->bytes_received = res.bytes_received;
  if (options_.residual_norm_every > 0 && step % options_.residual_norm_every == 0) {
    rec->residual_norm = std::sqrt(mem->Moments(acc, n, -1.0f).sum_sq);
    rec->residual_norm_step = step;
  } else {
    absl::MutexLock lock(&mu_);
    rec->residual_norm = b->last.residual_norm;
    rec->residual_norm_step = b->last.residual_norm_step;
  }
  return s;
}

void Engine::Publish(Bucket* b, uint64_t step, const absl::Status& status,
                     const ExchangeRecord& rec_in) {
  if (!status.ok()) {
    SPEX_LOG(ERROR) << "bucket " << b->id << " step " << step << ": " << status;
  }
  // Stats first: a trainer that sees the result and then asks GetStats must find this exchange.
  {
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      b->error_step = step;
      b->error = status;
    }
    b->last = rec_in;
    b->exchanges++;
    total_exchanges_++;
    for (int p = 0; p < static_cast<int>(Phase::kCount); ++p)
      b->phase_sum[p] += rec_in.phase_seconds[p];
  }
  const uint64_t t = MonotonicNanos();
  b->header->status.store(status.ok() ? 0 : static_cast<int32_t>(status.code()));
  b->header->published.store(static_cast<uint32_t>(step + 1));
  if (b->header->waiters.load()) FutexWake(&b->header->published);
  b->next_step = step + 1;
  const double publish_seconds = (MonotonicNanos() - t) * 1e-9;
  absl::MutexLock lock(&mu_);
  b->last.phase_seconds[static_cast<int>(Phase::kPublish)] += publish_seconds;
  b->phase_sum[static_cast<int>(Phase::kPublish)] += publish_seconds;
  b->completed = step + 1;
  processing_ = false;
  published_cv_.SignalAll();
}

std::vector<BucketSummary> Engine::Buckets() const {
  absl::MutexLock lock(&mu_);
  std::vector<BucketSummary> out;
  for (const auto& [id, b] : buckets_) {
    BucketSummary s;
    s.bucket_id = id;
    s.elements = b->elements;
    s.compressor = b->compressor;
    s.exchanges = b->exchanges;
    s.last = b->last;
    for (int p = 0; p < static_cast<int>(Phase::kCount); ++p) {
      s.mean_phase_seconds[p] = b->exchanges ? b->phase_sum[p] / b->exchanges : 0;
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<SessionSummary> Engine::Sessions() const {
  absl::MutexLock lock(&mu_);
  std::vector<SessionSummary> out;
  const absl::Time now = absl::Now();
  for (const auto& [id, s] : sessions_) {
    out.push_back(
        {id, s->local_rank, s->pid, s->client, s->buckets, absl::ToDoubleSeconds(now - s->opened)});
  }
  return out;
}

uint64_t Engine::total_exchanges() const {
  absl::MutexLock lock(&mu_);
  return total_exchanges_;
}

std::vector<std::string> Engine::LinkedSegments() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& bell : doorbells_) {
    if (!bell->unlinked()) out.push_back(bell->name());
  }
  for (const auto& [id, b] : buckets_) {
    if (!b->shm->unlinked()) out.push_back(b->shm->name());
  }
  return out;
}

}  // namespace spex
