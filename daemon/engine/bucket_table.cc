#include "daemon/engine/bucket_table.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status_macros.h"

namespace spex {
namespace {

// The header trainers check when they attach (proto/contract/layout.h), at the segment's start.
BucketHeader* NewHeader(void* at, uint64_t id, uint64_t elements, uint32_t slots,
                        DType dtype = DType::kFloat32) {
  auto* h = new (at) BucketHeader();
  h->magic = kBucketMagic;
  h->version = kLayoutVersion;
  h->bucket_id = id;
  h->elements = elements;
  h->slots = slots;
  h->dtype = static_cast<uint32_t>(dtype);
  h->slot_stride = SlotStride(elements, DTypeSize(dtype));
  return h;
}

}  // namespace

BucketTable::BucketTable(const EngineOptions* options, Collective* coll, Primitives* prims,
                         DevicePath device)
    : options_(options), coll_(coll), prims_(prims), device_(device) {}

absl::StatusOr<EngineBucket*> BucketTable::Create(const BucketSpec& spec) {
  auto b = std::make_unique<EngineBucket>();
  b->id = spec.id;
  b->elements = spec.elements;
  b->compressor = spec.compressor;
  b->params = spec.params;
  b->policy = spec.policy;
  b->out.density = spec.density;
  BucketData& v = b->mem.view;
  v.id = spec.id;
  v.elements = spec.elements;
  v.dtype = spec.policy.dtype;
  v.wire = spec.policy.wire();
  absl::Status s = device_.allocator != nullptr ? AllocateDevice(b.get()) : AllocateHost(b.get());
  if (s.ok()) s = BuildCompressor(b.get(), spec.density);
  const uint32_t slots = options_->local_trainers;
  if (s.ok() && (slots > 1 || b->ex.sparse != nullptr)) {
    if (v.on_device) {
      auto acc = device_.allocator->AllocateScratch(spec.elements * sizeof(float));
      if (acc.ok()) {
        b->mem.acc_device = std::move(*acc);
        v.acc = static_cast<float*>(b->mem.acc_device->data());
      } else {
        s = acc.status();
      }
      if (s.ok() && b->ex.sparse != nullptr && options_->error_feedback) {
        // As on the CPU path: residual + local sum goes here first (step.h).
        auto next = device_.allocator->AllocateScratch(spec.elements * sizeof(float));
        if (next.ok()) {
          b->mem.acc_next_device = std::move(*next);
          v.acc_next = static_cast<float*>(b->mem.acc_next_device->data());
        } else {
          s = next.status();
        }
      }
    } else {
      b->mem.acc_host.assign(spec.elements, 0.0f);
      v.acc = b->mem.acc_host.data();
      if (b->ex.sparse != nullptr && options_->error_feedback) {
        // Residual + local sum goes here first, so a skipped step keeps the residual (step.h).
        b->mem.acc_next_host.assign(spec.elements, 0.0f);
        v.acc_next = b->mem.acc_next_host.data();
      }
    }
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("bucket ", spec.id, " (", spec.elements,
                                               " elements): ", s.message()));
  }
  EngineBucket* out = b.get();
  buckets_[spec.id] = std::move(b);
  return out;
}

// One shm segment: the header, then the input slots and the output.
absl::Status BucketTable::AllocateHost(EngineBucket* b) {
  const uint32_t slots = options_->local_trainers;
  const DType dtype = b->mem.view.dtype;
  const size_t eb = DTypeSize(dtype);
  auto shm = ShmBuffer::Create(BucketBytes(b->elements, slots, eb),
                               absl::StrCat(options_->shm_tag, "-b", b->id));
  if (!shm.ok()) return shm.status();
  b->mem.shm = std::move(*shm);
  uint8_t* base = static_cast<uint8_t*>(b->mem.shm->data());
  b->mem.header = NewHeader(base, b->id, b->elements, slots, dtype);
  b->mem.view.pulled = b->mem.shm->pulled_flag();
  for (uint32_t r = 0; r < slots; ++r) PlaceOwnInput(b, r, nullptr);  // every input in its slot
  if (IsHalf(dtype)) {
    // Half slots and output in shm; the steps' float32 output is host staging (step.h).
    b->mem.view.half_output =
        reinterpret_cast<uint16_t*>(base + OutputOffset(b->elements, slots, eb));
    b->mem.output_host.assign(b->elements, 0.0f);
    b->mem.view.output = b->mem.output_host.data();
    return absl::OkStatus();
  }
  b->mem.view.output = reinterpret_cast<float*>(base + OutputOffset(b->elements, slots));
  return absl::OkStatus();
}

