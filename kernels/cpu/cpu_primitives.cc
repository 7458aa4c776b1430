// The fast CPU Primitives (cpu_primitives.h): each primitive split across the thread pool over
// the Highway kernels of simd_kernels.cc.
#include "kernels/cpu/cpu_primitives.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/top_k.h"
#include "kernels/splitmix.h"

namespace spex {
namespace {

constexpr size_t kMinChunk = 64 * 1024;         // elements per parallel task, at least
constexpr size_t kChunkAlign = 64;              // task boundaries, in elements from `begin`
constexpr size_t kParallelIndexed = 64 * 1024;  // Gather/Sample outputs worth splitting
constexpr size_t kPrefetchAhead = 32;           // indexed loops touch x[idx[j + this]] early

// [begin, end) cut into `chunks` pieces of `step` elements (the last one shorter).
struct Split {
  size_t begin, end, step, chunks;
  size_t Begin(size_t c) const { return begin + c * step; }
  size_t End(size_t c) const { return std::min(end, begin + (c + 1) * step); }
};

absl::Status CheckIndices(const uint32_t* idx, size_t m, size_t n, const char* op) {
  if (m == 0 || simd::MaxIndex(idx, m) < n) return absl::OkStatus();
  for (size_t j = 0; j < m; ++j) {
    if (idx[j] >= n) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": index ", idx[j], " at position ", j,
                                                     " is out of range for ", n, " elements"));
    }
  }
  return absl::OkStatus();
}

// SumScaled reads at most this many inputs in one pass (more fall back to Accumulate passes).
constexpr int kMaxSumInputs = 16;
// SumScaled and SumScaledCheckFinite stream their output past this size: a core's L2 (2 MiB on
// this project's machines, 1-2 MiB on current server cores). A larger output cannot stay in the
// core's own caches until the next pass reads it, and the last-level cache is shared with the
// trainers computing beside spexd. Measured on micro@0.1's 3.2M-element CNN bucket (2 emulated
// hosts, a core each; docs/benchmarks.md): the daemon's CPU per step 17.2 -> 15.3 ms against
// the earlier 32 MiB threshold (a server L3's order), which left that bucket unstreamed.
constexpr size_t kStreamBytes = size_t{2} << 20;

class CpuPrimitives final : public Primitives {
 public:
  explicit CpuPrimitives(int threads) : pool_(threads) {}

  Device device() const override { return Device::kCpu; }

  void Accumulate(float* y, const float* x, size_t n) override {
    ForChunks(Cut(0, n),
              [&](size_t, size_t b, size_t e, int) { simd::Accumulate(y + b, x + b, e - b); });
  }

  void Scale(float* x, float a, size_t n) override {
    ForChunks(Cut(0, n), [&](size_t, size_t b, size_t e, int) { simd::Scale(x + b, a, e - b); });
  }

  absl::Status SumScaled(float* y, const float* const* xs, int count, float a, size_t n) override {
    if (count < 1) return absl::InvalidArgumentError("SumScaled needs at least one input");
    // Rare: more local trainers than one pass reads; the unfused passes (same rounding).
    if (count > kMaxSumInputs) return Primitives::SumScaled(y, xs, count, a, n);
    // Streamed past kStreamBytes as SumScaledCheckFinite is (the same stores with or without
    // the check, so the check is all that differs between the two).
    const bool stream = n * sizeof(float) > kStreamBytes;
    ForChunks(Cut(0, n), [&](size_t, size_t b, size_t e, int) {
      const float* shifted[kMaxSumInputs];
      for (int r = 0; r < count; ++r) shifted[r] = xs[r] + b;
      simd::SumScaled(y + b, shifted, count, a, e - b, stream);
    });
    return absl::OkStatus();
  }

  absl::Status SumScaledCheckFinite(float* y, const float* const* xs, int count, float a, size_t n,
                                    size_t* first_bad) override {
    if (count < 1)
      return absl::InvalidArgumentError("SumScaledCheckFinite needs at least one input");
    if (count > kMaxSumInputs)
      return Primitives::SumScaledCheckFinite(y, xs, count, a, n, first_bad);
    const Split split = Cut(0, n);
    std::vector<size_t> bad(split.chunks, n);
    // A y larger than this (the engine's second accumulator of a large sparse bucket) is written
    // with non-temporal stores: it cannot stay cached for the next pass anyway, and a plain store
    // would first read every line of it (the write-allocate), a third more traffic than the
    // in-place sum it replaced.
    const bool stream = n * sizeof(float) > kStreamBytes;
    ForChunks(split, [&](size_t c, size_t b, size_t e, int) {
      const float* shifted[kMaxSumInputs];
      for (int r = 0; r < count; ++r) shifted[r] = xs[r] + b;
      const size_t local = simd::SumScaledCheckFinite(y + b, shifted, count, a, e - b, stream);
      if (local < e - b) bad[c] = b + local;
    });
    *first_bad = n;
    for (size_t v : bad) *first_bad = std::min(*first_bad, v);
    return absl::OkStatus();
  }

