// A bucket's I/O around its step, in one place for both devices: waiting for the trainers'
// inputs before the step, and making the step's result the trainers' output after it (a half
// bucket's float32 result rounded once into its half output; on the device path the result
// copied to trainers on other GPUs and the output event recorded). The engine's paths call
// these at the same points whatever the device: the device-dependent choices (which of them
// runs before the commit vote, which at publishing) are made here, not behind `on_device`
// branches at each caller.
#pragma once

#include "absl/status/status.h"
#include "daemon/engine/bucket.h"
#include "daemon/memory/device_memory.h"
#include "kernels/primitives.h"

namespace spex {

class BucketIO {
 public:
  // `prims`: the buckets' memory (device primitives on the device path); `device`: the device
  // path (empty on the CPU path: every call but the rounding is then a no-op).
  BucketIO(const DevicePath& device, Primitives* prims, int local_trainers)
      : device_(device), prims_(prims), local_trainers_(local_trainers) {}

  // Before the step reads the inputs. Device path: waits for every trainer's input event (on
  // its own GPU), then gathers the inputs of trainers on other GPUs into their staging slots on
  // the home GPU, in local-rank order (from here the step is the one-GPU step). The CPU path:
  // nothing to wait for (the doorbell said the inputs are written).
  absl::Status WaitInputs(EngineBucket* b) const;

  // After the step, before its commit vote (`status`: the step's outcome so far). Device path:
  // the result becomes the trainers' output now (a half bucket rounded on the device when the
  // step succeeded, then copied to trainers on other GPUs and the output event recorded on
  // every GPU holding a buffer of the bucket, even after a failure, so no trainer waits on a
  // stale record). The CPU path: nothing (the result is rounded at publishing). Returns
  // `status`, or the first failure here when it was ok.
  absl::Status StepDone(EngineBucket* b, const absl::Status& status) const;

  // Before publishing (`status`: the outcome to publish). The CPU path: a half bucket's float32
  // result rounded once into the trainers' output when `status` is ok. Device path: nothing
  // (StepDone did it). Returns `status`, or the rounding's failure when it was ok.
  absl::Status BeforePublish(EngineBucket* b, const absl::Status& status) const;

 private:
  // The bucket's events are ordered through the device path's slot ordering.
  bool ordered(const EngineBucket& b) const {
    return device_.ordering != nullptr && b.mem.data != nullptr;
  }
  // The one place a half output is rounded (step.h RoundOutput), on whichever memory the
  // bucket's data is.
  absl::Status Round(EngineBucket* b) const;
  absl::Status RecordOutput(EngineBucket* b) const;

  const DevicePath device_;
  Primitives* const prims_;
  const int local_trainers_;
};

}  // namespace spex
