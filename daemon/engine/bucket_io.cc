// BucketIO (bucket_io.h): a bucket's inputs and outputs around its step, on either device.
#include "daemon/engine/bucket_io.h"

#include "absl/strings/str_cat.h"
#include "daemon/engine/step.h"

namespace spex {

absl::Status BucketIO::StepDone(EngineBucket* b, const absl::Status& status) const {
  absl::Status s = status;
  // Device path: a half bucket's result is rounded on the device before the output event, which
  // marks the result written.
  if (s.ok() && b->mem.view.on_device) s = Round(b);
  if (absl::Status recorded = RecordOutput(b); s.ok()) s = recorded;
  return s;
}

absl::Status BucketIO::BeforePublish(EngineBucket* b, const absl::Status& status) const {
  // The host path: a half bucket's float32 result rounded once into the trainers' output.
  if (!status.ok() || b->mem.view.on_device) return status;
  return Round(b);
}

absl::Status BucketIO::Round(EngineBucket* b) const { return RoundOutput(prims_, b->mem.view); }

namespace {

// Several GPUs (docs/design.md#multi-gpu): the slot ordering of trainer r's GPU, null when its
// buffer is not on another GPU of the path.
SlotOrdering* RemoteOrdering(const DevicePath& path, const BucketMemory& mem, int r) {
  if (mem.remote[r] == nullptr) return nullptr;
  for (const NodeDevice& d : path.others) {
    if (d.ordinal == mem.remote_device[r]) return d.ordering;
  }
  return nullptr;
}

}  // namespace

// Waits for every trainer's input event (on its own GPU), then gathers the inputs of trainers
// on other GPUs into their staging slots on the home GPU, in local-rank order: from here the
// step is the one-GPU step.
absl::Status BucketIO::WaitInputs(EngineBucket* b) const {
  if (!ordered(*b)) return absl::OkStatus();
  const BucketData& v = b->mem.view;
  const size_t bytes = b->elements * DTypeSize(v.dtype);
  for (int r = 0; r < local_trainers_; ++r) {
    SharedBuffer* own = b->mem.remote[r] != nullptr ? b->mem.remote[r].get() : b->mem.data.get();
    SlotOrdering* ordering =
        b->mem.remote[r] != nullptr ? RemoteOrdering(device_, b->mem, r) : device_.ordering;
    absl::Status s = ordering == nullptr
                         ? absl::InternalError(absl::StrCat("GPU ", b->mem.remote_device[r],
                                                            " has no slot ordering"))
                         : ordering->WaitInput(own, r);
    if (s.ok() && b->mem.remote[r] != nullptr) {
      const auto* from =
          static_cast<const uint8_t*>(own->data()) + DeviceInputOffset(b->elements, 0);
      void* to = IsHalf(v.dtype) ? static_cast<void*>(const_cast<uint16_t*>(v.half_input[r]))
                                 : static_cast<void*>(v.input[r]);
      s = device_.link->Copy(device_.home, to, b->mem.remote_device[r], from, bytes);
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("bucket ", b->id, ": copying local trainer ", r,
                                                   "'s input from GPU ", b->mem.remote_device[r],
                                                   " to GPU ", device_.home, ": ", s.message()));
      }
    }
    if (!s.ok()) {
      const int gpu = b->mem.remote[r] != nullptr ? b->mem.remote_device[r] : device_.home;
      return absl::Status(s.code(),
                          absl::StrCat("bucket ", b->id, ": waiting for local trainer ", r,
                                       "'s input event on GPU ", gpu, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// Copies the home GPU's output to every trainer on another GPU, then records the output event
// on every GPU holding a buffer of the bucket (each after its copy). Every buffer is recorded
// even after a failure, so no trainer waits on a stale record; the first failure is returned.
absl::Status BucketIO::RecordOutput(EngineBucket* b) const {
  if (!ordered(*b)) return absl::OkStatus();
  const int local = local_trainers_;
  absl::Status first;
  for (int r = 0; r < local; ++r) {
    if (b->mem.remote[r] == nullptr) continue;
    SharedBuffer* own = b->mem.remote[r].get();
    // The published output: a half bucket's half values (rounded before this, StepDone).
    const BucketData& v = b->mem.view;
    const size_t eb = DTypeSize(v.dtype);
    auto* to = static_cast<uint8_t*>(own->data()) + DeviceOutputOffset(b->elements, 1, eb);
    const void* from = IsHalf(v.dtype) ? static_cast<const void*>(v.half_output)
                                       : static_cast<const void*>(v.output);
    absl::Status s =
        device_.link->Copy(b->mem.remote_device[r], to, device_.home, from, b->elements * eb);
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("bucket ", b->id, ": copying the output to GPU ",
                                              b->mem.remote_device[r], " (local trainer ", r,
                                              "): ", s.message()));
    }
    SlotOrdering* ordering = RemoteOrdering(device_, b->mem, r);
    absl::Status rec = ordering == nullptr ? absl::InternalError("no slot ordering")
                                           : ordering->RecordOutput(own, local);
    if (s.ok() && !rec.ok()) {
      s = absl::Status(rec.code(),
                       absl::StrCat("bucket ", b->id, ": recording the output event on GPU ",
                                    b->mem.remote_device[r], ": ", rec.message()));
    }
    if (first.ok()) first = s;
  }
  absl::Status s = device_.ordering->RecordOutput(b->mem.data.get(), local);
  if (!s.ok() && first.ok()) {
    first = absl::Status(
        s.code(), absl::StrCat("bucket ", b->id, ": recording the output event: ", s.message()));
  }
  return first;
}

}  // namespace spex
