// bfloat16 and float16 buckets on the engine's device path (docs/dtypes.md), without a GPU: the
// fake device (fake_device.h: host memory claiming to be a GPU's, CPU primitives claiming
// Device::kCuda that check every pointer's side) and several fake GPUs on one node
// (fake_node.h), against the CPU path fed the same half inputs:
//  - every compressor at bfloat16 and float16, 1 node x 2 trainers and 2 nodes x 2 trainers:
//    a half bucket with native wire values, one with wire_values=float32 and a dense half
//    bucket give every trainer, at every step, the CPU path's half output bit for bit; nothing
//    the device primitives touch is host memory, nothing staged is device memory;
//  - the dense half exchange stages only half values between device and host (2 bytes an
//    element each way);
//  - trainers on two fake GPUs (with and without peer access): bit-identical too;
//  - a trainer registering another type, and a NaN in a half input, get the CPU path's errors;
//    under nonfinite=propagate the NaN reaches the half outputs; the layout on the device is
//    2-byte slots and the header says the type;
//  - the dense-fallback probe (sparse buckets' steps run dense), node sums past float16's range
//    (sent as float32, every output finite) and a checkpoint resume of a half device bucket are
//    bit-identical too;
//  - half_math.h (the CUDA kernels' conversions, compiled here for the host) equals
//    kernels/half.h for every half pattern and at every rounding boundary of float32.
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/engine.h"
#include "gtest/gtest.h"
#include "kernels/compressor.h"
#include "kernels/cuda/half_math.h"
#include "kernels/half.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/fake_device.h"
#include "tests/support/fake_node.h"
#include "tests/support/synthetic_gradient.h"

namespace spex::test {
namespace {

using fake::FakeNode;

constexpr size_t kN = 12007;      // the two compressed buckets
constexpr size_t kDenseN = 3001;  // the dense half bucket
constexpr int kSteps = 4;
constexpr double kDensity = 0.01;
constexpr uint64_t kNative = 1, kF32Wire = 2, kDense = 3;

// Roughly Gaussian with a few larger positions, not integers: the order of additions shows in
// the bits (as half_engine_test's values).
float Value(int node, int trainer, uint64_t bucket, uint64_t step, size_t i) {
  return Gradient({node, trainer, bucket, step, i}, {GradientShape::kGaussian, 1e-2});
}

struct Layout {
  std::string compressor = "topk";
  DType dtype = DType::kBFloat16;
  int nodes = 2;
  int trainers = 2;
  // devices[node]: the node's GPU ordinals (the first is home); trainer t is on
  // devices[node][t % size]. Empty: the CPU path.
  std::vector<std::vector<int>> devices;
  bool peer = true;
  // kAuto: the probe's first 2 x probe_steps (3) steps alternate sparse and dense by step
  // number, so both runs take the same exchanges within kSteps.
  DenseFallback fallback = DenseFallback::kOff;
  // Step 0 of the compressed buckets hands in large values at every hundredth position, whose
  // node sums are past the type's range and whose averages fit (float16: 33,000 to 39,720 on
  // each trainer; docs/dtypes.md#values-past-the-types-range).
  bool big = false;
};

struct Run {
  // outputs[node][trainer][step][b]: the half output of bucket kNative, kF32Wire, kDense.
  std::vector<std::vector<std::vector<std::vector<std::vector<uint16_t>>>>> outputs;
  std::vector<std::unique_ptr<FakeNode>> nodes;
  std::vector<std::string> errors;
  bool header_ok = true;  // every header said the type and 2-byte slots
};

EngineClusterOptions Options(const Layout& l, std::vector<std::unique_ptr<FakeNode>>* nodes) {
  EngineClusterOptions o;
  o.nodes = l.nodes;
  o.trainers = l.trainers;
  o.hub_timeout = absl::Seconds(30);
  o.engine.shm_tag = "halfdevtest";
  o.engine.min_sparse_elements = 0;
  o.engine.dense_fallback = l.fallback;
  o.engine.probe_steps = 3;
  o.engine.residual_norm_every = 1;
  if (l.devices.empty()) {
    o.cpu_primitives = true;
    return o;
  }
  for (int n = 0; n < l.nodes; ++n) {
    nodes->push_back(std::make_unique<FakeNode>(l.devices[n], l.peer));
  }
  o.parts = [nodes](int n) {
    FakeNode* f = (*nodes)[n].get();
    return NodeParts{f->device_prims(), f->path()};
  };
  o.wrap = [nodes](int n, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), (*nodes)[n]->home());
  };
  return o;
}