// The header alone in shm (the doorbell counters stay host memory), the data in the
// allocator's buffer.
absl::Status BucketTable::AllocateDevice(EngineBucket* b) {
  const uint32_t slots = options_->local_trainers;
  const DType dtype = b->mem.view.dtype;
  const size_t eb = DTypeSize(dtype);
  auto shm = ShmBuffer::Create(kPageBytes, absl::StrCat(options_->shm_tag, "-b", b->id));
  if (!shm.ok()) return shm.status();
  b->mem.shm = std::move(*shm);
  b->mem.header = NewHeader(b->mem.shm->data(), b->id, b->elements, slots, dtype);
  const size_t bytes = DeviceBucketBytes(b->elements, slots, eb);
  auto data = device_.allocator->AllocateBucket(bytes, slots + 1);
  if (!data.ok()) return data.status();
  b->mem.data = std::move(*data);
  if (b->mem.data->size() < bytes) {
    return absl::InternalError(absl::StrCat("the allocator returned ", b->mem.data->size(),
                                            " bytes, ", bytes, " were asked for"));
  }
  uint8_t* base = static_cast<uint8_t*>(b->mem.data->data());
  if (IsHalf(dtype)) {
    // Half slots and output in the device buffer; the steps' float32 output is device scratch,
    // rounded on the device into the half output before the output event (step.h).
    for (uint32_t r = 0; r < slots; ++r) {
      b->mem.view.half_input[r] =
          reinterpret_cast<const uint16_t*>(base + DeviceInputOffset(b->elements, r, eb));
    }
    b->mem.view.half_output =
        reinterpret_cast<uint16_t*>(base + DeviceOutputOffset(b->elements, slots, eb));
    auto out = device_.allocator->AllocateScratch(b->elements * sizeof(float));
    if (!out.ok()) return out.status();
    b->mem.output_device = std::move(*out);
    b->mem.view.output = static_cast<float*>(b->mem.output_device->data());
  } else {
    for (uint32_t r = 0; r < slots; ++r) {
      b->mem.view.input[r] = reinterpret_cast<float*>(base + DeviceInputOffset(b->elements, r));
    }
    b->mem.view.output = reinterpret_cast<float*>(base + DeviceOutputOffset(b->elements, slots));
  }
  b->mem.view.on_device = true;
  b->mem.scratch = std::make_unique<Scratch>(prims_);
  b->mem.view.scratch = b->mem.scratch.get();
  return absl::OkStatus();
}

