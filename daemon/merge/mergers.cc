#include "daemon/merge/mergers.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace spex {
namespace {

uint64_t HashWords(const char* name, std::initializer_list<uint64_t> words) {
  uint64_t h = Fnv1a(kFnvOffset, name, std::char_traits<char>::length(name));
  for (uint64_t w : words) h = Fnv1a(h, &w, sizeof(w));
  return h;
}

absl::Status CheckLimits(const GroupLimits& limits) {
  if (limits.max_group_elements == 0) {
    return absl::InvalidArgumentError("--max_group_elements must be >= 1");
  }
  if (limits.window == 0 || limits.window > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--merge_window must be in [1, 64] (the agreement round carries 64 keys); got ",
        limits.window));
  }
  return absl::OkStatus();
}

// Greedy from the front: a new group starts where `fits` says the next member would not fit, or
// where ClampGroup (step, P, max_group_elements) cuts.
template <typename Fits>
std::vector<size_t> GreedyPack(absl::Span<const MergeCandidate> c, const GroupLimits& limits,
                               Fits fits) {
  std::vector<size_t> groups;
  size_t i = 0;
  while (i < c.size()) {
    const size_t legal = ClampGroup(c.subspan(i), c.size() - i, limits);
    uint64_t sum = c[i].elements;
    size_t n = 1;
    while (n < legal && fits(sum, c[i + n].elements)) {
      sum += c[i + n].elements;
      ++n;
    }
    groups.push_back(n);
    i += n;
  }
  return groups;
}

class FixedMerger : public Merger {
 public:
  explicit FixedMerger(const FixedOptions& o) : o_(o) {}
  const char* name() const override { return "fixed"; }
  bool agreed() const override { return true; }
  // The cycle time may differ between nodes (MERGING.md 3), so it is not hashed.
  uint64_t ConfigHash() const override {
    return HashWords("fixed", {o_.threshold_bytes, o_.limits.window, o_.limits.max_group_elements});
  }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    return c.empty() ? 0 : 1;  // never used: agreed mergers go through Offer/Pack
  }
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t now_ns, int64_t* deadline_ns) override {
    const int64_t cycle_ns = o_.cycle_ms * 1000000;
    if (has_round_ && now_ns < last_round_ns_ + cycle_ns) {
      *deadline_ns = last_round_ns_ + cycle_ns;
      return 0;
    }
    const size_t r = ReadyPrefix(c, o_.limits.window);
    if (r == 0) return 0;
    // A round that starts late (engine busy past the deadline) starts at once, as Horovod's
    // next cycle does after a long one.
    has_round_ = true;
    last_round_ns_ = now_ns;
    return r;
  }
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    const uint64_t t = o_.threshold_bytes;
    return GreedyPack(agreed, o_.limits,
                      [t](uint64_t sum, uint64_t next) { return t != 0 && 4 * (sum + next) <= t; });
  }

 private:
  FixedOptions o_;
  bool has_round_ = false;
  int64_t last_round_ns_ = 0;
};

class OmgsMerger : public Merger {
 public:
  explicit OmgsMerger(const OmgsOptions& o) : o_(o) {}
  const char* name() const override { return "omgs"; }
  uint64_t ConfigHash() const override {
    return HashWords("omgs", {static_cast<uint64_t>(o_.mode), o_.threshold_elements, o_.count,
                              o_.limits.window, o_.limits.max_group_elements});
  }
  // The plan group starting at the head: threshold closes WITH the bucket that brings the
  // running sum to >= T_el; count closes with the count-th bucket. Then the shared rules.
  size_t NextGroup(absl::Span<const MergeCandidate> c) override {
    if (c.empty()) return 0;
    size_t want = 0;
    if (o_.mode == OmgsMode::kCount) {
      want = static_cast<size_t>(o_.count);
    } else {
      uint64_t sum = 0;
      while (want < c.size()) {
        sum += c[want].elements;
        ++want;
        if (sum >= o_.threshold_elements) break;
      }
    }
    return ClampGroup(c, want, o_.limits);
  }

 private:
  OmgsOptions o_;
};

class RgmergeReadyMerger : public Merger {
 public:
  explicit RgmergeReadyMerger(const RgmergeOptions& o) : o_(o) {}
  const char* name() const override { return "rgmerge"; }
  bool agreed() const override { return true; }
  uint64_t ConfigHash() const override {
    return HashWords("rgmerge/ready", {o_.limits.window, o_.limits.max_group_elements});
  }
  size_t NextGroup(absl::Span<const MergeCandidate> c) override { return c.empty() ? 0 : 1; }
  // Linger off: the previous exchange's duration is the merge window.
  size_t Offer(absl::Span<const MergeCandidate> c, int64_t /*now_ns*/,
               int64_t* /*deadline_ns*/) override {
    return ReadyPrefix(c, o_.limits.window);
  }
  std::vector<size_t> Pack(absl::Span<const MergeCandidate> agreed) override {
    return GreedyPack(agreed, o_.limits, [](uint64_t, uint64_t) { return true; });
  }

 private:
  RgmergeOptions o_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Merger>> MakeFixedMerger(const FixedOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.cycle_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fixed_cycle_ms must be >= 0; got ", options.cycle_ms));
  }
  return std::unique_ptr<Merger>(new FixedMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeOmgsMerger(const OmgsOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  if (options.mode == OmgsMode::kMgs) {
    return absl::UnimplementedError(
        "--omgs_mode=mgs is not implemented; use --omgs_mode=threshold (default) or count");
  }
  if (options.mode == OmgsMode::kThreshold && options.threshold_elements == 0) {
    return absl::InvalidArgumentError("--omgs_threshold_elements must be >= 1");
  }
  if (options.mode == OmgsMode::kCount && options.count == 0) {
    return absl::InvalidArgumentError("--omgs_count must be >= 1");
  }
  return std::unique_ptr<Merger>(new OmgsMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeRgmergeReadyMerger(const RgmergeOptions& options) {
  if (absl::Status s = CheckLimits(options.limits); !s.ok()) return s;
  return std::unique_ptr<Merger>(new RgmergeReadyMerger(options));
}

absl::StatusOr<std::unique_ptr<Merger>> MakeMerger(MergerPolicy policy, const MergeParams& params) {
  switch (policy) {
    case MergerPolicy::kNone:
      return MakeNoMerger();
    case MergerPolicy::kFixed: {
      FixedOptions o;
      o.threshold_bytes = params.fixed_threshold_bytes;
      o.cycle_ms = params.fixed_cycle_ms;
      o.limits = params.limits;
      return MakeFixedMerger(o);
    }
    case MergerPolicy::kOmgs: {
      OmgsOptions o;
      o.mode = params.omgs_count_mode ? OmgsMode::kCount : OmgsMode::kThreshold;
      o.threshold_elements = params.omgs_threshold_elements;
      o.count = params.omgs_count;
      o.limits = params.limits;
      return MakeOmgsMerger(o);
    }
    case MergerPolicy::kRgmerge: {
      RgmergeOptions o;
      o.limits = params.limits;
      return MakeRgmergeReadyMerger(o);
    }
  }
  return absl::InvalidArgumentError("--merger: unknown policy");
}

}  // namespace spex