int DeviceOf(const Layout& l, int node, int trainer) {
  if (l.devices.empty()) return -1;
  const std::vector<int>& d = l.devices[node];
  return d[trainer % d.size()];
}

Run RunLayout(const Layout& l) {
  const DType t = l.dtype;
  const uint64_t ids[3] = {kNative, kF32Wire, kDense};
  const size_t sizes[3] = {kN, kN, kDenseN};
  const std::string compressors[3] = {l.compressor, l.compressor, "dense"};
  const std::map<std::string, std::string> params[3] = {
      {{"dtype", DTypeName(t)}},
      {{"dtype", DTypeName(t)}, {"wire_values", "float32"}},
      {{"dtype", DTypeName(t)}}};
  Run r;
  r.outputs.assign(l.nodes, std::vector<std::vector<std::vector<std::vector<uint16_t>>>>(
                                l.trainers, std::vector<std::vector<std::vector<uint16_t>>>(
                                                kSteps, std::vector<std::vector<uint16_t>>(3))));
  r.errors.assign(l.nodes * l.trainers, "");
  EngineCluster cluster(Options(l, &r.nodes));
  if (!cluster.status().ok()) {
    r.errors[0] = cluster.status().ToString();
    return r;
  }
  std::atomic<int> bad_header{0};
  cluster.ForEachTrainer([&](int n, int k) {
    std::string& err = r.errors[n * l.trainers + k];
    auto tr = Trainer::Open(&cluster.engine(n), k, l.trainers);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (int b = 0; b < 3; ++b) {
      auto g =
          tr->Register(ids[b], sizes[b], compressors[b], kDensity, params[b], DeviceOf(l, n, k));
      if (!g.ok()) return void(err = g.status().ToString());
      // The header says the type and 2-byte slots; trainer k's slot lies (slots - k) strides
      // before the output (on another GPU its buffer has one slot of its own).
      const BucketHeader* h = tr->header(ids[b]);
      const bool remote = DeviceOf(l, n, k) > 0;
      const uint64_t to_output = g->device_buffer != nullptr
                                     ? g->device_output_offset - g->device_input_offset
                                     : g->output_offset - g->input_offset;
      bad_header += h->dtype != static_cast<uint32_t>(t) ||
                    h->slot_stride != SlotStride(sizes[b], 2) ||
                    to_output != (remote ? 1 : l.trainers - k) * SlotStride(sizes[b], 2);
    }
    for (int s = 0; s < kSteps; ++s) {
      for (int b = 0; b < 3; ++b) {
        auto* in = reinterpret_cast<uint16_t*>(tr->input(ids[b]));
        for (size_t i = 0; i < sizes[b]; ++i) {
          const bool large = l.big && s == 0 && ids[b] != kDense && i % 100 == 0;
          in[i] = FloatToHalf(t, large ? 33000.0f + 70.0f * (i % 97) : Value(n, k, ids[b], s, i));
        }
      }
      // Trainer 0 through the RPC path, the others through the doorbell.
      for (int b = 0; b < 3; ++b) {
        if (k == 0) {
          auto rec = tr->Exchange(ids[b], s, absl::Seconds(30));
          if (!rec.ok()) return void(err = rec.status().ToString());
        } else {
          absl::Status st = tr->Ring(ids[b], s);
          if (!st.ok()) return void(err = st.ToString());
        }
        const auto* out = reinterpret_cast<const uint16_t*>(tr->output(ids[b]));
        r.outputs[n][k][s][b].assign(out, out + sizes[b]);
      }
    }
  });
  r.header_ok = bad_header.load() == 0;
  return r;
}

