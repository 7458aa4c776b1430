// The MPI collective (daemon/transport/mpi_collective.h) under the Collective conformance suite
// (tests/support/collective_conformance.h), with and without the CPU primitives as its scaler.
// Not a test by itself: mpi_collective_test.sh runs it under mpirun with 2 and 4 ranks. Every
// rank runs every case for itself; after each case the ranks exchange pass/fail, so a failure on
// any rank fails the case on all of them and rank 0's XML (the only one written) is the world's.
// Each rank prints "mpi_collective_test: rank R of N: T tests, F failed" when done.
#include "daemon/transport/mpi_collective.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/primitives.h"
#include "tests/support/collective_conformance.h"

namespace spex::test {
namespace {

class MpiWorld : public CollectiveWorld {
 public:
  MpiWorld(std::string name, Primitives* scaler, MpiWaitPolicy policy = {},
           const ComputeProbe* probe = nullptr)
      : name_(std::move(name)), collective_(MPI_COMM_WORLD, scaler, policy) {
    MPI_Comm_dup(MPI_COMM_WORLD, &verdicts_);
    collective_.SetComputeProbe(probe);
  }
  ~MpiWorld() override { MPI_Comm_free(&verdicts_); }

  std::string name() const override { return name_; }

  void Run(const std::function<void(Collective*)>& fn) override {
    const int rank = collective_.rank(), size = collective_.size();
    {
      SCOPED_TRACE(absl::StrCat("rank ", rank, " of ", size));
      fn(&collective_);
    }
    // Every rank's verdict on this case, on a communicator of its own.
    int mine = ::testing::Test::HasFailure() ? 1 : 0;
    std::vector<int> all(size);
    MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, verdicts_);
    for (int r = 0; r < size; ++r) {
      if (r != rank && all[r] && !mine) {
        ADD_FAILURE() << "rank " << r << " failed this case (its output says where)";
      }
    }
  }

 private:
  const std::string name_;
  MpiCollective collective_;
  MPI_Comm verdicts_;
};

std::unique_ptr<Primitives>& Scaler() {
  static auto* scaler = new std::unique_ptr<Primitives>();
  return *scaler;
}

// Trainers that compute for 64 of a wait's questions, then wait for 64, and so on: the waits of
// --mpi_sleep_beside_compute sleep and test back to back in turn (every rank differently).
class AlternatingProbe : public ComputeProbe {
 public:
  bool Computing() const override { return (asked_++ / 64) % 2 == 0; }

