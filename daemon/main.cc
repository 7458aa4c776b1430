// spexd: the per-node daemon. Wiring only: the configuration (daemon/config.h), the MPI world,
// the device path (CUDA primitives, CUDA IPC buffers, NCCL) when --device picks the GPU, the
// engine, the gRPC server, systemd notifications, and the stop.
#include <mpi.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "daemon/config.h"
#include "daemon/device.h"
#include "daemon/engine/engine.h"
#include "daemon/memory/cuda_device_link.h"
#include "daemon/memory/cuda_device_memory.h"
#include "daemon/memory/segment_janitor.h"
#include "daemon/observe/metrics.h"
#include "daemon/observe/timeline.h"
#include "daemon/service/spex_service.h"
#include "daemon/transport/agreement.h"
#include "daemon/transport/mpi_collective.h"
#include "daemon/transport/nccl_collective.h"
#include "daemon/util/heap.h"
#include "daemon/util/log.h"
#include "daemon/util/sd_notify.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "kernels/base/status_macros.h"
#include "kernels/primitives.h"
#include "proto/contract/socket_paths.h"

namespace spex {
namespace {

constexpr char kVersion[] = "spexd 0.1.0";

// systemd notifications are best effort: a failure is logged and the daemon goes on.
void Notify(const absl::Status& sent) {
  if (!sent.ok()) SPEX_LOG(WARNING) << "sd_notify: " << sent.message();
}

// This daemon's place in the MPI world: its node rank among `size`, and its index among the
// `host_count` daemons of its host.
struct World {
  int rank = 0;
  int size = 1;
  int host_index = 0;
  int host_count = 1;
};

World JoinWorld() {
  World w;
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &w.host_index);
  MPI_Comm_size(local, &w.host_count);
  MPI_Comm_free(&local);
  return w;
}

// --device, agreed by every node: each probes its own GPU; one node's failure fails all of them,
// and `auto` takes the GPU only when every node takes it. `gpus` gets this node's usable GPUs.
absl::StatusOr<Device> AgreeOnDevice(Collective* coll, DeviceChoice choice,
                                     std::vector<int>* gpus) {
  const std::string flag = absl::StrCat("--device=", AbslUnparseFlag(choice));
  std::string reason;
  absl::StatusOr<Device> device = ChooseDevice(choice, &reason, gpus);
  SPEX_RETURN_IF_ERROR(
      AgreeOnAllNodes(coll, device.status(), absl::StrCat("the ", flag, " check")));
  // [0]: some node serves host buffers; [1]: some node was told --device=cuda.
  uint64_t v[2] = {*device == Device::kCpu ? 1u : 0u, choice == DeviceChoice::kCuda ? 1u : 0u};
  SPEX_RETURN_IF_ERROR(coll->AllReduce(v, 2, ElemType::kUint64, ReduceOp::kMax));
  if (v[0] != 0 && v[1] != 0) {
    return absl::FailedPreconditionError(
        "--device differs between nodes: a node started with --device=cuda cannot exchange with "
        "nodes on the CPU; start every spexd with the same --device");
  }
  if (*device == Device::kCuda && v[0] != 0) {
    device = Device::kCpu;
    reason = "--device=auto: using the CPU: not every node has a usable GPU (see their logs)";
  }
  SPEX_LOG(INFO) << reason;
  return device;
}

// A flag every node must set alike: one all-reduce (MAX of x and ~x: the largest and the
// smallest) gives every node the same verdict, naming `flag`, the range seen and `why`.
absl::Status AgreeOnFlag(Collective* coll, const char* flag, int64_t value, const char* why) {
  uint64_t v[2] = {static_cast<uint64_t>(value), ~static_cast<uint64_t>(value)};
  SPEX_RETURN_IF_ERROR(coll->AllReduce(v, 2, ElemType::kUint64, ReduceOp::kMax));
  const int64_t most = static_cast<int64_t>(v[0]), least = static_cast<int64_t>(~v[1]);
  if (least == most) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(flag, " differs between nodes (", least, " to ",
                                                    most, "; this node: ", value, "): ", why,
                                                    ", so start every spexd with the "
                                                    "same ",
                                                    flag));
}

