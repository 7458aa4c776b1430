// The engine conformance suite: the behaviours every path of the engine must share, written once
// and run on every backend a node's engine can have (TensorPipe's conformance suites, gloo's
// tests over every transport):
//  - kCpu: the CPU path (the CPU primitives, host shared memory);
//  - kFakeDevice: the device path on one fake GPU per node (tests/support/fake_device.h: host
//    memory claiming to be a GPU's, primitives checking which side every pointer is on, the
//    collective checked the same way);
//  - kFakeNode: the multi-GPU path on a fake node of two fake GPUs per node
//    (tests/support/fake_node.h), trainer t's buckets on GPU t % 2, peer access on even nodes
//    and host staging on odd ones.
// The cases (TEST_P in engine_conformance.cc): dense buckets average exactly over both
// signalling paths; sparse buckets (topk, micro) equal the oracle of kernels/reference_cluster.h
// step after step, outputs and residual norms; error feedback loses nothing (every value handed
// in comes out once the residual is drained); bad requests and a NaN or infinity under
// --nonfinite=error get clear errors and the engine keeps serving; bfloat16 and float16 dense
// buckets average exactly; a checkpointed bucket resumed on fresh engines continues bit for bit.
// A backend's test instantiates the suite with its backends:
//   INSTANTIATE_TEST_SUITE_P(Cpu, EngineConformance, ::testing::Values(EngineBackend::kCpu),
//                            EngineConformanceName);
// The cases reach the test binary through the :engine_conformance target, which is alwayslink.
// A new engine path joins the enum and EngineBackendWorld; a behaviour every path must share
// becomes a TEST_P here (docs/testing.md, "Where a new test goes").
#pragma once

#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/fake_device.h"
#include "tests/support/fake_node.h"

namespace spex::test {

enum class EngineBackend { kCpu, kFakeDevice, kFakeNode };

// "Cpu", "FakeDevice", "FakeNode".
std::string EngineBackendName(EngineBackend backend);
inline void PrintTo(EngineBackend backend, std::ostream* os) { *os << EngineBackendName(backend); }
std::string EngineConformanceName(const ::testing::TestParamInfo<EngineBackend>& info);

// The fakes behind one cluster's nodes on a backend; must outlive the EngineCluster built from
// Options().
class EngineBackendWorld {
 public:
  EngineBackendWorld(EngineBackend backend, int nodes);

  // `nodes` x `trainers` engines on this backend (shm tag "conformance").
  EngineClusterOptions Options(int trainers);
  // The GPU trainer `trainer`'s buckets go on (Trainer::Register's `device`; -1: the home GPU
  // or the CPU path).
  int DeviceOf(int trainer) const;
  // Whether this backend's grants are device buffers.
  bool on_device() const { return backend_ != EngineBackend::kCpu; }
  // What the fakes saw go wrong: a host pointer given to device primitives or the reverse, a
  // copy between the wrong GPUs. Empty on the CPU path.
  std::vector<std::string> Violations() const;

 private:
  const EngineBackend backend_;
  const int nodes_;
  std::vector<std::unique_ptr<fake::FakeDevice>> devices_;   // kFakeDevice: one per node
  std::vector<std::unique_ptr<fake::FakeNode>> fake_nodes_;  // kFakeNode: one per node
};

class EngineConformance : public ::testing::TestWithParam<EngineBackend> {
 protected:
  EngineBackend backend() const { return GetParam(); }
};

}  // namespace spex::test
