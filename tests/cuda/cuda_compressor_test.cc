// The compressors of DeviceCompressorNames() on a real GPU: every Select over the CUDA primitives
// (acc, add and scratch in cudaMalloc'd memory) against the same Select over the CPU primitives,
// over several steps on 4 simulated nodes with their Updates, with and without `add`.
//
// Compressors whose decisions rest only on exact primitives (top-k, count/select above a
// threshold, histograms, sampling, gathers) must select bit-identically and leave acc
// bit-identical, as on the fake device (device_compressor_test). Those that compute a threshold
// from Moments sums (gaussiank, redsync, redsync_trim, deft, the SIDCo family) may differ in the
// last bits of that threshold, since the GPU sums in another order: for them each step's
// selection must keep within 2% of the CPU's size and share at least 95% of its indices, and the
// test prints what it measured. Without a usable GPU (or without --config=cuda) every case
// skips, saying why.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/compressors/selection.h"
#include "kernels/primitives.h"
#include "tests/cuda/compressor_cases.h"

namespace spex {
namespace {

using testcases::Case;
using testcases::Cases;
using testcases::Data;

// Compressors whose thresholds come from floating-point sums (Moments): not bit-exact on a GPU.
bool SumsDecide(const std::string& name) {
  return name == "gaussiank" || name == "redsync" || name == "redsync_trim" || name == "deft" ||
         name.rfind("sidco", 0) == 0;
}

std::unique_ptr<ScratchBuffer> Put(Primitives* gpu, const std::vector<float>& host) {
  auto a = gpu->AllocScratch(host.size() * sizeof(float));
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return nullptr;
  EXPECT_TRUE(gpu->CopyFromHost((*a)->data(), host.data(), host.size() * 4).ok());
  return std::move(*a);
}

std::vector<float> Get(Primitives* gpu, const ScratchBuffer& a, size_t n) {
  std::vector<float> h(n);
  EXPECT_TRUE(gpu->CopyToHost(h.data(), a.data(), n * 4).ok());
  return h;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

class CudaCompressor : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const absl::Status s = MakeCudaPrimitives(&gpu_);
    if (!s.ok()) GTEST_SKIP() << "no CUDA primitives here: " << s.message();
  }
  std::unique_ptr<Primitives> gpu_;
};

TEST_P(CudaCompressor, SelectsAsOnTheCpu) {
  const Case& c = GetParam();
  constexpr int kNodes = 4;
  constexpr size_t kN = 1000003;
  constexpr int kSteps = 6;
  ASSERT_TRUE(CompressorRunsOnDevice(c.name));
  const bool exact = !SumsDecide(c.name);
  std::unique_ptr<Primitives> cpu = MakeCpuPrimitives(1);
  std::vector<std::unique_ptr<Compressor>> on_cpu, on_gpu;
  std::vector<std::vector<float>> acc_cpu;
  std::vector<std::unique_ptr<ScratchBuffer>> acc_gpu;
  for (int r = 0; r < kNodes; ++r) {
    const CompressorSpec spec{c.name, c.density, c.params, r, kNodes, kN};
    auto a = MakeCompressor(spec, cpu.get());
    auto b = MakeCompressor(spec, gpu_.get());
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    on_cpu.push_back(std::move(*a));
    on_gpu.push_back(std::move(*b));
    acc_cpu.push_back(Data(kN, 100 + r));
    acc_gpu.push_back(Put(gpu_.get(), acc_cpu.back()));
    ASSERT_NE(acc_gpu.back(), nullptr);
  }
  const Pattern pattern = on_cpu[0]->pattern();
  const bool zero = pattern == Pattern::kSparseGather;
  double worst_size = 0, worst_overlap = 1;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Selection> sel_cpu(kNodes), sel_gpu(kNodes);
    for (int r = 0; r < kNodes; ++r) {
      SCOPED_TRACE(::testing::Message() << c.label << " step " << step << " rank " << r);
      std::vector<float> add_host;
      std::unique_ptr<ScratchBuffer> add_gpu;
      if (step % 2 == 1) {
        add_host = Data(kN, 1000 * step + r);
        add_gpu = Put(gpu_.get(), add_host);
      }
      ASSERT_TRUE(on_cpu[r]
                      ->Select(step, acc_cpu[r].data(),
                               add_host.empty() ? nullptr : add_host.data(), zero, &sel_cpu[r])
                      .ok());
      const absl::Status s = on_gpu[r]->Select(
          step, static_cast<float*>(acc_gpu[r]->data()),
          add_gpu ? static_cast<const float*>(add_gpu->data()) : nullptr, zero, &sel_gpu[r]);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE(gpu_->Health().ok()) << gpu_->Health();
      std::vector<float> acc_after = Get(gpu_.get(), *acc_gpu[r], kN);
      if (exact) {
        EXPECT_EQ(sel_gpu[r].idx, sel_cpu[r].idx);
        EXPECT_TRUE(SameBits(sel_gpu[r].val, sel_cpu[r].val));
        EXPECT_EQ(std::memcmp(sel_gpu[r].scalars, sel_cpu[r].scalars, sizeof(sel_cpu[r].scalars)),
                  0);
        EXPECT_TRUE(SameBits(acc_after, acc_cpu[r]));
      } else {
        const double a = sel_cpu[r].idx.size(), b = sel_gpu[r].idx.size();
        const double size_diff = std::abs(a - b) / std::max(1.0, a);
        std::vector<uint32_t> common;
        std::set_intersection(sel_cpu[r].idx.begin(), sel_cpu[r].idx.end(), sel_gpu[r].idx.begin(),
                              sel_gpu[r].idx.end(), std::back_inserter(common));
        const double overlap = common.size() / std::max(1.0, std::max(a, b));
        worst_size = std::max(worst_size, size_diff);
        worst_overlap = std::min(worst_overlap, overlap);
        EXPECT_LE(size_diff, 0.02) << "cpu selected " << a << ", gpu " << b;
        EXPECT_GE(overlap, 0.95) << "cpu selected " << a << ", gpu " << b << ", common "
                                 << common.size();
        // Keep the two sides on the same accumulator so one step's difference does not compound.
        ASSERT_TRUE(gpu_->CopyFromHost(acc_gpu[r]->data(), acc_cpu[r].data(), kN * 4).ok());
        sel_gpu[r] = sel_cpu[r];
      }
    }
    const testcases::AllSelections all = testcases::GatherSelections(sel_cpu, pattern);
    const Gathered g = all.view();
    const std::vector<uint32_t>& gathered = all.indices;
    for (int r = 0; r < kNodes; ++r) {
      ASSERT_TRUE(on_cpu[r]->Update(step, g).ok());
      ASSERT_TRUE(on_gpu[r]->Update(step, g).ok());
      if (pattern == Pattern::kIndexUnion) {
        ASSERT_TRUE(cpu->ZeroAt(acc_cpu[r].data(), kN, gathered.data(), gathered.size()).ok());
        std::vector<float> a = Get(gpu_.get(), *acc_gpu[r], kN);
        ASSERT_TRUE(cpu->ZeroAt(a.data(), kN, gathered.data(), gathered.size()).ok());
        ASSERT_TRUE(gpu_->CopyFromHost(acc_gpu[r]->data(), a.data(), kN * 4).ok());
      }
    }
  }
  if (!exact) {
    std::printf("[ %s ] worst size difference %.5f, worst overlap %.5f\n", c.label.c_str(),
                worst_size, worst_overlap);
  }
}

INSTANTIATE_TEST_SUITE_P(OnGpu, CudaCompressor, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.label; });

}  // namespace
}  // namespace spex
