// Compressor::SaveState/LoadState, the compressor part of a training checkpoint: every registered
// compressor, restored into a fresh cluster (with the residuals), continues bit-identically to
// the one it was saved from; a cluster given only the residuals drifts off for the compressors
// with controller state (so the saved state is what makes the difference); bad blobs are named
// errors that change nothing.
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/primitives.h"
#include "kernels/reference_cluster.h"
#include "tests/kernels/compressor_test_util.h"

namespace spex {
namespace {

constexpr size_t kN = 20000;
constexpr int kNodes = 2;
constexpr uint64_t kSaveAt = 7;  // past sidco's first stage adaptation (every 5 steps)
constexpr uint64_t kSteps = 20;

struct Case {
  std::string name;
  std::map<std::string, std::string> params;
  std::string label() const { return params.empty() ? name : name + "+" + params.begin()->second; }
};

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& name : CompressorNames()) cases.push_back({name, {}});
  cases.push_back({"micro", {{"threshold_control", "reference"}}});
  cases.push_back({"exdyna", {{"threshold_control", "reference"}}});
  return cases;
}

std::unique_ptr<ReferenceCluster> MakeCluster(const Case& c, Primitives* prims) {
  auto made = ReferenceCluster::Create({c.name, 0.01, c.params, 0, 1, kN}, kNodes, 1, true, prims);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

// Runs one step with every node's input drawn from (step, node); the averaged output.
std::vector<float> RunStep(ReferenceCluster& cluster, uint64_t step) {
  std::vector<std::vector<float>> in;
  std::vector<std::vector<const float*>> ptrs(kNodes);
  for (int r = 0; r < kNodes; ++r) {
    in.push_back(Laplace(kN, static_cast<uint32_t>(step * 31 + r + 1)));
    // A few heavy entries per node so that the selection moves between partitions.
    for (size_t i = (step * 977 + r * 131) % 4000; i < kN; i += 4000 + step) in[r][i] *= 40;
  }
  for (int r = 0; r < kNodes; ++r) ptrs[r].push_back(in[r].data());
  std::vector<float> out(kN);
  EXPECT_TRUE(cluster.Step(step, ptrs, out.data()).ok());
  return out;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Copies the residuals, and the compressor states when `states`, from one cluster to another.
void Restore(ReferenceCluster& from, ReferenceCluster& to, bool states) {
  for (int r = 0; r < kNodes; ++r) {
    to.set_residual(r, from.residual(r));
    if (!states) continue;
    absl::StatusOr<std::string> blob = from.compressor(r).SaveState();
    ASSERT_TRUE(blob.ok()) << blob.status();
    ASSERT_TRUE(to.compressor(r).LoadState(*blob).ok());
  }
}

class CompressorStateTest : public ::testing::TestWithParam<Case> {};

TEST_P(CompressorStateTest, RestoredCompressorContinuesBitIdentically) {
  const Case& c = GetParam();
  auto prims = MakeCpuPrimitives(1);
  auto saved = MakeCluster(c, prims.get());
  auto restored = MakeCluster(c, prims.get());
  for (uint64_t step = 0; step < kSaveAt; ++step) RunStep(*saved, step);
  Restore(*saved, *restored, true);
  for (uint64_t step = kSaveAt; step < kSteps; ++step) {
    ASSERT_TRUE(SameBits(RunStep(*saved, step), RunStep(*restored, step)))
        << c.label() << " differs at step " << step;
  }
  for (int r = 0; r < kNodes; ++r) {
    EXPECT_EQ(*saved->compressor(r).SaveState(), *restored->compressor(r).SaveState());
  }
}

INSTANTIATE_TEST_SUITE_P(All, CompressorStateTest, ::testing::ValuesIn(AllCases()),
                         [](const auto& info) {
                           std::string s = info.param.label();
                           for (char& ch : s) {
                             if (ch == '+' || ch == '-') ch = '_';
                           }
                           return s;
                         });

// The control: the same run restored without the compressor state (residuals only) gives a
// different output for the compressors that carry controller state between steps.
TEST(CompressorStateControl, WithoutTheStateTheRunDiffers) {
  // (exdyna's default histogram control meets every partition's quota exactly, so its layout
  // never moves on these inputs; its reference control moves the threshold and the layout.)
  const std::vector<Case> stateful = {{"exdyna", {{"threshold_control", "reference"}}},
                                      {"sage", {}},
                                      {"sidco_e", {}},
                                      {"deft", {}},
                                      {"micro", {{"threshold_control", "reference"}}}};
  auto prims = MakeCpuPrimitives(1);
  for (const Case& c : stateful) {
    auto saved = MakeCluster(c, prims.get());
    auto fresh = MakeCluster(c, prims.get());
    for (uint64_t step = 0; step < kSaveAt; ++step) RunStep(*saved, step);
    Restore(*saved, *fresh, false);
    bool differs = false;
    for (uint64_t step = kSaveAt; step < kSteps; ++step) {
      differs |= !SameBits(RunStep(*saved, step), RunStep(*fresh, step));
    }
    EXPECT_TRUE(differs) << c.label() << ": the compressor state made no difference";
  }
}

std::unique_ptr<Compressor> Made(const std::string& name, size_t n, int rank, int nodes,
                                 Primitives* prims) {
  return MustMake(name, 0.01, n, prims, {}, rank, nodes);
}

// A blob that does not fit is refused with a message naming what differs, and changes nothing:
// the compressor goes on exactly like an untouched twin.
TEST(CompressorStateErrors, MismatchesAreNamedAndChangeNothing) {
  auto prims = MakeCpuPrimitives(1);
  auto source = Made("sage", kN, 0, 2, prims.get());
  std::vector<float> acc = Laplace(kN, 3);
  Selection sel;
  ASSERT_TRUE(source->Select(0, acc.data(), nullptr, true, &sel).ok());
  const std::string blob = *source->SaveState();

  struct Bad {
    std::unique_ptr<Compressor> target;
    std::string expect;
  };
  std::vector<Bad> bad;
  bad.push_back({Made("topk", kN, 0, 2, prims.get()), "the checkpoint is of compressor 'sage'"});
  bad.push_back({Made("sage", kN + 1, 0, 2, prims.get()), "20000-element bucket"});
  bad.push_back({Made("sage", kN, 0, 4, prims.get()), "saved by node 0 of 2, this is node 0 of 4"});
  bad.push_back({Made("sage", kN, 1, 2, prims.get()), "saved by node 0 of 2, this is node 1 of 2"});
  for (Bad& b : bad) {
    const absl::Status s = b.target->LoadState(blob);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find(b.expect), std::string::npos) << s;
  }
}

TEST(CompressorStateErrors, TruncatedOrCorruptBlobsAreDataLoss) {
  auto prims = MakeCpuPrimitives(1);
  for (const std::string name : {"exdyna", "sidco_e", "deft", "micro"}) {
    auto source = Made(name, kN, 0, 1, prims.get());
    std::vector<float> acc = Laplace(kN, 5);
    Selection sel;
    ASSERT_TRUE(source->Select(0, acc.data(), nullptr, false, &sel).ok());
    const std::string blob = *source->SaveState();
    auto target = Made(name, kN, 0, 1, prims.get());
    const std::string before = *target->SaveState();
    for (size_t len = 0; len < blob.size(); ++len) {
      const absl::Status s = target->LoadState(blob.substr(0, len));
      EXPECT_FALSE(s.ok()) << name << " took a blob cut to " << len << " bytes";
    }
    for (size_t at = 0; at < blob.size(); ++at) {
      std::string corrupt = blob;
      corrupt[at] ^= 0x10;
      const absl::Status s = target->LoadState(corrupt);
      EXPECT_FALSE(s.ok()) << name << " took a blob with byte " << at << " flipped";
    }
    EXPECT_EQ(*target->SaveState(), before) << name << ": a refused blob changed the state";
    std::string version = blob;
    version[4] = 9;
    const absl::Status s = target->LoadState(version);
    EXPECT_NE(s.message().find("format version 9"), std::string::npos) << s;
    EXPECT_TRUE(target->LoadState(blob).ok());
    EXPECT_EQ(*target->SaveState(), blob);
  }
}

// A compressor without SaveOwnState says so by name.
class Unsaved final : public Compressor {
 public:
  explicit Unsaved(Primitives* p) : Compressor({"unsaved", 0.5, {}, 0, 1, 8}, p) {}
  Pattern pattern() const override { return Pattern::kDense; }

 protected:
  absl::Status DoSelect(const StepContext&, float*, const float*, bool, Selection*) override {
    return absl::OkStatus();
  }
};

TEST(CompressorStateErrors, UnsupportedCompressorIsNamed) {
  auto prims = MakeCpuPrimitives(1);
  Unsaved c(prims.get());
  EXPECT_FALSE(c.SupportsState());
  const absl::Status save = c.SaveState().status();
  EXPECT_EQ(save.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(save.message().find("checkpointing is not supported for unsaved"), std::string::npos);
  EXPECT_EQ(c.LoadState("x").code(), absl::StatusCode::kUnimplemented);
  for (const std::string& name : CompressorNames()) {
    EXPECT_TRUE(Made(name, kN, 0, 1, prims.get())->SupportsState()) << name;
  }
}

}  // namespace
}  // namespace spex
