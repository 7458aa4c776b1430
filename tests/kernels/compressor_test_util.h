// Small helpers shared by the per-compressor tests.
#pragma once

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/compressor.h"

namespace spex {

inline std::unique_ptr<Compressor> MustMake(const std::string& name, double density, size_t n,
                                            Primitives* prims,
                                            std::map<std::string, std::string> params = {},
                                            int rank = 0, int nodes = 1) {
  auto made = MakeCompressor({name, density, std::move(params), rank, nodes, n}, prims);
  EXPECT_TRUE(made.ok()) << made.status();
  return made.ok() ? std::move(*made) : nullptr;
}

inline std::vector<float> Laplace(size_t n, uint32_t seed, float scale = 1e-3f) {
  std::mt19937 gen(seed);
  std::exponential_distribution<float> expo(1.0f / scale);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> x(n);
  for (float& v : x) v = (sign(gen) ? 1.0f : -1.0f) * expo(gen);
  return x;
}

inline std::vector<float> Normal(size_t n, uint32_t seed, float sd = 1e-3f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = normal(gen);
  return x;
}

// Indices with |x| > t (strict) or >= t.
inline std::vector<uint32_t> Above(const std::vector<float>& x, float t, bool strict) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < x.size(); ++i) {
    const float a = std::fabs(x[i]);
    if (strict ? a > t : a >= t) out.push_back(static_cast<uint32_t>(i));
  }
  return out;
}

}  // namespace spex