 private:
  mutable uint64_t asked_ = 0;
};

MpiWaitPolicy SleepBesideCompute() {
  MpiWaitPolicy p{1000, 1 << 20};
  p.sleep_only_beside_compute = true;
  return p;
}

std::vector<std::unique_ptr<MpiWorld>>& Worlds() {
  static auto* worlds = new std::vector<std::unique_ptr<MpiWorld>>();
  return *worlds;
}

// Called while InitGoogleTest registers the instantiation, after MPI_Init.
std::vector<CollectiveWorld*> MpiWorlds() {
  if (Worlds().empty()) {
    Scaler() = MakeCpuPrimitives(1);
    Worlds().push_back(std::make_unique<MpiWorld>("mpi", nullptr));
    Worlds().push_back(std::make_unique<MpiWorld>("mpi_cpu_scaler", Scaler().get()));
    // Non-blocking forms, passive waiting: as the wire stage (--merge_overlap) runs them by
    // default (50 us sleeps), and with --mpi_wait_max_sleep_us=1000.
    Worlds().push_back(
        std::make_unique<MpiWorld>("mpi_passive_wait", Scaler().get(), MpiWaitPolicy{50, 0}));
    Worlds().push_back(
        std::make_unique<MpiWorld>("mpi_passive_backoff", Scaler().get(), MpiWaitPolicy{1000, 0}));
    // Chosen by size, as spexd does by default (a smaller threshold, so that the suite's sizes
    // fall on both sides of it: 7 floats wait inside MPI, 4097 passively).
    Worlds().push_back(
        std::make_unique<MpiWorld>("mpi_wait_by_size", Scaler().get(), MpiWaitPolicy{1000, 4096}));
    // --mpi_sleep_beside_compute: every form non-blocking (small all-reduces as all-gathers),
    // sleeping while the probe says the trainers compute; without a probe it never sleeps.
    static const AlternatingProbe* probe = new AlternatingProbe();
    Worlds().push_back(std::make_unique<MpiWorld>("mpi_sleep_beside_compute", Scaler().get(),
                                                  SleepBesideCompute(), probe));
    Worlds().push_back(std::make_unique<MpiWorld>("mpi_sleep_beside_nothing", Scaler().get(),
                                                  SleepBesideCompute()));
  }
  std::vector<CollectiveWorld*> out;
  for (auto& w : Worlds()) out.push_back(w.get());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mpi, CollectiveConformance,
                         ::testing::Combine(::testing::ValuesIn(MpiWorlds()),
                                            ::testing::ValuesIn(ConformanceSizes())),
                         ConformanceName);

// The sleeps of a passive wait: 50 us, then 1/32 of the wait so far, capped; a cap at or under
// 50 us keeps them at 50 (the wire stage's behaviour before the cap existed).
TEST(PassiveSleep, GrowsWithTheWaitUpToTheCap) {
  EXPECT_EQ(PassiveSleepUs(0, 1000), 50);
  EXPECT_EQ(PassiveSleepUs(1600, 1000), 50);
  EXPECT_EQ(PassiveSleepUs(3200, 1000), 100);
  EXPECT_EQ(PassiveSleepUs(16000, 1000), 500);
  EXPECT_EQ(PassiveSleepUs(32000, 1000), 1000);
  EXPECT_EQ(PassiveSleepUs(int64_t{9} * 1000000, 1000), 1000);
  EXPECT_EQ(PassiveSleepUs(int64_t{9} * 1000000, 50), 50);
  EXPECT_EQ(PassiveSleepUs(int64_t{9} * 1000000, 1), 50);
}

// The waiting policy's choices: passive from passive_min_bytes up, never with max_sleep_us 0.
TEST(MpiWaitPolicy, PassiveFromTheThresholdUp) {
  const MpiWaitPolicy by_size{1000, 1 << 20};
  EXPECT_FALSE(by_size.Passive(0));
  EXPECT_FALSE(by_size.Passive(4096));
  EXPECT_FALSE(by_size.Passive((1 << 20) - 1));
  EXPECT_TRUE(by_size.Passive(1 << 20));
  EXPECT_TRUE(by_size.Passive(size_t{25557032} * 4));  // the main job's dense bucket
  const MpiWaitPolicy all{1000, 0};
  EXPECT_TRUE(all.Passive(0));
  EXPECT_TRUE(all.Passive(8));
  const MpiWaitPolicy none{0, 0};
  EXPECT_FALSE(none.Passive(0));
  EXPECT_FALSE(none.Passive(size_t{25557032} * 4));
  const MpiWaitPolicy none_by_size{0, 1 << 20};
  EXPECT_FALSE(none_by_size.Passive(size_t{1} << 30));
}

// --mpi_sleep_beside_compute: every size non-blocking (never with max_sleep_us 0).
TEST(MpiWaitPolicy, SleepBesideComputeMakesEverySizeNonBlocking) {
  MpiWaitPolicy p = SleepBesideCompute();
  EXPECT_TRUE(p.Passive(0));
  EXPECT_TRUE(p.Passive(8));
  EXPECT_TRUE(p.Passive(size_t{25557032} * 4));
  p.max_sleep_us = 0;
  EXPECT_FALSE(p.Passive(8));
}

// Under it a small all-reduce is an all-gather and a reduction in rank order, so a float sum
// comes out bit for bit alike on every rank; a large one stays MPI_Iallreduce. Both count as
// non-blocking waits.
TEST(MpiWaitPolicy, SleepBesideComputeSmallAllReduceAlikeOnEveryRank) {
  MpiCollective c(MPI_COMM_WORLD, nullptr, SleepBesideCompute());
  const int rank = c.rank(), size = c.size();
  // Values whose float sum depends on the order: 1e8 on rank 0, small ones elsewhere.
  std::vector<float> v(5);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = rank == 0 ? 1e8f : 0.3f * static_cast<float>(i + rank);
  ASSERT_TRUE(c.AllReduce(v.data(), v.size(), ElemType::kFloat32, ReduceOp::kSum).ok());
  float want = 1e8f;
  for (int r = 1; r < size; ++r) want += 0.3f * static_cast<float>(4 + r);
  EXPECT_EQ(v[4], want);
  std::vector<float> all(static_cast<size_t>(size) * v.size());
  MPI_Allgather(v.data(), 5, MPI_FLOAT, all.data(), 5, MPI_FLOAT, MPI_COMM_WORLD);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(std::memcmp(all.data() + r * 5, v.data(), 5 * sizeof(float)), 0) << "rank " << r;
  }
  uint64_t most[2] = {static_cast<uint64_t>(rank), ~static_cast<uint64_t>(rank)};
  ASSERT_TRUE(c.AllReduce(most, 2, ElemType::kUint64, ReduceOp::kMax).ok());
  EXPECT_EQ(most[0], static_cast<uint64_t>(size - 1));
  EXPECT_EQ(~most[1], 0u);
  std::vector<double> large(size_t{1} << 14, 1.0);  // 128 KiB a rank: the all-reduce itself
  ASSERT_TRUE(c.AllReduce(large.data(), large.size(), ElemType::kFloat64, ReduceOp::kSum).ok());
  EXPECT_EQ(large.back(), static_cast<double>(size));
  EXPECT_EQ(c.passive_waits(), 3u);
  EXPECT_EQ(c.blocking_waits(), 0u);
}

