// MakeCudaPrimitives for builds without CUDA: always an error that says how to get CUDA.
// kernels/cuda provides the real definition under --config=cuda.
#include "kernels/primitives.h"

namespace spex {

absl::Status MakeCudaPrimitives(std::unique_ptr<Primitives>* out) {
  if (out != nullptr) out->reset();
  return absl::UnimplementedError("spex was built without CUDA; rebuild with --config=cuda");
}

absl::Status MakeCudaPrimitivesOnDevice(int, std::unique_ptr<Primitives>* out) {
  return MakeCudaPrimitives(out);
}

}  // namespace spex
