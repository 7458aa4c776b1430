// libFuzzer target: the compressor request validator (ValidateCompressor: name, density and
// parameters, as RegisterBucket passes them) and, for an accepted request, the compressor it
// builds (MakeCompressor on the reference primitives, 1..4 nodes, 1..2048 elements): a few
// steps of Select with fuzzed gradients (NaN and infinities included) and Update with what
// the other nodes "gathered" — valid shapes, and fuzzed ones that Update must refuse. A
// compressor's selection must be ascending, unique and in range, its values the inputs.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/compressor.h"
#include "kernels/reference/reference_primitives.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

const char* const kKeys[] = {"seed",           "threshold_control",
                             "histogram_trim", "refine",
                             "search",         "trim",
                             "stages",         "adaptive",
                             "compact",        "threshold",
                             "sample_ratio",   "units_per_node",
                             "no_such_key",    ""};
const char* const kValues[] = {"0",
                               "1",
                               "-1",
                               "7",
                               "1e-6",
                               "1e30",
                               "1e309",
                               "nan",
                               "inf",
                               "-inf",
                               "0.5",
                               "true",
                               "false",
                               "yes",
                               "band",
                               "reference",
                               "histogram",
                               "32",
                               "33",
                               "1024",
                               "1025",
                               "18446744073709551615",
                               "18446744073709551616",
                               "0x10",
                               " 1",
                               ""};

std::string Pick(FuzzedDataProvider& in, const char* const* list, size_t n) {
  if (in.ConsumeBool()) return list[in.ConsumeIntegralInRange<size_t>(0, n - 1)];
  return in.ConsumeRandomLengthString(40);
}

