// Device choice for --device (daemon/device.h): the decision logic with a fake GPU probe, and
// the real probe on this machine (no GPU here: it must say why, and auto must fall back).
#include "daemon/device.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace spex {
namespace {

class FakeProbe : public GpuProbe {
 public:
  explicit FakeProbe(GpuProbeResult r) : result_(std::move(r)) {}
  GpuProbeResult Probe() override {
    ++calls;
    return result_;
  }
  int calls = 0;

 private:
  GpuProbeResult result_;
};

GpuProbeResult NoDriver() {
  GpuProbeResult r;
  r.built_with_cuda = true;
  r.error =
      "no NVIDIA driver (or one older than the CUDA runtime): cudaErrorInsufficientDriver "
      "(CUDA driver version is insufficient for CUDA runtime version)";
  return r;
}

GpuProbeResult WithGpus(std::vector<std::pair<int, int>> capabilities) {
  GpuProbeResult r;
  r.built_with_cuda = true;
  for (size_t i = 0; i < capabilities.size(); ++i) {
    GpuInfo g;
    g.ordinal = static_cast<int>(i);
    g.name = "Test GPU";
    g.major = capabilities[i].first;
    g.minor = capabilities[i].second;
    g.memory_bytes = 80ull << 30;
    r.devices.push_back(g);
  }
  return r;
}

const std::vector<int> kArchs = {80, 90};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ChooseDevice, CpuNeverProbes) {
  FakeProbe probe(NoDriver());
  std::string reason;
  absl::StatusOr<Device> d = ChooseDevice("cpu", probe, kArchs, &reason);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Device::kCpu);
  EXPECT_EQ(probe.calls, 0);
  EXPECT_TRUE(Contains(reason, "cpu"));
}

TEST(ChooseDevice, CudaWithoutDriverIsAnErrorSayingWhy) {
  FakeProbe probe(NoDriver());
  absl::StatusOr<Device> d = ChooseDevice("cuda", probe, kArchs, nullptr);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(d.status().message()), "no NVIDIA driver")) << d.status();
  EXPECT_TRUE(Contains(std::string(d.status().message()), "cudaErrorInsufficientDriver"));
  EXPECT_TRUE(Contains(std::string(d.status().message()), "--device=cpu"));
}

TEST(ChooseDevice, AutoWithoutDriverFallsBackToCpuWithTheReason) {
  FakeProbe probe(NoDriver());
  std::string reason;
  absl::StatusOr<Device> d = ChooseDevice("auto", probe, kArchs, &reason);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Device::kCpu);
  EXPECT_TRUE(Contains(reason, "using the CPU")) << reason;
  EXPECT_TRUE(Contains(reason, "cudaErrorInsufficientDriver")) << reason;
}

TEST(ChooseDevice, BuiltWithoutCuda) {
  FakeProbe probe(GpuProbeResult{});
  std::string reason;
  absl::StatusOr<Device> d = ChooseDevice("auto", probe, {}, &reason);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Device::kCpu);
  EXPECT_TRUE(Contains(reason, "built without CUDA")) << reason;
  d = ChooseDevice("cuda", probe, {}, nullptr);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(d.status().message()), "--config=cuda")) << d.status();
}

TEST(ChooseDevice, NoDevicesAtAll) {
  FakeProbe probe(WithGpus({}));
  absl::StatusOr<Device> d = ChooseDevice("cuda", probe, kArchs, nullptr);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(std::string(d.status().message()), "found no GPU")) << d.status();
}

TEST(ChooseDevice, UsesTheFirstGpuTheKernelsRunOn) {
  FakeProbe probe(WithGpus({{7, 5}, {8, 6}}));  // a Turing card, then an Ampere one
  std::string reason;
  absl::StatusOr<Device> d = ChooseDevice("cuda", probe, kArchs, &reason);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, Device::kCuda);
  EXPECT_TRUE(Contains(reason, "GPU 1")) << reason;
  EXPECT_TRUE(Contains(reason, "sm_86")) << reason;
  d = ChooseDevice("auto", probe, kArchs, &reason);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Device::kCuda);
}

// The ordinals spexd can put its buckets on (several daemons on one host take one each).
TEST(ChooseDevice, ListsTheUsableOrdinals) {
  FakeProbe probe(WithGpus({{8, 0}, {7, 5}, {9, 0}, {8, 9}}));
  std::vector<int> usable = {42};
  absl::StatusOr<Device> d = ChooseDevice("auto", probe, kArchs, nullptr, &usable);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, Device::kCuda);
  EXPECT_EQ(usable, (std::vector<int>{0, 2, 3}));
  FakeProbe none(NoDriver());
  d = ChooseDevice("auto", none, kArchs, nullptr, &usable);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Device::kCpu);
  EXPECT_TRUE(usable.empty());
  d = ChooseDevice("cpu", probe, kArchs, nullptr, &usable);
  EXPECT_TRUE(usable.empty());
}