// What the GPU path owns: the home GPU's primitives and buffers, NCCL over it, and the other
// GPUs of --devices with the link between them (docs/design.md#multi-gpu).
struct GpuPath {
  std::unique_ptr<Primitives> prims;
  std::unique_ptr<CudaDeviceMemory> memory;
  std::unique_ptr<Collective> nccl;
  std::vector<std::unique_ptr<CudaDeviceMemory>> others;
  std::unique_ptr<CudaDeviceLink> link;
};

// This daemon's GPUs (ServedDevices: --devices, else every usable GPU, or one each, round
// robin, for daemons sharing a host) with the home GPU's CUDA primitives, device memory on
// each, and the link between them. FailedPrecondition saying why and what to do otherwise.
absl::Status SetUpGpu(const std::vector<int>& gpus, const std::vector<int>& given,
                      const World& world, GpuPath* path) {
  if (gpus.empty()) return absl::InternalError("--device chose the GPU but listed no usable one");
  if (world.host_count > static_cast<int>(gpus.size())) {
    SPEX_LOG(WARNING) << world.host_count << " daemons share this host's " << gpus.size()
                      << " usable GPU(s); NCCL refuses two ranks on one GPU";
  }
  SPEX_ASSIGN_OR_RETURN(std::vector<int> served,
                        ServedDevices(given, gpus, world.host_index, world.host_count));
  const int gpu = served.front();
  for (size_t i = 1; i < served.size(); ++i) {
    absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> m = CudaDeviceMemory::Create(served[i]);
    if (!m.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--devices: GPU ", served[i], ": ", m.status().message()));
    }
    path->others.push_back(std::move(*m));
  }
  if (served.size() > 1) {
    absl::StatusOr<std::unique_ptr<CudaDeviceLink>> link = CudaDeviceLink::Create(served);
    if (!link.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--devices: the link between GPUs: ", link.status().message()));
    }
    path->link = std::move(*link);
    SPEX_LOG(INFO) << "GPU path: trainers on GPUs " << absl::StrJoin(served, ",") << " (home GPU "
                   << gpu << "); " << path->link->Describe();
  }
  if (absl::Status s = MakeCudaPrimitivesOnDevice(gpu, &path->prims); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--device: GPU ", gpu,
                                                      ": CUDA primitives: ", s.message(),
                                                      ". Use --device=cpu to run on the CPU"));
  }
  absl::StatusOr<std::unique_ptr<CudaDeviceMemory>> m = CudaDeviceMemory::Create(gpu);
  if (!m.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device: GPU ", gpu, ": ", m.status().message(), ". Use --device=cpu to run on the CPU"));
  }
  path->memory = std::move(*m);
  return absl::OkStatus();
}

// The GPU path on every node, or an error on every node: buckets in CUDA IPC buffers on this
// node's GPU, reduced and compressed by the CUDA primitives, exchanged by NCCL (bootstrapped
// over `mpi`).
absl::Status SetUpGpuPath(MpiCollective* mpi, const std::vector<int>& gpus,
                          const std::vector<int>& given, const World& world, GpuPath* path) {
  SPEX_RETURN_IF_ERROR(AgreeOnAllNodes(mpi, SetUpGpu(gpus, given, world, path), "the GPU set-up"));
  // Every rank takes part; on failure every rank gets the same outcome (nccl_collective.h).
  absl::StatusOr<std::unique_ptr<Collective>> nccl = MakeNcclCollective(mpi, path->memory->gpu());
  if (!nccl.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--device: NCCL: ", nccl.status().message(),
                                                      ". Use --device=cpu to run on the CPU"));
  }
  path->nccl = std::move(*nccl);
  SPEX_LOG(INFO) << "GPU path: buckets on GPU " << path->memory->gpu()
                 << ", exchanged through NCCL";
  return absl::OkStatus();
}

