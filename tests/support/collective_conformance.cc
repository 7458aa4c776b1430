#include "tests/support/collective_conformance.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/transport/inproc_collective.h"

namespace spex::test {

void Spawn(int ranks, const std::function<void(Collective*)>& fn, absl::Duration timeout) {
  InProcessHub hub(ranks, timeout);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&hub, &fn, r, ranks] {
      SCOPED_TRACE(absl::StrCat("rank ", r, " of ", ranks));
      std::unique_ptr<Collective> c = hub.Connect(r);
      fn(c.get());
    });
  }
  for (std::thread& t : threads) t.join();
}

namespace {

class InProcessWorld : public CollectiveWorld {
 public:
  explicit InProcessWorld(int ranks) : ranks_(ranks) {}
  std::string name() const override { return absl::StrCat("inproc", ranks_); }
  void Run(const std::function<void(Collective*)>& fn) override { Spawn(ranks_, fn); }

 private:
  const int ranks_;
};

// Values whose sums, maxima and minima are exact in their type, over up to 8 ranks. The 64-bit
// integers use bits a double cannot hold, and for max/min the unsigned ones put the top bit on
// odd ranks, so an implementation going through double or int64 gets them wrong.
template <typename T>
T Value(int r, size_t i, ReduceOp op);

template <>
float Value<float>(int r, size_t i, ReduceOp) {
  return static_cast<float>(static_cast<int>((r * 7 + i * 3) % 29) - 14) +
         0.25f * static_cast<float>((i + r) % 4);
}

template <>
double Value<double>(int r, size_t i, ReduceOp) {
  return (static_cast<double>((r * 7 + i * 3) % 29) - 14.0) * 1e6 + 0.5 * ((i + r) % 4);
}

template <>
int64_t Value<int64_t>(int r, size_t i, ReduceOp) {
  return (static_cast<int64_t>(i % 16) - 8) * (int64_t{1} << 55) + r * 3 + 1;
}

template <>
uint64_t Value<uint64_t>(int r, size_t i, ReduceOp op) {
  if (op == ReduceOp::kSum) return (uint64_t{i % 16} << 56) | static_cast<uint64_t>(r * 5 + 1);
  const uint64_t low = i * 7 + r;
  return r % 2 ? (uint64_t{1} << 63) | low : low;
}

template <typename T>
T Combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return a < b ? b : a;
    case ReduceOp::kMin:
      return b < a ? b : a;
  }
  return a;
}

const char* OpName(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : op == ReduceOp::kMax ? "max" : "min";
}

template <typename T>
void CheckAllReduce(Collective* c, size_t n, ElemType type) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    SCOPED_TRACE(OpName(op));
    std::vector<T> data(n);
    for (size_t i = 0; i < n; ++i) data[i] = Value<T>(c->rank(), i, op);
    ASSERT_TRUE(c->AllReduce(data.data(), n, type, op).ok());
    size_t wrong = 0, first = n;
    for (size_t i = 0; i < n; ++i) {
      T want = Value<T>(0, i, op);
      for (int r = 1; r < c->size(); ++r) want = Combine(want, Value<T>(r, i, op), op);
      if (data[i] != want && wrong++ == 0) first = i;
    }
    EXPECT_EQ(wrong, 0u) << "first wrong element " << first << " of " << n;
  }
}

// The sum every rank's AllReduceScaled input adds up to (exact: small multiples of 1/4).
float ScaledSum(int size, size_t i) {
  float sum = 0.0f;
  for (int r = 0; r < size; ++r) sum += Value<float>(r, i, ReduceOp::kSum);
  return sum;
}

