// Round-trip latency of one empty exchange (a 1-element bucket) on one node, through the
// doorbell and through the Exchange RPC of a running spexd, beside the floor measured in the
// same run: a bare two-process futex ping-pong (sleeping, and with both sides spinning).
// The sleeping floor depends on where the two processes run: on two cores a wake-up pays the
// idle core's exit (about 50 us on these virtual machines), on one core it is a context switch
// (about 2 us). The floor the doorbell is judged against is the cross-core one (the daemon's
// engine thread and a trainer run side by side on different cores), so the ping-pong pins its
// two processes to two different CPUs; the same-core figure is reported beside it.
// Driven by bench/exchange_bench.py, which starts the daemon; prints one JSON object.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "client/client.h"
#include "proto/contract/futex.h"

ABSL_FLAG(std::string, socket, "", "spexd socket (empty: only the futex floor)");
ABSL_FLAG(int, iters, 10000, "round trips per measurement");

namespace {

struct Pct {
  double p50, p99;
};

Pct Percentiles(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)]};
}

// Two processes bounce a counter through a shared word; `spin` polls instead of sleeping.
// cpus: -1 = leave the placement to the scheduler; else parent on cpu_a, child on cpu_b.
void PinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

Pct FutexPingPong(int iters, bool spin, int cpu_a = -1, int cpu_b = -1) {
  cpu_set_t saved;
  sched_getaffinity(0, sizeof(saved), &saved);
  auto* w = static_cast<std::atomic<uint32_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (w) std::atomic<uint32_t>(0);
  auto wait_for = [&](uint32_t want) {
    for (;;) {
      uint32_t cur = w->load();
      if (cur == want) return;
      if (spin) {
        spex::CpuRelax();
      } else {
        spex::FutexWait(w, cur, -1);
      }
    }
  };
  pid_t child = fork();
  if (child == 0) {
    PinTo(cpu_b);
    for (int i = 0; i < iters + 100; ++i) {
      wait_for(2 * i + 1);
      w->store(2 * i + 2);
      if (!spin) spex::FutexWake(w);
    }
    _exit(0);
  }
  PinTo(cpu_a);
  std::vector<double> us;
  for (int i = 0; i < iters + 100; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    w->store(2 * i + 1);
    if (!spin) spex::FutexWake(w);
    wait_for(2 * i + 2);
    if (i >= 100)
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  waitpid(child, nullptr, 0);
  sched_setaffinity(0, sizeof(saved), &saved);
  munmap(w, 4096);
  return Percentiles(us);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int iters = absl::GetFlag(FLAGS_iters);
  const bool two_cpus = sysconf(_SC_NPROCESSORS_ONLN) >= 2;
  Pct sleep = FutexPingPong(iters, false, 0, two_cpus ? 1 : 0);  // cross-core: the floor
  Pct same = FutexPingPong(iters, false, 0, 0);
  Pct spin = FutexPingPong(iters, true, 0, two_cpus ? 1 : 0);
  std::printf(
      "{\"futex_sleep_p50_us\": %.3f, \"futex_sleep_p99_us\": %.3f, \"futex_spin_p50_us\": %.3f, "
      "\"futex_spin_p99_us\": %.3f, \"futex_same_core_p50_us\": %.3f, \"futex_same_core_p99_us\": "
      "%.3f",
      sleep.p50, sleep.p99, spin.p50, spin.p99, same.p50, same.p99);
  if (!absl::GetFlag(FLAGS_socket).empty()) {
    spex::ClientOptions o;
    o.socket = absl::GetFlag(FLAGS_socket);
    auto client = spex::Client::Connect(o);
    if (!client.ok()) {
      std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
      return 1;
    }
    auto bucket = (*client)->RegisterBucket(0, 1);
    if (!bucket.ok()) {
      std::fprintf(stderr, "%s\n", bucket.status().ToString().c_str());
      return 1;
    }
    for (auto [mode, name] : {std::pair{spex::ExchangeMode::kDoorbell, "doorbell"},
                              std::pair{spex::ExchangeMode::kRpc, "rpc"}}) {
      std::vector<double> us;
      for (int i = 0; i < iters + 100; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        absl::Status s = (*client)->Exchange(*bucket, mode);
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          return 1;
        }
        if (i >= 100)
          us.push_back(
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count());
      }
      Pct p = Percentiles(us);
      std::printf(", \"%s_p50_us\": %.3f, \"%s_p99_us\": %.3f", name, p.p50, name, p.p99);
    }
    std::printf(", \"spin_us\": %u", (*client)->hello().spin_us());
  }
  std::printf("}\n");
  return 0;
}
