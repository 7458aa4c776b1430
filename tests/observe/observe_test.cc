// The observers on a known run of the engine (2 in-process nodes x 1 trainer, a dense and a
// sparse bucket, 5 steps): the Prometheus exposition passes `promtool check metrics` (any output
// fails) and carries the run's values, also over HTTP from the exposer; the timeline is valid
// JSON with every bucket's phases in order (tests/observe/check_timeline.py); the
// --metrics_address check; the timeline's start/stop rules.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/engine/engine.h"
#include "daemon/observe/metrics.h"
#include "daemon/observe/metrics_address.h"
#include "daemon/observe/timeline.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/primitives.h"

namespace spex {
namespace {

constexpr int kSteps = 5;
constexpr uint64_t kDenseElements = 1000;
constexpr uint64_t kSparseElements = 70000;

std::string TempDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

// Runs `cmd`, returns its exit status and (stdout + stderr) in `out`.
int RunCommand(const std::string& cmd, std::string* out) {
  out->clear();
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The value of the sample `name{labels...}` in an exposition; -1 when absent.
double Value(const std::string& text, const std::string& name,
             const std::map<std::string, std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    if (line.substr(0, brace == absl::string_view::npos ? space : brace) != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      if (!absl::StrContains(line, absl::StrCat(k, "=\"", v, "\""))) match = false;
    }
    if (match) return std::stod(std::string(line.substr(space + 1)));
  }
  return -1;
}

// One GET over plain HTTP/1.0 on 127.0.0.1:port.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return "";
  std::string resp;
  char buf[8192];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) resp.append(buf, n);
  close(fd);
  return resp;
}

// Two in-process nodes x 1 trainer run kSteps of a dense bucket (0) and a topk bucket (1) over
// the Exchange path; node 0 has the observers. `between` runs after the exchanges, with the
// sessions still open. `node0_bytes`, if given, gets the sums of the bytes sent and received
// that node 0's exchange records (the Exchange answers) report, per bucket.
void KnownRun(std::vector<ExchangeObserver*> observers, const std::function<void(Engine&)>& attach,
              const std::function<void(Engine&)>& between,
              std::map<uint64_t, std::pair<uint64_t, uint64_t>>* node0_bytes = nullptr) {
  InProcessHub hub(2, absl::Seconds(20));
  std::unique_ptr<Primitives> prims = MakeCpuPrimitives(1);
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int n = 0; n < 2; ++n) {
    colls.push_back(hub.Connect(n));
    EngineOptions o;
    o.local_trainers = 1;
    o.shm_tag = "observetest";
    o.dense_fallback = DenseFallback::kOff;
    if (n == 0) o.observers = observers;
    engines.push_back(std::make_unique<Engine>(o, colls.back().get(), prims.get()));
    ASSERT_TRUE(engines.back()->Start().ok());
  }
  attach(*engines[0]);
  std::vector<uint64_t> sessions(2);
  std::vector<std::thread> trainers;
  for (int n = 0; n < 2; ++n) {
    trainers.emplace_back([&, n] {
      Engine& e = *engines[n];
      auto hello = e.Hello("", 0, 1, 0, "observe_test");
      ASSERT_TRUE(hello.ok()) << hello.status();
      sessions[n] = hello->session_id;
      auto dense = e.RegisterBucket(hello->session_id, 0, kDenseElements, "dense", 0);
      auto sparse = e.RegisterBucket(hello->session_id, 1, kSparseElements, "topk", 0.01);
      ASSERT_TRUE(dense.ok() && sparse.ok());
      for (int s = 0; s < kSteps; ++s) {
        for (const BucketGrant* g : {&*dense, &*sparse}) {
          auto* base = static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data());
          float* in = reinterpret_cast<float*>(base + g->input_offset);
          for (uint64_t i = 0; i < g->elements; ++i)
            in[i] = static_cast<float>(static_cast<int>((i * 7919 + s * 31 + n) % 1001) - 500);
        }
        for (uint64_t b : {0, 1}) {
          auto rec = e.Exchange(hello->session_id, b, s, absl::Now() + absl::Seconds(20));
          ASSERT_TRUE(rec.ok()) << rec.status();
          if (n == 0 && node0_bytes != nullptr) {
            (*node0_bytes)[b].first += rec->bytes_sent;
            (*node0_bytes)[b].second += rec->bytes_received;
          }
        }
      }
    });
  }
  for (auto& t : trainers) t.join();
  between(*engines[0]);
  for (int n = 0; n < 2; ++n) EXPECT_TRUE(engines[n]->Goodbye(sessions[n]).ok());
  attach(*engines[0]);  // a second attach is harmless
  for (auto& e : engines) e->RequestStop();
  for (auto& e : engines) e->WaitStopped();
}