// Runs `l` on the CPU path and on its devices and compares every trainer's half outputs;
// *nonfinite (when given) counts the CPU path's outputs that are NaN or infinite.
void ExpectSameAsCpu(const Layout& l, int* nonfinite = nullptr) {
  Layout cpu_layout = l;
  cpu_layout.devices.clear();
  const Run cpu = RunLayout(cpu_layout);
  const Run dev = RunLayout(l);
  for (const std::string& e : cpu.errors) ASSERT_EQ(e, "") << "CPU path";
  for (const std::string& e : dev.errors) ASSERT_EQ(e, "") << "device path";
  EXPECT_TRUE(cpu.header_ok) << "CPU path: a header not saying the type and 2-byte slots";
  EXPECT_TRUE(dev.header_ok) << "device path: a header not saying the type and 2-byte slots";
  const char* names[3] = {"native wire", "float32 wire", "dense"};
  for (int b = 0; b < 3; ++b) {
    int differing = 0, first_node = -1, first_step = -1;
    size_t first_i = 0;
    for (int n = 0; n < l.nodes; ++n) {
      for (int k = 0; k < l.trainers; ++k) {
        for (int s = 0; s < kSteps; ++s) {
          const std::vector<uint16_t>& a = cpu.outputs[n][k][s][b];
          const std::vector<uint16_t>& d = dev.outputs[n][k][s][b];
          if (a.size() != d.size() || a.empty()) {
            ++differing;
            continue;
          }
          for (size_t i = 0; i < a.size(); ++i) {
            if (a[i] == d[i]) continue;
            if (differing++ == 0) first_node = n, first_step = s, first_i = i;
          }
        }
      }
    }
    EXPECT_EQ(differing, 0) << names[b] << ": half outputs differing between the CPU path and "
                            << "the device path; the first at node " << first_node << " step "
                            << first_step << " element " << first_i;
  }
  for (const auto& node : dev.nodes) {
    EXPECT_TRUE(node->violations().empty()) << node->violations().front();
  }
  if (nonfinite != nullptr) {
    *nonfinite = 0;
    for (const auto& node : cpu.outputs) {
      for (const auto& trainer : node) {
        for (const auto& step : trainer) {
          for (const auto& out : step) {
            for (uint16_t h : out) *nonfinite += !std::isfinite(HalfToFloat(l.dtype, h));
          }
        }
      }
    }
  }
  // The outputs moved every step: a run whose outputs never changed would compare equal too.
  const auto& o = cpu.outputs[0][0];
  EXPECT_NE(o[0][0], o[kSteps - 1][0]);
}

struct Case {
  std::string compressor;
  DType dtype;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.compressor << " " << DTypeName(c.dtype); }

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return info.param.compressor + "_" + DTypeName(info.param.dtype);
}

class HalfDeviceTest : public ::testing::TestWithParam<Case> {};

TEST_P(HalfDeviceTest, OneNodeTwoTrainersBitIdenticalToTheCpuPath) {
  Layout l;
  l.compressor = GetParam().compressor;
  l.dtype = GetParam().dtype;
  l.nodes = 1;
  l.devices = {{0}};
  ExpectSameAsCpu(l);
}

TEST_P(HalfDeviceTest, TwoNodesTwoTrainersBitIdenticalToTheCpuPath) {
  Layout l;
  l.compressor = GetParam().compressor;
  l.dtype = GetParam().dtype;
  l.nodes = 2;
  l.devices = {{0}, {0}};
  ExpectSameAsCpu(l);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string& name : CompressorNames()) {
    for (DType t : {DType::kBFloat16, DType::kFloat16}) cases.push_back({name, t});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllCompressors, HalfDeviceTest, ::testing::ValuesIn(AllCases()), CaseName);

