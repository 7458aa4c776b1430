// Scalar statistics behind the distribution-fitting compressors (Gaussian-k, SIDCo): the normal
// quantile, the regularized incomplete gamma function and its inverse, and SIDCo's closed-form
// thresholds (docs/algorithms.md#sidco). Every threshold keeps the fraction `ratio` of a fitted
// distribution's mass above it.
#pragma once

namespace spex {

// Phi^-1(p) for p in (0, 1) (Acklam's rational approximation refined by one Halley step on erfc;
// |error| < 1e-12 in practice).
double NormalQuantile(double p);

// Regularized upper incomplete gamma Q(a, x) = 1 - P(a, x), a > 0, x >= 0.
double RegularizedGammaQ(double a, double x);
// x with Q(a, x) = q, for a > 0 and q in (0, 1).
double InverseRegularizedGammaQ(double a, double q);

// Exponential with mean `mean`: -mean ln(ratio).
double ExponentialThreshold(double mean, double ratio);
// Generalised Pareto by the method of moments: k = (mean^2/var - 1) / 2,
// alpha = mean (mean^2/var + 1) / 2, threshold = alpha (1 - ratio^k) / k (the exponential limit
// -alpha ln(ratio) when |k| < 1e-9; the exponential fit when var <= 0).
double GParetoThreshold(double mean, double var, double ratio);
// Gamma by Minka's approximation: s = ln(mean) - mean_log,
// shape a = (3 - s + sqrt((s - 3)^2 + 24 s)) / (12 s), scale b = mean / a,
// threshold = b Q^-1(a, ratio) (= b P^-1(a, 1 - ratio), the EC form). s <= 0 (all equal): mean.
double GammaThreshold(double mean, double mean_log, double ratio);

}  // namespace spex