// Sparse buckets get their compressor on the bucket's own primitives (the device's on the
// device path); "dense", a dense-pattern compressor and small buckets exchange dense.
absl::Status BucketTable::BuildCompressor(EngineBucket* b, double density) {
  if (!SparseCandidate(b->compressor, b->elements)) return absl::OkStatus();
  CompressorSpec spec;
  spec.name = b->compressor;
  spec.density = density;
  spec.params = b->params;
  spec.node_rank = coll_->rank();
  spec.node_count = coll_->size();
  spec.elements = b->elements;
  absl::StatusOr<std::unique_ptr<Compressor>> c = options_->compressor_factory
                                                      ? options_->compressor_factory(spec, prims_)
                                                      : MakeCompressor(spec, prims_);
  if (!c.ok()) return c.status();
  if (*c == nullptr || (*c)->pattern() == Pattern::kDense) return absl::OkStatus();
  if (absl::Status s = CheckSparseAllreduce(b->policy.sparse_allreduce,
                                            b->policy.sparse_allreduce_param, b->compressor);
      !s.ok()) {
    return s;
  }
  b->ex.sparse = std::make_unique<SparseState>();
  b->ex.sparse->compressor = std::move(*c);
  b->ex.sparse->oktopk = b->policy.sparse_allreduce == SparseAllreduce::kOkTopk;
  b->ex.allreduce_probe =
      b->policy.sparse_allreduce == SparseAllreduce::kAuto && CompressorCanUseOkTopk(b->compressor);
  OkTopkOptions& ok = b->ex.sparse->oktopk_options;
  ok.global =
      options_->oktopk_global == OkTopkSelect::kAll ? OkTopkGlobal::kAll : OkTopkGlobal::kTopk;
  ok.recompute_every = static_cast<uint32_t>(options_->oktopk_recompute_every);
  ok.rebalance_every = static_cast<uint32_t>(options_->oktopk_rebalance_every);
  b->ex.mode = b->policy.dense_fallback == DenseFallback::kAuto ? BucketExchange::Mode::kProbe
                                                                : BucketExchange::Mode::kSparse;
  b->ex.model_pending = options_->auto_decide == AutoDecide::kModel &&
                        (b->ex.mode == BucketExchange::Mode::kProbe || b->ex.allreduce_probe);
  return absl::OkStatus();
}

absl::Status BucketTable::CheckDevice(int device) const {
  if (device < 0) return absl::OkStatus();
  if (device_.allocator == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the trainer says its bucket is on GPU ", device,
        ", but this spexd serves host buffers (--device=cpu, or auto without a usable GPU); "
        "start spexd with --device=cuda"));
  }
  if (device == device_.home) return absl::OkStatus();
  std::vector<std::string> served = {absl::StrCat(device_.home)};
  for (const NodeDevice& d : device_.others) {
    if (d.ordinal == device) return absl::OkStatus();
    served.push_back(absl::StrCat(d.ordinal));
  }
  const std::string list = absl::StrJoin(served, ",");
  return absl::FailedPreconditionError(absl::StrCat(
      "the trainer's bucket is on GPU ", device, ", but this spexd serves GPU",
      served.size() > 1 ? "s " : " ", list, " (--devices=", list,
      "); start spexd with --devices naming GPU ", device,
      " (or without --devices: every visible GPU), or put the trainer on one of those"));
}

absl::Status BucketTable::PlaceSlot(EngineBucket* b, uint32_t slot, int device) {
  SPEX_RETURN_IF_ERROR(CheckDevice(device));
  if (device < 0 || device == device_.home || b->mem.data == nullptr) {
    b->mem.remote[slot].reset();
    return absl::OkStatus();
  }
  if (b->mem.remote[slot] != nullptr && b->mem.remote_device[slot] == device) {
    return absl::OkStatus();
  }
  const NodeDevice* on = nullptr;
  for (const NodeDevice& d : device_.others) {
    if (d.ordinal == device) on = &d;
  }
  if (on == nullptr || on->allocator == nullptr || device_.link == nullptr) {
    return absl::InternalError(absl::StrCat("GPU ", device, " has no allocator or link"));
  }
  const size_t bytes = DeviceBucketBytes(b->elements, 1, DTypeSize(b->mem.view.dtype));
  auto data = on->allocator->AllocateBucket(bytes, options_->local_trainers + 1);
  if (!data.ok()) {
    return absl::Status(data.status().code(),
                        absl::StrCat("bucket ", b->id, " on GPU ", device, " (local trainer ", slot,
                                     "): ", data.status().message()));
  }
  if ((*data)->size() < bytes) {
    return absl::InternalError(absl::StrCat("the allocator of GPU ", device, " returned ",
                                            (*data)->size(), " bytes, ", bytes, " were asked for"));
  }
  b->mem.remote[slot] = std::move(*data);
  b->mem.remote_device[slot] = device;
  return absl::OkStatus();
}

