// The compressors that run on device primitives (DeviceCompressorNames), on the fake device:
// every Select over the fake device's primitives (acc, add and all scratch in fake device
// memory, every pointer checked) is bit-identical to the same Select over the CPU primitives
// (selection, scalars and acc afterwards), over several steps on 4 simulated nodes with their
// Updates, with and without `add`; acc is never copied back whole. Dense is refused.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/compressors/device_scratch.h"
#include "kernels/compressors/selection.h"
#include "tests/cuda/compressor_cases.h"
#include "tests/support/fake_device.h"

namespace spex {
namespace {

using fake::FakeDevice;

using testcases::Case;
using testcases::Cases;
using testcases::Data;

// Device memory of the fake device holding a copy of `host`.
std::unique_ptr<DeviceArray> OnDevice(FakeDevice* d, const std::vector<float>& host) {
  auto a = d->AllocateScratch(host.size() * sizeof(float));
  EXPECT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(d->device_prims()->CopyFromHost((*a)->data(), host.data(), host.size() * 4).ok());
  return std::move(*a);
}

// The test reads the fake device's memory directly (it is host memory), so that the staging
// counters hold the compressors' copies only.
std::vector<float> ToHost(DeviceArray* a, size_t n) {
  std::vector<float> h(n);
  std::memcpy(h.data(), a->data(), n * 4);
  return h;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

class DeviceCompressor : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceCompressor, SelectsBitIdenticallyToTheCpu) {
  const Case& c = GetParam();
  constexpr int kNodes = 4;
  constexpr size_t kN = 100003;  // above 2^16, so a histogram's copy is smaller than acc's
  constexpr int kSteps = 6;
  ASSERT_TRUE(CompressorRunsOnDevice(c.name));
  FakeDevice device;
  std::unique_ptr<Primitives> cpu = MakeCpuPrimitives(1);
  std::vector<std::unique_ptr<Compressor>> on_cpu, on_dev;
  std::vector<std::vector<float>> acc_cpu;
  std::vector<std::unique_ptr<DeviceArray>> acc_dev;
  for (int r = 0; r < kNodes; ++r) {
    const CompressorSpec spec{c.name, c.density, c.params, r, kNodes, kN};
    auto a = MakeCompressor(spec, cpu.get());
    auto b = MakeCompressor(spec, device.device_prims());
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    on_cpu.push_back(std::move(*a));
    on_dev.push_back(std::move(*b));
    acc_cpu.push_back(Data(kN, 100 + r));
    acc_dev.push_back(OnDevice(&device, acc_cpu.back()));
  }
  const Pattern pattern = on_cpu[0]->pattern();
  const bool zero = pattern == Pattern::kSparseGather;
  const fake::Staging before = device.staging();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Selection> sel_cpu(kNodes), sel_dev(kNodes);
    for (int r = 0; r < kNodes; ++r) {
      SCOPED_TRACE(::testing::Message() << c.label << " step " << step << " rank " << r);
      // Every other step adds a local sum in the same pass (the ErrorFeedback form).
      std::vector<float> add_host;
      std::unique_ptr<DeviceArray> add_dev;
      if (step % 2 == 1) {
        add_host = Data(kN, 1000 * step + r);
        add_dev = OnDevice(&device, add_host);
      }
      ASSERT_TRUE(on_cpu[r]
                      ->Select(step, acc_cpu[r].data(),
                               add_host.empty() ? nullptr : add_host.data(), zero, &sel_cpu[r])
                      .ok());
      const absl::Status s = on_dev[r]->Select(
          step, static_cast<float*>(acc_dev[r]->data()),
          add_dev ? static_cast<const float*>(add_dev->data()) : nullptr, zero, &sel_dev[r]);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(sel_dev[r].idx, sel_cpu[r].idx);
      EXPECT_TRUE(SameBits(sel_dev[r].val, sel_cpu[r].val));
      EXPECT_EQ(std::memcmp(sel_dev[r].scalars, sel_cpu[r].scalars, sizeof(sel_cpu[r].scalars)), 0);
      EXPECT_TRUE(SameBits(ToHost(acc_dev[r].get(), kN), acc_cpu[r]));
    }
    // The exchange's bookkeeping, as the engine does it, on both sides.
    const testcases::AllSelections all = testcases::GatherSelections(sel_cpu, pattern);
    const Gathered g = all.view();
    const std::vector<uint32_t>& gathered = all.indices;
    for (int r = 0; r < kNodes; ++r) {
      ASSERT_TRUE(on_cpu[r]->Update(step, g).ok());
      ASSERT_TRUE(on_dev[r]->Update(step, g).ok());
      if (pattern == Pattern::kIndexUnion) {  // the caller zeroes acc at the union
        ASSERT_TRUE(cpu->ZeroAt(acc_cpu[r].data(), kN, gathered.data(), gathered.size()).ok());
        std::vector<float> a = ToHost(acc_dev[r].get(), kN);
        ASSERT_TRUE(cpu->ZeroAt(a.data(), kN, gathered.data(), gathered.size()).ok());
        std::memcpy(acc_dev[r]->data(), a.data(), kN * 4);
      }
    }
  }
  EXPECT_TRUE(device.violations().empty()) << device.violations().front();
  // What came back were selections, samples and histogram bins: never acc.
  const fake::Staging after = device.staging();
  EXPECT_GT(after.to_host_calls, before.to_host_calls);
  EXPECT_LT(after.to_host_max_bytes, kN * 4);
}

INSTANTIATE_TEST_SUITE_P(Ported, DeviceCompressor, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.label; });