TEST(MetricsTest, KnownRunPassesPromtoolAndCarriesItsValues) {
  Metrics metrics(/*node_rank=*/0);
  absl::StatusOr<int> port = metrics.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  std::string text, scraped;
  KnownRun(
      {&metrics}, [&](Engine& e) { metrics.Attach(&e); },
      [&](Engine&) {
        // Observers run right after the trainers are woken: the last exchange may still be on
        // its way.
        for (int i = 0; i < 500; ++i) {
          text = metrics.Render();
          if (Value(text, "spex_exchanges_total", {{"bucket", "0"}}) == kSteps &&
              Value(text, "spex_exchanges_total", {{"bucket", "1"}}) == kSteps) {
            break;
          }
          absl::SleepFor(absl::Milliseconds(10));
        }
        scraped = HttpGet(*port, "/metrics");
      });
  metrics.Attach(nullptr);

  // promtool: the exposition parses and passes its lint (any output is a failure).
  const std::string file = TempDir() + "/metrics.txt";
  std::ofstream(file) << text;
  std::string out;
  EXPECT_EQ(RunCommand("promtool check metrics < " + file, &out), 0) << out;
  EXPECT_EQ(out, "") << "promtool check metrics complained";

  // The exposer serves the same families over HTTP.
  ASSERT_TRUE(absl::StartsWith(scraped, "HTTP/1.1 200") ||
              absl::StartsWith(scraped, "HTTP/1.0 200"))
      << scraped.substr(0, 200);
  const size_t body = scraped.find("\r\n\r\n");
  ASSERT_NE(body, std::string::npos);
  const std::string served = scraped.substr(body + 4);
  const std::string served_file = TempDir() + "/served.txt";
  std::ofstream(served_file) << served;
  EXPECT_EQ(RunCommand("promtool check metrics < " + served_file, &out), 0) << out;
  EXPECT_EQ(out, "");
  EXPECT_EQ(Value(served, "spex_exchanges_total", {{"bucket", "1"}}), kSteps);
  EXPECT_EQ(Value(served, "spex_sessions", {{"node", "0"}}), 1);

  for (const char* b : {"0", "1"}) {
    const std::map<std::string, std::string> l = {{"node", "0"}, {"bucket", b}};
    EXPECT_EQ(Value(text, "spex_exchanges_total", l), kSteps) << b;
    EXPECT_GT(Value(text, "spex_sent_bytes_total", l), 0) << b;
    EXPECT_GT(Value(text, "spex_received_bytes_total", l), 0) << b;
    EXPECT_EQ(Value(text, "spex_exchange_seconds_count", l), kSteps) << b;
    EXPECT_GT(Value(text, "spex_exchange_seconds_sum", l), 0) << b;
    for (int p = 0; p < kPhaseCount; ++p) {
      auto lp = l;
      lp["phase"] = PhaseName(static_cast<Phase>(p));
      EXPECT_EQ(Value(text, "spex_phase_seconds_count", lp), kSteps) << b << " " << lp["phase"];
      lp["le"] = "+Inf";
      EXPECT_EQ(Value(text, "spex_phase_seconds_bucket", lp), kSteps) << b << " " << lp["phase"];
    }
    EXPECT_EQ(Value(text, "spex_dense_fallbacks_total", l), 0) << b;
  }
  const std::map<std::string, std::string> dense = {{"bucket", "0"}};
  const std::map<std::string, std::string> sparse = {{"bucket", "1"}};
  EXPECT_EQ(Value(text, "spex_bucket_elements", dense), kDenseElements);
  EXPECT_EQ(Value(text, "spex_bucket_elements", sparse), kSparseElements);
  EXPECT_EQ(Value(text, "spex_target_density", dense), 1);
  EXPECT_EQ(Value(text, "spex_achieved_density", dense), 1);
  EXPECT_DOUBLE_EQ(Value(text, "spex_target_density", sparse), 0.01);
  const double achieved = Value(text, "spex_achieved_density", sparse);
  EXPECT_GT(achieved, 0.005);
  EXPECT_LT(achieved, 0.02);
  // topk is pattern B: every node's k elements are gathered.
  EXPECT_EQ(Value(text, "spex_gathered_elements", sparse), 2 * 700);
  EXPECT_EQ(Value(text, "spex_gathered_elements_total", sparse), kSteps * 2 * 700);
  EXPECT_GT(Value(text, "spex_residual_norm", sparse), 0);
  // A dense all-reduce of 1000 floats moves at least the bucket's bytes each way per step.
  EXPECT_GE(Value(text, "spex_sent_bytes_total", dense), kSteps * kDenseElements * 4);
  EXPECT_EQ(Value(text, "spex_exchange_errors_total", dense), -1);  // none
  // Per node, read from the engine at scrape time.
  EXPECT_EQ(Value(text, "spex_sessions", {{"node", "0"}}), 1);
  EXPECT_EQ(Value(text, "spex_nodes", {{"node", "0"}}), 2);
  EXPECT_EQ(Value(text, "spex_node_exchanges_total", {{"node", "0"}}), 2 * kSteps);
  // --merger=none has no group rounds, so no reduce is ever kept for one.
  EXPECT_EQ(Value(text, "spex_merge_reduces_reused_total", {{"node", "0"}}), 0);
  // --merger=none: every bucket is its own exchange.
  EXPECT_EQ(Value(text, "spex_merge_groups_total", {{"node", "0"}}), 2 * kSteps);
  EXPECT_GT(Value(text, "spex_merge_group_seconds_total", {{"node", "0"}}), 0);
  // The phases once per group: with none, the buckets' own phase times summed.
  for (const char* phase : {"reduce_local", "compress", "collective"}) {
    const double per_bucket =
        Value(text, "spex_phase_seconds_sum", {{"bucket", "0"}, {"phase", phase}}) +
        Value(text, "spex_phase_seconds_sum", {{"bucket", "1"}, {"phase", phase}});
    const double per_group = Value(text, "spex_merge_phase_seconds_total", {{"phase", phase}});
    EXPECT_GT(per_group, 0) << phase;
    EXPECT_NEAR(per_group, per_bucket, 1e-6 + 1e-9 * per_bucket) << phase;
  }
  // Their CPU time, per phase: present (Value gives -1 for a missing series), some of it while
  // reducing and compressing, and never more than the phase's time (one thread ran each).
  double cpu_total = 0;
  for (const char* phase : {"wait_local", "reduce_local", "compress", "collective", "publish"}) {
    const double wall = Value(text, "spex_merge_phase_seconds_total", {{"phase", phase}});
    const double cpu = Value(text, "spex_phase_cpu_seconds_total", {{"phase", phase}});
    EXPECT_GE(cpu, 0) << phase;
    EXPECT_LE(cpu, wall + 1e-4) << phase;
    cpu_total += cpu;
  }
  EXPECT_GT(cpu_total, 0);
  EXPECT_EQ(Value(text, "spex_buckets", {{"state", "waiting"}}), 2);
  EXPECT_EQ(Value(text, "spex_buckets", {{"state", "failed"}}), 0);
}