// --metrics_address: the HTTP endpoint (the i-th daemon of a host on port + i); --timeline: the
// recording from the start (the file overwritten).
absl::Status StartObservers(const DaemonConfig& config, const World& world, Metrics* metrics,
                            Timeline* timeline) {
  if (metrics != nullptr) {
    const int base = config.metrics->port;
    const int port = base == 0 ? 0 : base + world.host_index;
    if (port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics_address: port ", base, " + ",
                                                     world.host_index, " is beyond 65535"));
    }
    SPEX_ASSIGN_OR_RETURN(const int bound, metrics->Serve(config.metrics->Bind(port)));
    SPEX_LOG(INFO) << "metrics on http://" << config.metrics->Bind(bound) << "/metrics";
  }
  if (!config.timeline.empty()) {
    const std::string path = TimelinePath(config.timeline, world.rank, world.size);
    if (absl::Status s = timeline->Start(path, /*overwrite=*/true, config.timeline_max_bytes);
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("--timeline: ", s.message()));
    }
    SPEX_LOG(INFO) << "recording the timeline to " << path;
  }
  return absl::OkStatus();
}

// The gRPC server (with the health service and reflection) behind `listener`, which accepts the
// control socket's connections and hands them over (PeerListener: the callers' credentials).
// Threads, streams per connection and memory are bounded; health SERVING.
absl::StatusOr<std::unique_ptr<grpc::Server>> Serve(SpexService* service, PeerListener* listener,
                                                    const DaemonConfig& config) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("spexd");
  quota.SetMaxThreads(config.rpc_threads);
  quota.Resize(size_t{256} << 20);  // every connection's buffers together
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, config.max_streams_per_connection);
  builder.SetMaxReceiveMessageSize(1 << 20);  // requests are small (strings <= 256 bytes)
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server for ", listener->path()));
  }
  server->GetHealthCheckService()->SetServingStatus("spex.v1.Spex", true);
  listener->Serve(server.get());
  return server;
}

// Serves until a signal (SIGTERM/SIGINT) or a peer node stops the engine, then stops in an order
// that survives mpirun's escalation. Exits the process at once (status 3) when the engine is
// still inside a collective after `grace` (a peer left mid-exchange). A timeline being recorded
// is closed (valid JSON) as soon as the stop begins.
absl::Status ServeUntilStopped(Engine& engine, grpc::Server& server, PeerListener& listener,
                               const std::string& socket, absl::Duration grace, PeerNotice& notice,
                               SdNotifier& notifier, Timeline& timeline) {
  // Stopping removes every name first, before anything that can block: under mpirun a SIGTERM
  // is followed by SIGKILL after odls_base_sigkill_timeout (1 s by default), and a node whose
  // engine is inside a collective that a stopped peer left never gets through the clean path
  // (it would wait --shutdown_grace). Trainers that attached keep their mappings.
  auto unlink_names = [&engine, &socket] {
    for (const std::string& name : engine.LinkedSegments()) shm_unlink(name.c_str());
    unlink(socket.c_str());
  };
  // Also before anything that blocks (the SIGKILL above): what was recorded, closed.
  auto close_timeline = [&timeline] {
    if (timeline.recording()) timeline.Stop().IgnoreError();
  };
  // A dedicated thread waits for SIGTERM/SIGINT (blocked everywhere else); SIGUSR2 ends it.
  std::thread signals([&engine, &unlink_names, &close_timeline] {
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
    close_timeline();
    SPEX_LOG(INFO) << "signal " << sig << ": shutting down";
  });

  engine.WaitStopped();  // a signal, or a peer node stopping
  Notify(notifier.Stopping("stopping"));
  server.GetHealthCheckService()->SetServingStatus("spex.v1.Spex", false);
  engine.RequestStop();
  unlink_names();
  close_timeline();
  listener.Stop();  // no new connection; gRPC's own copies close with its shutdown
  server.Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  unlink(socket.c_str());
  pthread_kill(signals.native_handle(), SIGUSR2);
  signals.join();
  if (!engine.JoinFor(grace)) {
    for (const std::string& name : engine.LinkedSegments()) shm_unlink(name.c_str());
    SPEX_LOG(ERROR)
        << "engine still inside a collective after --shutdown_grace (a peer left mid-exchange); "
           "exiting without MPI_Finalize";
    std::fflush(nullptr);
    _exit(3);
  }
  notice.Drain();
  SPEX_LOG(INFO) << "stopped cleanly";
  return absl::OkStatus();
}

