// The plan of `omgs --omgs_mode=mgs` (docs/merging.md 4.3): OMGS-SGD's adaptive merge rule on
// measured, agreed inputs. A pure function of integers (and the density), so every node that is
// given the same inputs computes the same plan.
//
// Per bucket b in canonical (backprop) order: its size p_b, its backward gap tb_b (the time
// backprop takes to produce it after its predecessor) and whether it is dense (D). Costs:
//   selection of a merged buffer of x elements  ts(x) = s * x * log2(x)   (s in fs, log2 in Q16)
//   exchange of it (the all-gather of pattern B's pairs)
//                                               tc(x) = alpha + beta * 8 * floor(d * x) * (N - 1)
// Schedule of the current buffers (b = 0 is produced first): tau_b[0] = 0,
// tau_s[b] = tau_b[b] + tb[b], tau_b[b + 1] = tau_s[b] + ts[b] (selection runs after backward),
// tau_c[0] = tau_s[0] + ts[0], tau_c[b] = max(tau_c[b - 1] + tc[b - 1], tau_s[b] + ts[b]).
// Walk the buffers with the current group ending at b: merge b + 1 into it iff t_wait < t_save,
//   t_wait = tb[b + 1] + (behind ? ts(p_b + p_b+1) - ts(p_b) - ts(p_b+1) : 0)
//            - (tau_c[b] - (tau_s[b] + ts[b]))       (the time b would wait for the wire anyway)
//   t_save = tc(p_b) + tc(p_b+1) - tc(p_b + p_b+1)  (one start-up saved);
// on a merge the merged buffer has p_b + p_b+1 and tb_b + tb_b+1 and the schedule is recomputed;
// otherwise the group closes after b. A D bucket always joins its predecessor's group (the
// HKBU variant's rule for small layers). The first pair is not forced together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace spex {

struct MgsInputs {
  std::vector<uint64_t> elements;  // p_b
  std::vector<int64_t> gap_ns;     // tb_b (>= 0)
  std::vector<bool> dense;         // D buckets join their predecessor
  int64_t select_fs = 218897;      // s, femtoseconds per element * log2(elements): OMGS's
                                   // 2.18896957e-10 s by default
  int64_t alpha_ns = 3780956;      // as rgmerge's model: SAFusion's start-up by default
  int64_t beta_ps_per_byte = 1000;
  double density = 0.01;
  int nodes = 2;
  bool behind = true;  // selection behind: the convexity term of ts counts
};

// Group lengths (each >= 1) summing to the number of buckets; one group per bucket for inputs
// of different lengths or negative gaps.
std::vector<size_t> MgsPlan(const MgsInputs& in);

// log2(x) in Q16 fixed point (0 for x <= 1), by integer arithmetic only.
int64_t Log2Q16(uint64_t x);
// ts(x) and tc(x) of the model, in ns.
int64_t MgsSelectNs(const MgsInputs& in, uint64_t elements);
int64_t MgsCommNs(const MgsInputs& in, uint64_t elements);
// s (fs per element * log2 element) fitted through the origin to the per-bucket selection times
// (ns); `fallback` when no bucket has a positive size and time.
int64_t FitSelectFs(const std::vector<uint64_t>& elements, const std::vector<int64_t>& select_ns,
                    int64_t fallback);

}  // namespace spex
