// CUDA runtime errors as sentences an operator can act on (cuda_error.h).
#include "kernels/cuda/cuda_error.h"

#include "absl/strings/str_cat.h"

namespace spex {

std::string ExplainCudaError(const std::string& name, const std::string& text) {
  struct Hint {
    const char* name;
    const char* meaning;
  };
  static constexpr Hint kHints[] = {
      {"cudaErrorInsufficientDriver", "no NVIDIA driver (or one older than the CUDA runtime)"},
      {"cudaErrorNoDevice", "no CUDA-capable device"},
      {"cudaErrorNoKernelImageForDevice",
       "this GPU's architecture is not one the build compiled kernels for"},
      {"cudaErrorDevicesUnavailable", "every GPU is busy or in exclusive-process mode"},
      {"cudaErrorSystemDriverMismatch",
       "the NVIDIA kernel module and the user-space driver have different versions"},
      {"cudaErrorCompatNotSupportedOnDevice",
       "the CUDA forward-compatibility driver does not "
       "support this GPU"},
      {"cudaErrorInvalidDevice", "no such GPU ordinal"},
      {"cudaErrorMemoryAllocation", "out of GPU memory"},
  };
  const char* meaning = "CUDA error";
  for (const Hint& h : kHints) {
    if (name == h.name) meaning = h.meaning;
  }
  return absl::StrCat(meaning, ": ", name, " (", text, ")");
}

}  // namespace spex