// The flags every node must set alike, checked on every node (AgreeOnFlag).
absl::Status AgreeOnSharedFlags(Collective* mpi, const DaemonConfig& config) {
  SPEX_RETURN_IF_ERROR(AgreeOnFlag(mpi, "--local_trainers", config.engine.local_trainers,
                                   "averages divide by nodes x local trainers"));
  // Blocking and non-blocking collectives never match each other: every node waits alike.
  SPEX_RETURN_IF_ERROR(AgreeOnFlag(mpi, "--mpi_wait_max_sleep_us", config.mpi_wait_max_sleep_us,
                                   "a node waiting inside MPI and one waiting passively issue "
                                   "collectives that do not match"));
  SPEX_RETURN_IF_ERROR(AgreeOnFlag(mpi, "--mpi_sleep_beside_compute",
                                   static_cast<int64_t>(config.mpi_sleep_beside_compute),
                                   "a node waiting inside MPI and one waiting passively issue "
                                   "collectives that do not match"));
  SPEX_RETURN_IF_ERROR(AgreeOnFlag(mpi, "--mpi_passive_wait_min_bytes",
                                   config.mpi_passive_wait_min_bytes,
                                   "a node waiting inside MPI and one waiting passively issue "
                                   "collectives that do not match"));
  // The cost model's link measurement and verdict are collectives that probing does not issue.
  SPEX_RETURN_IF_ERROR(
      AgreeOnFlag(mpi, "--auto_decide", static_cast<int64_t>(config.engine.auto_decide),
                  "deciding by the cost model issues collectives probing does not"));
  return absl::OkStatus();
}

// The buffers' side: the GPU path when the nodes agreed on the GPU (`gpu` owns it; `device_path`
// points into it), else host buffers, with a warning when --devices was given anyway.
absl::Status SetUpBuffers(MpiCollective* mpi, Device device, const std::vector<int>& gpus,
                          const DaemonConfig& config, const World& world, Primitives* host_prims,
                          GpuPath* gpu, DevicePath* device_path) {
  if (device == Device::kCuda) {
    SPEX_RETURN_IF_ERROR(SetUpGpuPath(mpi, gpus, config.devices, world, gpu));
    *device_path = {gpu->memory.get(), gpu->memory.get(), host_prims};
    device_path->home = gpu->memory->gpu();
    for (const auto& m : gpu->others) device_path->others.push_back({m->gpu(), m.get(), m.get()});
    device_path->link = gpu->link.get();
  } else if (!config.devices.empty()) {
    SPEX_LOG(WARNING) << "--devices=" << absl::StrJoin(config.devices, ",")
                      << " has no effect: this spexd serves host buffers (--device)";
  }
  return absl::OkStatus();
}

// The CPUs spexd may use: those of its affinity mask, with a warning when that is fewer than the
// machine's and --threads did not choose.
int CpusToUse(const DaemonConfig& config) {
  // Under mpirun's default binding (a core per rank at 2 ranks or fewer) a spexd on a 64-core
  // node gets one.
  const int cpus = UsableCpus();
  const int machine_cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (cpus < machine_cpus && config.threads == 0) {
    SPEX_LOG(WARNING) << "spexd may run on " << cpus << " of this machine's " << machine_cpus
                      << " CPUs (its affinity mask), so its local reduce and compression use "
                      << cpus << " thread" << (cpus == 1 ? "" : "s")
                      << "; if that binding is not meant (mpirun binds each rank to a core by "
                         "default when there are 2 ranks or fewer), start spexd with `mpirun "
                         "--bind-to none` or `srun --cpu-bind=none`";
  }
  return cpus;
}

