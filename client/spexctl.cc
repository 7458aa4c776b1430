// spexctl: operator's view of a node's spexd over its control socket.
//   spexctl [--socket=PATH] health | stats [--json] | sessions | set-density D |
//           timeline start PATH | timeline stop | watch [--interval_ms=1000] [--count=N]
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "client/watch_rates.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/contract/socket_paths.h"
#include "proto/spex.grpc.pb.h"

ABSL_FLAG(std::string, socket, "",
          "spexd socket; default $SPEX_SOCKET, else the default path for --job");
ABSL_FLAG(std::string, job, "",
          "job name for the default socket path (default $SPEX_JOB / $SLURM_JOB_ID / default)");
ABSL_FLAG(int, timeout_ms, 3000, "RPC deadline in milliseconds");
ABSL_FLAG(bool, json, false, "stats: print the GetStats answer as JSON (proto3 JSON mapping)");
ABSL_FLAG(int, interval_ms, 1000, "watch: refresh interval in milliseconds");
ABSL_FLAG(int, count, 0, "watch: stop after this many refreshes (0: until Ctrl-C)");

constexpr char kUsage[] =
    "spexctl [--socket=PATH] [--job=NAME] [--timeout_ms=3000] health | stats [--json] | "
    "sessions | set-density D | timeline start PATH | timeline stop | watch [--interval_ms=1000] "
    "[--count=N]";

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
  if (absl::GetFlag(FLAGS_json)) {
    // The proto3 JSON mapping (64-bit integers are strings), field names as in spex.proto.
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = true;
    options.always_print_primitive_fields = true;
    std::string json;
    if (!google::protobuf::util::MessageToJsonString(resp, &json, options).ok()) {
      std::fprintf(stderr, "spexctl: cannot print the stats as JSON\n");
      return 1;
    }
    std::printf("%s\n", json.c_str());
    return 0;
  }
  std::printf("node %u/%u  collective %s  exchanges %lu\n", resp.node_rank(), resp.node_count(),
              resp.collective().c_str(), static_cast<unsigned long>(resp.exchanges()));
  std::printf("%8s %12s %-8s %-12s %4s %9s %9s %9s %10s %10s %10s %10s  mean phases (ms/CPU ms)\n",
              "bucket", "elements", "type", "compressor", "pat", "exchanges", "target", "achieved",
              "gathered", "sent", "received", "residual");
  for (const auto& b : resp.buckets()) {
    std::string phases;
    for (const auto& p : b.mean_phases()) {
      if (p.seconds() <= 0) continue;
      phases += absl::StrFormat(" %s=%.3f", p.phase(), p.seconds() * 1e3);
      if (p.cpu_seconds() > 0) phases += absl::StrFormat("/%.3f", p.cpu_seconds() * 1e3);
    }
    std::printf("%8lu %12lu %-8s %-12s %4s %9lu %9.4g %9.4g %10lu %10lu %10lu %10.4g %s\n",
                static_cast<unsigned long>(b.bucket_id()), static_cast<unsigned long>(b.elements()),
                b.dtype().empty() ? "float32" : b.dtype().c_str(), b.compressor().c_str(),
                b.last().pattern().c_str(), static_cast<unsigned long>(b.exchanges()),
                b.last().target_density(), b.last().achieved_density(),
                static_cast<unsigned long>(b.last().gathered_elements()),
                static_cast<unsigned long>(b.last().bytes_sent()),
                static_cast<unsigned long>(b.last().bytes_received()), b.last().residual_norm(),
                phases.c_str());
    if (!b.exchange_choice().empty()) {
      std::printf("%8s exchange: %s\n", "", b.exchange_choice().c_str());
    }
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

int Timeline(spex::v1::Spex::Stub* stub, const std::string& socket, const std::string& action,
             const std::string& path) {
  spex::v1::TimelineResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s;
  if (action == "start") {
    spex::v1::StartTimelineRequest req;
    // The daemon writes the file: a relative path is taken from spexctl's directory.
    std::string absolute = path;
    if (!path.empty() && path[0] != '/') {
      char cwd[PATH_MAX];
      if (getcwd(cwd, sizeof(cwd)) != nullptr) absolute = std::string(cwd) + "/" + path;
    }
    req.set_path(absolute);
    s = stub->StartTimeline(WithDeadline(&ctx), req, &resp);
    if (!s.ok()) return Report(s, socket);
    std::printf("recording the timeline to %s (stop with: spexctl timeline stop)\n",
                resp.path().c_str());
    return 0;
  }
  spex::v1::StopTimelineRequest req;
  s = stub->StopTimeline(WithDeadline(&ctx), req, &resp);
  if (!s.ok()) return Report(s, socket);
  std::printf(
      "timeline stopped: %lu exchanges in %s (open it in https://ui.perfetto.dev or "
      "chrome://tracing)\n",
      static_cast<unsigned long>(resp.exchanges()), resp.path().c_str());
  return 0;
}

volatile std::sig_atomic_t g_interrupted = 0;
void OnInterrupt(int) { g_interrupted = 1; }

// A live view: per bucket its data type, exchanges/s, bytes sent and received per second (deltas of
// the daemon's running totals over the refresh interval, client/watch_rates.h), density and the
// last exchange's phases; per node the sessions. The header gives the interval the rates are over.
// Redraws in place on a terminal, prints a block per refresh otherwise. Ends on Ctrl-C (SIGINT)
// or SIGTERM, or after --count refreshes.
int Watch(spex::v1::Spex::Stub* stub, const std::string& socket) {
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = isatty(STDOUT_FILENO) == 1;
  const int interval_ms = std::max(50, absl::GetFlag(FLAGS_interval_ms));
  const int count = absl::GetFlag(FLAGS_count);
  spex::WatchRates rates;
  uint64_t previous_total = 0;
  auto previous_time = std::chrono::steady_clock::now();
  bool have_previous = false;
  for (int frame = 0; !g_interrupted && (count <= 0 || frame < count); ++frame) {
    if (frame > 0) {
      const auto until = previous_time + std::chrono::milliseconds(interval_ms);
      while (!g_interrupted && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (g_interrupted) break;
    }
    spex::v1::GetStatsResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->GetStats(WithDeadline(&ctx), spex::v1::GetStatsRequest(), &resp);
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - previous_time).count();
    std::string out;
    if (tty) out += "\x1b[H\x1b[2J";
    const std::time_t wall = std::time(nullptr);
    char clock[16];
    std::strftime(clock, sizeof(clock), "%H:%M:%S", std::localtime(&wall));
    if (!s.ok()) {
      out += absl::StrFormat(
          "%s  %s at %s: %s (retrying every %d ms; Ctrl-C ends)\n", clock,
          s.error_code() == grpc::StatusCode::UNAVAILABLE ? "no daemon answers" : "error", socket,
          s.error_message(), interval_ms);
      have_previous = false;
      rates.Forget();
    } else {
      const double total_rate = have_previous && resp.exchanges() >= previous_total
                                    ? (resp.exchanges() - previous_total) / dt
                                    : -1.0;
      out += absl::StrFormat(
          "%s  spexd node %u/%u  collective %s  sessions %u  buckets %d  exchanges %u (%s/s%s)\n",
          clock, resp.node_rank(), resp.node_count(), resp.collective(), resp.sessions(),
          resp.buckets_size(), resp.exchanges(), spex::HumanRate(total_rate),
          have_previous ? absl::StrFormat(" over %.3f s", dt) : "");
      out += spex::WatchHeader();
      const std::map<uint64_t, spex::BucketRates> rate = rates.Update(resp, dt);
      for (const auto& b : resp.buckets()) out += spex::WatchRow(b, rate.at(b.bucket_id()));
      previous_total = resp.exchanges();
      have_previous = true;
    }
    previous_time = now;
    if (!tty) out += "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  const std::string cmd = args.size() >= 2 ? args[1] : "";
  const size_t want = cmd == "set-density" ? 3 : cmd == "timeline" ? 0 : 2;
  const bool timeline_ok =
      cmd == "timeline" && ((args.size() == 4 && std::string(args[2]) == "start") ||
                            (args.size() == 3 && std::string(args[2]) == "stop"));
  if (args.size() < 2 || (cmd == "timeline" ? !timeline_ok : args.size() != want)) {
    std::fprintf(stderr, "usage: %s\n", kUsage);
    return 2;
  }
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
  if (cmd == "timeline")
    return Timeline(stub.get(), socket, args[2], args.size() == 4 ? args[3] : "");
  if (cmd == "watch") return Watch(stub.get(), socket);
  std::fprintf(stderr,
               "spexctl: unknown command '%s'; use health, stats [--json], sessions, set-density "
               "D, timeline start PATH, timeline stop or watch\n",
               cmd.c_str());
  return 2;
}
