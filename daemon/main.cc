// spexd: the per-node daemon. Wiring only: flags, MPI, the device path (CUDA primitives, CUDA
// IPC buffers, NCCL) when --device picks the GPU, the engine, the gRPC server, signals.
#include <mpi.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/device.h"
#include "daemon/engine/engine.h"
#include "daemon/flags.h"
#include "daemon/memory/cuda_device_memory.h"
#include "daemon/service/spex_service.h"
#include "daemon/transport/mpi_collective.h"
#include "daemon/transport/nccl_collective.h"
#include "daemon/util/log.h"
#include "daemon/util/paths.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/primitives.h"

namespace spex {
namespace {

constexpr char kVersion[] = "spexd 0.1.0";

int Fail(const std::string& message) {
  SPEX_LOG(ERROR) << message;
  return 2;
}

// Index of this daemon among the daemons on its host, and their number.
void HostPosition(int* index, int* count) {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, index);
  MPI_Comm_size(local, count);
  MPI_Comm_free(&local);
}

// This daemon's GPU (daemons sharing a host take one usable GPU each, round robin) with its
// CUDA primitives and device memory. FailedPrecondition saying why and what to do otherwise.
absl::Status SetUpGpu(const std::vector<int>& gpus, int host_index, int host_count,
                      std::unique_ptr<Primitives>* prims,
                      std::unique_ptr<CudaDeviceMemory>* memory) {
  if (gpus.empty()) return absl::InternalError("--device chose the GPU but listed no usable one");
  const int gpu = gpus[host_index % gpus.size()];
  if (host_count > static_cast<int>(gpus.size())) {
    SPEX_LOG(WARNING) << host_count << " daemons share this host's " << gpus.size()
                      << " usable GPU(s); NCCL refuses two ranks on one GPU";
  }
  if (absl::Status s = MakeCudaPrimitivesOnDevice(gpu, prims); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--device: GPU ", gpu,
                                                      ": CUDA primitives: ", s.message(),
                                                      ". Use --device=cpu to run on the CPU"));
  }
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> m = CudaDeviceMemory::Create(gpu);
  if (!m.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device: GPU ", gpu, ": ", m.status().message(), ". Use --device=cpu to run on the CPU"));
  }
  *memory = std::move(*m);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return Fail(absl::StrCat("--log_level must be debug|info|warning|error, got '",
                             absl::GetFlag(FLAGS_log_level), "'"));
  }
  SetLogLevel(level);

  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  SetLogPrefix(absl::StrCat("spexd[node ", rank, "/", size, "]"));

  // --device: every node probes its own GPU; the nodes then agree (one all-reduce) so that a
  // start fails on every rank alike and `auto` picks the same path everywhere.
  const std::string device_flag = absl::GetFlag(FLAGS_device);
  std::string device_reason;
  std::vector<int> gpus;  // the GPUs this build's kernels run on, when the choice is the GPU
  absl::StatusOr<Device> device = ChooseDevice(device_flag, &device_reason, &gpus);
  int device_vote[2] = {device.ok() ? 0 : 1, device.ok() && *device == Device::kCuda ? 0 : 1};
  MPI_Allreduce(MPI_IN_PLACE, device_vote, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!device.ok()) return Fail(std::string(device.status().message()));
  if (device_vote[0])
    return Fail("--device=" + device_flag + ": another node has no usable GPU; see its log");
  if (*device == Device::kCuda && device_vote[1]) {
    // `auto` found a GPU here but not on every node: the whole world takes the CPU path.
    device = Device::kCpu;
    device_reason =
        "--device=auto: using the CPU: not every node has a usable GPU (see their logs)";
  }
  SPEX_LOG(INFO) << device_reason;
  const std::string job_flag = absl::GetFlag(FLAGS_job);
  const std::string job = job_flag.empty() ? DefaultJob() : job_flag;
  int host_index = 0, host_count = 1;
  HostPosition(&host_index, &host_count);
  std::string socket_path = absl::GetFlag(FLAGS_socket);
  if (socket_path.empty()) socket_path = DefaultSocketPath(job, host_count > 1 ? host_index : -1);
  for (size_t pos; (pos = socket_path.find("{rank}")) != std::string::npos;) {
    socket_path.replace(pos, 6, std::to_string(rank));
  }
  char* end = nullptr;
  const std::string mode_text = absl::GetFlag(FLAGS_socket_mode);
  const long mode = std::strtol(mode_text.c_str(), &end, 8);
  if (mode_text.empty() || *end != '\0' || mode < 0 || mode > 0777) {
    return Fail(absl::StrCat("--socket_mode must be octal permission bits such as 0600, got '",
                             mode_text, "'"));
  }
  // Every rank checks its socket; all must pass before anyone serves.
  absl::Status path_ok = PrepareSocketPath(socket_path);
  int bad = path_ok.ok() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!path_ok.ok()) return Fail(std::string(path_ok.message()));
  if (bad) return Fail("another node could not use its socket path; see its log");

  const int local_trainers = absl::GetFlag(FLAGS_local_trainers);
  // The divisor of every average is nodes x local trainers: every node must have the same.
  int trainers_range[2] = {-local_trainers, local_trainers};
  MPI_Allreduce(MPI_IN_PLACE, trainers_range, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (-trainers_range[0] != trainers_range[1]) {
    return Fail(absl::StrCat("--local_trainers differs between nodes (", -trainers_range[0], " to ",
                             trainers_range[1], "; this node: ", local_trainers,
                             "): averages divide by nodes x local trainers, so start every spexd "
                             "with the same --local_trainers"));
  }
  int spin = absl::GetFlag(FLAGS_spin_us);
  if (spin < 0) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    spin = cores > (local_trainers + 1) * host_count ? 50 : 0;
  }
  std::unique_ptr<Primitives> prims = MakeCpuPrimitives(absl::GetFlag(FLAGS_threads));
  MpiCollective mpi(MPI_COMM_WORLD, prims.get());
  PeerNotice notice(MPI_COMM_WORLD);
  // The GPU path: buckets' data in CUDA IPC buffers on this node's GPU, reduced by the CUDA
  // primitives, exchanged by NCCL (bootstrapped over MPI); the compressors keep running on the
  // CPU primitives in host memory (the engine stages sparse steps through host copies).
  Collective* collective = &mpi;
  Primitives* data_prims = prims.get();
  std::unique_ptr<Primitives> gpu_prims;
  std::unique_ptr<CudaDeviceMemory> gpu_memory;
  std::unique_ptr<Collective> nccl;
  DevicePath device_path;
  if (*device == Device::kCuda) {
    absl::Status s = SetUpGpu(gpus, host_index, host_count, &gpu_prims, &gpu_memory);
    int failed = s.ok() ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (!s.ok()) return Fail(std::string(s.message()));
    if (failed) {
      return Fail("--device=" + device_flag +
                  ": another node could not set up its GPU; see its log");
    }
    // Every rank takes part; on failure every rank gets the same outcome (nccl_collective.h).
    absl::StatusOr<std::unique_ptr<Collective>> made = MakeNcclCollective(&mpi, gpu_memory->gpu());
    if (!made.ok()) {
      return Fail(absl::StrCat("--device=", device_flag, ": NCCL: ", made.status().message(),
                               ". Use --device=cpu to run on the CPU"));
    }
    nccl = std::move(*made);
    collective = nccl.get();
    data_prims = gpu_prims.get();
    device_path.allocator = gpu_memory.get();
    device_path.ordering = gpu_memory.get();
    device_path.host_prims = prims.get();
    SPEX_LOG(INFO) << "GPU path: buckets on GPU " << gpu_memory->gpu()
                   << ", exchanged through NCCL";
  }

  EngineOptions opts;
  opts.local_trainers = local_trainers;
  opts.job = job_flag;
  opts.compressor = absl::GetFlag(FLAGS_compressor);
  opts.density = absl::GetFlag(FLAGS_density);
  opts.register_wait = absl::GetFlag(FLAGS_register_timeout);
  opts.engine_spin_us = spin;
  opts.client_spin_us = spin;
  opts.shm_tag = absl::StrCat(getpid());
  opts.error_feedback = absl::GetFlag(FLAGS_error_feedback);
  if (absl::GetFlag(FLAGS_min_sparse_elements) < 0)
    return Fail("--min_sparse_elements must be >= 0");
  opts.min_sparse_elements = static_cast<uint64_t>(absl::GetFlag(FLAGS_min_sparse_elements));
  opts.dense_fallback = absl::GetFlag(FLAGS_dense_fallback);
  opts.probe_steps = absl::GetFlag(FLAGS_probe_steps);
  if (opts.probe_steps < 1) return Fail("--probe_steps must be >= 1");
  opts.fp16_values = absl::GetFlag(FLAGS_fp16_values);
  opts.residual_norm_every = absl::GetFlag(FLAGS_residual_norm_every);
  opts.merger = absl::GetFlag(FLAGS_merger);
  opts.announce_stop = [&notice] { notice.Announce(); };
  opts.peer_stopped = [&notice](int* who) { return notice.PeerStopped(who); };
  Engine engine(opts, collective, data_prims, device_path);
  if (absl::Status s = engine.Start(); !s.ok()) return Fail(std::string(s.message()));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  SpexService service(&engine, kVersion);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    engine.RequestStop();
    engine.JoinFor(absl::Seconds(1));
    return Fail(absl::StrCat("cannot listen on unix:", socket_path));
  }
  chmod(socket_path.c_str(), static_cast<mode_t>(mode));
  server->GetHealthCheckService()->SetServingStatus("spex.v1.Spex", true);
  SPEX_LOG(INFO) << kVersion << " serving unix:" << socket_path << " (" << local_trainers
                 << " local trainers, compressor " << opts.compressor << ", spin " << spin
                 << " us, " << (device_path.allocator != nullptr ? "CUDA" : "host")
                 << " buffers, collective " << collective->name() << ")";

  // Stopping removes every name first, before anything that can block: under mpirun a SIGTERM
  // is followed by SIGKILL after odls_base_sigkill_timeout (1 s by default), and a node whose
  // engine is inside a collective that a stopped peer left never gets through the clean path
  // (it would wait --shutdown_grace). Trainers that attached keep their mappings.
  auto unlink_names = [&engine, &socket_path] {
    for (const std::string& name : engine.LinkedSegments()) shm_unlink(name.c_str());
    unlink(socket_path.c_str());
  };
  // Signals: a dedicated thread waits for SIGTERM/SIGINT (blocked everywhere else).
  std::thread signals([&engine, &unlink_names] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGUSR2);
    int sig = 0;
    sigwait(&set, &sig);
    if (sig == SIGUSR2) return;
    engine.RequestStop();  // first: no new registration creates a segment after this
    unlink_names();
    SPEX_LOG(INFO) << "signal " << sig << ": shutting down";
  });

  engine.WaitStopped();  // a signal here, or a peer node stopping
  server->GetHealthCheckService()->SetServingStatus("spex.v1.Spex", false);
  engine.RequestStop();
  unlink_names();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  unlink(socket_path.c_str());
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
  if (!engine.JoinFor(absl::GetFlag(FLAGS_shutdown_grace))) {
    for (const std::string& name : engine.LinkedSegments()) shm_unlink(name.c_str());
    SPEX_LOG(ERROR)
        << "engine still inside a collective after --shutdown_grace (a peer left mid-exchange); "
           "exiting without MPI_Finalize";
    std::fflush(nullptr);
    _exit(3);
  }
  notice.Drain();
  SPEX_LOG(INFO) << "stopped cleanly";
  return 0;
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "spexd: per-node sparse gradient exchange daemon. Start one per node under mpirun/srun; "
      "trainers connect over a unix socket. See README.md.");
  absl::ParseCommandLine(argc, argv);
  // Block the stop signals before any thread starts, so only the signal thread receives them.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr,
                 "spexd: MPI provides thread level %d; at least MPI_THREAD_SERIALIZED is needed\n",
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  // Start-up checks depend only on flags every rank shares, or are agreed by an all-reduce,
  // so a failing start fails on every rank alike and can still finalize cleanly.
  int rc = spex::Main(argc, argv);
  // MPI_Finalize synchronises with every rank. A peer that was SIGKILLed (mpirun's escalation
  // after SIGTERM) or that is stuck can leave it waiting forever, so it gets --shutdown_grace.
  std::thread watchdog([rc] {
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_shutdown_grace)));
    std::fprintf(
        stderr,
        "spexd: MPI_Finalize did not return within --shutdown_grace (a peer left); exiting\n");
    std::fflush(nullptr);
    _exit(rc != 0 ? rc : 3);
  });
  watchdog.detach();
  MPI_Finalize();
  return rc;
}