// How the engine's collectives wait (MpiWaitPolicy): --mpi_wait_max_sleep_us and
// --mpi_passive_wait_min_bytes, or sleeping only beside the trainers' compute where any node asks
// for it (WantsSleepBesideCompute; every node must issue the same blocking or non-blocking forms).
absl::Status SetWaitPolicy(MpiCollective* mpi, const DaemonConfig& config, const World& world,
                           int cpus) {
  uint64_t want = WantsSleepBesideCompute(config, world.host_count, cpus) ? 1 : 0;
  SPEX_RETURN_IF_ERROR(mpi->AllReduce(&want, 1, ElemType::kUint64, ReduceOp::kMax));
  MpiWaitPolicy policy{config.mpi_wait_max_sleep_us, config.mpi_passive_wait_min_bytes};
  policy.sleep_only_beside_compute = want != 0;
  if (policy.sleep_only_beside_compute) {
    SPEX_LOG(INFO) << "the engine's collectives wait non-blocking, sleeping (at most "
                   << policy.max_sleep_us << " us) only while this node's trainers compute";
  }
  mpi->set_policy(policy);
  return absl::OkStatus();
}

// The engine's options: the flags', the spin chosen for this host, and the hooks into the peer
// notice and systemd's watchdog.
EngineOptions EngineOptionsFor(const DaemonConfig& config, const World& world, int cpus,
                               PeerNotice& notice, SdNotifier& notifier) {
  EngineOptions opts = config.engine;
  opts.engine_spin_us = opts.client_spin_us = SpinUs(config, world.host_count, cpus);
  opts.announce_stop = [&notice] { notice.Announce(); };
  opts.peer_stopped = [&notice](int* who) { return notice.PeerStopped(who); };
  opts.heartbeat = [&notifier] { notifier.Watchdog().IgnoreError(); };
  return opts;
}

// --merge_overlap: the engine's wire stage gets `wire` unless merge groups would need
// MPI_THREAD_MULTIPLE and MPI does not provide it.
void UseWireCollective(const EngineOptions& opts, MpiCollective* wire, Engine* engine) {
  int level = 0;
  MPI_Query_thread(&level);
  if (opts.merger != MergerPolicy::kNone && opts.merge_overlap && level < MPI_THREAD_MULTIPLE) {
    SPEX_LOG(WARNING) << "--merge_overlap: MPI provides thread level " << level
                      << ", not MPI_THREAD_MULTIPLE; merge groups run without overlap";
  } else {
    engine->set_wire_collective(wire);
  }
}

// The control socket and the gRPC service over a started engine, until the stop. A failure to
// listen or serve stops the engine.
absl::Status ServeEngine(Engine& engine, const DaemonConfig& config, const EngineOptions& opts,
                         const std::string& socket, bool cuda_buffers, Collective& collective,
                         PeerNotice& notice, SdNotifier& notifier, Timeline& timeline) {
  absl::StatusOr<std::unique_ptr<PeerListener>> listener =
      PeerListener::Listen({socket, config.socket_mode, config.allow_uids, config.max_connections});
  if (!listener.ok()) {
    engine.RequestStop();
    engine.JoinFor(absl::Seconds(1));
    return listener.status();
  }
  SegmentJanitor::TrackSocket(socket);  // removed should spexd be killed (segment_janitor.h)
  SpexService service(
      &engine, kVersion, listener->get(),
      {config.timeline_dir, config.timeline_max_bytes, config.max_exchange_wait,
       std::max(1, config.rpc_threads - 3),
       config.max_checkpoint_streams > 0 ? config.max_checkpoint_streams : opts.local_trainers,
       config.checkpoint_stream_timeout},
      &timeline);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = Serve(&service, listener->get(), config);
  if (!server.ok()) {
    engine.RequestStop();
    engine.JoinFor(absl::Seconds(1));
    return server.status();
  }
  SPEX_LOG(INFO) << kVersion << " serving unix:" << socket << " (" << opts.local_trainers
                 << " local trainers, compressor " << opts.compressor << ", spin "
                 << opts.engine_spin_us << " us, " << (cuda_buffers ? "CUDA" : "host")
                 << " buffers, collective " << collective.name() << ")";
  Notify(notifier.Ready(absl::StrCat("serving on ", socket)));
  return ServeUntilStopped(engine, **server, **listener, socket, config.shutdown_grace, notice,
                           notifier, timeline);
}

