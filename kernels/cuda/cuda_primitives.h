// The CUDA implementation of Primitives (kernels/primitives.h) for one GPU: cub where cub has
// the operation (threshold count/select, moments, top-k selection), small grid-stride kernels
// for the rest. Every pointer passed to it is device memory of that GPU. Built only with
// --config=cuda; MakeCudaPrimitives (declared in primitives.h) picks the current device.
//
// Behaviour beyond primitives.h: every call completes (the object's stream is synchronised)
// before it returns, and calls on one object are serialised (it owns scratch memory). A CUDA
// failure in a call without a Status result (Accumulate, CountAbove, ...) makes that call return
// 0 / leave its outputs unspecified and is kept: CudaPrimitivesError reports the first one.
// ScatterAdd with repeated indices adds them with float atomics, in an unspecified order.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "kernels/primitives.h"

namespace spex {

// FailedPrecondition (with the CUDA error, e.g. "no NVIDIA driver ...: cudaErrorInsufficient
// Driver (...)") where no GPU is usable or this GPU cannot run the build's kernels;
// InvalidArgument for an ordinal that does not exist.
absl::Status MakeCudaPrimitivesOnDevice(int device, std::unique_ptr<Primitives>* out);

// The first CUDA error a call without a Status result hit on `p` (which must come from
// MakeCudaPrimitives*); OK while there was none.
absl::Status CudaPrimitivesError(const Primitives& p);

}  // namespace spex
