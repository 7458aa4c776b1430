// A new job's trainers register while the engine is still inside the previous job's last step:
// each registration waits for the step to end, and only the first may drop the previous job's
// buckets. Before, every waiting registration dropped them again, so the second trainer's
// registration dropped the bucket the first had just registered: the first got NOT_FOUND and
// the others waited out the register timeout ("only 1 of 2 local trainers registered it").
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/engine/engine.h"
#include "daemon/transport/collective.h"
#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

// Passes everything through; the first dense all-reduce after `armed` is set sleeps first.
class SlowCollective : public Collective {
 public:
  SlowCollective(std::unique_ptr<Collective> inner, std::atomic<bool>* armed,
                 std::atomic<int>* inside)
      : inner_(std::move(inner)), armed_(armed), inside_(inside) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return inner_->name(); }
  absl::Status AllReduce(void* data, size_t count, ElemType type, ReduceOp op) override {
    return inner_->AllReduce(data, count, type, op);
  }
  absl::Status AllReduceScaled(const float* send, float* recv, size_t count, float scale) override {
    if (armed_->load() && !slept_) {
      slept_ = true;
      (*inside_)++;
      absl::SleepFor(absl::Milliseconds(800));
    }
    return inner_->AllReduceScaled(send, recv, count, scale);
  }
  absl::Status AllGather(const void* send, size_t bytes, void* recv) override {
    return inner_->AllGather(send, bytes, recv);
  }
  absl::Status AllGatherV(const void* send, size_t send_bytes, std::vector<size_t>* counts,
                          std::vector<uint8_t>* recv) override {
    return inner_->AllGatherV(send, send_bytes, counts, recv);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

 private:
  std::unique_ptr<Collective> inner_;
  std::atomic<bool>* armed_;
  std::atomic<int>* inside_;
  bool slept_ = false;  // the engine thread's alone
};

TEST(NewJob, RegistrationsWaitingForTheLastStepResetOnce) {
  constexpr int kNodes = 2, kLocal = 2;
  constexpr size_t n = 1000;
  std::atomic<bool> armed{false};
  std::atomic<int> inside{0};
  EngineClusterOptions o;
  o.nodes = kNodes;
  o.trainers = kLocal;
  o.wrap = [&](int, std::unique_ptr<Collective> c) -> std::unique_ptr<Collective> {
    return std::make_unique<SlowCollective>(std::move(c), &armed, &inside);
  };
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  // Job 1: every trainer hands in step 0 and leaves while the engines are inside it.
  std::vector<std::unique_ptr<Trainer>> job1;
  for (int node = 0; node < kNodes; ++node) {
    for (int rank = 0; rank < kLocal; ++rank) {
      auto t = Trainer::Open(&cluster.engine(node), rank, kLocal);
      ASSERT_TRUE(t.ok()) << t.status();
      ASSERT_TRUE(t->Register(1, n, "dense", 0).ok());
      t->Fill(1, [](size_t i) { return static_cast<float>(i % 5); });
      job1.push_back(std::make_unique<Trainer>(std::move(*t)));
    }
  }
  armed = true;
  for (auto& t : job1) t->MarkReady(1, 0);
  while (inside.load() < kNodes) absl::SleepFor(absl::Milliseconds(5));
  for (auto& t : job1) ASSERT_TRUE(t->Goodbye().ok());
  // Job 2 registers at once, on every node, while step 0 of job 1 still runs.
  cluster.ForEachTrainer([&](int node, int rank) {
    auto t = Trainer::Open(&cluster.engine(node), rank, kLocal);
    ASSERT_TRUE(t.ok()) << t.status();
    auto g = t->Register(2, n, "dense", 0);
    ASSERT_TRUE(g.ok()) << g.status();
    EXPECT_EQ(g->next_step, 0u);
    t->Fill(2, [&](size_t i) { return static_cast<float>(node * kLocal + rank + i % 3); });
    const absl::Time t0 = absl::Now();
    auto r = t->Exchange(2, 0, absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << "node " << node << " trainer " << rank << ": " << r.status();
    EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
    // (0 + 1 + 2 + 3) / 4 + i % 3
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(t->output(2)[i], 1.5f + i % 3) << i;
    EXPECT_TRUE(t->Goodbye().ok());
  });
}

}  // namespace
}  // namespace spex::test