  // One pass where the sum runs on one thread: the range before the histogram's, the
  // histogram's counted as it is written, the range after. Split over threads, each chunk
  // would need its own bins; the sum and the count then run as two passes (the default).
  absl::Status SumScaledCheckFiniteHistogram(float* y, const float* const* xs, int count, float a,
                                             size_t n, size_t* first_bad,
                                             const HistogramRange& h) override {
    if (count < 1 || count > kMaxSumInputs || Cut(0, n).chunks != 1 || h.bins == nullptr ||
        h.begin > h.end || h.end > n) {
      return Primitives::SumScaledCheckFiniteHistogram(y, xs, count, a, n, first_bad, h);
    }
    const bool stream = n * sizeof(float) > kStreamBytes;  // as SumScaledCheckFinite
    *first_bad = n;
    auto part = [&](size_t b, size_t e, bool hist) {
      if (e <= b) return;
      const float* shifted[kMaxSumInputs];
      for (int r = 0; r < count; ++r) shifted[r] = xs[r] + b;
      const size_t local =
          hist ? simd::SumScaledCheckFiniteHistogram(y + b, shifted, count, a, e - b, stream,
                                                     h.first_bin, h.bins)
               : simd::SumScaledCheckFinite(y + b, shifted, count, a, e - b, stream);
      if (local < e - b) *first_bad = std::min(*first_bad, b + local);
    };
    part(0, h.begin, false);
    part(h.begin, h.end, true);
    part(h.end, n, false);
    return absl::OkStatus();
  }

  absl::Status Copy(float* dst, const float* src, size_t n) override {
    if (n == 0) return absl::OkStatus();
    ForChunks(Cut(0, n), [&](size_t, size_t b, size_t e, int) {
      std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
    });
    return absl::OkStatus();
  }

  absl::Status Fill(float* x, float v, size_t n) override {
    ForChunks(Cut(0, n), [&](size_t, size_t b, size_t e, int) { std::fill(x + b, x + e, v); });
    return absl::OkStatus();
  }

  // Host memory is this device's memory: the staging copies are plain (parallel) copies.
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override {
    CopyBytes(host_dst, src, bytes);
    return absl::OkStatus();
  }

  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override {
    CopyBytes(dst, host_src, bytes);
    return absl::OkStatus();
  }

  size_t CountAbove(const float* x, size_t n, float t) override {
    const Split s = Cut(0, n);
    std::vector<size_t> counts(s.chunks);
    ForChunks(s, [&](size_t c, size_t b, size_t e, int) {
      counts[c] = simd::CountAbove(x + b, e - b, t);
    });
    size_t total = 0;
    for (size_t c : counts) total += c;
    return total;
  }

  size_t SelectAbove(float* x, size_t begin, size_t end, float t, bool zero, uint32_t* idx,
                     float* val, size_t capacity) override {
    return SelectRange(x, nullptr, begin, end, t, zero, idx, val, capacity);
  }

  size_t AddSelectAbove(float* acc, const float* add, size_t begin, size_t end, float t, bool zero,
                        uint32_t* idx, float* val, size_t capacity) override {
    return SelectRange(acc, add, begin, end, t, zero, idx, val, capacity);
  }

  size_t TopK(const float* x, size_t n, size_t k, uint32_t* idx, float* val) override {
    return FastTopK(*this, x, n, k, idx, val);
  }

  AbsMoments Moments(const float* x, size_t n, float lower_bound) override {
    const Split s = Cut(0, n);
    std::vector<AbsMoments> parts(s.chunks);
    ForChunks(s, [&](size_t c, size_t b, size_t e, int) {
      parts[c] = simd::Moments(x + b, e - b, lower_bound);
    });
    return Sum(parts);
  }

  AbsMoments AccumulateMoments(float* acc, const float* add, size_t n, float lower_bound,
                               bool logs) override {
    const Split s = Cut(0, n);  // Moments' chunks, so the sums are the same bits
    std::vector<AbsMoments> parts(s.chunks);
    ForChunks(s, [&](size_t c, size_t b, size_t e, int) {
      parts[c] = simd::FusedMoments(acc + b, add ? add + b : nullptr, e - b, lower_bound, logs);
    });
    return Sum(parts);
  }

