// NcclCollective (nccl_collective.h): the collectives on device buffers over NCCL, bootstrapped
// over the daemon's MPI world; compiled only under --config=cuda.
#include "daemon/transport/nccl_collective.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/base/status_macros.h"

#ifdef SPEX_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/cuda_guard.h"
#endif

namespace spex {

AllGatherVPlan PlanAllGatherV(const std::vector<size_t>& counts) {
  AllGatherVPlan plan;
  plan.displs.resize(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) {
    plan.displs[r] = plan.total;
    plan.total += counts[r];
    plan.block = std::max(plan.block, counts[r]);
  }
  // Padded costs size * block bytes on the wire against total for exact sends; the ring
  // all-gather is worth up to 1/8 of extra bytes over many small point-to-point messages.
  const size_t padded_bytes = plan.block * counts.size();
  plan.padded = plan.total > 0 && padded_bytes - plan.total <= padded_bytes / 8;
  return plan;
}

absl::StatusOr<std::string> AgreeOnNcclId(
    Collective* bootstrap, const absl::Status& local,
    const std::function<absl::StatusOr<std::string>()>& make_id) {
  const int size = bootstrap->size();
  const uint64_t ready = local.ok() ? 1 : 0;
  std::vector<uint64_t> all(size);
  if (absl::Status s = bootstrap->AllGather(&ready, sizeof(ready), all.data()); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("NCCL bootstrap: exchanging readiness failed: ", s.message()));
  }
  std::vector<int> not_ready;
  for (int r = 0; r < size; ++r) {
    if (all[r] != 1) not_ready.push_back(r);
  }
  if (!not_ready.empty()) {
    std::string message = absl::StrCat("NCCL bootstrap: rank(s) ", absl::StrJoin(not_ready, ", "),
                                       " of ", size, " cannot use their GPU");
    if (!local.ok()) absl::StrAppend(&message, "; this rank: ", local.message());
    return absl::FailedPreconditionError(message);
  }

  // Byte 0: 1 when rank 0 made an id; then the id.
  std::string packet(1 + kNcclUniqueIdBytes, '\0');
  absl::Status made = absl::OkStatus();
  if (bootstrap->rank() == 0) {
    absl::StatusOr<std::string> id = make_id();
    if (id.ok() && id->size() != kNcclUniqueIdBytes) {
      id = absl::InternalError(
          absl::StrCat("the unique id has ", id->size(), " bytes, not ", kNcclUniqueIdBytes));
    }
    if (id.ok()) {
      packet[0] = 1;
      std::memcpy(&packet[1], id->data(), kNcclUniqueIdBytes);
    } else {
      made = id.status();
    }
  }
  if (absl::Status s = bootstrap->Broadcast(packet.data(), packet.size(), 0); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("NCCL bootstrap: broadcasting the unique id failed: ", s.message()));
  }
  if (packet[0] != 1) {
    return absl::FailedPreconditionError(
        bootstrap->rank() == 0
            ? absl::StrCat("NCCL bootstrap: could not create the unique id: ", made.message())
            : "NCCL bootstrap: rank 0 could not create the unique id (see its log)");
  }
  return packet.substr(1);
}

#ifdef SPEX_HAVE_CUDA
namespace {

constexpr absl::Duration kCallTimeout = absl::Minutes(5);

absl::Status CudaCheck(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(
      absl::StrCat(what, ": ", ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e))));
}

// Device memory that only grows.
class DeviceScratch {
 public:
  ~DeviceScratch() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  absl::StatusOr<uint8_t*> Get(size_t bytes) {
    if (bytes > bytes_) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = nullptr;
      bytes_ = 0;
      const size_t grown = std::max(bytes, size_t{4096});
      SPEX_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&ptr_, grown), "cudaMalloc(NCCL staging)"));
      bytes_ = grown;
    }
    return static_cast<uint8_t*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

