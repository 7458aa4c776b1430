#include "tests/cuda/device_engine_server.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "daemon/service/spex_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/run_tag.h"

namespace spex::test {

struct DeviceEngineServer::Impl {
  explicit Impl(EngineClusterOptions o) : cluster(std::move(o)) {}
  EngineCluster cluster;
  std::unique_ptr<SpexService> service;
};

absl::StatusOr<std::unique_ptr<DeviceEngineServer>> DeviceEngineServer::Start(
    fake::FakeDevice* device, Options options) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = options.trainers;
  o.engine.shm_tag = "devtest";
  if (options.sparse) {
    o.engine.min_sparse_elements = 0;
    o.engine.dense_fallback = DenseFallback::kOff;
  }
  o.parts = [device](int) { return NodeParts{device->device_prims(), device->path()}; };
  o.wrap = [device](int, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), device);
  };
  auto impl = std::make_unique<Impl>(std::move(o));
  if (!impl->cluster.status().ok()) return impl->cluster.status();
  // Calls are made in-process, as this process (no connection carries credentials).
  impl->service = std::make_unique<SpexService>(
      &impl->cluster.engine(0), "test",
      PeerCred{static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid()),
               static_cast<uint32_t>(getpid())});
  return std::unique_ptr<DeviceEngineServer>(new DeviceEngineServer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<DeviceEngineServer>> DeviceEngineServer::Start(fake::FakeNode* node,
                                                                              Options options) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = options.trainers;
  o.engine.shm_tag = "devtest";
  if (options.sparse) {
    o.engine.min_sparse_elements = 0;
    o.engine.dense_fallback = DenseFallback::kOff;
  }
  if (node == nullptr) {
    o.cpu_primitives = true;
  } else {
    o.parts = [node](int) { return NodeParts{node->device_prims(), node->path()}; };
    o.wrap = [node](int, std::unique_ptr<Collective> c) {
      return fake::CheckedCollective(std::move(c), node->home());
    };
  }
  auto impl = std::make_unique<Impl>(std::move(o));
  if (!impl->cluster.status().ok()) return impl->cluster.status();
  impl->service = std::make_unique<SpexService>(
      &impl->cluster.engine(0), "test",
      PeerCred{static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid()),
               static_cast<uint32_t>(getpid())});
  return std::unique_ptr<DeviceEngineServer>(new DeviceEngineServer(std::move(impl)));
}

DeviceEngineServer::DeviceEngineServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceEngineServer::~DeviceEngineServer() {
  // The service goes before the engine it serves.
  if (impl_ != nullptr) impl_->service.reset();
}

v1::Spex::Service* DeviceEngineServer::service() { return impl_->service.get(); }

bool DeviceEngineServer::device_buckets() const {
  return impl_->cluster.engine(0).device_buckets();
}

ServedEngine::ServedEngine(absl::StatusOr<std::unique_ptr<DeviceEngineServer>> engine,
                           const std::string& tag)
    : socket_(absl::StrCat("/tmp/spex-", tag, "-", RunTag(), ".sock")) {
  unlink(socket_.c_str());
  if (!engine.ok()) {
    status_ = engine.status();
    return;
  }
  engine_ = std::move(*engine);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
  builder.RegisterService(engine_->service());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) status_ = absl::InternalError("the gRPC server did not start");
}

ServedEngine::~ServedEngine() {
  if (server_ != nullptr) server_->Shutdown();
  unlink(socket_.c_str());
}

}  // namespace spex::test
