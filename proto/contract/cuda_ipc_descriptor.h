// The CUDA IPC descriptor of a device bucket (spex.v1.CudaIpcDescriptor): the handle bytes the
// daemon exports (daemon/memory/cuda_ipc_buffer.h) and a trainer opens (client/ipc_handle_cache.h),
// as plain values, with the codec both sides use. Part of the trainer-daemon contract: plain C++,
// no CUDA call, tested without a GPU.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/contract/layout.h"

namespace spex {

namespace v1 {
class CudaIpcDescriptor;
}

// Bytes in a cudaIpcMemHandle_t / cudaIpcEventHandle_t (CUDA_IPC_HANDLE_SIZE).
inline constexpr size_t kCudaIpcHandleBytes = 64;
// One event per input slot plus the output.
inline constexpr size_t kMaxIpcEvents = kMaxLocalTrainers + 1;

using IpcHandle = std::array<uint8_t, kCudaIpcHandleBytes>;

// The layout of a device bucket's data is DeviceInputOffset / DeviceOutputOffset /
// DeviceBucketBytes (layout.h). The IPC events of such a buffer are one per input slot (event
// r: trainer r's input is written) and then one for the output (event `slots`: the daemon's
// result is written).

// What a trainer needs to open a buffer, as plain values.
struct CudaIpcHandles {
  IpcHandle memory{};
  std::vector<IpcHandle> events;  // one per slot
  uint64_t size = 0;              // bytes
  int32_t device = 0;             // the daemon's GPU ordinal
};

// The handle's bytes as a string (the descriptor's field; a map key).
std::string IpcHandleBytes(const IpcHandle& handle);

void EncodeCudaIpcDescriptor(const CudaIpcHandles& handles, v1::CudaIpcDescriptor* out);
// InvalidArgument naming the field when a handle is not kCudaIpcHandleBytes long, the memory
// handle is all zeros, there are no events or more than kMaxIpcEvents, size is 0, or the
// device ordinal is negative.
absl::StatusOr<CudaIpcHandles> DecodeCudaIpcDescriptor(const v1::CudaIpcDescriptor& d);

}  // namespace spex