void CheckAllReduceScaled(Collective* c, size_t n, bool in_place) {
  for (float scale : {1.0f, 0.25f, 1.0f / 3.0f}) {
    SCOPED_TRACE(absl::StrCat("scale ", scale));
    std::vector<float> send(n), recv(n, -7.0f);
    for (size_t i = 0; i < n; ++i) send[i] = Value<float>(c->rank(), i, ReduceOp::kSum);
    const std::vector<float> sent = send;
    float* out = in_place ? send.data() : recv.data();
    ASSERT_TRUE(c->AllReduceScaled(send.data(), out, n, scale).ok());
    size_t wrong = 0, first = n;
    for (size_t i = 0; i < n; ++i) {
      if (out[i] != ScaledSum(c->size(), i) * scale && wrong++ == 0) first = i;
    }
    EXPECT_EQ(wrong, 0u) << "first wrong element " << first << " of " << n;
    if (!in_place) {
      EXPECT_TRUE(send == sent) << "AllReduceScaled wrote into its send buffer";
    }
  }
}

uint8_t Byte(int r, size_t i) { return static_cast<uint8_t>(r * 131 + i * 7 + (i >> 8)); }

// Rank r's AllGatherV contribution under `shape`: 0 = unequal with zeros (every third rank from
// rank 1 sends nothing), 1 = every rank sends nothing, 2 = only the last rank sends.
size_t VBytes(int shape, int r, int size, size_t n) {
  switch (shape) {
    case 0:
      return r % 3 == 1 ? 0 : n + 5 * r;
    case 1:
      return 0;
    default:
      return r == size - 1 ? n : 0;
  }
}

void CheckAllGatherV(Collective* c, size_t n, int shape) {
  const int size = c->size();
  std::vector<uint8_t> send(VBytes(shape, c->rank(), size, n));
  for (size_t i = 0; i < send.size(); ++i) send[i] = Byte(c->rank(), i);
  // Stale contents of the wrong size, which the call must replace.
  std::vector<size_t> counts(size + 3, 99);
  std::vector<uint8_t> recv(3, 0xEE);
  ASSERT_TRUE(c->AllGatherV(send.data(), send.size(), &counts, &recv).ok());
  std::vector<size_t> want_counts(size);
  size_t total = 0;
  for (int r = 0; r < size; ++r) total += want_counts[r] = VBytes(shape, r, size, n);
  EXPECT_EQ(counts, want_counts);
  ASSERT_EQ(recv.size(), total);
  size_t off = 0, wrong = 0;
  for (int r = 0; r < size; ++r) {
    for (size_t i = 0; i < want_counts[r]; ++i) wrong += recv[off + i] != Byte(r, i);
    off += want_counts[r];
  }
  EXPECT_EQ(wrong, 0u);
}

// AllToAllV: the bytes rank `from` sends rank `to` under `shape`: 0 = unequal with zeros (every
// pair with (from + to) % 3 == 1 sends nothing), 1 = nothing at all, 2 = only the last rank sends
// (to everyone), 3 = each rank only to itself.
size_t PairBytes(int shape, int from, int to, int size, size_t n) {
  switch (shape) {
    case 0:
      return (from + to) % 3 == 1 ? 0 : n + 5 * from + 3 * to;
    case 1:
      return 0;
    case 2:
      return from == size - 1 ? n + to : 0;
    default:
      return from == to ? n : 0;
  }
}

uint8_t PairByte(int from, int to, size_t i) { return Byte(from, i + 977 * to); }

// The backend's AllToAllV must deliver exactly the addressed blocks, and agree with the
// Collective default (built on AllGatherV), which every backend inherits.
void CheckAllToAllV(Collective* c, size_t n, int shape) {
  const int size = c->size(), me = c->rank();
  std::vector<std::vector<uint8_t>> send(size);
  for (int to = 0; to < size; ++to) {
    send[to].resize(PairBytes(shape, me, to, size, n));
    for (size_t i = 0; i < send[to].size(); ++i) send[to][i] = PairByte(me, to, i);
  }
  // Stale contents of the wrong shape, which the call must replace.
  std::vector<std::vector<uint8_t>> recv(size + 2, std::vector<uint8_t>(3, 0xEE));
  ASSERT_TRUE(c->AllToAllV(send, &recv).ok());
  ASSERT_EQ(recv.size(), static_cast<size_t>(size));
  for (int from = 0; from < size; ++from) {
    SCOPED_TRACE(absl::StrCat("from rank ", from));
    ASSERT_EQ(recv[from].size(), PairBytes(shape, from, me, size, n));
    size_t wrong = 0;
    for (size_t i = 0; i < recv[from].size(); ++i) wrong += recv[from][i] != PairByte(from, me, i);
    EXPECT_EQ(wrong, 0u);
  }
  std::vector<std::vector<uint8_t>> by_default;
  ASSERT_TRUE(c->Collective::AllToAllV(send, &by_default).ok());
  EXPECT_TRUE(by_default == recv) << "differs from the Collective default's result";
}

}  // namespace

