// The --device choice (device.h): auto, cpu or cuda, with the GPU probe behind an interface so the
// choice and its log line are tested without a GPU.
#include "daemon/device.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_error.h"
#endif

namespace spex {
namespace {

std::string ArchList(const std::vector<int>& archs) {
  std::vector<std::string> names;
  for (int a : archs) names.push_back(absl::StrCat("sm_", a));
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

std::string Describe(const GpuInfo& g) {
  return absl::StrFormat("GPU %d (%s, sm_%d%d, %.1f GiB)", g.ordinal, g.name, g.major, g.minor,
                         g.memory_bytes / double(1ull << 30));
}

#ifdef SPEX_HAVE_CUDA
class CudaGpuProbe final : public GpuProbe {
 public:
  GpuProbeResult Probe() override {
    GpuProbeResult r;
    r.built_with_cuda = true;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it: the process goes on (on the CPU) and must not trip on it
      r.error = ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e));
      return r;
    }
    for (int i = 0; i < count; ++i) {
      cudaDeviceProp prop{};
      e = cudaGetDeviceProperties(&prop, i);
      if (e != cudaSuccess) {
        cudaGetLastError();
        r.error = absl::StrCat("GPU ", i, ": ",
                               ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e)));
        continue;
      }
      GpuInfo g;
      g.ordinal = i;
      g.name = prop.name;
      g.major = prop.major;
      g.minor = prop.minor;
      g.memory_bytes = prop.totalGlobalMem;
      r.devices.push_back(g);
    }
    if (!r.devices.empty()) r.error.clear();  // some GPU answered; choose among those
    return r;
  }
};
#else
class NoCudaProbe final : public GpuProbe {
 public:
  GpuProbeResult Probe() override { return GpuProbeResult{}; }
};
#endif

}  // namespace

std::unique_ptr<GpuProbe> MakeGpuProbe() {
#ifdef SPEX_HAVE_CUDA
  return std::make_unique<CudaGpuProbe>();
#else
  return std::make_unique<NoCudaProbe>();
#endif
}

std::vector<int> BuiltCudaArchs() {
#ifdef SPEX_CUDA_ARCHS
  return {SPEX_CUDA_ARCHS};
#else
  return {};
#endif
}

bool ArchRunsOn(int arch, int major, int minor) { return arch / 10 == major && arch % 10 <= minor; }

absl::StatusOr<std::vector<int>> ParseDeviceList(absl::string_view text) {
  std::vector<int> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    int v = -1;
    if (!absl::SimpleAtoi(part, &v) || v < 0 || v > 1023) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices must list CUDA device ordinals (0..1023) separated by commas, "
                       "e.g. --devices=0,1; got '",
                       part.substr(0, 32), "' in '", text.substr(0, 64), "'"));
    }
    for (int seen : out) {
      if (seen == v) {
        return absl::InvalidArgumentError(
            absl::StrCat("--devices names GPU ", v, " twice ('", text.substr(0, 64), "')"));
      }
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<int>> ServedDevices(const std::vector<int>& given,
                                               const std::vector<int>& usable, int host_index,
                                               int host_count) {
  if (usable.empty()) return absl::FailedPreconditionError("no usable GPU");
  if (given.empty()) {
    if (host_count <= 1) return usable;
    return std::vector<int>{usable[host_index % usable.size()]};
  }
  for (int g : given) {
    bool found = false;
    for (int u : usable) found = found || u == g;
    if (!found) {
      return absl::FailedPreconditionError(
          absl::StrCat("--devices names GPU ", g,
                       ", which this host does not have or whose kind this build "
                       "has no kernels for (usable GPUs: ",
                       absl::StrJoin(usable, ","),
                       "); list only those in --devices, or leave it out to use them all"));
    }
  }
  return given;
}

bool AbslParseFlag(absl::string_view text, DeviceChoice* out, std::string* error) {
  if (text == "auto") {
    *out = DeviceChoice::kAuto;
  } else if (text == "cpu") {
    *out = DeviceChoice::kCpu;
  } else if (text == "cuda") {
    *out = DeviceChoice::kCuda;
  } else {
    *error =
        absl::StrCat("--device must be one of auto, cpu, cuda; got '", text.substr(0, 64), "'");
    return false;
  }
  return true;
}

std::string AbslUnparseFlag(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::kCpu:
      return "cpu";
    case DeviceChoice::kCuda:
      return "cuda";
    case DeviceChoice::kAuto:
      break;
  }
  return "auto";
}

absl::StatusOr<Device> ChooseDevice(DeviceChoice choice, GpuProbe& probe,
                                    const std::vector<int>& archs, std::string* reason,
                                    std::vector<int>* usable) {
  std::string ignored;
  if (reason == nullptr) reason = &ignored;
  std::vector<int> runs_here;
  if (usable == nullptr) usable = &runs_here;
  usable->clear();
  if (choice == DeviceChoice::kCpu) {
    *reason = "--device=cpu: serving host buffers with the CPU primitives";
    return Device::kCpu;
  }
  const std::string flag = AbslUnparseFlag(choice);

  const GpuProbeResult found = probe.Probe();
  std::string why_not;
  const GpuInfo* chosen = nullptr;
  if (!found.built_with_cuda) {
    why_not = "spexd was built without CUDA (rebuild with bazel build --config=cuda)";
  } else if (!found.error.empty()) {
    why_not = found.error;
  } else if (found.devices.empty()) {
    why_not = "the CUDA runtime found no GPU";
  } else {
    std::vector<std::string> seen;
    for (const GpuInfo& g : found.devices) {
      bool runs = false;
      for (int arch : archs) runs = runs || ArchRunsOn(arch, g.major, g.minor);
      if (runs) {
        usable->push_back(g.ordinal);
        if (chosen == nullptr) chosen = &g;
      }
      seen.push_back(Describe(g));
    }
    if (chosen == nullptr) {
      why_not = absl::StrCat("no GPU can run this build's kernels (built for ", ArchList(archs),
                             "; found ", absl::StrJoin(seen, ", "), ")");
    }
  }

  if (chosen != nullptr) {
    *reason = absl::StrCat("--device=", flag, ": using ", Describe(*chosen));
    return Device::kCuda;
  }
  usable->clear();
  if (choice == DeviceChoice::kCuda) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=cuda: no usable GPU: ", why_not,
                     ". Use --device=cpu (or auto) to run on the CPU."));
  }
  *reason = absl::StrCat("--device=auto: using the CPU: ", why_not);
  return Device::kCpu;
}

absl::StatusOr<Device> ChooseDevice(DeviceChoice choice, std::string* reason,
                                    std::vector<int>* usable) {
  std::unique_ptr<GpuProbe> probe = MakeGpuProbe();
  return ChooseDevice(choice, *probe, BuiltCudaArchs(), reason, usable);
}

absl::StatusOr<Device> ChooseDevice(const std::string& flag, GpuProbe& probe,
                                    const std::vector<int>& archs, std::string* reason,
                                    std::vector<int>* usable) {
  DeviceChoice choice;
  std::string error;
  if (!AbslParseFlag(flag, &choice, &error)) {
    if (usable != nullptr) usable->clear();
    return absl::InvalidArgumentError(error);
  }
  return ChooseDevice(choice, probe, archs, reason, usable);
}

absl::StatusOr<Device> ChooseDevice(const std::string& flag, std::string* reason,
                                    std::vector<int>* usable) {
  std::unique_ptr<GpuProbe> probe = MakeGpuProbe();
  return ChooseDevice(flag, *probe, BuiltCudaArchs(), reason, usable);
}

}  // namespace spex
