// Which device spexd serves buffers on (--device=auto|cpu|cuda). The GPU probe sits behind a
// small interface so the choice is tested with a fake; the real probe asks the CUDA runtime
// under --config=cuda and reports "built without CUDA" otherwise. With `cuda` and no usable
// GPU the choice is an error saying why; with `auto` it is the CPU plus the reason to log.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/primitives.h"

namespace spex {

struct GpuInfo {
  int ordinal = 0;
  std::string name;
  int major = 0;  // compute capability
  int minor = 0;
  uint64_t memory_bytes = 0;
};

struct GpuProbeResult {
  bool built_with_cuda = false;
  // Why the runtime offers no GPU (e.g. "no NVIDIA driver (...): cudaErrorInsufficientDriver
  // (...)"); empty when the runtime answered, even with zero devices.
  std::string error;
  std::vector<GpuInfo> devices;
};

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;
  virtual GpuProbeResult Probe() = 0;
};

// The CUDA runtime's view (cudaGetDeviceCount, cudaGetLastError to clear a failure,
// cudaGetDeviceProperties); without --config=cuda: built_with_cuda = false.
std::unique_ptr<GpuProbe> MakeGpuProbe();

// The GPU architectures this build has kernels for (e.g. {80, 90}); empty without CUDA.
std::vector<int> BuiltCudaArchs();

// True when kernels compiled for sm_<arch> (SASS) run on a GPU of compute capability
// major.minor: same major version and minor >= the arch's minor.
bool ArchRunsOn(int arch, int major, int minor);

// --devices: GPU ordinals, comma-separated, distinct, each in 0..1023 ("" = none given).
// InvalidArgument naming --devices and what is wrong.
absl::StatusOr<std::vector<int>> ParseDeviceList(absl::string_view text);

// The GPUs one daemon serves (docs/design.md#multi-gpu): `given` (--devices) when not empty,
// each of which must be in `usable` (else FailedPrecondition naming --devices and the usable
// GPUs); else every usable GPU when this daemon is alone on its host, or one of them (round
// robin by `host_index`) when `host_count` daemons share it. The first is the home GPU.
absl::StatusOr<std::vector<int>> ServedDevices(const std::vector<int>& given,
                                               const std::vector<int>& usable, int host_index,
                                               int host_count);

// --device: where spexd serves buffers. kAuto takes the GPU when a usable one is found.
enum class DeviceChoice { kAuto, kCpu, kCuda };
bool AbslParseFlag(absl::string_view text, DeviceChoice* out, std::string* error);
std::string AbslUnparseFlag(DeviceChoice choice);

// `reason` (may be null) gets a sentence for the log saying what was chosen and why. Error:
// FailedPrecondition for kCuda without a usable GPU (naming the cause). `archs` are the
// architectures the kernels were built for (BuiltCudaArchs() in production). `usable` (may be
// null) gets the ordinals of every GPU the kernels run on, ascending, when the choice is the
// GPU (the first of them is the one `reason` names), and is cleared otherwise.
absl::StatusOr<Device> ChooseDevice(DeviceChoice choice, GpuProbe& probe,
                                    const std::vector<int>& archs, std::string* reason,
                                    std::vector<int>* usable = nullptr);

// The production form: the real probe and this build's architectures.
absl::StatusOr<Device> ChooseDevice(DeviceChoice choice, std::string* reason,
                                    std::vector<int>* usable = nullptr);

// The same by the flag's spelling (auto | cpu | cuda); InvalidArgument naming the accepted
// values for another.
absl::StatusOr<Device> ChooseDevice(const std::string& flag, GpuProbe& probe,
                                    const std::vector<int>& archs, std::string* reason,
                                    std::vector<int>* usable = nullptr);
absl::StatusOr<Device> ChooseDevice(const std::string& flag, std::string* reason,
                                    std::vector<int>* usable = nullptr);

}  // namespace spex