bool OnDevice(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

ncclDataType_t ToNccl(ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      return ncclFloat32;
    case ElemType::kFloat64:
      return ncclFloat64;
    case ElemType::kInt64:
      return ncclInt64;
    case ElemType::kUint64:
      return ncclUint64;
  }
  return ncclUint8;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

absl::Status DeviceReady(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "no usable GPU: ", ExplainCudaError(cudaGetErrorName(e), cudaGetErrorString(e))));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ordinal ", device, " does not exist (", count, " device(s))"));
  }
  return CudaCheck(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(int rank, int size, int device) : rank_(rank), size_(size), device_(device) {}
  ~NcclCollective() override {
    DeviceGuard guard(device_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const std::string& id_bytes) {
    DeviceGuard guard(device_);
    SPEX_RETURN_IF_ERROR(
        CudaCheck(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate"));
    ncclUniqueId id;
    static_assert(sizeof(id.internal) == kNcclUniqueIdBytes);
    std::memcpy(id.internal, id_bytes.data(), kNcclUniqueIdBytes);
    return Nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    SPEX_RETURN_IF_ERROR(Usable());
    if (count == 0) return absl::OkStatus();
    DeviceGuard guard(device_);
    const size_t bytes = count * ElemSize(type);
    absl::StatusOr<uint8_t*> d = StageIn(data, bytes, &in_);
    if (!d.ok()) return d.status();
    SPEX_RETURN_IF_ERROR(Nccl(
        ncclAllReduce(*d, *d, count, ToNccl(type), ToNccl(op), comm_, stream_), "ncclAllReduce"));
    SPEX_RETURN_IF_ERROR(StageOut(data, *d, bytes));
    return Finish("ncclAllReduce");
  }

  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    SPEX_RETURN_IF_ERROR(Usable());
    if (count == 0) return absl::OkStatus();
    DeviceGuard guard(device_);
    const size_t bytes = count * sizeof(float);
    absl::StatusOr<uint8_t*> s = StageIn(send, bytes, &in_);
    if (!s.ok()) return s.status();
    absl::StatusOr<uint8_t*> r = send == recv ? s : StageIn(recv, 0, &out_, bytes);
    if (!r.ok()) return r.status();
    // NCCL's pre-multiplied sum: sum over ranks of (scale * x), the scaling fused into the
    // reduction instead of a second pass.
    ncclRedOp_t op;
    SPEX_RETURN_IF_ERROR(
        Nccl(ncclRedOpCreatePreMulSum(&op, &scale, ncclFloat32, ncclScalarHostImmediate, comm_),
             "ncclRedOpCreatePreMulSum"));
    absl::Status st =
        Nccl(ncclAllReduce(*s, *r, count, ncclFloat32, op, comm_, stream_), "ncclAllReduce");
    ncclRedOpDestroy(op, comm_);
    SPEX_RETURN_IF_ERROR(st);
    SPEX_RETURN_IF_ERROR(StageOut(recv, *r, bytes));
    return Finish("ncclAllReduce(scaled)");
  }

  absl::Status AllGather(const void* send, size_t bytes, void* recv) override {
    SPEX_RETURN_IF_ERROR(Usable());
    if (bytes == 0) return absl::OkStatus();
    DeviceGuard guard(device_);
    absl::StatusOr<uint8_t*> s = StageIn(send, bytes, &in_);
    if (!s.ok()) return s.status();
    absl::StatusOr<uint8_t*> r = StageIn(recv, 0, &out_, bytes * size_);
    if (!r.ok()) return r.status();
    SPEX_RETURN_IF_ERROR(
        Nccl(ncclAllGather(*s, *r, bytes, ncclUint8, comm_, stream_), "ncclAllGather"));
    SPEX_RETURN_IF_ERROR(StageOut(recv, *r, bytes * size_));
    return Finish("ncclAllGather");
  }

  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    SPEX_RETURN_IF_ERROR(Usable());
    DeviceGuard guard(device_);
    // 1. Every rank's byte count (one uint64 each, gathered on the GPU).
    absl::StatusOr<uint8_t*> c = small_.Get(size_ * sizeof(uint64_t));
    if (!c.ok()) return c.status();
    uint64_t* dcounts = reinterpret_cast<uint64_t*>(*c);
    const uint64_t mine = send_bytes;
    SPEX_RETURN_IF_ERROR(CudaCheck(
        cudaMemcpyAsync(dcounts + rank_, &mine, sizeof(mine), cudaMemcpyHostToDevice, stream_),
        "AllGatherV counts"));
    SPEX_RETURN_IF_ERROR(Nccl(
        ncclAllGather(dcounts + rank_, dcounts, 1, ncclUint64, comm_, stream_), "ncclAllGather"));
    std::vector<uint64_t> host(size_);
    SPEX_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(host.data(), dcounts, size_ * sizeof(uint64_t),
                                                   cudaMemcpyDeviceToHost, stream_),
                                   "AllGatherV counts"));
    SPEX_RETURN_IF_ERROR(Finish("AllGatherV counts"));
    counts->assign(host.begin(), host.end());
    const AllGatherVPlan plan = PlanAllGatherV(*counts);
    recv->resize(plan.total);
    if (plan.total == 0) return absl::OkStatus();

    // 2. The chunks.
    absl::StatusOr<uint8_t*> s = StageIn(send, send_bytes, &in_);
    if (!s.ok()) return s.status();
    if (plan.padded) {
      absl::StatusOr<uint8_t*> out = out_.Get(plan.block * size_);
      if (!out.ok()) return out.status();
      uint8_t* mine_block = *out + plan.block * rank_;
      if (send_bytes > 0) {
        SPEX_RETURN_IF_ERROR(CudaCheck(
            cudaMemcpyAsync(mine_block, *s, send_bytes, cudaMemcpyDeviceToDevice, stream_),
            "AllGatherV pack"));
      }
      SPEX_RETURN_IF_ERROR(Nccl(
          ncclAllGather(mine_block, *out, plan.block, ncclUint8, comm_, stream_), "ncclAllGather"));
      for (int r = 0; r < size_; ++r) {
        if ((*counts)[r] == 0) continue;
        SPEX_RETURN_IF_ERROR(
            CudaCheck(cudaMemcpyAsync(recv->data() + plan.displs[r], *out + plan.block * r,
                                      (*counts)[r], cudaMemcpyDeviceToHost, stream_),
                      "AllGatherV unpack"));
      }
    } else {
      absl::StatusOr<uint8_t*> out = out_.Get(plan.total);
      if (!out.ok()) return out.status();
      SPEX_RETURN_IF_ERROR(Nccl(ncclGroupStart(), "ncclGroupStart"));
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        if (send_bytes > 0) {
          SPEX_RETURN_IF_ERROR(
              Nccl(ncclSend(*s, send_bytes, ncclUint8, r, comm_, stream_), "ncclSend"));
        }
        if ((*counts)[r] > 0) {
          SPEX_RETURN_IF_ERROR(
              Nccl(ncclRecv(*out + plan.displs[r], (*counts)[r], ncclUint8, r, comm_, stream_),
                   "ncclRecv"));
        }
      }
      SPEX_RETURN_IF_ERROR(Nccl(ncclGroupEnd(), "ncclGroupEnd"));
      if (send_bytes > 0) {
        SPEX_RETURN_IF_ERROR(CudaCheck(cudaMemcpyAsync(*out + plan.displs[rank_], *s, send_bytes,
                                                       cudaMemcpyDeviceToDevice, stream_),
                                       "AllGatherV own chunk"));
      }
      SPEX_RETURN_IF_ERROR(CudaCheck(
          cudaMemcpyAsync(recv->data(), *out, plan.total, cudaMemcpyDeviceToHost, stream_),
          "AllGatherV result"));
    }
    return Finish("AllGatherV");
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    SPEX_RETURN_IF_ERROR(Usable());
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root, " out of range"));
    }
    if (bytes == 0) return absl::OkStatus();
    DeviceGuard guard(device_);
    absl::StatusOr<uint8_t*> d = StageIn(data, bytes, &in_);
    if (!d.ok()) return d.status();
    SPEX_RETURN_IF_ERROR(
        Nccl(ncclBroadcast(*d, *d, bytes, ncclUint8, root, comm_, stream_), "ncclBroadcast"));
    SPEX_RETURN_IF_ERROR(StageOut(data, *d, bytes));
    return Finish("ncclBroadcast");
  }

  absl::Status Barrier() override {
    SPEX_RETURN_IF_ERROR(Usable());
    DeviceGuard guard(device_);
    absl::StatusOr<uint8_t*> d = small_.Get(sizeof(float));
    if (!d.ok()) return d.status();
    SPEX_RETURN_IF_ERROR(
        Nccl(ncclAllReduce(*d, *d, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce"));
    return Finish("Barrier");
  }

 private:
  absl::Status Usable() const {
    if (comm_ != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "the NCCL communicator was aborted after an earlier failure; restart the job");
  }

  absl::Status Nccl(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return absl::OkStatus();
    const char* detail = comm_ != nullptr ? ncclGetLastError(comm_) : ncclGetLastError(nullptr);
    return absl::UnavailableError(absl::StrCat(
        what, " failed: ", ncclGetErrorString(r), detail != nullptr && *detail ? " (" : "",
        detail != nullptr ? detail : "", detail != nullptr && *detail ? ")" : ""));
  }

  // A device pointer for `p`: p itself when it is device memory, else scratch filled with its
  // first `copy_bytes` bytes (room for max(copy_bytes, room) bytes).
  absl::StatusOr<uint8_t*> StageIn(const void* p, size_t copy_bytes, DeviceScratch* scratch,
                                   size_t room = 0) {
    if (OnDevice(p)) return static_cast<uint8_t*>(const_cast<void*>(p));
    absl::StatusOr<uint8_t*> d = scratch->Get(std::max(copy_bytes, room));
    if (!d.ok()) return d.status();
    if (copy_bytes > 0) {
      SPEX_RETURN_IF_ERROR(CudaCheck(
          cudaMemcpyAsync(*d, p, copy_bytes, cudaMemcpyHostToDevice, stream_), "stage in"));
    }
    return d;
  }
  absl::Status StageOut(void* p, const uint8_t* d, size_t bytes) {
    if (p == d) return absl::OkStatus();
    return CudaCheck(cudaMemcpyAsync(p, d, bytes, cudaMemcpyDeviceToHost, stream_), "stage out");
  }

  // Waits for the stream, watching for NCCL's asynchronous errors; a call that does not finish
  // within kCallTimeout (a peer died or hangs) aborts the communicator instead of hanging.
  absl::Status Finish(const char* what) {
    const absl::Time deadline = absl::Now() + kCallTimeout;
    for (int polls = 0;; ++polls) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaCheck(e, what);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        Abort();
        return absl::UnavailableError(absl::StrCat(what, " failed: ", ncclGetErrorString(async),
                                                   "; the NCCL communicator was aborted"));
      }
      if (absl::Now() > deadline) {
        Abort();
        return absl::DeadlineExceededError(
            absl::StrCat(what, " did not finish within ", absl::FormatDuration(kCallTimeout),
                         " (a peer is gone or stuck); the NCCL communicator was aborted"));
      }
      if (polls < 2000) {
        std::this_thread::yield();
      } else {
        absl::SleepFor(absl::Microseconds(50));
      }
    }
  }
  void Abort() {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  const int rank_, size_, device_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  DeviceScratch in_, out_, small_;
};

}  // namespace
#endif  // SPEX_HAVE_CUDA

absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(Collective* bootstrap, int device) {
  if (bootstrap == nullptr) return absl::InvalidArgumentError("MakeNcclCollective: no bootstrap");
#ifdef SPEX_HAVE_CUDA
  const absl::Status local = DeviceReady(device);
  absl::StatusOr<std::string> id =
      AgreeOnNcclId(bootstrap, local, []() -> absl::StatusOr<std::string> {
        ncclUniqueId uid;
        const ncclResult_t r = ncclGetUniqueId(&uid);
        if (r != ncclSuccess) {
          return absl::UnavailableError(absl::StrCat("ncclGetUniqueId: ", ncclGetErrorString(r)));
        }
        return std::string(uid.internal, sizeof(uid.internal));
      });
  if (!id.ok()) return id.status();
  auto nccl = std::make_unique<NcclCollective>(bootstrap->rank(), bootstrap->size(), device);
  if (absl::Status s = nccl->Init(*id); !s.ok()) return s;
  return std::unique_ptr<Collective>(std::move(nccl));
#else
  const absl::Status local = absl::FailedPreconditionError(
      "spex was built without CUDA; rebuild with bazel build --config=cuda");
  absl::StatusOr<std::string> id =
      AgreeOnNcclId(bootstrap, local, []() -> absl::StatusOr<std::string> {
        return absl::FailedPreconditionError("spex was built without CUDA");
      });
  if (!id.ok()) return id.status();
  return absl::InternalError("NCCL bootstrap agreed although this rank has no CUDA");
#endif
}

}  // namespace spex