// config -> MPI world -> device path -> engine -> gRPC server -> wait for the stop. Every
// start-up check holds on all nodes or fails on all of them (AgreeOnAllNodes), so a failed start
// leaves no node waiting in a collective and every node can still finalize.
absl::Status Run(const absl::StatusOr<DaemonConfig>& loaded, SdNotifier& notifier) {
  Notify(notifier.Status("starting"));
  if (loaded.ok()) SetLogLevel(loaded->log_level);
  const World world = JoinWorld();
  SetLogPrefix(absl::StrCat("spexd[node ", world.rank, "/", world.size, "]"));
  SegmentJanitor::TrackOpenMpiSegment(world.host_index);  // Open MPI's, should spexd be killed
  std::unique_ptr<Primitives> host_prims = MakeCpuPrimitives(loaded.ok() ? loaded->threads : 0);
  // Blocking collectives until every node has agreed on how to wait (--mpi_wait_*, below).
  MpiCollective mpi(MPI_COMM_WORLD, host_prims.get());
  SPEX_RETURN_IF_ERROR(AgreeOnAllNodes(&mpi, loaded.status(), "its flag checks"));
  const DaemonConfig& config = *loaded;
  Notify(notifier.Status(absl::StrCat("MPI world of ", world.size, " nodes")));

  std::vector<int> gpus;
  SPEX_ASSIGN_OR_RETURN(const Device device, AgreeOnDevice(&mpi, config.device, &gpus));
  const std::string socket = SocketPath(config, world.rank, world.host_index, world.host_count);
  SPEX_RETURN_IF_ERROR(AgreeOnAllNodes(&mpi, PrepareSocketPath(socket), "the --socket check"));
  SPEX_RETURN_IF_ERROR(AgreeOnSharedFlags(&mpi, config));
  const int cpus = CpusToUse(config);
  SPEX_RETURN_IF_ERROR(SetWaitPolicy(&mpi, config, world, cpus));
  PeerNotice notice(MPI_COMM_WORLD);
  GpuPath gpu;
  DevicePath device_path;
  SPEX_RETURN_IF_ERROR(
      SetUpBuffers(&mpi, device, gpus, config, world, host_prims.get(), &gpu, &device_path));

  EngineOptions opts = EngineOptionsFor(config, world, cpus, notice, notifier);
  // Observers (they outlive the engine). The timeline is always there, so that `spexctl
  // timeline start` can record at run time; it costs one atomic load per exchange while off.
  Timeline timeline(world.rank);
  opts.observers.push_back(&timeline);
  std::unique_ptr<Metrics> metrics;
  if (config.metrics.has_value()) {
    metrics = std::make_unique<Metrics>(world.rank);
    opts.observers.push_back(metrics.get());
  }
  SPEX_RETURN_IF_ERROR(AgreeOnAllNodes(&mpi,
                                       StartObservers(config, world, metrics.get(), &timeline),
                                       "the --metrics_address/--timeline set-up"));
  // --merge_overlap: the wire stage's own communicator. Every node duplicates it here, alike
  // (MPI_Comm_dup is collective), whether or not its engine will use it; declared before the
  // engine, so it outlives the engine's threads.
  std::unique_ptr<MpiCollective> wire;
  if (gpu.nccl == nullptr) {
    wire = std::make_unique<MpiCollective>(MPI_COMM_WORLD, host_prims.get(),
                                           std::max<int64_t>(50, config.mpi_wait_max_sleep_us));
  }
  Collective* collective = gpu.nccl != nullptr ? gpu.nccl.get() : &mpi;
  Engine engine(opts, collective, gpu.prims != nullptr ? gpu.prims.get() : host_prims.get(),
                device_path);
  if (wire != nullptr) UseWireCollective(opts, wire.get(), &engine);
  SPEX_RETURN_IF_ERROR(engine.Start());
  // Scrapes read the engine's sessions and buckets; detached before the engine goes away.
  if (metrics != nullptr) metrics->Attach(&engine);
  absl::Cleanup detach_metrics = [&metrics] {
    if (metrics != nullptr) metrics->Attach(nullptr);
  };

  return ServeEngine(engine, config, opts, socket, gpu.memory != nullptr, *collective, notice,
                     notifier, timeline);
}