// The dense-fallback probe runs some steps of the sparse buckets dense: the dense half exchange
// with a float32 output widened on the device (a sparse bucket's next step reads it).
TEST(HalfDeviceFallback, SparseBucketsStepsRunDenseBitIdenticalToTheCpuPath) {
  for (const char* compressor : {"topk", "micro"}) {
    SCOPED_TRACE(compressor);
    Layout l;
    l.compressor = compressor;
    l.dtype = DType::kBFloat16;
    l.devices = {{0}, {0}};
    l.fallback = DenseFallback::kAuto;
    ExpectSameAsCpu(l);
  }
}

// Node sums past float16's range (docs/dtypes.md#values-past-the-types-range): the values that
// do not fit go as float32, and the residual is zeroed there, on the device path as on the CPU
// path (pattern B's remainders added on the device, pattern A's union, the dense probe step's
// check of its device output): bit-identical, and every output finite.
TEST(HalfDeviceOverflow, NodeSumsPastTheRangeBitIdenticalToTheCpuPathAndFinite) {
  for (const char* compressor : {"topk", "micro"}) {
    for (DenseFallback fallback : {DenseFallback::kOff, DenseFallback::kAuto}) {
      SCOPED_TRACE(absl::StrCat(compressor, fallback == DenseFallback::kAuto ? " probe" : ""));
      Layout l;
      l.compressor = compressor;
      l.dtype = DType::kFloat16;
      l.devices = {{0}, {0}};
      l.fallback = fallback;
      l.big = true;
      int nonfinite = -1;
      ExpectSameAsCpu(l, &nonfinite);
      EXPECT_EQ(nonfinite, 0);
    }
  }
}

// Several GPUs on one node: trainer 1's buffer on GPU 1, its input gathered to GPU 0 and the
// half output delivered back, with and without peer access.
TEST(HalfMultiDevice, TrainersOnTwoGpusBitIdenticalToTheCpuPath) {
  for (bool peer : {true, false}) {
    for (const char* compressor : {"topk", "micro"}) {
      SCOPED_TRACE(absl::StrCat(compressor, peer ? " with peer access" : " staged"));
      Layout l;
      l.compressor = compressor;
      l.dtype = peer ? DType::kBFloat16 : DType::kFloat16;
      l.nodes = 2;
      l.devices = {{0, 1}, {0, 1}};
      l.peer = peer;
      ExpectSameAsCpu(l);
    }
  }
}

EngineClusterOptions OneDeviceNode(fake::FakeDevice* device, int trainers) {
  EngineClusterOptions o;
  o.nodes = 1;
  o.trainers = trainers;
  o.hub_timeout = absl::Seconds(5);
  o.engine.shm_tag = "halfdevtest";
  o.parts = [device](int) { return NodeParts{device->device_prims(), device->path()}; };
  o.wrap = [device](int, std::unique_ptr<Collective> c) {
    return fake::CheckedCollective(std::move(c), device);
  };
  return o;
}

