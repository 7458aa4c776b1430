// The engine conformance suite (tests/support/engine_conformance.h) on the CPU path: the
// behaviours every engine path shares. The fake device's and fake node's instances are
// tests/cuda/engine_conformance_test.cc.
#include "tests/support/engine_conformance.h"

namespace spex::test {
namespace {

INSTANTIATE_TEST_SUITE_P(Cpu, EngineConformance, ::testing::Values(EngineBackend::kCpu),
                         EngineConformanceName);

}  // namespace
}  // namespace spex::test
