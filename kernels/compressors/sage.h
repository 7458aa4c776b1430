// SAGE's multiplicative threshold correction (docs/algorithms.md#sage), exposed for tests.
#pragma once

#include <cstddef>

namespace spex {

struct SageFactors {
  double alpha = 1, beta = 1, gamma = 1;
};

// alpha = savg_cur / savg_prev (1 when savg_prev is 0 or either is not finite);
// beta = 2 / (1 + exp(d_target - d_exam)); r = d_exam / d_target:
// gamma = 0.95 if r < 0.1, 1.05 if r > 10, else 1.
SageFactors SageCorrection(double savg_cur, double savg_prev, double d_target, double d_exam);

// Slovin's sample size with e = 0.05: floor(n / (1 + n e^2)), at least 1.
size_t SlovinSampleSize(size_t n);

// The smallest beta * gamma can be at target density d (d_exam = 0): 0.95 * 2 / (1 + exp(d)).
double SageMinBetaGamma(double d_target);

}  // namespace spex
