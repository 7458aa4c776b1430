// spexctl: operator's view of a node's spexd over its control socket.
//   spexctl [--socket=PATH] health | stats | sessions | set-density D
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "daemon/util/paths.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/spex.grpc.pb.h"

ABSL_FLAG(std::string, socket, "",
          "spexd socket; default $SPEX_SOCKET, else the default path for --job");
ABSL_FLAG(std::string, job, "",
          "job name for the default socket path (default $SPEX_JOB / $SLURM_JOB_ID / default)");
ABSL_FLAG(int, timeout_ms, 3000, "RPC deadline in milliseconds");

namespace {

grpc::ClientContext* WithDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(absl::GetFlag(FLAGS_timeout_ms)));
  return ctx;
}

int Report(const grpc::Status& s, const std::string& socket) {
  std::fprintf(stderr, "spexctl: %s at %s: %s\n",
               s.error_code() == grpc::StatusCode::UNAVAILABLE ? "no daemon answers" : "error",
               socket.c_str(), s.error_message().c_str());
  return 1;
}

int Health(const std::shared_ptr<grpc::Channel>& ch, const std::string& socket) {
  // grpc.health.v1.Health/Check, called generically so spexctl needs no health stubs.
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  WithDeadline(&ctx);
  // HealthCheckRequest{service = "spex.v1.Spex"}: field 1, length-delimited.
  const std::string service = "spex.v1.Spex";
  std::string req = std::string(1, '\x0a') + static_cast<char>(service.size()) + service;
  grpc::Slice slice(req);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status status;
  bool done = false;
  std::mutex mu;
  std::condition_variable cv;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return Report(status, socket);
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1 SERVING}: bytes 0x08 0x01.
  const bool serving = bytes.size() >= 2 && bytes[0] == 0x08 && bytes[1] == 0x01;
  std::printf("%s %s\n", socket.c_str(), serving ? "SERVING" : "NOT_SERVING");
  return serving ? 0 : 1;
}

int Stats(spex::v1::Spex::Stub* stub, const std::string& socket) {
  spex::v1::GetStatsRequest req;
  spex::v1::GetStatsResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->GetStats(WithDeadline(&ctx), req, &resp);
  if (!s.ok()) return Report(s, socket);
  std::printf("node %u/%u  collective %s  exchanges %lu\n", resp.node_rank(), resp.node_count(),
              resp.collective().c_str(), static_cast<unsigned long>(resp.exchanges()));
  std::printf("%8s %12s %-12s %4s %9s %9s %9s %10s %10s %10s %10s  mean phases (ms)\n", "bucket",
              "elements", "compressor", "pat", "exchanges", "target", "achieved", "gathered",
              "sent", "received", "residual");
  for (const auto& b : resp.buckets()) {
    std::string phases;
    for (const auto& p : b.mean_phases()) {
      if (p.seconds() > 0) phases += absl::StrFormat(" %s=%.3f", p.phase(), p.seconds() * 1e3);
    }
    std::printf("%8lu %12lu %-12s %4s %9lu %9.4g %9.4g %10lu %10lu %10lu %10.4g %s\n",
                static_cast<unsigned long>(b.bucket_id()), static_cast<unsigned long>(b.elements()),
                b.compressor().c_str(), b.last().pattern().c_str(),
                static_cast<unsigned long>(b.exchanges()), b.last().target_density(),
                b.last().achieved_density(),
                static_cast<unsigned long>(b.last().gathered_elements()),
                static_cast<unsigned long>(b.last().bytes_sent()),
                static_cast<unsigned long>(b.last().bytes_received()), b.last().residual_norm(),
                phases.c_str());
  }
  return 0;
}

int SetDensity(spex::v1::Spex::Stub* stub, const std::string& socket, const std::string& value) {
  spex::v1::SetDensityRequest req;
  char* end = nullptr;
  req.set_density(std::strtod(value.c_str(), &end));
  if (value.empty() || *end != '\0') {
    std::fprintf(stderr, "spexctl: set-density needs a number in (0, 1], got '%s'\n",
                 value.c_str());
    return 2;
  }
  spex::v1::SetDensityResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->SetDensity(WithDeadline(&ctx), req, &resp);
  if (!s.ok()) return Report(s, socket);
  std::printf(
      "density %s requested (change %lu); every node applies it at the same step, with the next "
      "exchange\n",
      value.c_str(), static_cast<unsigned long>(resp.version()));
  return 0;
}

int Sessions(spex::v1::Spex::Stub* stub, const std::string& socket) {
  spex::v1::ListSessionsRequest req;
  spex::v1::ListSessionsResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->ListSessions(WithDeadline(&ctx), req, &resp);
  if (!s.ok()) return Report(s, socket);
  std::printf("%20s %10s %8s %8s %8s  %s\n", "session", "local_rank", "pid", "buckets", "age_s",
              "client");
  for (const auto& x : resp.sessions()) {
    std::printf("%20lu %10u %8u %8u %8.1f  %s\n", static_cast<unsigned long>(x.session_id()),
                x.local_rank(), x.pid(), x.buckets(), x.age_seconds(), x.client().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("spexctl [--socket=PATH] health|stats|sessions|set-density D");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2 || args.size() > 3 ||
      (args.size() == 3 && std::string(args[1]) != "set-density")) {
    std::fprintf(stderr, "usage: spexctl [--socket=PATH] health|stats|sessions|set-density D\n");
    return 2;
  }
  const std::string cmd = args[1];
  std::string socket = absl::GetFlag(FLAGS_socket);
  if (socket.empty()) {
    std::string job = absl::GetFlag(FLAGS_job);
    socket = spex::ClientSocketPath(job.empty() ? spex::DefaultJob() : job);
  }
  auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  auto stub = spex::v1::Spex::NewStub(channel);
  if (cmd == "health") return Health(channel, socket);
  if (cmd == "stats") return Stats(stub.get(), socket);
  if (cmd == "sessions") return Sessions(stub.get(), socket);
  if (cmd == "set-density") return SetDensity(stub.get(), socket, args.size() == 3 ? args[2] : "");
  std::fprintf(stderr,
               "spexctl: unknown command '%s'; use health, stats, sessions or set-density D\n",
               cmd.c_str());
  return 2;
}