// The dense half exchange of a device bucket rounds on the device and stages only half values:
// per step exactly n * 2 bytes down and n * 2 up, against 4 bytes an element for a float32
// bucket of the same size on the same engines.
TEST(HalfDeviceStaging, TheDenseHalfExchangeStagesHalfValuesOnly) {
  constexpr size_t n = 40000;
  std::vector<std::unique_ptr<FakeNode>> nodes;
  Layout l;
  l.nodes = 2;
  l.trainers = 1;
  l.devices = {{0}, {0}};
  EngineClusterOptions o = Options(l, &nodes);
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<fake::Staging> half_step(2), f32_step(2);
  std::vector<std::string> errors(2);
  cluster.ForEachTrainer([&](int node, int) {
    std::string& err = errors[node];
    auto tr = Trainer::Open(&cluster.engine(node), 0, 1);
    if (!tr.ok()) return void(err = tr.status().ToString());
    if (!tr->Register(5, n, "dense", 0, {{"dtype", "bfloat16"}}).ok()) return void(err = "reg 5");
    if (!tr->Register(6, n, "dense", 0).ok()) return void(err = "reg 6");
    auto* in5 = reinterpret_cast<uint16_t*>(tr->input(5));
    for (size_t i = 0; i < n; ++i) in5[i] = FloatToBf16(Value(node, 0, 5, 0, i));
    tr->Fill(6, [&](size_t i) { return Value(node, 0, 6, 0, i); });
    fake::FakeDevice* d = nodes[node]->home();
    const fake::Staging s0 = d->staging();
    if (!tr->Exchange(5, 0).ok()) return void(err = "exchange 5");
    const fake::Staging s1 = d->staging();
    if (!tr->Exchange(6, 0).ok()) return void(err = "exchange 6");
    const fake::Staging s2 = d->staging();
    half_step[node].to_host_bytes = s1.to_host_bytes - s0.to_host_bytes;
    half_step[node].from_host_bytes = s1.from_host_bytes - s0.from_host_bytes;
    f32_step[node].to_host_bytes = s2.to_host_bytes - s1.to_host_bytes;
    f32_step[node].from_host_bytes = s2.from_host_bytes - s1.from_host_bytes;
  });
  for (int node = 0; node < 2; ++node) {
    EXPECT_EQ(errors[node], "");
    EXPECT_EQ(half_step[node].to_host_bytes, n * 2) << "node " << node;
    EXPECT_EQ(half_step[node].from_host_bytes, n * 2) << "node " << node;
    // The float32 dense bucket's all-reduce runs on the device (NCCL's part): nothing staged.
    EXPECT_EQ(f32_step[node].to_host_bytes, 0u) << "node " << node;
  }
  for (const auto& node : nodes) EXPECT_TRUE(node->violations().empty());
}