// Each collective waits as its result's size says, and an all-gather whose ranks send different
// sizes (some under the threshold, some over) waits alike on every rank, by the gathered total:
// chosen by each rank's own bytes, the forms would not match and the gather would hang.
TEST(MpiWaitPolicy, EveryRankChoosesAlike) {
  MpiCollective c(MPI_COMM_WORLD, nullptr, MpiWaitPolicy{1000, 4096});
  const int rank = c.rank(), size = c.size();
  std::vector<float> small(7, 1.0f), large(1024, 1.0f);  // 28 and 4096 bytes
  ASSERT_TRUE(c.AllReduce(small.data(), small.size(), ElemType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(c.blocking_waits(), 1u);
  EXPECT_EQ(c.passive_waits(), 0u);
  ASSERT_TRUE(c.AllReduce(large.data(), large.size(), ElemType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(c.passive_waits(), 1u);
  EXPECT_EQ(large[1023], static_cast<float>(size));
  // Rank 0 sends 4096 bytes, the others 1: the total is over the threshold on every rank.
  std::vector<uint8_t> send(rank == 0 ? 4096 : 1, static_cast<uint8_t>(rank + 1)), recv;
  std::vector<size_t> counts;
  ASSERT_TRUE(c.AllGatherV(send.data(), send.size(), &counts, &recv).ok());
  EXPECT_EQ(c.passive_waits(), 2u);   // the gather
  EXPECT_EQ(c.blocking_waits(), 2u);  // and its size round (a few bytes)
  ASSERT_EQ(recv.size(), 4096u + static_cast<size_t>(size - 1));
  EXPECT_EQ(recv[4095], 1);
  EXPECT_EQ(recv.back(), static_cast<uint8_t>(size));
  // The same gather with every rank under it waits inside MPI everywhere.
  send.assign(1, static_cast<uint8_t>(rank + 1));
  ASSERT_TRUE(c.AllGatherV(send.data(), send.size(), &counts, &recv).ok());
  EXPECT_EQ(c.passive_waits(), 2u);
  EXPECT_EQ(c.blocking_waits(), 4u);
  // The policy can change between calls, alike on every rank.
  c.set_policy({0, 0});
  ASSERT_TRUE(c.AllReduce(large.data(), large.size(), ElemType::kFloat32, ReduceOp::kSum).ok());
  EXPECT_EQ(c.passive_waits(), 2u);
  EXPECT_EQ(c.blocking_waits(), 5u);
}

// main() chose libnbc's ring MPI_Iallreduce as spexd does; a choice already in the environment
// stays.
TEST(PreferRingIallreduce, SetsTheAlgorithmUnlessChosen) {
  const char* kVar = "OMPI_MCA_coll_libnbc_iallreduce_algorithm";
  ASSERT_NE(std::getenv(kVar), nullptr);
  EXPECT_STREQ(std::getenv(kVar), "1");
  setenv(kVar, "3", 1);
  PreferRingIallreduce();
  EXPECT_STREQ(std::getenv(kVar), "3");
  setenv(kVar, "1", 1);
}

// On ranks other than 0: only failures, each line marked with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                r.line_number(), r.message());
    std::fflush(stdout);
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::printf("[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  const int rank_;
};

}  // namespace
}  // namespace spex::test

int main(int argc, char** argv) {
  spex::PreferRingIallreduce();  // as spexd does
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // Only rank 0 writes the XML: the others drop --gtest_output before gtest reads it.
  std::vector<char*> args(argv, argv + argc);
  if (rank != 0) {
    args.erase(
        std::remove_if(args.begin() + 1, args.end(),
                       [](const char* a) { return std::strncmp(a, "--gtest_output", 14) == 0; }),
        args.end());
  }
  int args_count = static_cast<int>(args.size());
  args.push_back(nullptr);
  ::testing::InitGoogleTest(&args_count, args.data());
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new spex::test::RankFailurePrinter(rank));
  }
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  std::printf("mpi_collective_test: rank %d of %d: %d tests, %d failed\n", rank, size,
              unit.test_to_run_count(), unit.failed_test_count());
  std::fflush(stdout);
  spex::test::Worlds().clear();
  spex::test::Scaler().reset();
  MPI_Finalize();
  return rc;
}
