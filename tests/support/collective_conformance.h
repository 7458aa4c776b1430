// The Collective conformance suite: every operation of daemon/transport/collective.h, checked for
// exact results on every rank, over any backend, parameterised by world (backend and ranks) and
// element count. A backend's test instantiates it with its worlds and keeps only the cases that
// are its own (TensorPipe's helper-plus-suite shape), e.g.
//   INSTANTIATE_TEST_SUITE_P(InProcess, CollectiveConformance,
//                            ::testing::Combine(::testing::ValuesIn(InProcessWorlds(2, 8)),
//                                               ::testing::ValuesIn(ConformanceSizes())),
//                            ConformanceName);
// The cases (TEST_P in collective_conformance.cc) reach the test binary through the
// :collective_conformance target, which is alwayslink.
#pragma once

#include <cstddef>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "daemon/transport/collective.h"
#include "gtest/gtest.h"

namespace spex::test {

// How a backend runs one case: calls fn once on every rank with that rank's Collective and
// returns when every rank is done. A world over processes (MPI) runs fn for its own rank only;
// the other ranks make the same call in their processes, and Run marks the case failed on
// every rank when any rank failed, so rank 0's report is the world's.
class CollectiveWorld {
 public:
  virtual ~CollectiveWorld() = default;
  virtual std::string name() const = 0;  // a test-name part: letters, digits, '_'
  virtual void Run(const std::function<void(Collective*)>& fn) = 0;
};

// Test parameters print as the world's name.
inline void PrintTo(CollectiveWorld* world, std::ostream* os) { *os << world->name(); }

// gloo's spawn(): runs fn on `ranks` threads, each with its rank's Collective over one fresh
// InProcessHub, and returns after every thread ended. Failures inside fn are traced with the
// rank ("rank 2 of 4").
void Spawn(int ranks, const std::function<void(Collective*)>& fn,
           absl::Duration timeout = absl::Seconds(30));

// Spawn as a world; the worlds for lo..hi ranks live until the program ends.
std::vector<CollectiveWorld*> InProcessWorlds(int lo, int hi);

// 0, 1, odd (7, 4097) and large (1 << 20) element counts.
std::vector<size_t> ConformanceSizes();

using ConformanceParam = std::tuple<CollectiveWorld*, size_t>;
std::string ConformanceName(const ::testing::TestParamInfo<ConformanceParam>& info);

class CollectiveConformance : public ::testing::TestWithParam<ConformanceParam> {
 protected:
  CollectiveWorld* world() const { return std::get<0>(GetParam()); }
  size_t n() const { return std::get<1>(GetParam()); }
  void Run(const std::function<void(Collective*)>& fn) { world()->Run(fn); }
};

}  // namespace spex::test