TEST(HalfDeviceErrors, TrainersRegisteringAnotherTypeAreRefusedNamingBoth) {
  fake::FakeDevice device;
  EngineCluster cluster(OneDeviceNode(&device, 2));
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  Engine& e = cluster.engine(0);
  auto a = e.Hello("", 0, 2, 0, "t");
  auto b = e.Hello("", 1, 2, 0, "t");
  ASSERT_TRUE(a.ok() && b.ok());
  auto bf = e.RegisterBucket(a->session_id, 4, 1000, "dense", 0, {{"dtype", "bfloat16"}});
  ASSERT_TRUE(bf.ok()) << bf.status();
  ASSERT_NE(bf->device_buffer, nullptr) << "a half bucket on the device path";
  auto f16 = e.RegisterBucket(b->session_id, 4, 1000, "dense", 0, {{"dtype", "float16"}});
  ASSERT_EQ(f16.status().code(), absl::StatusCode::kInvalidArgument) << f16.status();
  EXPECT_NE(f16.status().message().find("registered as bfloat16"), std::string::npos);
  EXPECT_NE(f16.status().message().find("says float16"), std::string::npos);
  auto f32 = e.RegisterBucket(b->session_id, 4, 1000, "dense", 0);
  ASSERT_EQ(f32.status().code(), absl::StatusCode::kInvalidArgument) << f32.status();
  EXPECT_NE(f32.status().message().find("says float32"), std::string::npos) << f32.status();
  auto ok = e.RegisterBucket(b->session_id, 4, 1000, "dense", 0, {{"dtype", "bf16"}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->device_output_offset - ok->device_input_offset, SlotStride(1000, 2))
      << "2-byte device slots";
  EXPECT_EQ(ok->device_buffer->size(), DeviceBucketBytes(1000, 2, 2));
}

TEST(HalfDeviceErrors, ANaNInAHalfInputFailsTheStepNamingTheTrainer) {
  fake::FakeDevice device;
  EngineClusterOptions o = OneDeviceNode(&device, 2);
  o.engine.nonfinite = NonfinitePolicy::kError;
  o.engine.min_sparse_elements = 0;  // topk, not dense, at 500 elements
  o.engine.dense_fallback = DenseFallback::kOff;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<absl::Status> st(2);
  std::vector<std::vector<uint16_t>> next(2);
  cluster.ForEachTrainer([&](int, int k) {
    auto tr = Trainer::Open(&cluster.engine(0), k, 2);
    ASSERT_TRUE(tr.ok());
    ASSERT_TRUE(tr->Register(9, 500, "topk", 0.1, {{"dtype", "float16"}}).ok());
    auto* in = reinterpret_cast<uint16_t*>(tr->input(9));
    for (size_t i = 0; i < 500; ++i) in[i] = FloatToF16(0.5f);
    if (k == 1) in[123] = 0x7e00;  // NaN
    st[k] = tr->Exchange(9, 0).status();
    // The bucket goes on: the next step is clean.
    for (size_t i = 0; i < 500; ++i) in[i] = FloatToF16(0.25f * (i % 7 == 0));
    auto rec = tr->Exchange(9, 1);
    EXPECT_TRUE(rec.ok()) << rec.status();
    const auto* out = reinterpret_cast<const uint16_t*>(tr->output(9));
    next[k].assign(out, out + 500);
  });
  for (const absl::Status& s : st) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("123"), std::string::npos) << s;
    EXPECT_NE(s.message().find("local trainer 1"), std::string::npos) << s;
  }
  // Step 1 (step 0 was skipped, its residual kept: zero): 72 positions hold 0.25 from both
  // trainers; topk at 10% sends about 50 of them, averaged to 0.25 (exact in float16), and
  // nothing else.
  int selected = 0, wrong = 0;
  for (size_t i = 0; i < 500; ++i) {
    selected += next[0][i] == FloatToF16(0.25f);
    wrong += next[0][i] != 0 && (next[0][i] != FloatToF16(0.25f) || i % 7 != 0);
  }
  EXPECT_GE(selected, 45);
  EXPECT_LE(selected, 55);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(next[0], next[1]);
  EXPECT_TRUE(device.violations().empty());
}

// nonfinite=propagate: a NaN in one trainer's half input makes a sparse half bucket's whole
// output NaN (FillNonfinite into the device's float32 output, rounded on the device) for every
// trainer, and the next clean step is normal again; a dense one carries the NaN where it was.
TEST(HalfDeviceErrors, UnderPropagateANaNInputGivesNaNOutputs) {
  fake::FakeDevice device;
  EngineClusterOptions o = OneDeviceNode(&device, 2);
  o.engine.nonfinite = NonfinitePolicy::kPropagate;
  o.engine.min_sparse_elements = 0;
  o.engine.dense_fallback = DenseFallback::kOff;
  EngineCluster cluster(o);
  ASSERT_TRUE(cluster.status().ok()) << cluster.status();
  std::vector<std::string> errors(2);
  std::vector<int> nan_sparse(2), nan_dense(2), nan_next(2);
  cluster.ForEachTrainer([&](int, int k) {
    std::string& err = errors[k];
    auto tr = Trainer::Open(&cluster.engine(0), k, 2);
    if (!tr.ok()) return void(err = tr.status().ToString());
    for (uint64_t id : {7, 8}) {
      if (!tr->Register(id, 400, id == 7 ? "topk" : "dense", 0.1, {{"dtype", "bfloat16"}}).ok()) {
        return void(err = "register");
      }
    }
    for (int s = 0; s < 2; ++s) {
      for (uint64_t id : {7, 8}) {
        auto* in = reinterpret_cast<uint16_t*>(tr->input(id));
        for (size_t i = 0; i < 400; ++i) in[i] = FloatToBf16(0.5f + i * 0.01f);
        if (s == 0 && k == 1) in[17] = 0x7fc0;  // NaN
        auto rec = tr->Exchange(id, s);
        if (!rec.ok()) return void(err = rec.status().ToString());
        const auto* out = reinterpret_cast<const uint16_t*>(tr->output(id));
        int nans = 0;
        for (size_t i = 0; i < 400; ++i) nans += std::isnan(Bf16ToFloat(out[i]));
        (s == 1 ? nan_next : id == 7 ? nan_sparse : nan_dense)[k] += nans;
      }
    }
  });
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(errors[k], "");
    EXPECT_EQ(nan_sparse[k], 400) << "trainer " << k << ": the sparse bucket's output all NaN";
    EXPECT_EQ(nan_dense[k], 1) << "trainer " << k << ": the dense bucket's NaN where it was";
    EXPECT_EQ(nan_next[k], 0) << "trainer " << k << ": the next step clean";
  }
  EXPECT_TRUE(device.violations().empty());
}

