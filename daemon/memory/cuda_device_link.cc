// Copies between a node's GPUs (cuda_device_link.h): peer to peer where the GPUs have peer
// access, else staged through pinned host memory; compiled only under --config=cuda.
#include "daemon/memory/cuda_device_link.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/cuda_guard.h"
#endif

namespace spex {

#ifdef SPEX_HAVE_CUDA
namespace {

class CudaDeviceLinkImpl final : public CudaDeviceLink {
 public:
  explicit CudaDeviceLinkImpl(size_t staging_bytes) : chunk_(staging_bytes) {}

  ~CudaDeviceLinkImpl() override {
    for (auto& [ordinal, d] : devices_) {
      DeviceGuard guard(ordinal);
      for (cudaEvent_t e : d.events) {
        if (e != nullptr) cudaEventDestroy(e);
      }
      if (d.stream != nullptr) cudaStreamDestroy(d.stream);
    }
    for (void* p : pinned_) {
      if (p != nullptr) cudaFreeHost(p);
    }
  }

  absl::Status Init(const std::vector<int>& ordinals) {
    for (int o : ordinals) {
      if (devices_.count(o)) {
        return absl::InvalidArgumentError(absl::StrCat("--devices names GPU ", o, " twice"));
      }
      DeviceGuard guard(o);
      if (cudaError_t e = cudaSetDevice(o); e != cudaSuccess) {
        return CudaFailure(e, absl::StrCat("cudaSetDevice(", o, ")"));
      }
      PerDevice& d = devices_[o];
      if (cudaError_t e = cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking);
          e != cudaSuccess) {
        d.stream = nullptr;
        return CudaFailure(e, absl::StrCat("cudaStreamCreate (GPU ", o, " link)"));
      }
      for (cudaEvent_t& ev : d.events) {
        if (cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
            e != cudaSuccess) {
          ev = nullptr;
          return CudaFailure(e, absl::StrCat("cudaEventCreate (GPU ", o, " link)"));
        }
      }
    }
    for (int a : ordinals) {
      for (int b : ordinals) {
        if (a == b) continue;
        int can = 0;
        if (cudaError_t e = cudaDeviceCanAccessPeer(&can, a, b); e != cudaSuccess) {
          return CudaFailure(e, absl::StrCat("cudaDeviceCanAccessPeer(", a, ", ", b, ")"));
        }
        if (!can) continue;
        DeviceGuard guard(a);
        cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();
        } else if (e != cudaSuccess) {
          return CudaFailure(e, absl::StrCat("cudaDeviceEnablePeerAccess(", a, " -> ", b, ")"));
        }
        peer_[{a, b}] = true;
      }
    }
    bool any_staged = false;
    for (int a : ordinals) {
      for (int b : ordinals) any_staged = any_staged || (a != b && !PeerAccess(a, b));
    }
    if (any_staged) {
      for (void*& p : pinned_) {
        if (cudaError_t e = cudaHostAlloc(&p, chunk_, cudaHostAllocPortable); e != cudaSuccess) {
          p = nullptr;
          return CudaFailure(e, absl::StrCat("cudaHostAlloc(", chunk_, ") for staged copies"));
        }
      }
    }
    return absl::OkStatus();
  }

  bool PeerAccess(int from, int to) const override {
    if (from == to) return true;
    auto it = peer_.find({from, to});
    return it != peer_.end() && it->second;
  }

  std::string Describe() const override {
    std::vector<std::string> pairs;
    for (const auto& [p, on] : peer_) {
      if (on) pairs.push_back(absl::StrCat(p.first, "->", p.second));
    }
    return absl::StrCat(
        "GPUs with peer access: ", pairs.empty() ? "none" : absl::StrJoin(pairs, " "),
        "; other pairs copy through pinned host memory");
  }