int Main(const absl::StatusOr<DaemonConfig>& config, SdNotifier& notifier) {
  if (absl::Status s = Run(config, notifier); !s.ok()) {
    SPEX_LOG(ERROR) << s.message();
    Notify(notifier.Stopping(absl::StrCat("failed: ", s.message())));
    return 2;
  }
  return 0;
}

// Blocks the stop signals before any thread starts, so only the signal thread receives them.
void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// MPI_Finalize synchronises with every rank. A peer that was SIGKILLed (mpirun's escalation
// after SIGTERM) or that is stuck can leave it waiting forever, so it gets `grace`.
void FinalizeWithin(absl::Duration grace, int rc) {
  std::thread watchdog([grace, rc] {
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(grace));
    std::fprintf(
        stderr,
        "spexd: MPI_Finalize did not return within --shutdown_grace (a peer left); exiting\n");
    std::fflush(nullptr);
    _exit(rc != 0 ? rc : 3);
  });
  watchdog.detach();
  MPI_Finalize();
}

}  // namespace
}  // namespace spex

int main(int argc, char** argv) {
  spex::UseOneMallocArena();  // before any thread starts (daemon/util/heap.h says why)
  spex::KeepLargeBlocksInHeap();
  absl::SetProgramUsageMessage(
      "spexd: per-node sparse gradient exchange daemon. Start one per node under mpirun/srun; "
      "trainers connect over a unix socket. See README.md.");
  absl::ParseCommandLine(argc, argv);  // a misspelt enumerated flag exits here, naming it
  spex::BlockStopSignals();
  // systemd's variables are read (and removed, spexd's children must not notify in its name)
  // before MPI starts threads that may read the environment meanwhile.
  spex::SdNotifier notifier(/*unset_environment=*/true);
  // Forked while spexd has one thread: removes the segments' names should spexd end without
  // doing so (SIGKILL, or Open MPI's abort when mpirun goes first). segment_janitor.h.
  if (absl::Status s = spex::SegmentJanitor::Start(argc, argv); !s.ok()) {
    SPEX_LOG(WARNING) << s.message() << "; running without it: a daemon that is killed leaves its "
                      << "segments' names in /dev/shm";
  }
  spex::PreferRingIallreduce();  // the passive waits' MPI_Iallreduce (mpi_collective.h)
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr,
                 "spexd: MPI provides thread level %d; at least MPI_THREAD_SERIALIZED is needed\n",
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const absl::StatusOr<spex::DaemonConfig> config = spex::LoadConfig();
  const int rc = spex::Main(config, notifier);
  spex::FinalizeWithin(config.ok() ? config->shutdown_grace : spex::DaemonConfig().shutdown_grace,
                       rc);
  return rc;
}
