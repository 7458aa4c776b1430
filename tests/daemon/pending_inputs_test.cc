// What a collective's wait learns about the trainers beside it (--mpi_sleep_beside_compute):
// PendingInputs over the ready words of the buckets still to come, and Scheduler::PendingOfStep,
// which picks those buckets for the group being exchanged.
#include <memory>
#include <vector>

#include "daemon/engine/bucket_table.h"
#include "daemon/engine/scheduler.h"
#include "daemon/merge/merger.h"
#include "daemon/transport/inproc_collective.h"
#include "gtest/gtest.h"
#include "kernels/primitives.h"

namespace spex {
namespace {

TEST(PendingInputs, ComputingUntilEveryWatchedTrainerSignalled) {
  PendingInputs p;
  EXPECT_FALSE(p.Computing());  // nothing to come: the trainers wait for results
  // On the heap: BucketHeader is 64-byte aligned, which ASan's stack does not keep.
  auto ha = std::make_unique<BucketHeader>(), hb = std::make_unique<BucketHeader>();
  BucketHeader& a = *ha;
  BucketHeader& b = *hb;
  p.Add(&a, /*step=*/4, /*watch_mask=*/0b11);
  p.Add(&b, /*step=*/4, /*watch_mask=*/0b01);  // trainer 1 died: b waits for trainer 0 only
  EXPECT_TRUE(p.Computing());
  a.ready[0].value = 5;
  EXPECT_TRUE(p.Computing());  // a still lacks trainer 1
  a.ready[1].value = 5;
  EXPECT_TRUE(p.Computing());  // b lacks trainer 0
  b.ready[1].value = 5;        // the dead trainer's word does not count
  EXPECT_TRUE(p.Computing());
  b.ready[0].value = 4;  // step 3's signal, not step 4's
  EXPECT_TRUE(p.Computing());
  b.ready[0].value = 5;
  EXPECT_FALSE(p.Computing());
  p.Clear();
  EXPECT_EQ(p.size(), 0u);
  EXPECT_FALSE(p.Computing());
}

// Three registered buckets of one step; the group is the first handed in. The others are pending
// until their trainers hand them in; a bucket already a step ahead is not.
TEST(PendingOfStep, TheGroupsStepBucketsNotHandedIn) {
  EngineOptions options;
  options.local_trainers = 2;
  options.shm_tag = "spextest";
  InProcessHub hub(1);
  std::unique_ptr<Collective> coll = hub.Connect(0);
  std::unique_ptr<Primitives> prims = MakeCpuPrimitives(1);
  BucketTable table(&options, coll.get(), prims.get(), DevicePath{});
  std::vector<EngineBucket*> b;
  for (uint64_t id = 1; id <= 3; ++id) {
    BucketSpec spec;
    spec.id = id;
    spec.elements = 64;
    spec.compressor = "dense";
    absl::StatusOr<EngineBucket*> made = table.Create(spec);
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE((*made)->MoveTo(BucketState::kWaiting));
    (*made)->ex.next_step = 7;
    b.push_back(*made);
  }
  absl::StatusOr<std::unique_ptr<Merger>> merger = MakeMerger(MergerPolicy::kNone, MergeParams{});
  ASSERT_TRUE(merger.ok()) << merger.status();
  Scheduler scheduler(2, std::move(*merger));
  for (int r = 0; r < 2; ++r) b[0]->mem.header->ready[r].value = 8;  // bucket 1 handed in
  b[2]->ex.next_step = 8;  // bucket 3 is a step ahead (exchanged already this step)
  PendingInputs pending;
  scheduler.PendingOfStep(table, b[0]->ex.compute_step(), &pending);
  EXPECT_EQ(pending.size(), 1u);  // bucket 2
  EXPECT_TRUE(pending.Computing());
  b[1]->mem.header->ready[0].value = 8;
  EXPECT_TRUE(pending.Computing());
  b[1]->mem.header->ready[1].value = 8;  // the step's last bucket is in: nobody computes
  EXPECT_FALSE(pending.Computing());
  scheduler.PendingOfStep(table, b[0]->ex.compute_step(), &pending);
  EXPECT_EQ(pending.size(), 0u);
  // A dead trainer is not waited for.
  b[1]->ex.next_step = 8;
  b[0]->ex.next_step = 8;
  b[0]->mem.header->ready[0].value = 9;  // the group runs: its living trainer handed it in
  b[2]->mem.header->ready[0].value = 9;
  scheduler.set_dead(0b10);
  scheduler.PendingOfStep(table, b[0]->ex.compute_step(), &pending);
  EXPECT_EQ(pending.size(), 1u);  // bucket 2, whose trainer 0 has not signalled step 8
  b[1]->mem.header->ready[0].value = 9;
  EXPECT_FALSE(pending.Computing());
}

}  // namespace
}  // namespace spex