TEST(ChooseDevice, GpuTooOldOrTooNewForTheBuild) {
  FakeProbe probe(WithGpus({{7, 5}, {10, 0}}));
  absl::StatusOr<Device> d = ChooseDevice("cuda", probe, kArchs, nullptr);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(d.status().message());
  EXPECT_TRUE(Contains(m, "built for sm_80, sm_90")) << m;
  EXPECT_TRUE(Contains(m, "sm_75")) << m;
  EXPECT_TRUE(Contains(m, "sm_100")) << m;
  std::string reason;
  d = ChooseDevice("auto", probe, kArchs, &reason);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*d, Device::kCpu);
}

TEST(ChooseDevice, UnknownValueListsTheAcceptedOnes) {
  FakeProbe probe(WithGpus({{9, 0}}));
  absl::StatusOr<Device> d = ChooseDevice("gpu", probe, kArchs, nullptr);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(d.status().message()), "auto, cpu, cuda")) << d.status();
  EXPECT_TRUE(Contains(std::string(d.status().message()), "'gpu'"));
  EXPECT_EQ(probe.calls, 0);
}

TEST(ArchRunsOn, SameMajorAndAtLeastTheMinor) {
  EXPECT_TRUE(ArchRunsOn(80, 8, 0));
  EXPECT_TRUE(ArchRunsOn(80, 8, 9));  // sm_80 code runs on Ada (8.9)
  EXPECT_TRUE(ArchRunsOn(90, 9, 0));
  EXPECT_FALSE(ArchRunsOn(86, 8, 0));  // newer minor than the GPU
  EXPECT_FALSE(ArchRunsOn(80, 9, 0));  // SASS does not cross major versions
  EXPECT_FALSE(ArchRunsOn(90, 10, 0));
}

// The real probe, on whatever machine runs the test.
TEST(ChooseDevice, RealProbeOnThisMachine) {
  std::unique_ptr<GpuProbe> probe = MakeGpuProbe();
  const GpuProbeResult found = probe->Probe();
#ifdef SPEX_HAVE_CUDA
  EXPECT_TRUE(found.built_with_cuda);
  // --define=spex_cuda_archs (80,90 in .bazelrc's --config=cuda).
  ASSERT_FALSE(BuiltCudaArchs().empty());
  for (int arch : BuiltCudaArchs()) EXPECT_GE(arch, 75);
#else
  EXPECT_FALSE(found.built_with_cuda);
  EXPECT_TRUE(BuiltCudaArchs().empty());
#endif
  std::string reason;
  absl::StatusOr<Device> automatic = ChooseDevice("auto", &reason);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  absl::StatusOr<Device> cuda = ChooseDevice("cuda", nullptr);
  if (found.built_with_cuda && found.error.empty() && !found.devices.empty()) {
    // A GPU answered: cuda is chosen unless its architecture is not in the build.
    EXPECT_EQ(cuda.ok(), *automatic == Device::kCuda);
    return;
  }
  EXPECT_EQ(*automatic, Device::kCpu);
  EXPECT_TRUE(Contains(reason, "using the CPU")) << reason;
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(cuda.status().message());
#ifdef SPEX_HAVE_CUDA
  // Without a driver the runtime says cudaErrorInsufficientDriver.
  EXPECT_TRUE(Contains(m, "cudaError") || Contains(m, "found no GPU")) << m;
#else
  EXPECT_TRUE(Contains(m, "built without CUDA")) << m;
#endif
}

// --devices: the list's syntax, and which GPUs one daemon serves (docs/design.md#multi-gpu).
TEST(Devices, ParsesAListAndRefusesWhatIsNotOne) {
  EXPECT_TRUE(ParseDeviceList("")->empty());
  EXPECT_EQ(*ParseDeviceList("2,0, 3"), (std::vector<int>{2, 0, 3}));
  for (const char* bad : {"0,,1", "a", "-1", "1,1", "0,2000", "1.5"}) {
    absl::StatusOr<std::vector<int>> d = ParseDeviceList(bad);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(std::string(d.status().message()), "--devices")) << d.status();
  }
}

TEST(Devices, ServesTheGivenGpusOrEveryUsableOne) {
  const std::vector<int> usable = {0, 1, 2, 3};
  EXPECT_EQ(*ServedDevices({}, usable, 0, 1), usable);  // alone on its host: all of them
  EXPECT_EQ(*ServedDevices({}, usable, 1, 2), (std::vector<int>{1}));  // two daemons: one each
  EXPECT_EQ(*ServedDevices({}, usable, 5, 6), (std::vector<int>{1}));
  EXPECT_EQ(*ServedDevices({2, 0}, usable, 0, 1), (std::vector<int>{2, 0}));  // 2 is home
  absl::StatusOr<std::vector<int>> missing = ServedDevices({1, 7}, usable, 0, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string m(missing.status().message());
  EXPECT_TRUE(Contains(m, "--devices names GPU 7")) << m;
  EXPECT_TRUE(Contains(m, "usable GPUs: 0,1,2,3")) << m;
  EXPECT_FALSE(ServedDevices({}, {}, 0, 1).ok());
}

}  // namespace
}  // namespace spex