// A half device bucket's checkpoint (docs/checkpoint.md): 2 nodes stopped after 2 of 4 steps
// and resumed on fresh engines and fake devices from their records give the uninterrupted job's
// half outputs bit for bit; resumed without the records they differ.
struct HalfJob {
  std::vector<std::vector<uint16_t>> out;  // [step * 2 + node]
  std::vector<std::string> saved, errors;
};

HalfJob RunHalfJob(int first, int last, const std::vector<std::string>* load, bool save) {
  constexpr int kJobNodes = 2;
  HalfJob job;
  job.out.assign(kSteps * kJobNodes, {});
  job.saved.assign(kJobNodes, "");
  job.errors.assign(kJobNodes, "");
  std::vector<std::unique_ptr<FakeNode>> nodes;
  Layout l;
  l.nodes = kJobNodes;
  l.trainers = 1;
  l.devices = {{0}, {0}};
  EngineCluster cluster(Options(l, &nodes));
  if (!cluster.status().ok()) {
    job.errors[0] = cluster.status().ToString();
    return job;
  }
  cluster.ForEachTrainer([&](int n, int) {
    std::string& err = job.errors[n];
    auto tr = Trainer::Open(&cluster.engine(n), 0, 1);
    if (!tr.ok()) return void(err = tr.status().ToString());
    auto g = tr->Register(kNative, kN, "topk", kDensity, {{"dtype", "bfloat16"}});
    if (!g.ok()) return void(err = g.status().ToString());
    if (g->device_buffer == nullptr) return void(err = "not a device bucket");
    if (load != nullptr) {
      absl::Status s = cluster.engine(n).LoadBucketState(tr->session_id(), kNative, (*load)[n]);
      if (!s.ok()) return void(err = s.ToString());
    }
    for (int s = 0; s + first < last; ++s) {
      auto* in = reinterpret_cast<uint16_t*>(tr->input(kNative));
      for (size_t i = 0; i < kN; ++i) in[i] = FloatToBf16(Value(n, 0, kNative, s + first, i));
      auto rec = tr->Exchange(kNative, s);
      if (!rec.ok()) return void(err = rec.status().ToString());
      const auto* out = reinterpret_cast<const uint16_t*>(tr->output(kNative));
      job.out[(s + first) * kJobNodes + n].assign(out, out + kN);
    }
    if (save) {
      auto rec = cluster.engine(n).SaveBucketState(tr->session_id(), kNative);
      if (!rec.ok()) return void(err = rec.status().ToString());
      job.saved[n] = *rec;
    }
  });
  return job;
}

