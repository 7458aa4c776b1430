// The omgs mgs plan (mgs_plan.h): OMGS-SGD's merge rule as a pure function of agreed integers, so
// every node computes the same groups.
#include "daemon/merge/mgs_plan.h"

#include <algorithm>

namespace spex {

int64_t Log2Q16(uint64_t x) {
  if (x <= 1) return 0;
  const int l = 63 - __builtin_clzll(x);
  // The mantissa in [1, 2) as Q32; each squaring yields one more bit of the fraction.
  uint64_t m = l >= 32 ? x >> (l - 32) : x << (32 - l);
  int64_t r = static_cast<int64_t>(l) << 16;
  for (int i = 15; i >= 0; --i) {
    m = static_cast<uint64_t>((static_cast<unsigned __int128>(m) * m) >> 32);
    if (m >= (uint64_t{2} << 32)) {
      m >>= 1;
      r |= int64_t{1} << i;
    }
  }
  return r;
}

int64_t MgsSelectNs(const MgsInputs& in, uint64_t elements) {
  const unsigned __int128 t = static_cast<unsigned __int128>(std::max<int64_t>(0, in.select_fs)) *
                              elements * static_cast<uint64_t>(Log2Q16(elements));
  return static_cast<int64_t>(t / (static_cast<unsigned __int128>(1000000) << 16));
}

int64_t MgsCommNs(const MgsInputs& in, uint64_t elements) {
  const uint64_t k = static_cast<uint64_t>(in.density * static_cast<double>(elements));
  const int64_t peers = std::max(0, in.nodes - 1);
  return in.alpha_ns + in.beta_ps_per_byte * 8 * static_cast<int64_t>(k) * peers / 1000;
}

int64_t FitSelectFs(const std::vector<uint64_t>& elements, const std::vector<int64_t>& select_ns,
                    int64_t fallback) {
  // s = sum(sigma z) / sum(z^2), z = n log2 n (least squares through the origin), in doubles:
  // each node fits its own, and the agreement takes the maximum.
  double szz = 0, szy = 0;
  for (size_t b = 0; b < std::min(elements.size(), select_ns.size()); ++b) {
    if (elements[b] < 2 || select_ns[b] <= 0) continue;
    const double z =
        static_cast<double>(elements[b]) * static_cast<double>(Log2Q16(elements[b])) / 65536.0;
    szz += z * z;
    szy += z * static_cast<double>(select_ns[b]) * 1e6;  // ns -> fs
  }
  if (!(szz > 0)) return fallback;
  return std::max<int64_t>(0, static_cast<int64_t>(szy / szz));
}

std::vector<size_t> MgsPlan(const MgsInputs& in) {
  const size_t num_buckets = in.elements.size();
  if (num_buckets == 0) return {};
  bool valid = in.gap_ns.size() == num_buckets && in.dense.size() == num_buckets;
  for (size_t b = 0; valid && b < num_buckets; ++b) valid = in.gap_ns[b] >= 0;
  if (!valid) return std::vector<size_t>(num_buckets, 1);
  struct Buf {
    uint64_t p;
    int64_t tb;
    size_t count;
  };
  std::vector<Buf> bufs;
  for (size_t b = 0; b < num_buckets; ++b) bufs.push_back({in.elements[b], in.gap_ns[b], 1});
  std::vector<int64_t> ts, tc, tau_s, tau_c;
  auto schedule = [&] {
    const size_t n = bufs.size();
    ts.assign(n, 0);
    tc.assign(n, 0);
    tau_s.assign(n, 0);
    tau_c.assign(n, 0);
    int64_t tau_b = 0;
    for (size_t i = 0; i < n; ++i) {
      ts[i] = MgsSelectNs(in, bufs[i].p);
      tc[i] = MgsCommNs(in, bufs[i].p);
      tau_s[i] = tau_b + bufs[i].tb;
      tau_b = tau_s[i] + ts[i];
      tau_c[i] = i == 0 ? tau_s[i] + ts[i] : std::max(tau_c[i - 1] + tc[i - 1], tau_s[i] + ts[i]);
    }
  };
  size_t i = 0, b = 0;  // bufs[i] is the current group; bucket b + 1 is the next candidate
  while (i + 1 < bufs.size()) {
    const size_t next_bucket = b + 1;
    bool merge = in.dense[next_bucket];
    if (!merge) {
      schedule();
      const Buf& cur = bufs[i];
      const Buf& nxt = bufs[i + 1];
      const int64_t conv = in.behind ? MgsSelectNs(in, cur.p + nxt.p) - ts[i] - ts[i + 1] : 0;
      const int64_t t_wait = nxt.tb + conv - (tau_c[i] - (tau_s[i] + ts[i]));
      const int64_t t_save = tc[i] + tc[i + 1] - MgsCommNs(in, cur.p + nxt.p);
      merge = t_wait < t_save;
    }
    if (merge) {
      bufs[i + 1].p += bufs[i].p;
      bufs[i + 1].tb += bufs[i].tb;
      bufs[i + 1].count += bufs[i].count;
      bufs.erase(bufs.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
    b = next_bucket;
  }
  std::vector<size_t> plan;
  for (const Buf& g : bufs) plan.push_back(g.count);
  return plan;
}

}  // namespace spex
