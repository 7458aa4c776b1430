// A trainer killed in the middle of a job: the daemon notices within a second or two (it watches
// every trainer's process through a pidfd), the step it left half-done fails on every trainer of
// every node with an error naming it (node, local rank, pid) instead of hanging until the
// exchange timeout, its local rank is free again, and once the survivors leave the node serves a
// new job without a restart.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_primitives.h"

namespace spex {
namespace {

// A process that stands for a trainer: it only has to live until it is killed.
pid_t StartStandIn() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

void Reap(pid_t pid) {
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

TEST(TrainerDeath, TheHalfDoneStepFailsEverywhereNamingTheDeadTrainer) {
  const int N = 2, L = 2;
  const size_t n = 5000;
  // pids[node][rank]; the trainer of node 0, rank 1 is the one that dies.
  pid_t pids[N][L];
  for (auto& node : pids) {
    for (pid_t& p : node) {
      p = StartStandIn();
      ASSERT_GT(p, 0);
    }
  }
  InProcessHub hub(N, absl::Seconds(60));
  auto prims = MakeReferencePrimitives();
  std::vector<std::unique_ptr<Collective>> colls;
  std::vector<std::unique_ptr<Engine>> engines;
  for (int r = 0; r < N; ++r) {
    colls.push_back(hub.Connect(r));
    EngineOptions o;
    o.local_trainers = L;
    o.shm_tag = "deathtest";
    engines.push_back(std::make_unique<Engine>(o, colls.back().get(), prims.get()));
    ASSERT_TRUE(engines.back()->Start().ok());
  }
  std::vector<std::vector<absl::Status>> results(N, std::vector<absl::Status>(L));
  std::vector<std::vector<absl::Duration>> waited(N, std::vector<absl::Duration>(L));
  std::vector<std::vector<uint64_t>> sessions(N, std::vector<uint64_t>(L));
  std::atomic<int> at_step1{0};
  std::vector<std::thread> threads;
  for (int node = 0; node < N; ++node) {
    for (int t = 0; t < L; ++t) {
      threads.emplace_back([&, node, t] {
        Engine& e = *engines[node];
        auto hello = e.Hello("", t, L, static_cast<uint32_t>(pids[node][t]), "t");
        ASSERT_TRUE(hello.ok()) << hello.status();
        sessions[node][t] = hello->session_id;
        auto g = e.RegisterBucket(hello->session_id, 3, n, "dense", 0);
        ASSERT_TRUE(g.ok()) << g.status();
        ASSERT_TRUE(e.Exchange(hello->session_id, 3, 0, absl::Now() + absl::Seconds(20)).ok());
        at_step1++;
        if (node == 0 && t == 1) return;  // this trainer never submits step 1: it dies
        const absl::Time t0 = absl::Now();
        results[node][t] =
            e.Exchange(hello->session_id, 3, 1, absl::Now() + absl::Seconds(60)).status();
        waited[node][t] = absl::Now() - t0;
      });
    }
  }
  while (at_step1.load() < N * L) std::this_thread::yield();
  absl::SleepFor(absl::Milliseconds(200));  // the others are inside step 1 now
  Reap(pids[0][1]);
  for (auto& th : threads) th.join();
  const std::string who = absl::StrCat("local trainer 1 (pid ", pids[0][1], ") of node 0 died");
  for (int node = 0; node < N; ++node) {
    for (int t = 0; t < L; ++t) {
      if (node == 0 && t == 1) continue;
      SCOPED_TRACE(absl::StrCat("node ", node, " trainer ", t));
      EXPECT_EQ(results[node][t].code(), absl::StatusCode::kAborted) << results[node][t];
      EXPECT_NE(results[node][t].message().find(who), std::string::npos) << results[node][t];
      EXPECT_LT(waited[node][t], absl::Seconds(3));
    }
  }
  // Its local rank is free again, so a restarted trainer can say Hello.
  for (int i = 0; i < 50 && engines[0]->Sessions().size() != 1; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(engines[0]->Sessions().size(), 1u);
  // The survivors leave; a new job (a new trainer in rank 1 of node 0) runs from step 0.
  for (int node = 0; node < N; ++node) {
    for (int t = 0; t < L; ++t) {
      if (node == 0 && t == 1) continue;
      EXPECT_TRUE(engines[node]->Goodbye(sessions[node][t]).ok());
    }
  }
  const pid_t fresh = StartStandIn();
  std::vector<absl::Status> second(N * L);
  threads.clear();
  for (int node = 0; node < N; ++node) {
    for (int t = 0; t < L; ++t) {
      threads.emplace_back([&, node, t] {
        Engine& e = *engines[node];
        const pid_t pid = node == 0 && t == 1 ? fresh : pids[node][t];
        auto hello = e.Hello("", t, L, static_cast<uint32_t>(pid), "t2");
        ASSERT_TRUE(hello.ok()) << hello.status();
        auto g = e.RegisterBucket(hello->session_id, 3, n, "dense", 0);
        ASSERT_TRUE(g.ok()) << g.status();
        EXPECT_EQ(g->next_step, 0u);
        float* in = reinterpret_cast<float*>(
            static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data()) + g->input_offset);
        const float* out = reinterpret_cast<const float*>(
            static_cast<uint8_t*>(const_cast<ShmBuffer*>(g->buffer)->data()) + g->output_offset);
        for (size_t i = 0; i < n; ++i) in[i] = static_cast<float>(node * L + t);
        second[node * L + t] =
            e.Exchange(hello->session_id, 3, 0, absl::Now() + absl::Seconds(20)).status();
        if (second[node * L + t].ok()) {
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 1.5f);  // (0 + 1 + 2 + 3) / 4
        }
        EXPECT_TRUE(e.Goodbye(hello->session_id).ok());
      });
    }
  }
  for (auto& th : threads) th.join();
  for (const absl::Status& s : second) EXPECT_TRUE(s.ok()) << s;
  for (auto& e : engines) e->RequestStop();
  engines.clear();
  Reap(fresh);
  for (auto& node : pids) {
    for (pid_t p : node) Reap(p);
  }
}

}  // namespace
}  // namespace spex