TEST(HalfDeviceCheckpoint, AResumedHalfDeviceJobIsBitIdentical) {
  constexpr int kStop = 2;
  const HalfJob whole = RunHalfJob(0, kSteps, nullptr, false);
  const HalfJob before = RunHalfJob(0, kStop, nullptr, true);
  const HalfJob resumed = RunHalfJob(kStop, kSteps, &before.saved, false);
  const HalfJob fresh = RunHalfJob(kStop, kSteps, nullptr, false);
  for (const HalfJob* j : {&whole, &before, &resumed, &fresh}) {
    for (const std::string& e : j->errors) ASSERT_EQ(e, "");
  }
  auto same_from = [](const HalfJob& a, const HalfJob& b, int first) {
    for (size_t j = first * 2; j < a.out.size(); ++j) {
      if (a.out[j].empty() || a.out[j] != b.out[j]) return false;
    }
    return true;
  };
  EXPECT_TRUE(same_from(resumed, whole, kStop)) << "the resumed half device job differs";
  EXPECT_FALSE(same_from(fresh, whole, kStop)) << "resuming without the records should differ";
}

// The CUDA kernels' conversions (half_math.h) against kernels/half.h.
TEST(HalfMath, WideningEqualsKernelsHalfForEveryPattern) {
  int wrong_bf16 = 0, wrong_f16 = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    wrong_bf16 += FloatBits(gpu::WidenBf16(x)) != FloatBits(Bf16ToFloat(x));
    wrong_f16 += FloatBits(gpu::WidenF16(x)) != FloatBits(F16ToFloat(x));
  }
  EXPECT_EQ(wrong_bf16, 0);
  EXPECT_EQ(wrong_f16, 0);
}

TEST(HalfMath, NarrowingEqualsKernelsHalfAtEveryBoundary) {
  // Every float whose top 16 bits are any pattern, with low bits at and around each place a
  // rounding decision changes (bfloat16 at bit 16, float16 normals at bit 13, float16
  // subnormals at bits 14..24), plus a pseudo-random spread.
  std::vector<uint32_t> lows = {0,      1,      0x7fff, 0x8000, 0x8001, 0xffff, 0x0fff,
                                0x1000, 0x1001, 0x2000, 0x3000, 0x5000, 0x6000};
  for (int b = 13; b < 16; ++b) {
    for (uint32_t d : {0u, 1u}) {
      lows.push_back((1u << b) - d);
      lows.push_back((1u << b) + d);
    }
  }
  uint64_t checked = 0;
  int wrong_bf16 = 0, wrong_f16 = 0;
  uint32_t first_wrong = 0;
  auto check = [&](uint32_t u) {
    const float f = BitsFloat(u);
    ++checked;
    const bool bf16_wrong = gpu::NarrowBf16(f) != FloatToBf16(f);
    const bool f16_wrong = gpu::NarrowF16(f) != FloatToF16(f);
    if ((bf16_wrong || f16_wrong) && wrong_bf16 + wrong_f16 == 0) first_wrong = u;
    wrong_bf16 += bf16_wrong;
    wrong_f16 += f16_wrong;
  };
  for (uint32_t hi = 0; hi < 65536; ++hi) {
    for (uint32_t lo : lows) check((hi << 16) | (lo & 0xffff));
  }
  // The float16 subnormal range (|f| < 2^-14, exponents 102..112) exhaustively at a stride.
  for (uint32_t u = 0x33000000u - 64; u < 0x38800000u + 64; u += 7) {
    check(u);
    check(u | 0x80000000u);
  }
  uint64_t x = 1;
  for (int i = 0; i < 2000000; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    check(static_cast<uint32_t>(x >> 32));
  }
  EXPECT_GT(checked, 4000000u);
  EXPECT_EQ(wrong_bf16, 0) << "first at bits 0x" << std::hex << first_wrong;
  EXPECT_EQ(wrong_f16, 0) << "first at bits 0x" << std::hex << first_wrong;
}

}  // namespace
}  // namespace spex::test