  void Sample(const float* x, size_t n, size_t m, uint64_t seed, float* out) override {
    if (n == 0) {
      std::fill(out, out + m, 0.0f);
      return;
    }
    // Draw j is a pure function of (seed, j), so pieces can run in any order.
    ForChunks(Cut(0, m, kParallelIndexed), [&](size_t, size_t b, size_t e, int) {
      // Positions of a batch first (prefetched), then the loads: many misses in flight.
      constexpr size_t kBatch = 256;
      size_t pos[kBatch];
      uint64_t state = seed + b * kSplitMix64Gamma;
      for (size_t j0 = b; j0 < e; j0 += kBatch) {
        const size_t len = std::min(kBatch, e - j0);
        for (size_t j = 0; j < len; ++j) {
          const uint64_t r = SplitMix64(&state);
          pos[j] = static_cast<size_t>((static_cast<unsigned __int128>(r) * n) >> 64);
          __builtin_prefetch(x + pos[j]);
        }
        for (size_t j = 0; j < len; ++j) out[j0 + j] = x[pos[j]];
      }
    });
  }

  absl::Status ScatterAdd(float* y, size_t n, const uint32_t* idx, const float* val,
                          size_t m) override {
    if (absl::Status s = CheckIndices(idx, m, n, "ScatterAdd"); !s.ok()) return s;
    for (size_t j = 0; j < m; ++j) {  // serial: indices may repeat
      if (j + kPrefetchAhead < m) __builtin_prefetch(y + idx[j + kPrefetchAhead], 1);
      y[idx[j]] += val[j];
    }
    return absl::OkStatus();
  }

  absl::Status Gather(const float* x, size_t n, const uint32_t* idx, size_t m,
                      float* out) override {
    if (absl::Status s = CheckIndices(idx, m, n, "Gather"); !s.ok()) return s;
    ForChunks(Cut(0, m, kParallelIndexed), [&](size_t, size_t b, size_t e, int) {
      for (size_t j = b; j < e; ++j) {
        if (j + kPrefetchAhead < e) __builtin_prefetch(x + idx[j + kPrefetchAhead]);
        out[j] = x[idx[j]];
      }
    });
    return absl::OkStatus();
  }

  absl::Status ZeroAt(float* x, size_t n, const uint32_t* idx, size_t m) override {
    if (absl::Status s = CheckIndices(idx, m, n, "ZeroAt"); !s.ok()) return s;
    for (size_t j = 0; j < m; ++j) {
      if (j + kPrefetchAhead < m) __builtin_prefetch(x + idx[j + kPrefetchAhead], 1);
      x[idx[j]] = 0.0f;
    }
    return absl::OkStatus();
  }

  void AbsHistogram16(const float* x, size_t begin, size_t end, uint32_t* bins) override {
    HistogramFrom(x, begin, end, 0, bins);
  }

  void AbsHistogram16From(const float* x, size_t begin, size_t end, uint32_t first_bin,
                          uint32_t* bins) override {
    HistogramFrom(x, begin, end, std::min<uint32_t>(first_bin, kHistogramBins), bins);
  }

 private:
  // The parts of a chunked Moments, summed in chunk order (so the result is reproducible).
  static AbsMoments Sum(const std::vector<AbsMoments>& parts) {
    AbsMoments m;
    for (const AbsMoments& p : parts) {
      m.count += p.count;
      m.sum += p.sum;
      m.sum_sq += p.sum_sq;
      m.sum_log += p.sum_log;
      m.log_count += p.log_count;
      m.max = std::max(m.max, p.max);
    }
    return m;
  }

  void CopyBytes(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    auto* d = static_cast<uint8_t*>(dst);
    const auto* s = static_cast<const uint8_t*>(src);
    // Whole floats in parallel chunks, then the odd tail bytes.
    const size_t words = bytes / sizeof(float);
    ForChunks(Cut(0, words), [&](size_t, size_t b, size_t e, int) {
      std::memcpy(d + b * sizeof(float), s + b * sizeof(float), (e - b) * sizeof(float));
    });
    const size_t done = words * sizeof(float);
    if (bytes > done) std::memcpy(d + done, s + done, bytes - done);
  }