// The running totals GetStats reports per bucket (and spexctl watch turns into bytes/s) are the
// sums of the known run's exchanges: exactly 4 bytes per element each way for the dense bucket
// of 2 nodes, the records' sums and the Prometheus counters for the topk bucket.
TEST(MetricsTest, BucketTotalsAreTheKnownRunsBytes) {
  Metrics metrics(/*node_rank=*/0);
  std::vector<BucketSummary> buckets;
  std::string text;
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> records;
  KnownRun(
      {&metrics}, [&](Engine& e) { metrics.Attach(&e); },
      [&](Engine& e) {
        buckets = e.Buckets();
        for (int i = 0; i < 500; ++i) {  // the observers may still be on the last exchange
          text = metrics.Render();
          if (Value(text, "spex_exchanges_total", {{"bucket", "0"}}) == kSteps &&
              Value(text, "spex_exchanges_total", {{"bucket", "1"}}) == kSteps) {
            break;
          }
          absl::SleepFor(absl::Milliseconds(10));
        }
      },
      &records);
  metrics.Attach(nullptr);
  ASSERT_EQ(buckets.size(), 2u);
  for (const BucketSummary& b : buckets) {
    SCOPED_TRACE(b.bucket_id);
    EXPECT_EQ(b.exchanges, static_cast<uint64_t>(kSteps));
    EXPECT_GT(b.bytes_sent_total, 0u);
    EXPECT_EQ(b.bytes_sent_total, records[b.bucket_id].first);
    EXPECT_EQ(b.bytes_received_total, records[b.bucket_id].second);
    const std::map<std::string, std::string> l = {{"bucket", std::to_string(b.bucket_id)}};
    EXPECT_EQ(Value(text, "spex_sent_bytes_total", l), b.bytes_sent_total);
    EXPECT_EQ(Value(text, "spex_received_bytes_total", l), b.bytes_received_total);
    if (b.bucket_id == 0) {  // dense, 2 nodes: 2 * 4n * (N - 1) / N = 4n bytes each way
      EXPECT_EQ(b.bytes_sent_total, kSteps * kDenseElements * 4);
      EXPECT_EQ(b.bytes_received_total, kSteps * kDenseElements * 4);
    }
  }
}

