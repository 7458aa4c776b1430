// Every job gets a new doorbell generation (the previous one was attached by every local trainer
// and unlinked). The engine frees the old ones, so a daemon serving job after job keeps at most
// three mapped; before, it kept every one for its life (4 KiB and a mapping per job, found by
// bench/soak.py).
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

// The doorbell segments mapped in this process (the engines run in it).
int MappedBells(const std::string& tag) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("/spex-" + tag + "-bell-") != std::string::npos;
  }
  return n;
}

TEST(DoorbellGenerations, OldOnesAreFreedJobAfterJob) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = 1;
  o.engine.shm_tag = "belltest";
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  constexpr int kJobs = 20;
  for (int job = 0; job < kJobs; ++job) {
    auto t = Trainer::Open(&cluster.engine(0), 0, 1);
    ASSERT_TRUE(t.ok()) << t.status();
    t->doorbell()->attached[0].store(1);  // as the client does once it mapped the segment
    ASSERT_TRUE(t->Register(1, 1000, "dense", 0).ok());
    t->Fill(1, [&](size_t i) { return static_cast<float>(i % 7 + job); });
    ASSERT_TRUE(t->Exchange(1, 0).ok()) << "job " << job;
    EXPECT_EQ(t->output(1)[8], static_cast<float>(1 + job));
    ASSERT_TRUE(t->Goodbye().ok());
  }
  // The engine frees them between iterations of its loop (at most 50 ms apart when idle).
  int mapped = MappedBells("belltest");
  for (int i = 0; i < 50 && mapped > 3; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    mapped = MappedBells("belltest");
  }
  EXPECT_LE(mapped, 3) << "doorbell generations still mapped after " << kJobs << " jobs";
  EXPECT_GE(mapped, 1);
}

}  // namespace
}  // namespace spex::test
