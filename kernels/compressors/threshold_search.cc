#include "kernels/compressors/threshold_search.h"

namespace spex {

float DgcCorrect(float th, size_t k, const CountFn& count, int* rounds) {
  *rounds = 0;
  for (int r = 0; r < kDgcMaxRounds; ++r) {
    const double c = static_cast<double>(count(th));
    if (c > 1.3 * k) {
      th *= 1.3f;
    } else if (c < 0.7 * k) {
      th *= 0.7f;
    } else {
      break;
    }
    ++*rounds;
  }
  return th;
}

float RedSyncSearch(double mean, double max, size_t k, const CountFn& count, int* probes) {
  double lo = 0, hi = 1;
  float th = static_cast<float>(mean);  // the reference starts from 0.0; any probe overwrites it
  *probes = 0;
  while (hi - lo > kRedSyncEps) {
    const double mid = lo + (hi - lo) / 2;
    th = static_cast<float>(mean + mid * (max - mean));
    const size_t nnz = count(th);
    ++*probes;
    if (nnz > k && nnz < 2 * k) break;
    if (static_cast<double>(nnz) < k / 2.0) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return th;
}

float RedSyncTrimSearch(double mean, double max, size_t k, const CountFn& count, int* probes) {
  float th = static_cast<float>(mean);
  *probes = 0;
  for (int i = 4; i >= 0; --i) {
    th = static_cast<float>(mean + 0.2 * i * (max - mean));
    ++*probes;
    if (count(th) >= k) break;
  }
  return th;
}

}  // namespace spex
