// redsync_trim (pattern B; docs/algorithms.md#redsync_trim, SIDCo's RedSyncTrimCompressor):
// RedSync's statistics (mean and max of |acc|) with a descending search r = 0.8, 0.6, ..., 0.0 for
// th = mean + r (max - mean) until at least k entries exceed it; then the candidates |acc| > th
// are trimmed to their exact top-k (trim=true, spex's default) or all sent (trim=false, as the
// reference). Implementation shared with redsync (redsync.cc).
#include <memory>

#include "kernels/compressors/factories.h"
#include "kernels/compressors/redsync.h"

namespace spex {

std::unique_ptr<Compressor> MakeRedSyncTrim(const CompressorSpec& spec, Primitives* prims,
                                            ParamReader& r) {
  const bool trim = r.Bool("trim", true,
                           "keep the exact top-k of the candidates (false: send them all, as the "
                           "reference)");
  if (prims == nullptr || !r.ok()) return nullptr;
  return NewRedSync(spec, prims, true, trim);
}

}  // namespace spex