TEST(MetricsTest, ErrorsAreCountedByCode) {
  Metrics metrics(3);
  ExchangeRecord rec;
  rec.bucket_id = 7;
  ExchangeEvent e;
  e.record = &rec;
  e.code = absl::StatusCode::kDataLoss;
  e.terminal = true;
  metrics.OnExchange(e);
  metrics.OnExchange(e);
  e.code = absl::StatusCode::kOk;
  metrics.OnExchange(e);
  const std::string text = metrics.Render();
  EXPECT_EQ(Value(text, "spex_exchange_errors_total",
                  {{"node", "3"}, {"bucket", "7"}, {"code", "DATA_LOSS"}}),
            2);
  EXPECT_EQ(Value(text, "spex_exchanges_total", {{"node", "3"}, {"bucket", "7"}}), 3);
  const std::string file = TempDir() + "/errors.txt";
  std::ofstream(file) << text;
  std::string out;
  EXPECT_EQ(RunCommand("promtool check metrics < " + file, &out), 0) << out;
  EXPECT_EQ(out, "");
}

TEST(MetricsTest, ServeReportsAPortInUse) {
  Metrics a(0), b(0);
  absl::StatusOr<int> port = a.Serve("127.0.0.1:0");
  ASSERT_TRUE(port.ok()) << port.status();
  absl::StatusOr<int> again = b.Serve(absl::StrCat("127.0.0.1:", *port));
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::StrContains(again.status().message(), "--metrics_address")) << again.status();
}

TEST(MetricsAddressTest, LoopbackOnlyUnlessAllowed) {
  for (const char* ok : {"127.0.0.1:9400", "localhost:9400", "[::1]:9400", "127.0.0.2:0"}) {
    absl::StatusOr<MetricsAddress> a = ParseMetricsAddress(ok, false);
    ASSERT_TRUE(a.ok()) << ok << ": " << a.status();
    EXPECT_TRUE(a->loopback);
  }
  EXPECT_EQ(ParseMetricsAddress("localhost:9400", false)->Bind(9401), "127.0.0.1:9401");
  EXPECT_EQ(ParseMetricsAddress("[::1]:9400", false)->Bind(9400), "[::1]:9400");
  for (const char* remote : {"0.0.0.0:9400", "10.1.2.3:9400", "[::]:9400"}) {
    absl::StatusOr<MetricsAddress> a = ParseMetricsAddress(remote, false);
    ASSERT_FALSE(a.ok()) << remote;
    EXPECT_TRUE(absl::StrContains(a.status().message(), "--metrics_allow_remote")) << a.status();
    EXPECT_TRUE(absl::StrContains(a.status().message(), "--metrics_address")) << a.status();
    absl::StatusOr<MetricsAddress> allowed = ParseMetricsAddress(remote, true);
    ASSERT_TRUE(allowed.ok()) << allowed.status();
    EXPECT_FALSE(allowed->loopback);
  }
  for (const char* bad : {"9400", ":9400", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000",
                          "example.com:9400", "[::1]9400", "127.0.0.1:94,00"}) {
    absl::StatusOr<MetricsAddress> a = ParseMetricsAddress(bad, true);
    EXPECT_FALSE(a.ok()) << bad;
    if (!a.ok()) {
      EXPECT_TRUE(absl::StrContains(a.status().message(), "--metrics_address"));
    }
  }
}

std::string Runfile(const std::string& path) {
  const char* dir = std::getenv("TEST_SRCDIR");
  return absl::StrCat(dir != nullptr ? dir : ".", "/spex/", path);
}