float Value(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 0:
      return NAN;
    case 1:
      return INFINITY;
    case 2:
      return -INFINITY;
    case 3:
      return 0.0f;
    default:
      return in.ConsumeFloatingPointInRange<float>(-1e3f, 1e3f);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static const std::vector<std::string> names = spex::CompressorNames();
  std::string name = in.ConsumeBool()
                         ? names[in.ConsumeIntegralInRange<size_t>(0, names.size() - 1)]
                         : in.ConsumeRandomLengthString(24);
  double density;
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      density = in.ConsumeFloatingPoint<double>();
      break;
    case 1:
      density = in.ConsumeProbability<double>();
      break;
    default:
      density = std::ldexp(1.0, -in.ConsumeIntegralInRange<int>(0, 12));
  }
  std::map<std::string, std::string> params;
  const int np = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < np; ++i) {
    std::string key = Pick(in, kKeys, sizeof(kKeys) / sizeof(kKeys[0]));
    params[key] = Pick(in, kValues, sizeof(kValues) / sizeof(kValues[0]));
  }
  const absl::Status valid = spex::ValidateCompressor(name, density, params);
  if (!valid.ok()) {
    Check(valid.code() == absl::StatusCode::kInvalidArgument && !valid.message().empty());
    return 0;
  }
  Check(density > 0 && density <= 1);

  spex::CompressorSpec spec;
  spec.name = name;
  spec.density = density;
  spec.params = params;
  spec.node_count = in.ConsumeIntegralInRange<int>(1, 4);
  spec.node_rank = in.ConsumeIntegralInRange<int>(0, spec.node_count - 1);
  spec.elements = in.ConsumeIntegralInRange<size_t>(1, in.ConsumeBool() ? 256 : 2048);
  static std::unique_ptr<spex::Primitives> prims = spex::MakeReferencePrimitives();
  auto made = spex::MakeCompressor(spec, prims.get());
  if (!made.ok()) {
    Check(made.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  spex::Compressor& c = **made;
  const size_t n = spec.elements;
  const spex::Pattern pattern = c.pattern();
  std::vector<float> acc(n), add(n), before(n);
  spex::Selection sel;
  const int steps = in.ConsumeIntegralInRange<int>(1, 4);
  for (int step = 0; step < steps; ++step) {
    const bool fill_all = in.ConsumeBool();
    for (size_t i = 0; i < n; ++i) {
      add[i] = (fill_all || in.ConsumeBool()) ? Value(in) : 0.0f;
    }
    const bool zero = pattern != spex::Pattern::kIndexUnion && in.ConsumeBool();
    for (size_t i = 0; i < n; ++i) before[i] = acc[i] + add[i];
    absl::Status s = c.Select(step, acc.data(), add.data(), zero, &sel);
    if (!s.ok()) return 0;  // a refusal (e.g. non-finite input) is an answer, not a crash
    if (sel.all) {
      Check(pattern == spex::Pattern::kDense && sel.val.size() == n);
    } else {
      Check(sel.val.size() == sel.idx.size() || pattern == spex::Pattern::kIndexUnion);
      for (size_t i = 0; i < sel.idx.size(); ++i) {
        Check(sel.idx[i] < n);
        if (i) Check(sel.idx[i] > sel.idx[i - 1]);
      }
      for (size_t i = 0; i < sel.val.size() && i < sel.idx.size(); ++i) {
        const float want = before[sel.idx[i]];
        Check(sel.val[i] == want || (std::isnan(sel.val[i]) && std::isnan(want)));
      }
    }
    // What every node gathered: this node's selection and fuzzed ones from the others.
    std::vector<uint64_t> counts(spec.node_count, 0);
    std::vector<uint32_t> indices;
    std::vector<std::vector<uint32_t>> per_node(spec.node_count);
    for (int r = 0; r < spec.node_count; ++r) {
      if (r == spec.node_rank) {
        if (!sel.all) per_node[r] = sel.idx;
      } else if (pattern != spex::Pattern::kDense) {
        const size_t k = in.ConsumeIntegralInRange<size_t>(0, std::min<size_t>(n, 64));
        for (size_t j = 0; j < k; ++j) {
          per_node[r].push_back(in.ConsumeIntegralInRange<uint32_t>(0, n - 1));
        }
        std::sort(per_node[r].begin(), per_node[r].end());
        per_node[r].erase(std::unique(per_node[r].begin(), per_node[r].end()), per_node[r].end());
      }
      counts[r] = per_node[r].size();
      indices.insert(indices.end(), per_node[r].begin(), per_node[r].end());
    }
    if (pattern == spex::Pattern::kIndexUnion) {
      std::sort(indices.begin(), indices.end());
      indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    } else if (pattern == spex::Pattern::kDense) {
      indices.clear();
    }
    // Sometimes a malformed gather, which Update must refuse or tolerate, never crash on.
    const int corrupt = in.ConsumeIntegralInRange<int>(0, 5);
    if (corrupt == 1 && !indices.empty()) {
      indices[in.ConsumeIntegralInRange<size_t>(0, indices.size() - 1)] =
          in.ConsumeIntegral<uint32_t>();
    } else if (corrupt == 2) {
      counts[in.ConsumeIntegralInRange<size_t>(0, counts.size() - 1)] =
          in.ConsumeIntegral<uint64_t>();
    } else if (corrupt == 3) {
      counts.push_back(in.ConsumeIntegral<uint32_t>());
    } else if (corrupt == 4 && !indices.empty()) {
      std::reverse(indices.begin(), indices.end());
    }
    spex::Gathered g{counts, indices};
    absl::Status u = c.Update(step, g);
    if (corrupt == 0) Check(u.ok());
    if (!u.ok()) Check(u.code() == absl::StatusCode::kInvalidArgument);
    if (pattern == spex::Pattern::kIndexUnion) {
      for (uint32_t i : indices) {
        if (i < n) acc[i] = 0;  // the caller zeroes the union
      }
    }
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) {
      absl::Status d = c.SetDensity(in.ConsumeFloatingPoint<double>());
      (void)d;
    }
  }
  return 0;
}