// The one place a host bucket's input pointers are set: at allocation (every slot) and at each
// registration of a trainer.
void BucketTable::PlaceOwnInput(EngineBucket* b, uint32_t slot,
                                std::unique_ptr<TrainerMemory> own) {
  BucketData& v = b->mem.view;
  if (b->mem.shm == nullptr || v.on_device) return;  // the device path keeps its slots
  const size_t eb = DTypeSize(v.dtype);
  uint8_t* base = static_cast<uint8_t*>(b->mem.shm->data());
  void* in = own != nullptr ? const_cast<void*>(own->data())
                            : static_cast<void*>(base + InputOffset(b->elements, slot, eb));
  if (IsHalf(v.dtype)) {
    v.half_input[slot] = static_cast<const uint16_t*>(in);
  } else {
    v.input[slot] = static_cast<float*>(in);  // read only: the steps never write an input
  }
  v.input_pulled[slot] = own != nullptr ? own->pulled_flag() : nullptr;
  b->mem.own_input[slot] = std::move(own);
}

uint64_t BucketTable::ShmBytes(uint64_t elements) const {
  return device_.allocator != nullptr ? kPageBytes
                                      : BucketBytes(elements, options_->local_trainers);
}

uint64_t BucketTable::Footprint(uint64_t elements, bool sparse) const {
  const uint64_t data = device_.allocator != nullptr
                            ? DeviceBucketBytes(elements, options_->local_trainers) + kPageBytes
                            : BucketBytes(elements, options_->local_trainers);
  const bool acc = options_->local_trainers > 1 || sparse;
  // Sparse with error feedback: the second accumulator (BucketData::acc_next).
  const bool acc_next = sparse && options_->error_feedback;
  return data + (acc ? 4 * elements : 0) + (acc_next ? 4 * elements : 0) +
         (sparse ? 8 * elements : 0);
}

bool BucketTable::SparseCandidate(const std::string& compressor, uint64_t elements) const {
  return compressor != "dense" && elements >= options_->min_sparse_elements;
}

uint64_t BucketTable::RemoteBytes(uint64_t elements, DType dtype, int device) const {
  if (device_.allocator == nullptr || device < 0 || device == device_.home) return 0;
  return DeviceBucketBytes(elements, 1, DTypeSize(dtype));
}

uint64_t BucketTable::SlotRemoteBytes(const EngineBucket& b, uint32_t slot) const {
  if (b.mem.remote[slot] == nullptr) return 0;
  return RemoteBytes(b.elements, b.mem.view.dtype, b.mem.remote_device[slot]);
}

uint64_t BucketTable::TotalBytes() const {
  uint64_t total = 0;
  for (const auto& [id, b] : buckets_) {
    total += Footprint(b->elements, b->ex.sparse != nullptr);
    for (uint32_t s = 0; s < kMaxLocalTrainers; ++s) total += SlotRemoteBytes(*b, s);
  }
  return total;
}

EngineBucket* BucketTable::Find(uint64_t id) {
  auto it = buckets_.find(id);
  return it == buckets_.end() ? nullptr : it->second.get();
}

void BucketTable::Erase(uint64_t id) { buckets_.erase(id); }

void BucketTable::UnlinkAttached() {
  for (auto& [id, b] : buckets_) {
    if (b->mem.shm->unlinked()) continue;
    bool all = true;
    for (int r = 0; r < options_->local_trainers && all; ++r) {
      all = b->mem.header->attached[r].load() != 0;
    }
    if (!all) continue;
    b->mem.shm->Unlink().IgnoreError();
    if (b->mem.data != nullptr) b->mem.data->Unlink().IgnoreError();
    for (int r = 0; r < options_->local_trainers; ++r) {
      if (b->mem.remote[r] != nullptr) b->mem.remote[r]->Unlink().IgnoreError();
    }
  }
}

std::vector<std::string> BucketTable::LinkedSegments() const {
  std::vector<std::string> out;
  for (const auto& [id, b] : buckets_) {
    if (!b->mem.shm->unlinked()) out.push_back(b->mem.shm->name());
  }
  return out;
}

}  // namespace spex
