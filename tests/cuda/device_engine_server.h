// One engine on a FakeDevice behind the gRPC service (daemon/service/spex_service.h), for tests
// that also use the client: this header does not include the engine's, whose spex::Bucket (the
// engine's bucket) would clash with the client's spex::Bucket in one translation unit.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "proto/spex.grpc.pb.h"
#include "tests/support/fake_device.h"
#include "tests/support/fake_node.h"

namespace spex::test {

class DeviceEngineServer {
 public:
  struct Options {
    int trainers = 1;
    // Every bucket but "dense" sparse from the first step (min_sparse_elements 0, no fallback).
    bool sparse = false;
  };
  // Starts the engine on `device` (which must outlive the server), its collective checked.
  static absl::StatusOr<std::unique_ptr<DeviceEngineServer>> Start(fake::FakeDevice* device,
                                                                   Options options);
  // The same on the several fake GPUs of `node` (docs/design.md#multi-gpu), or on the CPU path
  // (host buckets, CPU primitives) when `node` is null.
  static absl::StatusOr<std::unique_ptr<DeviceEngineServer>> Start(fake::FakeNode* node,
                                                                   Options options);
  ~DeviceEngineServer();

  // The service, to call directly or to register with a grpc::ServerBuilder.
  v1::Spex::Service* service();
  // Whether the engine keeps buckets on the device (Engine::device_buckets).
  bool device_buckets() const;

 private:
  struct Impl;
  explicit DeviceEngineServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A DeviceEngineServer served over gRPC on the unix socket /tmp/spex-<tag>-<pid>.sock of this
// process (short: a socket path has a length limit), stopped and unlinked when it goes out of
// scope. status() says why it is not serving (the engine's or the server's start failed).
class ServedEngine {
 public:
  ServedEngine(absl::StatusOr<std::unique_ptr<DeviceEngineServer>> engine, const std::string& tag);
  ~ServedEngine();
  ServedEngine(const ServedEngine&) = delete;
  ServedEngine& operator=(const ServedEngine&) = delete;

  const absl::Status& status() const { return status_; }
  const std::string& socket() const { return socket_; }

 private:
  std::string socket_;
  absl::Status status_;
  std::unique_ptr<DeviceEngineServer> engine_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace spex::test
