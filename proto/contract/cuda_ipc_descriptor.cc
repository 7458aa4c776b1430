// The CUDA IPC descriptor codec (cuda_ipc_descriptor.h): handle bytes <->
// spex.v1.CudaIpcDescriptor, with the size checks both the daemon and its trainers rely on.
#include "proto/contract/cuda_ipc_descriptor.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "proto/spex.pb.h"

namespace spex {
namespace {

absl::StatusOr<IpcHandle> HandleFromBytes(const std::string& bytes, const std::string& field) {
  if (bytes.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC descriptor: ", field, " has ",
                                                   bytes.size(), " bytes; a CUDA IPC ",
                                                   "handle has ", kCudaIpcHandleBytes));
  }
  IpcHandle h;
  std::memcpy(h.data(), bytes.data(), h.size());
  return h;
}

}  // namespace

std::string IpcHandleBytes(const IpcHandle& handle) {
  return std::string(reinterpret_cast<const char*>(handle.data()), handle.size());
}

void EncodeCudaIpcDescriptor(const CudaIpcHandles& handles, v1::CudaIpcDescriptor* out) {
  out->Clear();
  out->set_mem_handle(IpcHandleBytes(handles.memory));
  for (const IpcHandle& e : handles.events) out->add_event_handles(IpcHandleBytes(e));
  out->set_size(handles.size);
  out->set_device_ordinal(handles.device);
}

absl::StatusOr<CudaIpcHandles> DecodeCudaIpcDescriptor(const v1::CudaIpcDescriptor& d) {
  CudaIpcHandles h;
  absl::StatusOr<IpcHandle> memory = HandleFromBytes(d.mem_handle(), "mem_handle");
  if (!memory.ok()) return memory.status();
  if (std::all_of(memory->begin(), memory->end(), [](uint8_t b) { return b == 0; })) {
    return absl::InvalidArgumentError(
        "CUDA IPC descriptor: mem_handle is all zeros (not one cudaIpcGetMemHandle filled)");
  }
  h.memory = *memory;
  if (d.event_handles_size() == 0 || d.event_handles_size() > static_cast<int>(kMaxIpcEvents)) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA IPC descriptor: ", d.event_handles_size(),
                                                   " event handles; expected one per slot, 1 to ",
                                                   kMaxIpcEvents));
  }
  for (int i = 0; i < d.event_handles_size(); ++i) {
    absl::StatusOr<IpcHandle> e =
        HandleFromBytes(d.event_handles(i), absl::StrCat("event_handles[", i, "]"));
    if (!e.ok()) return e.status();
    h.events.push_back(*e);
  }
  if (d.size() == 0) return absl::InvalidArgumentError("CUDA IPC descriptor: size is 0");
  if (d.device_ordinal() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA IPC descriptor: device_ordinal ", d.device_ordinal(), " is negative"));
  }
  h.size = d.size();
  h.device = d.device_ordinal();
  return h;
}

}  // namespace spex