std::vector<CollectiveWorld*> InProcessWorlds(int lo, int hi) {
  static std::vector<std::unique_ptr<CollectiveWorld>>* worlds =
      new std::vector<std::unique_ptr<CollectiveWorld>>();
  std::vector<CollectiveWorld*> out;
  for (int ranks = lo; ranks <= hi; ++ranks) {
    worlds->push_back(std::make_unique<InProcessWorld>(ranks));
    out.push_back(worlds->back().get());
  }
  return out;
}

std::vector<size_t> ConformanceSizes() { return {0, 1, 7, 4097, size_t{1} << 20}; }

std::string ConformanceName(const ::testing::TestParamInfo<ConformanceParam>& info) {
  return absl::StrCat(std::get<0>(info.param)->name(), "_n", std::get<1>(info.param));
}

TEST_P(CollectiveConformance, RankAndSizeAreAPermutation) {
  Run([](Collective* c) {
    EXPECT_GT(std::strlen(c->name()), 0u);
    ASSERT_GE(c->rank(), 0);
    ASSERT_LT(c->rank(), c->size());
    const int64_t mine[2] = {c->rank(), c->size()};
    std::vector<int64_t> all(2 * c->size(), -1);
    ASSERT_TRUE(c->AllGather(mine, sizeof(mine), all.data()).ok());
    for (int r = 0; r < c->size(); ++r) {
      EXPECT_EQ(all[2 * r], r);
      EXPECT_EQ(all[2 * r + 1], c->size());
    }
  });
}

TEST_P(CollectiveConformance, AllReduceFloat32) {
  Run([n = n()](Collective* c) { CheckAllReduce<float>(c, n, ElemType::kFloat32); });
}

TEST_P(CollectiveConformance, AllReduceFloat64) {
  Run([n = n()](Collective* c) { CheckAllReduce<double>(c, n, ElemType::kFloat64); });
}

TEST_P(CollectiveConformance, AllReduceInt64) {
  Run([n = n()](Collective* c) { CheckAllReduce<int64_t>(c, n, ElemType::kInt64); });
}

TEST_P(CollectiveConformance, AllReduceUint64) {
  Run([n = n()](Collective* c) { CheckAllReduce<uint64_t>(c, n, ElemType::kUint64); });
}

TEST_P(CollectiveConformance, AllReduceScaledIntoOtherBuffer) {
  Run([n = n()](Collective* c) { CheckAllReduceScaled(c, n, /*in_place=*/false); });
}

TEST_P(CollectiveConformance, AllReduceScaledInPlace) {
  Run([n = n()](Collective* c) { CheckAllReduceScaled(c, n, /*in_place=*/true); });
}

TEST_P(CollectiveConformance, AllGather) {
  Run([n = n()](Collective* c) {
    std::vector<uint8_t> send(n), recv(n * c->size(), 0xEE);
    for (size_t i = 0; i < n; ++i) send[i] = Byte(c->rank(), i);
    ASSERT_TRUE(c->AllGather(send.data(), n, recv.data()).ok());
    size_t wrong = 0;
    for (int r = 0; r < c->size(); ++r) {
      for (size_t i = 0; i < n; ++i) wrong += recv[r * n + i] != Byte(r, i);
    }
    EXPECT_EQ(wrong, 0u);
  });
}