TEST(TimelineTest, KnownRunHasEveryBucketsPhasesInOrder) {
  const std::string path = TempDir() + "/timeline.json";
  unlink(path.c_str());
  Timeline timeline(/*node_rank=*/0);
  ASSERT_TRUE(timeline.Start(path, /*overwrite=*/false).ok());
  uint64_t written = 0;
  KnownRun(
      {&timeline}, [](Engine&) {},
      [&](Engine&) {
        // The last exchange's event may still be on its way; the writer writes every 100 ms.
        for (int i = 0; i < 500 && timeline.exchanges_written() < 2 * kSteps; ++i) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        absl::StatusOr<uint64_t> n = timeline.Stop();
        ASSERT_TRUE(n.ok()) << n.status();
        written = *n;
      });
  EXPECT_EQ(written, 2u * kSteps);
  EXPECT_FALSE(timeline.recording());
  std::string out;
  EXPECT_EQ(
      RunCommand(absl::StrCat("/usr/bin/python3 ", Runfile("tests/observe/check_timeline.py"), " ",
                              path, " --pid 0 --buckets 0,1 --sparse 1 --steps ", kSteps),
                 &out),
      0)
      << out;
  std::cout << out;
}

TEST(TimelineTest, StartAndStopRules) {
  const std::string path = TempDir() + "/rules.json";
  unlink(path.c_str());
  Timeline t(2);
  EXPECT_EQ(t.Stop().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.Start(path, false).ok());
  EXPECT_EQ(t.Start(path + ".2", false).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(t.Stop().ok());
  // Never replaced without overwrite (the RPC), nor through a symlink.
  EXPECT_EQ(t.Start(path, false).code(), absl::StatusCode::kAlreadyExists);
  const std::string link = TempDir() + "/link.json";
  unlink(link.c_str());
  ASSERT_EQ(symlink(path.c_str(), link.c_str()), 0);
  EXPECT_EQ(t.Start(link, false).code(), absl::StatusCode::kAlreadyExists);
  // The flag overwrites; an empty recording is still a valid trace; the destructor closes it.
  {
    Timeline flag(2);
    ASSERT_TRUE(flag.Start(path, true).ok());
  }
  std::string out;
  EXPECT_EQ(RunCommand("/usr/bin/python3 -c 'import json,sys; e=json.load(open(sys.argv[1])); "
                       "assert e[0][\"name\"]==\"process_name\" and e[0][\"pid\"]==2, e' " +
                           path,
                       &out),
            0)
      << out;
  EXPECT_EQ(t.Start("/nonexistent-dir/x.json", false).code(),
            absl::StatusCode::kFailedPrecondition);
}

// The RPC's recordings stop growing at --timeline_max_bytes: whole events only, valid JSON.
TEST(TimelineTest, SizeCapKeepsTheFileValidAndSmall) {
  const std::string path = TempDir() + "/capped.json";
  unlink(path.c_str());
  Timeline timeline(/*node_rank=*/0);
  constexpr uint64_t kCap = 4096;
  ASSERT_TRUE(timeline.Start(path, /*overwrite=*/false, kCap).ok());
  KnownRun(
      {&timeline}, [](Engine&) {},
      [&](Engine&) {
        for (int i = 0; i < 300 && !timeline.capped(); ++i) absl::SleepFor(absl::Milliseconds(10));
        ASSERT_TRUE(timeline.Stop().ok());
      });
  EXPECT_TRUE(timeline.capped()) << "the known run writes more than " << kCap << " bytes";
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_LE(static_cast<uint64_t>(st.st_size), kCap + 8);  // + the closing "\n]\n"
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string out;
  EXPECT_EQ(RunCommand("/usr/bin/python3 -c 'import json,sys; e=json.load(open(sys.argv[1])); "
                       "assert any(x[\"name\"]==\"exchange\" for x in e), e' " +
                           path,
                       &out),
            0)
      << out;
}

TEST(TimelineTest, PathPerNode) {
  EXPECT_EQ(TimelinePath("/t/tl.json", 0, 1), "/t/tl.json");
  EXPECT_EQ(TimelinePath("/t/tl.json", 3, 4), "/t/tl.3.json");
  EXPECT_EQ(TimelinePath("/t/tl", 3, 4), "/t/tl.3");
  EXPECT_EQ(TimelinePath("/t/node{rank}.json", 3, 4), "/t/node3.json");
}

}  // namespace
}  // namespace spex