  absl::Status Copy(int dst_device, void* dst, int src_device, const void* src,
                    size_t bytes) override {
    absl::MutexLock lock(&mu_);  // one copy at a time: the staging buffers and streams are shared
    auto dst_it = devices_.find(dst_device);
    auto src_it = devices_.find(src_device);
    if (dst_it == devices_.end() || src_it == devices_.end()) {
      return absl::InternalError(absl::StrCat("link copy between GPU ", src_device, " and GPU ",
                                              dst_device, ": not a GPU of this link"));
    }
    PerDevice& to = dst_it->second;
    PerDevice& from = src_it->second;
    if (bytes == 0) return absl::OkStatus();
    if (src_device == dst_device || PeerAccess(dst_device, src_device) ||
        PeerAccess(src_device, dst_device)) {
      DeviceGuard guard(dst_device);
      cudaError_t e = src_device == dst_device
                          ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, to.stream)
                          : cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, to.stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(to.stream);
      if (e != cudaSuccess) {
        return CudaFailure(e, absl::StrCat("peer copy of ", bytes, " bytes from GPU ", src_device,
                                           " to GPU ", dst_device));
      }
      return absl::OkStatus();
    }
    // Staged: chunk i downloads into pinned buffer i % 2 on the source GPU's stream and
    // records downloaded[i % 2]; the destination's stream waits for it and uploads, recording
    // uploaded[i % 2], which the download of chunk i + 2 waits for before reusing the buffer.
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    size_t i = 0;
    for (size_t at = 0; at < bytes; at += chunk_, ++i) {
      const size_t len = std::min(chunk_, bytes - at);
      const int k = static_cast<int>(i % 2);
      cudaError_t e = cudaSuccess;
      {
        DeviceGuard guard(src_device);
        if (i >= 2) e = cudaStreamWaitEvent(from.stream, to.events[2 + k], 0);
        if (e == cudaSuccess) {
          e = cudaMemcpyAsync(pinned_[k], s + at, len, cudaMemcpyDeviceToHost, from.stream);
        }
        if (e == cudaSuccess) e = cudaEventRecord(from.events[k], from.stream);
      }
      if (e == cudaSuccess) {
        DeviceGuard guard(dst_device);
        e = cudaStreamWaitEvent(to.stream, from.events[k], 0);
        if (e == cudaSuccess) {
          e = cudaMemcpyAsync(d + at, pinned_[k], len, cudaMemcpyHostToDevice, to.stream);
        }
        if (e == cudaSuccess) e = cudaEventRecord(to.events[2 + k], to.stream);
      }
      if (e != cudaSuccess) {
        Drain(from, to, src_device, dst_device);
        return CudaFailure(e, absl::StrCat("staged copy of ", bytes, " bytes from GPU ", src_device,
                                           " to GPU ", dst_device));
      }
    }
    return Drain(from, to, src_device, dst_device);
  }

 private:
  struct PerDevice {
    cudaStream_t stream = nullptr;
    // [0], [1]: a chunk downloaded into pinned buffer 0/1 (recorded on the source's stream);
    // [2], [3]: a chunk uploaded from it (recorded on the destination's stream).
    cudaEvent_t events[4] = {};
  };

  absl::Status Drain(PerDevice& from, PerDevice& to, int src_device, int dst_device) {
    cudaError_t e1, e2;
    {
      DeviceGuard guard(src_device);
      e1 = cudaStreamSynchronize(from.stream);
    }
    {
      DeviceGuard guard(dst_device);
      e2 = cudaStreamSynchronize(to.stream);
    }
    if (e1 != cudaSuccess) return CudaFailure(e1, absl::StrCat("GPU ", src_device, " link stream"));
    if (e2 != cudaSuccess) return CudaFailure(e2, absl::StrCat("GPU ", dst_device, " link stream"));
    return absl::OkStatus();
  }

  const size_t chunk_;
  absl::Mutex mu_;
  std::map<int, PerDevice> devices_;
  std::map<std::pair<int, int>, bool> peer_;
  void* pinned_[2] = {nullptr, nullptr};
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeviceLink>> CudaDeviceLink::Create(
    const std::vector<int>& ordinals, size_t staging_bytes) {
  if (staging_bytes == 0) return absl::InvalidArgumentError("link staging buffers of 0 bytes");
  auto link = std::make_unique<CudaDeviceLinkImpl>(staging_bytes);
  if (absl::Status s = link->Init(ordinals); !s.ok()) return s;
  return std::unique_ptr<CudaDeviceLink>(std::move(link));
}

#else  // !SPEX_HAVE_CUDA

absl::StatusOr<std::unique_ptr<CudaDeviceLink>> CudaDeviceLink::Create(
    const std::vector<int>& ordinals, size_t staging_bytes) {
  (void)staging_bytes;
  return absl::FailedPreconditionError(
      absl::StrCat("a link between GPUs ", absl::StrJoin(ordinals, ","),
                   ": spex was built without CUDA; rebuild with bazel build --config=cuda"));
}

#endif  // SPEX_HAVE_CUDA

}  // namespace spex