// `send` as this rank's own block of `recv`: gathered in place (MPI_IN_PLACE on MPI).
TEST_P(CollectiveConformance, AllGatherInPlace) {
  Run([n = n()](Collective* c) {
    std::vector<uint8_t> recv(n * c->size(), 0xEE);
    uint8_t* mine = recv.data() + c->rank() * n;
    for (size_t i = 0; i < n; ++i) mine[i] = Byte(c->rank(), i);
    ASSERT_TRUE(c->AllGather(mine, n, recv.data()).ok());
    size_t wrong = 0;
    for (int r = 0; r < c->size(); ++r) {
      for (size_t i = 0; i < n; ++i) wrong += recv[r * n + i] != Byte(r, i);
    }
    EXPECT_EQ(wrong, 0u);
  });
}

// AllToAll of equal blocks between contiguous buffers: block r of rank s's send arrives at rank
// r's recv block s; the backend's own agrees with the Collective default (through AllToAllV).
TEST_P(CollectiveConformance, AllToAllEqualBlocks) {
  Run([n = n()](Collective* c) {
    const int N = c->size();
    std::vector<uint8_t> send(n * N), recv(n * N, 0xEE), by_default(n * N, 0xDD);
    auto byte = [](int from, int to, size_t i) {
      return static_cast<uint8_t>(from * 37 + to * 11 + i * 7 + (i >> 8));
    };
    for (int to = 0; to < N; ++to) {
      for (size_t i = 0; i < n; ++i) send[to * n + i] = byte(c->rank(), to, i);
    }
    ASSERT_TRUE(c->AllToAll(send.data(), n, recv.data()).ok());
    ASSERT_TRUE(c->Collective::AllToAll(send.data(), n, by_default.data()).ok());
    size_t wrong = 0;
    for (int from = 0; from < N; ++from) {
      for (size_t i = 0; i < n; ++i) wrong += recv[from * n + i] != byte(from, c->rank(), i);
    }
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(recv, by_default);
  });
}

TEST_P(CollectiveConformance, AllGatherVUnequalWithZeros) {
  Run([n = n()](Collective* c) { CheckAllGatherV(c, n, 0); });
}

TEST_P(CollectiveConformance, AllGatherVNothingFromAnyone) {
  Run([n = n()](Collective* c) { CheckAllGatherV(c, n, 1); });
}

TEST_P(CollectiveConformance, AllGatherVOnlyTheLastRank) {
  Run([n = n()](Collective* c) { CheckAllGatherV(c, n, 2); });
}

TEST_P(CollectiveConformance, AllToAllVUnequalWithZeros) {
  Run([n = n()](Collective* c) { CheckAllToAllV(c, n, 0); });
}

TEST_P(CollectiveConformance, AllToAllVNothingFromAnyone) {
  Run([n = n()](Collective* c) { CheckAllToAllV(c, n, 1); });
}

TEST_P(CollectiveConformance, AllToAllVOnlyTheLastRank) {
  Run([n = n()](Collective* c) { CheckAllToAllV(c, n, 2); });
}

TEST_P(CollectiveConformance, AllToAllVOnlyToItself) {
  Run([n = n()](Collective* c) { CheckAllToAllV(c, n, 3); });
}

TEST_P(CollectiveConformance, AllToAllVWrongBlockCountIsAnError) {
  Run([n = n()](Collective* c) {
    for (size_t blocks : {size_t{0}, static_cast<size_t>(c->size()) + 1}) {
      std::vector<std::vector<uint8_t>> send(blocks, std::vector<uint8_t>(n, 1)), recv;
      EXPECT_EQ(c->AllToAllV(send, &recv).code(), absl::StatusCode::kInvalidArgument)
          << blocks << " blocks";
    }
    // The world is still usable afterwards.
    EXPECT_TRUE(c->Barrier().ok());
  });
}