TEST(DeviceCompressors, EveryPortedOneIsCoveredAndTheOthersAreRefused) {
  std::vector<std::string> covered;
  for (const Case& c : Cases()) covered.push_back(c.name);
  FakeDevice device;
  for (const std::string& name : CompressorNames()) {
    const bool ported = CompressorRunsOnDevice(name);
    EXPECT_EQ(ported, std::find(covered.begin(), covered.end(), name) != covered.end()) << name;
    auto made = MakeCompressor({name, 0.01, {}, 0, 1, 1000}, device.device_prims());
    if (ported) {
      EXPECT_TRUE(made.ok()) << name << ": " << made.status();
    } else {
      EXPECT_EQ(made.status().code(), absl::StatusCode::kUnimplemented) << name;
    }
  }
}

// The shared helpers on device primitives, with a call-local scratch (no Scratch given) and
// with one, equal the CPU primitives' results: a select that overflows its first guess (with
// zeroing), a top-k of a sub-range (zeroed), a trim, histograms from a bin on, samples, zeroing.
TEST(DeviceHelpers, EqualTheCpuWithAndWithoutAScratch) {
  constexpr size_t kN = 20011;
  for (bool own : {false, true}) {
    SCOPED_TRACE(own ? "own scratch" : "call-local scratch");
    FakeDevice device;
    Primitives* dev = device.device_prims();
    std::unique_ptr<Primitives> cpu = MakeCpuPrimitives(1);
    Scratch scratch(dev);
    Scratch* s = own ? &scratch : nullptr;
    std::vector<float> a = Data(kN, 42);
    auto d = OnDevice(&device, a);
    float* da = static_cast<float*>(d->data());
    Selection x, y;
    // About 3000 entries above 0.01: the first guess (1024) overflows.
    EXPECT_EQ(AppendAbove(dev, da, nullptr, 7, kN - 5, 0.01f, true, 10, &y, s),
              AppendAbove(cpu.get(), a.data(), nullptr, 7, kN - 5, 0.01f, true, 10, &x));
    EXPECT_GT(x.idx.size(), 1024u);
    EXPECT_EQ(AppendTopK(dev, da, 100, 9000, 300, true, &y, s),
              AppendTopK(cpu.get(), a.data(), 100, 9000, 300, true, &x));
    EXPECT_EQ(TrimTopK(dev, &y, 10, 500, s), TrimTopK(cpu.get(), &x, 10, 500));
    EXPECT_EQ(y.idx, x.idx);
    EXPECT_TRUE(SameBits(y.val, x.val));
    EXPECT_TRUE(SameBits(ToHost(d.get(), kN), a));
    for (uint32_t first : {0u, 0x3c00u}) {
      std::vector<uint32_t> hx(Primitives::kHistogramBins, 1), hy(hx);
      ASSERT_TRUE(HistogramToHost(cpu.get(), a.data(), 3, kN, first, hx.data()).ok());
      ASSERT_TRUE(HistogramToHost(dev, da, 3, kN, first, hy.data(), s).ok());
      EXPECT_TRUE(std::equal(hx.begin() + first, hx.end(), hy.begin() + first)) << first;
    }
    std::vector<float> sx(777), sy(777);
    ASSERT_TRUE(SampleToHost(cpu.get(), a.data(), kN, sx.size(), 99, sx.data()).ok());
    ASSERT_TRUE(SampleToHost(dev, da, kN, sy.size(), 99, sy.data(), s).ok());
    EXPECT_TRUE(SameBits(sx, sy));
    const std::vector<uint32_t> at = {0, 5, 77, 19999};
    ASSERT_TRUE(ZeroAtHost(cpu.get(), a.data(), kN, at.data(), at.size()).ok());
    ASSERT_TRUE(ZeroAtHost(dev, da, kN, at.data(), at.size(), s).ok());
    EXPECT_TRUE(SameBits(ToHost(d.get(), kN), a));
    EXPECT_TRUE(scratch.TakeStatus().ok());
    EXPECT_TRUE(device.violations().empty()) << device.violations().front();
  }
}

// A device failure inside a step (here: the scratch allocation) is the Select's error.
TEST(DeviceCompressors, AScratchFailureIsTheSelectsError) {
  FakeDevice device;
  auto c = MakeCompressor({"topk", 0.01, {}, 0, 1, 5000}, device.device_prims());
  ASSERT_TRUE(c.ok());
  auto acc = OnDevice(&device, Data(5000, 1));
  device.FailAllocations(absl::ResourceExhaustedError("out of fake device memory"));
  Selection sel;
  const absl::Status s = (*c)->Select(0, static_cast<float*>(acc->data()), nullptr, true, &sel);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

}  // namespace
}  // namespace spex
