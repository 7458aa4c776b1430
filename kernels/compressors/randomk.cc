// randomk (pattern B, docs/algorithms.md#randomk, SIDCo's RandomKCompressor): k = max(1, floor(d
// n)) distinct positions drawn uniformly without replacement, independently per node and step
// (stream seeded by seed, node rank and step), sent with their acc values.
// Parameters: seed (default 1).
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/compressors/factories.h"
#include "kernels/splitmix.h"

namespace spex {
namespace {

// Sorts 32-bit keys with two 16-bit LSD radix passes (k keys in O(k), unlike a comparison sort).
void RadixSort(std::vector<uint32_t>* v, std::vector<uint32_t>* tmp) {
  tmp->resize(v->size());
  for (int shift : {0, 16}) {
    std::vector<uint32_t> count(65537, 0);
    for (uint32_t x : *v) count[((x >> shift) & 0xffffu) + 1]++;
    for (size_t b = 1; b < count.size(); ++b) count[b] += count[b - 1];
    for (uint32_t x : *v) (*tmp)[count[(x >> shift) & 0xffffu]++] = x;
    v->swap(*tmp);
  }
}

// k distinct uniform positions in [0, n), ascending.
void DrawPositions(uint64_t seed, size_t n, size_t k, std::vector<uint32_t>* out) {
  out->clear();
  uint64_t s = seed;
  auto below = [&](uint64_t m) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(SplitMix64(&s)) * m) >> 64);
  };
  if (k * 4 > n) {
    // Dense case: selection sampling (Knuth's algorithm S), one draw per position.
    size_t need = k;
    for (size_t i = 0; i < n && need > 0; ++i) {
      if (below(n - i) < need) {
        out->push_back(static_cast<uint32_t>(i));
        --need;
      }
    }
    return;
  }
  // Sparse case: draw k, sort, drop duplicates, then top up (the few redraws merged in).
  for (size_t j = 0; j < k; ++j) out->push_back(static_cast<uint32_t>(below(n)));
  std::vector<uint32_t> tmp;
  RadixSort(out, &tmp);
  out->erase(std::unique(out->begin(), out->end()), out->end());
  while (out->size() < k) {
    const size_t have = out->size();
    for (size_t j = have; j < k; ++j) out->push_back(static_cast<uint32_t>(below(n)));
    std::sort(out->begin() + have, out->end());
    std::inplace_merge(out->begin(), out->begin() + have, out->end());
    out->erase(std::unique(out->begin(), out->end()), out->end());
  }
}

class RandomK final : public StatelessCompressor {
 public:
  RandomK(const CompressorSpec& spec, Primitives* prims, uint64_t seed)
      : StatelessCompressor(spec, prims), seed_(seed), scratch_(prims) {}
  Pattern pattern() const override { return Pattern::kSparseGather; }

 protected:
  absl::Status DoSelect(const StepContext& ctx, float* acc, const float* add, bool zero,
                        Selection* out) override {
    if (add) prims_->Accumulate(acc, add, ctx.n);
    DrawPositions(StepSeed(seed_, ctx.node_rank, ctx.step), ctx.n, ctx.k, &out->idx);
    out->val.resize(out->idx.size());
    out->scalars[0] = static_cast<float>(ctx.k);
    const size_t m = out->idx.size();
    if (scratch_.host()) {
      absl::Status s = prims_->Gather(acc, ctx.n, out->idx.data(), m, out->val.data());
      if (s.ok() && zero) s = prims_->ZeroAt(acc, ctx.n, out->idx.data(), m);
      return s;
    }
    // Device: the positions go up once, for the gather and the zeroing; the values come back.
    const auto* idx =
        static_cast<const uint32_t*>(scratch_.Upload(0, out->idx.data(), m * 4).value_or(nullptr));
    auto* val = static_cast<float*>(scratch_.Get(1, m * 4).value_or(nullptr));
    if (idx == nullptr || val == nullptr) return scratch_.TakeStatus();
    absl::Status s = prims_->Gather(acc, ctx.n, idx, m, val);
    if (s.ok()) (void)scratch_.Fetch(out->val.data(), val, m * 4);  // a failure: kept
    if (s.ok() && zero) s = prims_->ZeroAt(acc, ctx.n, idx, m);
    if (s.ok()) s = scratch_.TakeStatus();
    return s;
  }

 private:
  uint64_t seed_;
  Scratch scratch_;
};

}  // namespace

std::unique_ptr<Compressor> MakeRandomK(const CompressorSpec& spec, Primitives* prims,
                                        ParamReader& r) {
  const uint64_t seed = r.Seed();
  if (prims == nullptr || !r.ok()) return nullptr;
  return std::make_unique<RandomK>(spec, prims, seed);
}

}  // namespace spex