TEST_P(CollectiveConformance, BroadcastFromEachRoot) {
  Run([n = n()](Collective* c) {
    for (int root = 0; root < c->size(); ++root) {
      SCOPED_TRACE(absl::StrCat("root ", root));
      std::vector<uint64_t> data(n, ~uint64_t{0} - c->rank());
      if (c->rank() == root) {
        for (size_t i = 0; i < n; ++i) data[i] = root * uint64_t{1000003} + i;
      }
      ASSERT_TRUE(c->Broadcast(data.data(), n * sizeof(uint64_t), root).ok());
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) wrong += data[i] != root * uint64_t{1000003} + i;
      EXPECT_EQ(wrong, 0u);
    }
  });
}

TEST_P(CollectiveConformance, BroadcastRootOutOfRangeIsAnError) {
  Run([n = n()](Collective* c) {
    std::vector<uint8_t> data(n, 5);
    for (int root : {-1, c->size()}) {
      EXPECT_EQ(c->Broadcast(data.data(), n, root).code(), absl::StatusCode::kInvalidArgument)
          << "root " << root;
    }
    EXPECT_EQ(data, std::vector<uint8_t>(n, 5));
    // The world is still usable afterwards.
    EXPECT_TRUE(c->Barrier().ok());
  });
}

TEST_P(CollectiveConformance, Barrier) {
  Run([](Collective* c) {
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(c->Barrier().ok()) << "barrier " << i;
  });
}

// Rounds of every operation back to back, as the engine issues them: no round may see another
// round's data.
TEST_P(CollectiveConformance, MixedSequence) {
  Run([n = n()](Collective* c) {
    const int rounds = n > 10000 ? 2 : 20;
    const int size = c->size(), rank = c->rank();
    for (int round = 0; round < rounds; ++round) {
      SCOPED_TRACE(absl::StrCat("round ", round));
      std::vector<double> d(n, rank + round);
      ASSERT_TRUE(c->AllReduce(d.data(), n, ElemType::kFloat64, ReduceOp::kSum).ok());
      const double want = size * (size - 1) / 2.0 + size * round;
      EXPECT_EQ(std::count(d.begin(), d.end(), want), static_cast<ptrdiff_t>(n));
      std::vector<float> x(n, static_cast<float>(rank + 1)), y(n);
      ASSERT_TRUE(c->AllReduceScaled(x.data(), y.data(), n, 0.5f).ok());
      const float want_y = size * (size + 1) / 2.0f * 0.5f;
      EXPECT_EQ(std::count(y.begin(), y.end(), want_y), static_cast<ptrdiff_t>(n));
      std::vector<uint8_t> mine((rank + round) % 3, static_cast<uint8_t>(rank)), all;
      std::vector<size_t> counts;
      ASSERT_TRUE(c->AllGatherV(mine.data(), mine.size(), &counts, &all).ok());
      size_t off = 0;
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(counts[r], static_cast<size_t>((r + round) % 3));
        for (size_t i = 0; i < counts[r]; ++i) EXPECT_EQ(all[off + i], r);
        off += counts[r];
      }
      EXPECT_EQ(all.size(), off);
      std::vector<std::vector<uint8_t>> to(size), from;
      for (int r = 0; r < size; ++r) to[r].assign((rank + r + round) % 3, uint8_t(rank * 16 + r));
      ASSERT_TRUE(c->AllToAllV(to, &from).ok());
      for (int r = 0; r < size; ++r) {
        EXPECT_EQ(from[r], std::vector<uint8_t>((r + rank + round) % 3, uint8_t(r * 16 + rank)));
      }
      const int root = round % size;
      int64_t b = rank == root ? 42 + round : -1;
      ASSERT_TRUE(c->Broadcast(&b, sizeof(b), root).ok());
      EXPECT_EQ(b, 42 + round);
      ASSERT_TRUE(c->Barrier().ok());
    }
  });
}

}  // namespace spex::test
