// The scalar statistics of the distribution-fitting compressors (stat_math.h).
#include "kernels/compressors/stat_math.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace spex {

double NormalQuantile(double p) {
  if (!(p > 0)) return -std::numeric_limits<double>::infinity();
  if (!(p < 1)) return std::numeric_limits<double>::infinity();
  static const double kA[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                              -2.759285104469687e+02, 1.383577518672690e+02,
                              -3.066479806614716e+01, 2.506628277459239e+00};
  static const double kB[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                              6.680131188771972e+01, -1.328068155288572e+01};
  static const double kC[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                              -2.400758277161838e+00, -2.549732539343734e+00,
                              4.374664141464968e+00,  2.938163982698783e+00};
  static const double kD[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                              3.754408661907416e+00};
  const double lo = 0.02425, hi = 1 - lo;
  double x;
  if (p < lo) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((kC[0] * q + kC[1]) * q + kC[2]) * q + kC[3]) * q + kC[4]) * q + kC[5]) /
        ((((kD[0] * q + kD[1]) * q + kD[2]) * q + kD[3]) * q + 1);
  } else if (p <= hi) {
    const double q = p - 0.5, r = q * q;
    x = (((((kA[0] * r + kA[1]) * r + kA[2]) * r + kA[3]) * r + kA[4]) * r + kA[5]) * q /
        (((((kB[0] * r + kB[1]) * r + kB[2]) * r + kB[3]) * r + kB[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((kC[0] * q + kC[1]) * q + kC[2]) * q + kC[3]) * q + kC[4]) * q + kC[5]) /
        ((((kD[0] * q + kD[1]) * q + kD[2]) * q + kD[3]) * q + 1);
  }
  // One Halley step on Phi(x) - p, with Phi from erfc.
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

namespace {

// log|Gamma(a)| without std::lgamma, which writes the sign into the global `signgam` (POSIX) and
// so races when two threads select at once (several engines in one process; found by TSan).
double LogGamma(double a) {
  int sign = 0;
  return lgamma_r(a, &sign);
}

// P(a, x) by its series (good for x < a + 1).
double GammaPSeries(double a, double x) {
  double sum = 1.0 / a, term = sum, ap = a;
  for (int i = 0; i < 1000; ++i) {
    ap += 1;
    term *= x / ap;
    sum += term;
    if (std::fabs(term) < std::fabs(sum) * 1e-16) break;
  }
  return sum * std::exp(-x + a * std::log(x) - LogGamma(a));
}

// Q(a, x) by its continued fraction (modified Lentz; good for x >= a + 1).
double GammaQFraction(double a, double x) {
  const double tiny = 1e-300;
  double b = x + 1 - a, c = 1 / tiny, d = 1 / b, h = d;
  for (int i = 1; i < 1000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (std::fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::fabs(del - 1) < 1e-16) break;
  }
  return std::exp(-x + a * std::log(x) - LogGamma(a)) * h;
}

}  // namespace

double RegularizedGammaQ(double a, double x) {
  if (x <= 0) return 1;
  if (x < a + 1) return 1 - GammaPSeries(a, x);
  return GammaQFraction(a, x);
}

double InverseRegularizedGammaQ(double a, double q) {
  if (!(q < 1)) return 0;
  if (!(q > 0)) return std::numeric_limits<double>::infinity();
  // Bracket, then safeguarded Newton (bisection whenever Newton leaves the bracket).
  double lo = 0, hi = std::max(1.0, a);
  while (RegularizedGammaQ(a, hi) > q) {
    lo = hi;
    hi *= 2;
  }
  // Wilson-Hilferty start for a >= 1, the bracket's midpoint otherwise.
  double x = 0.5 * (lo + hi);
  if (a >= 1) {
    const double z = NormalQuantile(1 - q), t = 1 - 1 / (9 * a) + z / (3 * std::sqrt(a));
    const double w = a * t * t * t;
    if (w > lo && w < hi) x = w;
  }
  const double lga = LogGamma(a);
  for (int i = 0; i < 200; ++i) {
    const double f = RegularizedGammaQ(a, x) - q;  // decreasing in x
    if (f > 0)
      lo = x;
    else
      hi = x;
    const double dens = std::exp((a - 1) * std::log(x) - x - lga);  // -dQ/dx
    double next = dens > 0 ? x + f / dens : 0.5 * (lo + hi);
    if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
    if (std::fabs(next - x) <= 1e-14 * std::max(1.0, x)) return next;
    x = next;
  }
  return x;
}

double ExponentialThreshold(double mean, double ratio) { return -mean * std::log(ratio); }

double GParetoThreshold(double mean, double var, double ratio) {
  if (!(var > 0)) return ExponentialThreshold(mean, ratio);
  const double m2v = mean * mean / var;
  const double k = 0.5 * (m2v - 1), alpha = 0.5 * mean * (m2v + 1);
  if (std::fabs(k) < 1e-9) return -alpha * std::log(ratio);
  return alpha * (1 - std::pow(ratio, k)) / k;
}

double GammaThreshold(double mean, double mean_log, double ratio) {
  const double s = std::log(mean) - mean_log;
  if (!(s > 1e-12)) return mean;
  const double a = (3 - s + std::sqrt((s - 3) * (s - 3) + 24 * s)) / (12 * s);
  const double b = mean / a;
  return b * InverseRegularizedGammaQ(a, ratio);
}

}  // namespace spex
