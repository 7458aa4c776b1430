// The engine conformance suite (tests/support/engine_conformance.h) on the device path: one fake
// GPU per node, and a fake node of two GPUs per node (trainers on both). The CPU path's instance
// is tests/daemon/engine_conformance_test.cc.
#include "tests/support/engine_conformance.h"

namespace spex::test {
namespace {

INSTANTIATE_TEST_SUITE_P(Device, EngineConformance,
                         ::testing::Values(EngineBackend::kFakeDevice, EngineBackend::kFakeNode),
                         EngineConformanceName);

}  // namespace
}  // namespace spex::test