  Split Cut(size_t begin, size_t end, size_t parallel_min = kCpuParallelMinElements) const {
    const size_t n = end > begin ? end - begin : 0;
    size_t chunks = 1;
    if (pool_.size() > 1 && n >= parallel_min) {
      chunks = std::max<size_t>(1, std::min<size_t>(4 * pool_.size(), n / kMinChunk));
    }
    size_t step = (n + chunks - 1) / chunks;
    step = (step + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
    chunks = step == 0 ? 1 : (n + step - 1) / step;
    return {begin, begin + n, step, chunks};
  }

  // fn(chunk, begin, end, worker) for every chunk of s, in parallel when there are several.
  template <class Fn>
  void ForChunks(const Split& s, Fn&& fn) {
    if (s.chunks == 1) {
      fn(size_t{0}, s.begin, s.end, 0);
      return;
    }
    pool_.Run(s.chunks, [&](size_t c, int w) { fn(c, s.Begin(c), s.End(c), w); });
  }

  // The bins from `first` on (every bin for first == 0).
  static void Histogram(const float* x, size_t begin, size_t end, uint32_t first, uint32_t* bins) {
    if (first == 0) {
      simd::Histogram16(x + begin, end - begin, bins);
    } else {
      simd::Histogram16From(x + begin, end - begin, first, bins);
    }
  }

  void HistogramFrom(const float* x, size_t begin, size_t end, uint32_t first, uint32_t* bins) {
    // Per-thread tables cost 256 KiB each to clear and merge: split only large inputs.
    const Split s = Cut(begin, end, 4 * kCpuParallelMinElements);
    if (s.chunks == 1) return Histogram(x, begin, end, first, bins);
    // One private table per thread (the bins from `first` on), merged at the end.
    std::vector<std::vector<uint32_t>> tables(pool_.size());
    ForChunks(s, [&](size_t, size_t b, size_t e, int w) {
      if (tables[w].empty()) tables[w].assign(kHistogramBins, 0);
      Histogram(x, b, e, first, tables[w].data());
    });
    for (const std::vector<uint32_t>& t : tables) {
      if (t.empty()) continue;
      for (size_t b = first; b < kHistogramBins; ++b) bins[b] += t[b];
    }
  }

  // SelectAbove / AddSelectAbove (add == nullptr for the former). In parallel, each chunk
  // selects into a private buffer in one pass; buffers are then concatenated in chunk order.
  // A chunk with more hits than its buffer holds selects the rest again, straight into place.
  size_t SelectRange(float* x, const float* add, size_t begin, size_t end, float t, bool zero,
                     uint32_t* idx, float* val, size_t capacity) {
    const Split s = Cut(begin, end);
    if (s.chunks == 1) {
      return add ? simd::AddSelect(x, add, s.begin, s.end, t, zero, idx, val, capacity)
                 : simd::Select(x, s.begin, s.end, t, zero, idx, val, capacity);
    }
    struct Part {
      std::unique_ptr<uint32_t[]> idx;
      std::unique_ptr<float[]> val;
      size_t cap = 0, count = 0;
      size_t kept() const { return std::min(cap, count); }
    };
    std::vector<Part> parts(s.chunks);
    ForChunks(s, [&](size_t c, size_t b, size_t e, int) {
      Part& p = parts[c];
      p.cap = std::min({e - b, capacity, std::max<size_t>(4096, (e - b) / 32)});
      p.idx.reset(new uint32_t[p.cap]);
      p.val.reset(new float[p.cap]);
      p.count = add ? simd::AddSelect(x, add, b, e, t, zero, p.idx.get(), p.val.get(), p.cap)
                    : simd::Select(x, b, e, t, zero, p.idx.get(), p.val.get(), p.cap);
    });
    std::vector<size_t> offset(s.chunks);
    size_t total = 0, copied = 0;
    bool refill = false;
    for (size_t c = 0; c < s.chunks; ++c) {
      offset[c] = total;
      total += parts[c].count;
      copied += parts[c].kept();
      refill |= parts[c].count > parts[c].cap && total - parts[c].count + parts[c].cap < capacity;
    }
    auto place = [&](size_t c, size_t, size_t e, int) {
      const Part& p = parts[c];
      const size_t off = offset[c];
      if (off >= capacity) return;
      const size_t n = std::min(p.kept(), capacity - off);
      std::memcpy(idx + off, p.idx.get(), n * sizeof(uint32_t));
      std::memcpy(val + off, p.val.get(), n * sizeof(float));
      if (p.count > p.cap && off + p.cap < capacity) {
        const size_t from = p.idx[p.cap - 1] + size_t{1};
        // Exactly this chunk's slots: SIMD stores may scribble past the count up to the cap.
        simd::Select(x, from, e, t, zero, idx + off + p.cap, val + off + p.cap,
                     std::min(p.count, capacity - off) - p.cap);
      }
    };
    if (refill || copied >= kMinChunk) {
      ForChunks(s, place);
    } else {
      for (size_t c = 0; c < s.chunks; ++c) place(c, s.Begin(c), s.End(c), 0);
    }
    // Entries zeroed in the first pass but beyond `capacity` get their values back.
    if (zero && total > capacity) {
      for (size_t c = 0; c < s.chunks; ++c) {
        const Part& p = parts[c];
        for (size_t j = capacity > offset[c] ? capacity - offset[c] : 0; j < p.kept(); ++j) {
          x[p.idx[j]] = p.val[j];
        }
      }
    }
    return total;
  }

  ThreadPool pool_;
};

}  // namespace

const char* CpuPrimitivesTarget() { return simd::TargetName(); }

int UsableCpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::unique_ptr<Primitives> MakeCpuPrimitives(int threads) {
  if (threads <= 0) threads = UsableCpus();
  return std::make_unique<CpuPrimitives>(threads);
}

}  // namespace spex
