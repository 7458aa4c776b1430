#include "daemon/merge/merger.h"

#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "daemon/merge/merge_timing.h"
#include "daemon/merge/mergers.h"
#include "daemon/merge/mgs_plan.h"
#include "daemon/merge/rgmerge_model.h"
#include "gtest/gtest.h"

namespace spex {
namespace {

using K = MergeKind;

MergeCandidate Cand(uint64_t id, uint64_t step, uint64_t n, bool ready = true, K kind = K::kDense) {
  MergeCandidate c;
  c.bucket_id = id;
  c.step = step;
  c.elements = n;
  c.ready = ready;
  c.kind = kind;
  return c;
}

size_t Sum(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t{0}); }

TEST(MergerTest, NoneExchangesOneBucketAtATime) {
  auto m = MakeMerger("none");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_STREQ((*m)->name(), "none");
  EXPECT_FALSE((*m)->agreed());
  MergeCandidate c[3] = {Cand(4, 0, 10), Cand(7, 0, 20), Cand(2, 1, 30, false)};
  EXPECT_EQ((*m)->NextGroup(absl::MakeConstSpan(c, 3)), 1u);
  EXPECT_EQ((*m)->NextGroup(absl::MakeConstSpan(c, 1)), 1u);
}

// Grouping is every merger's job; measuring (meter) and plan agreement (planner) belong only to
// the mergers that read timings or agree on a plan.
TEST(MergerTest, OnlyTheMergersThatMeasureOrPlanHaveThoseSides) {
  struct Case {
    const char* what;
    MergeParams params;
    MergerPolicy policy;
    bool meter, planner;
  };
  std::vector<Case> cases;
  MergeParams p;
  cases.push_back({"none", p, MergerPolicy::kNone, false, false});
  cases.push_back({"fixed", p, MergerPolicy::kFixed, false, false});
  cases.push_back({"omgs threshold", p, MergerPolicy::kOmgs, false, false});
  p.omgs_mode = OmgsMode::kCount;
  cases.push_back({"omgs count", p, MergerPolicy::kOmgs, false, false});
  p.omgs_mode = OmgsMode::kMgs;
  cases.push_back({"omgs mgs", p, MergerPolicy::kOmgs, true, true});
  p = MergeParams();
  cases.push_back({"rgmerge ready", p, MergerPolicy::kRgmerge, false, false});
  p.rgmerge_linger_auto = true;
  cases.push_back({"rgmerge ready, linger", p, MergerPolicy::kRgmerge, true, false});
  p.rgmerge_linger_auto = false;
  p.rgmerge_bind_late = true;
  cases.push_back({"rgmerge ready, late", p, MergerPolicy::kRgmerge, true, false});
  p.rgmerge_bind_late = false;
  p.rgmerge_model = true;
  cases.push_back({"rgmerge model", p, MergerPolicy::kRgmerge, true, true});
  for (const Case& c : cases) {
    auto m = MakeMerger(c.policy, c.params);
    ASSERT_TRUE(m.ok()) << c.what << ": " << m.status();
    EXPECT_EQ((*m)->meter() != nullptr, c.meter) << c.what;
    EXPECT_EQ((*m)->planner() != nullptr, c.planner) << c.what;
    EXPECT_EQ((*m)->meter(), (*m)->meter()) << c.what;  // one meter for the merger's life
  }
}

TEST(MergerTest, EveryPolicyIsMadeAndBadParametersNameTheirFlag) {
  for (const char* name : {"fixed", "omgs", "rgmerge"}) {
    auto m = MakeMerger(name);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_STREQ((*m)->name(), name);
  }
  MergeParams p;
  p.limits.window = 65;
  auto w = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("--merge_window"), std::string::npos) << w.status();
  p = MergeParams();
  p.fixed_cycle_ms = -1;
  auto c = MakeMerger(MergerPolicy::kFixed, p);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--fixed_cycle_ms"), std::string::npos) << c.status();
  auto m = MakeMerger("horovod");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("accepted: none"), std::string::npos) << m.status();
}

TEST(GroupRulesTest, NeverCrossAStepNeverGroupAProbeNeverExceedTheLimit) {
  GroupLimits limits;
  limits.max_group_elements = 100;
  std::vector<MergeCandidate> c = {Cand(0, 3, 40), Cand(1, 3, 40), Cand(2, 3, 40), Cand(3, 4, 1)};
  EXPECT_EQ(ClampGroup(c, 4, limits), 2u);  // 40+40+40 > 100
  limits.max_group_elements = 1000;
  EXPECT_EQ(ClampGroup(c, 4, limits), 3u);  // bucket 3 is at step 4
  c[1].kind = K::kProbe;
  EXPECT_EQ(ClampGroup(c, 4, limits), 1u);  // a P member ends the group before it
  c[0].kind = K::kProbe;
  EXPECT_EQ(ClampGroup(c, 4, limits), 1u);  // a P head is alone
  // A single bucket larger than the limit still forms a group on its own.
  limits.max_group_elements = 10;
  EXPECT_EQ(ClampGroup({Cand(0, 0, 50), Cand(1, 0, 1)}, 2, limits), 1u);
  EXPECT_EQ(ClampGroup({}, 2, limits), 0u);
}

TEST(GroupRulesTest, ReadyPrefixStopsAtTheFirstNotReadyOtherStepProbeOrWindow) {
  std::vector<MergeCandidate> c = {Cand(0, 1, 5), Cand(1, 1, 5), Cand(2, 1, 5, false),
                                   Cand(3, 1, 5)};
  EXPECT_EQ(ReadyPrefix(c, 64), 2u);
  EXPECT_EQ(ReadyPrefix(c, 1), 1u);
  c[0].ready = false;
  EXPECT_EQ(ReadyPrefix(c, 64), 0u);
  c = {Cand(0, 1, 5), Cand(1, 2, 5)};
  EXPECT_EQ(ReadyPrefix(c, 64), 1u);
  c = {Cand(0, 1, 5), Cand(1, 1, 5, true, K::kProbe)};
  EXPECT_EQ(ReadyPrefix(c, 64), 1u);
}

TEST(FixedMergerTest, LingersForTheCycleThenOffersTheReadyPrefix) {
  FixedOptions o;
  o.cycle_ms = 5;
  auto m = MakeFixedMerger(o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->agreed());
  std::vector<MergeCandidate> c = {Cand(0, 0, 8), Cand(1, 0, 8), Cand(2, 0, 8, false)};
  int64_t deadline = -1;
  EXPECT_EQ((*m)->Offer(c, 1000, &deadline), 2u);  // first round starts at once
  EXPECT_EQ((*m)->Offer(c, 1000 + 4999999, &deadline), 0u);
  EXPECT_EQ(deadline, 1000 + 5000000);
  EXPECT_EQ((*m)->Offer(c, 1000 + 5000000, &deadline), 2u);
  // Long past the deadline: at once again.
  EXPECT_EQ((*m)->Offer(c, 1000 + 50000000, &deadline), 2u);
}

TEST(FixedMergerTest, PacksGreedilyUnderTheByteThreshold) {
  FixedOptions o;
  o.threshold_bytes = 4 * 100;  // 100 elements
  auto m = MakeFixedMerger(o);
  ASSERT_TRUE(m.ok());
  std::vector<MergeCandidate> c = {Cand(0, 0, 60), Cand(1, 0, 40), Cand(2, 0, 1), Cand(3, 0, 500),
                                   Cand(4, 0, 10)};
  EXPECT_EQ((*m)->Pack(c), (std::vector<size_t>{2, 1, 1, 1}));  // 500 > T goes alone
  o.threshold_bytes = 0;  // Horovod's fusion disabled: one bucket per group
  auto off = MakeFixedMerger(o);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->Pack(c), (std::vector<size_t>(5, 1)));
}

TEST(OmgsMergerTest, ThresholdClosesWithTheBucketThatReachesIt) {
  OmgsOptions o;
  o.threshold_elements = 100;
  auto m = MakeOmgsMerger(o);
  ASSERT_TRUE(m.ok());
  EXPECT_FALSE((*m)->agreed());
  std::vector<MergeCandidate> c = {Cand(0, 0, 30, false), Cand(1, 0, 30), Cand(2, 0, 50),
                                   Cand(3, 0, 10)};
  EXPECT_EQ((*m)->NextGroup(c), 3u);  // 30+30+50 >= 100, `ready` plays no part
  EXPECT_EQ((*m)->NextGroup(absl::MakeConstSpan(c).subspan(3)), 1u);  // last group smaller
}

TEST(OmgsMergerTest, CountGroupsAndRefusals) {
  OmgsOptions o;
  o.mode = OmgsMode::kCount;
  o.count = 2;
  auto m = MakeOmgsMerger(o);
  ASSERT_TRUE(m.ok());
  std::vector<MergeCandidate> c = {Cand(0, 0, 1), Cand(1, 0, 1), Cand(2, 0, 1)};
  EXPECT_EQ((*m)->NextGroup(c), 2u);
  o.mode = OmgsMode::kMgs;
  o.plan_step = 0;
  auto mgs = MakeOmgsMerger(o);
  ASSERT_FALSE(mgs.ok());
  EXPECT_NE(mgs.status().message().find("--merge_plan_step"), std::string::npos) << mgs.status();
  o.mode = OmgsMode::kCount;
  o.count = 0;
  auto bad = MakeOmgsMerger(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--omgs_count"), std::string::npos);
  o.count = 2;
  o.limits.window = 65;
  bad = MakeOmgsMerger(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--merge_window"), std::string::npos);
}

TEST(RgmergeReadyTest, OffersTheReadyPrefixAndPacksUnderTheGroupLimit) {
  RgmergeOptions o;
  o.limits.max_group_elements = 100;
  auto m = MakeRgmergeReadyMerger(o);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->agreed());
  std::vector<MergeCandidate> c = {Cand(0, 0, 60), Cand(1, 0, 30), Cand(2, 0, 30),
                                   Cand(3, 0, 30, false)};
  int64_t deadline = 0;
  EXPECT_EQ((*m)->Offer(c, 0, &deadline), 3u);
  EXPECT_EQ((*m)->Pack(absl::MakeConstSpan(c).first(3)), (std::vector<size_t>{2, 1}));
}

// --- --rgmerge_linger=auto (docs/merging.md 5.1), with an injected clock. Buckets 0..3 of step
// 5 become ready 300 us apart; the engine reports them as members of step 4 to teach the gaps.
constexpr int64_t kUs = 1000;

MergeCandidate Stamped(uint64_t id, uint64_t step, int64_t ready_ns) {
  MergeCandidate c = Cand(id, step, 100, ready_ns > 0);
  c.ready_ns = ready_ns;
  return c;
}

std::unique_ptr<Merger> LingeringMerger(int64_t alpha_us, int64_t max_us) {
  RgmergeOptions o;
  o.linger_auto = true;
  o.alpha_ns = alpha_us * kUs;
  o.linger_max_ns = max_us * kUs;
  auto m = MakeRgmergeReadyMerger(o);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  MergeMeter* meter = (*m)->meter();
  EXPECT_NE(meter, nullptr);
  if (meter == nullptr) return nullptr;
  EXPECT_TRUE(meter->measures());
  for (uint64_t b = 0; b < 4; ++b) meter->ObserveMember(b, 4, 1000 * kUs + 300 * kUs * b, 0);
  meter->ObserveExchange(1 << 20, 5000 * kUs);
  return std::move(*m);
}

TEST(RgmergeLingerTest, LingersForTheNextBucketExpectedWithinAlpha) {
  auto m = LingeringMerger(/*alpha_us=*/1000, /*max_us=*/2000);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = 10000 * kUs;  // bucket 0 of step 5 ready at t0, the engine idle long before
  m->meter()->ExchangeIdleSince(t0 - 5000 * kUs);
  std::vector<MergeCandidate> c = {Stamped(0, 5, t0), Stamped(1, 5, 0), Stamped(2, 5, 0),
                                   Stamped(3, 5, 0)};
  int64_t deadline = 0;
  // Bucket 1 is expected at t0 + 300 us, within alpha: wait until then plus a tenth of the gap.
  EXPECT_EQ(m->Offer(c, t0 + 10 * kUs, &deadline), 0u);
  EXPECT_EQ(deadline, t0 + 330 * kUs);
  // It came: wait for bucket 2 too (t0 + 600 us + 30 us).
  c[1] = Stamped(1, 5, t0 + 310 * kUs);
  EXPECT_EQ(m->Offer(c, t0 + 320 * kUs, &deadline), 0u);
  EXPECT_EQ(deadline, t0 + 640 * kUs);
  // Bucket 2 is late past its deadline: offer what is ready.
  EXPECT_EQ(m->Offer(c, t0 + 650 * kUs, &deadline), 2u);
  // Everything of the step ready: nothing to wait for.
  for (uint64_t b = 2; b < 4; ++b) c[b] = Stamped(b, 5, t0 + 700 * kUs);
  EXPECT_EQ(m->Offer(c, t0 + 700 * kUs, &deadline), 4u);
  // The next bucket belongs to the next step: the step ends here, no linger.
  std::vector<MergeCandidate> end = {Stamped(3, 5, t0), Stamped(0, 6, 0)};
  EXPECT_EQ(m->Offer(end, t0 + 10 * kUs, &deadline), 1u);
}

TEST(RgmergeLingerTest, NeverRightAfterAnExchangeNorForABucketFartherThanAlpha) {
  auto m = LingeringMerger(/*alpha_us=*/1000, /*max_us=*/2000);
  ASSERT_NE(m, nullptr);
  const int64_t t0 = 10000 * kUs;
  std::vector<MergeCandidate> c = {Stamped(0, 5, t0), Stamped(1, 5, 0)};
  int64_t deadline = 0;
  m->meter()->ExchangeIdleSince(t0 - 500 * kUs);  // an exchange ended less than alpha ago
  EXPECT_EQ(m->Offer(c, t0, &deadline), 1u);
  m->meter()->ExchangeIdleSince(t0 + 5 * kUs);  // one is on the wire now
  EXPECT_EQ(m->Offer(c, t0 + 5 * kUs, &deadline), 1u);
  // Idle, but the next bucket is expected 300 us on and alpha is only 200 us.
  auto tight = LingeringMerger(/*alpha_us=*/200, /*max_us=*/2000);
  ASSERT_NE(tight, nullptr);
  tight->meter()->ExchangeIdleSince(0);
  EXPECT_EQ(tight->Offer(c, t0, &deadline), 1u);
  EXPECT_EQ(tight->Offer(c, t0 + 150 * kUs, &deadline), 0u);  // now within 200 us
  // No gap learnt for the bucket (a fresh merger), or no stamp on its predecessor: no linger.
  RgmergeOptions o;
  o.linger_auto = true;
  auto fresh = MakeRgmergeReadyMerger(o);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ((*fresh)->Offer(c, t0, &deadline), 1u);
  std::vector<MergeCandidate> unstamped = {Cand(0, 5, 100), Stamped(1, 5, 0)};
  EXPECT_EQ(m->Offer(unstamped, t0 + 5000 * kUs, &deadline), 1u);
  // Linger off (the default) never waits: it takes no timings at all.
  auto off = MakeRgmergeReadyMerger(RgmergeOptions());
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->meter(), nullptr);
  EXPECT_EQ((*off)->Offer(c, t0, &deadline), 1u);
}

TEST(RgmergeLingerTest, TheLingerPerHeadIsCappedByLingerMax) {
  auto m = LingeringMerger(/*alpha_us=*/1000, /*max_us=*/500);
  ASSERT_NE(m, nullptr);
  m->meter()->ExchangeIdleSince(0);
  const int64_t t0 = 10000 * kUs;
  std::vector<MergeCandidate> c = {Stamped(0, 5, t0), Stamped(1, 5, 0), Stamped(2, 5, 0),
                                   Stamped(3, 5, 0)};
  int64_t deadline = 0;
  EXPECT_EQ(m->Offer(c, t0, &deadline), 0u);
  EXPECT_EQ(deadline, t0 + 330 * kUs);
  c[1] = Stamped(1, 5, t0 + 300 * kUs);
  EXPECT_EQ(m->Offer(c, t0 + 300 * kUs, &deadline), 0u);
  EXPECT_EQ(deadline, t0 + 500 * kUs);  // bucket 2 is due at 630 us: capped at 500 us
  EXPECT_EQ(m->Offer(c, t0 + 500 * kUs, &deadline), 2u);
  // A new head starts its own budget.
  std::vector<MergeCandidate> next = {Stamped(2, 5, t0 + 600 * kUs), Stamped(3, 5, 0)};
  EXPECT_EQ(m->Offer(next, t0 + 600 * kUs, &deadline), 0u);
  EXPECT_EQ(deadline, t0 + 930 * kUs);
}

// --rgmerge_bind=late: while a pack is on the wire, the next round waits until its local work
// (a line fitted to the packs' local times against elements) would end as the wire's pack does (a
// line fitted to the wire times), then offers; with the wire idle, too few samples or the moment
// passed, it offers at once.
TEST(RgmergeBindTest, WhileAPackIsOnTheWireTheRoundWaitsUntilItsLocalWorkWouldEndWithIt) {
  RgmergeOptions o;
  o.bind_late = true;
  auto made = MakeRgmergeReadyMerger(o);
  ASSERT_TRUE(made.ok());
  Merger* m = made->get();
  MergeMeter* meter = m->meter();
  ASSERT_NE(meter, nullptr);
  EXPECT_FALSE(meter->measures());  // the stage times only: no members, no exchanges
  // Local work: 1 ms + 1 ns per element; wire: 2 ms + 4 ns per element (exact lines).
  const auto local = [](uint64_t n) { return static_cast<int64_t>(1000 * kUs + n); };
  const auto wire = [](uint64_t n) { return static_cast<int64_t>(2000 * kUs + 4 * n); };
  std::vector<MergeCandidate> c = {Cand(0, 5, 100000), Cand(1, 5, 200000), Cand(2, 5, 50, false)};
  int64_t deadline = 0;
  const int64_t t0 = 50000 * kUs;
  // Three samples of each so far: not enough to go by, offer at once.
  for (uint64_t n : {100000u, 300000u, 500000u}) {
    meter->PackHandedOff(n, local(n), 0);
    meter->PackDone(n, wire(n));
  }
  meter->PackHandedOff(1000000, local(1000000),
                       t0);                 // the fourth local sample; on the wire from t0
  meter->ExchangeIdleSince(t0 + 10 * kUs);  // busy: the scheduler passes `now`
  EXPECT_EQ(m->Offer(c, t0 + 10 * kUs, &deadline), 2u);
  meter->PackDone(700000, wire(700000));  // the fourth wire sample (a pack before this one)
  // The pack of 1M elements ends at t0 + 6 ms; the ready prefix (300000 elements) needs 1.3 ms:
  // start at t0 + 4.7 ms.
  EXPECT_EQ(m->Offer(c, t0 + 10 * kUs, &deadline), 0u);
  EXPECT_NEAR(deadline, t0 + 4700 * kUs, 10);  // least squares in doubles: a few ns off
  // Bucket 2 is ready now too: 300050 elements, 50 ns more local work, an earlier start.
  c[2].ready = true;
  meter->ExchangeIdleSince(t0 + 1000 * kUs);
  EXPECT_EQ(m->Offer(c, t0 + 1000 * kUs, &deadline), 0u);
  EXPECT_NEAR(deadline, t0 + 4700 * kUs - 50, 10);
  // At the deadline: offer.
  meter->ExchangeIdleSince(t0 + 4700 * kUs);
  EXPECT_EQ(m->Offer(c, t0 + 4700 * kUs, &deadline), 3u);
  // The wire went idle before the estimate (it rang the doorbell): offer at once.
  meter->ExchangeIdleSince(t0 + 3000 * kUs);
  EXPECT_EQ(m->Offer(c, t0 + 3100 * kUs, &deadline), 3u);
  // Early binding (the default) never waits for the wire: it takes no timings at all.
  auto early = MakeRgmergeReadyMerger(RgmergeOptions());
  ASSERT_TRUE(early.ok());
  EXPECT_EQ((*early)->meter(), nullptr);
  EXPECT_EQ((*early)->Offer(c, t0 + 10 * kUs, &deadline), 3u);
}

TEST(RgmergeLingerTest, AlphaIsFittedFromTheExchangesWhenNotGiven) {
  RgmergeOptions o;
  o.linger_auto = true;
  auto m = MakeRgmergeReadyMerger(o);
  ASSERT_TRUE(m.ok());
  MergeMeter* meter = (*m)->meter();
  ASSERT_NE(meter, nullptr);
  for (uint64_t b = 0; b < 2; ++b) meter->ObserveMember(b, 4, 1000 * kUs + 300 * kUs * b, 0);
  meter->ExchangeIdleSince(0);
  const int64_t t0 = 10000 * kUs;
  std::vector<MergeCandidate> c = {Stamped(0, 5, t0), Stamped(1, 5, 0)};
  int64_t deadline = 0;
  // Before any exchange: SAFusion's 3.78 ms, so a bucket 300 us away is waited for.
  EXPECT_EQ((*m)->Offer(c, t0, &deadline), 0u);
  // Exchanges of 100 us + 1 ns/B: alpha 100 us, and the bucket 300 us away is not.
  for (uint64_t bytes : {1000u, 50000u, 200000u}) {
    meter->ObserveExchange(bytes, static_cast<int64_t>(100 * kUs + bytes));
  }
  EXPECT_EQ((*m)->Offer(c, t0 + kUs, &deadline), 1u);
  EXPECT_EQ((*m)->Offer(c, t0 + 250 * kUs, &deadline), 0u);
}

// Trainer-written stamps may be anything: absurd ones never overflow (UBSan) and never make the
// engine wait past linger_max.
TEST(RgmergeLingerTest, AbsurdStampsNeitherOverflowNorWaitLong) {
  RgmergeOptions o;
  o.linger_auto = true;
  o.alpha_ns = int64_t{1} << 61;  // everything is "within alpha"
  o.linger_max_ns = 500 * kUs;
  auto m = MakeRgmergeReadyMerger(o);
  ASSERT_TRUE(m.ok());
  MergeMeter* meter = (*m)->meter();
  ASSERT_NE(meter, nullptr);
  const int64_t huge = std::numeric_limits<int64_t>::max() - 5;
  meter->ObserveMember(0, 4, 1, 0);
  meter->ObserveMember(1, 4, huge, 0);  // a gap of ~2^63, kept as an hour
  meter->ObserveMember(2, 4, -7, 0);
  meter->ExchangeIdleSince(0);
  int64_t deadline = 0;
  const int64_t now = int64_t{1} << 62;
  for (int64_t stamp : {huge, int64_t{1}, now, now - (int64_t{1} << 61)}) {
    std::vector<MergeCandidate> c = {Stamped(0, 5, stamp), Stamped(1, 5, 0)};
    deadline = 0;
    const size_t r = (*m)->Offer(c, now, &deadline);
    if (r == 0) {
      EXPECT_GT(deadline, now);
      EXPECT_LE(deadline, now + 500 * kUs) << stamp;
    } else {
      EXPECT_EQ(r, 1u) << stamp;
    }
  }
}

TEST(RgmergeLingerTest, FlagsAreValidatedAndNotHashed) {
  MergeParams p;
  p.rgmerge_linger_auto = true;
  p.rgmerge_linger_max_us = -1;
  auto bad = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--rgmerge_linger_max_us"), std::string::npos)
      << bad.status();
  p.rgmerge_linger_max_us = int64_t{1} << 60;  // would overflow in ns
  bad = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--rgmerge_linger_max_us"), std::string::npos);
  p.rgmerge_linger_max_us = 2000;
  auto on = MakeMerger(MergerPolicy::kRgmerge, p);
  p.rgmerge_linger_auto = false;
  auto off = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_TRUE(on.ok() && off.ok());
  EXPECT_EQ((*on)->ConfigHash(), (*off)->ConfigHash());  // may differ between nodes
  p.rgmerge_model = true;
  p.rgmerge_linger_auto = true;
  p.rgmerge_linger_max_us = -5;
  bad = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_FALSE(bad.ok());  // the model plan lingers as ready while it measures
  EXPECT_NE(bad.status().message().find("--rgmerge_linger_max_us"), std::string::npos);
}

// Every node forms the same groups from the same agreed prefix, whatever its own offer was: the
// packs are a function of the candidates only (the property the agreement round relies on).
TEST(MergerTest, PacksAreIdenticalAcrossInstancesAndCoverThePrefix) {
  std::vector<MergeCandidate> c;
  for (uint64_t i = 0; i < 40; ++i) c.push_back(Cand(i, 7, 1 + (i * 37) % 90, i % 3 != 0));
  FixedOptions fo;
  fo.threshold_bytes = 4 * 150;
  RgmergeOptions ro;
  ro.limits.max_group_elements = 200;
  auto f1 = MakeFixedMerger(fo), f2 = MakeFixedMerger(fo);
  auto r1 = MakeRgmergeReadyMerger(ro), r2 = MakeRgmergeReadyMerger(ro);
  ASSERT_TRUE(f1.ok() && f2.ok() && r1.ok() && r2.ok());
  int64_t d = 0;
  (*f1)->Offer(c, 123, &d);  // local timing state must not change the packing
  for (size_t m = 1; m <= c.size(); ++m) {
    auto prefix = absl::MakeConstSpan(c).first(m);
    EXPECT_EQ((*f1)->Pack(prefix), (*f2)->Pack(prefix));
    EXPECT_EQ(Sum((*f1)->Pack(prefix)), m);
    EXPECT_EQ((*r1)->Pack(prefix), (*r2)->Pack(prefix));
    EXPECT_EQ(Sum((*r1)->Pack(prefix)), m);
  }
}

TEST(MergerTest, ConfigHashesSeparateDifferentConfigurations) {
  FixedOptions a, b;
  b.threshold_bytes = a.threshold_bytes * 2;
  FixedOptions c = a;
  c.cycle_ms = 1;  // may differ between nodes
  auto ma = MakeFixedMerger(a), mb = MakeFixedMerger(b), mc = MakeFixedMerger(c);
  auto omgs = MakeOmgsMerger(OmgsOptions());
  auto rg = MakeRgmergeReadyMerger(RgmergeOptions());
  auto none = MakeMerger("none");
  ASSERT_TRUE(ma.ok() && mb.ok() && mc.ok() && omgs.ok() && rg.ok() && none.ok());
  EXPECT_NE((*ma)->ConfigHash(), (*mb)->ConfigHash());
  EXPECT_EQ((*ma)->ConfigHash(), (*mc)->ConfigHash());
  EXPECT_NE((*ma)->ConfigHash(), (*omgs)->ConfigHash());
  EXPECT_NE((*rg)->ConfigHash(), (*omgs)->ConfigHash());
  EXPECT_NE((*rg)->ConfigHash(), (*none)->ConfigHash());
}

// --- rgmerge's model generator (docs/merging.md 5.2): small integer profiles, groups worked out
// by hand. comm(x) = alpha + beta * 8 * floor(d x) * (N - 1) with beta = 125 ps/B, N = 2 and
// d = 1: alpha + x ns.
RgmergeModelInputs Profile(std::vector<uint64_t> n, std::vector<int64_t> w, int64_t alpha) {
  RgmergeModelInputs in;
  in.elements = std::move(n);
  in.gap_ns = std::move(w);
  in.select_ns.assign(in.elements.size(), 0);
  in.alpha_ns = alpha;
  in.beta_ps_per_byte = 125;
  in.density = 1.0;
  in.nodes = 2;
  return in;
}

TEST(RgmergeModelPlan, CommIsTheAllGatherOfThePairs) {
  RgmergeModelInputs in = Profile({}, {}, 10);
  EXPECT_EQ(RgmergeModelComm(in, 7), 17);
  in.nodes = 5;  // 4 peers' pairs, 8 bytes each at 0.125 ns/B
  EXPECT_EQ(RgmergeModelComm(in, 7), 10 + 4 * 7);
  in.density = 0.5;  // floor(3.5) = 3 pairs
  EXPECT_EQ(RgmergeModelComm(in, 7), 10 + 4 * 3);
}

// Step 1 closes {0,1} (gap 2 < alpha 10); the rest never pays (gaps 30, 50: waiting costs more
// than the start-ups saved) and stays one group; step 2 cannot merge them (the second group's
// W + C = 91 exceeds the first's M = comm(2) + 2 = 14); step 3 never cuts (comm of every prefix
// <= R = 91).
TEST(RgmergeModelPlan, PairsThenALeftover) {
  RgmergeModelInputs in = Profile({1, 1, 1, 1, 1, 1}, {0, 2, 3, 30, 4, 50}, 10);
  in.select_ns.assign(6, 1);
  EXPECT_EQ(RgmergeModelPlan(in), (std::vector<size_t>{2, 4}));
}

// Twenty buckets, gap 4 each: step 1 makes ten pairs (gap 8 < 10). The first two pairs are 2
// elements (M = 12), the others 2000 (M = 2010). Step 2: pairs 1 and 2 go alone (the budget 12
// holds one pair's W + C = 8, not two), then pair 2's budget 2010 takes the seven others: 2, 2,
// 2, 14. Step 3: R = 9 x 8 = 72; the prefix through group 2 (2004 elements) costs 2014 > 72, so
// the rest (14 buckets) is cut: group 2 holds 2 (< 3), so into floor(14 / 3) = 4 until half the
// buckets are assigned (6 + 4 = 10 of 20), then the remaining 10.
TEST(RgmergeModelPlan, OverlapMergingAndTheEqualTail) {
  std::vector<uint64_t> n(20, 1000);
  for (int b = 0; b < 4; ++b) n[b] = 1;
  RgmergeModelInputs in = Profile(n, std::vector<int64_t>(20, 4), 10);
  EXPECT_EQ(RgmergeModelPlan(in), (std::vector<size_t>{2, 2, 2, 4, 10}));
  in.equal_tail = false;  // the rest as one group
  EXPECT_EQ(RgmergeModelPlan(in), (std::vector<size_t>{2, 2, 2, 14}));
}

// Sixteen buckets of 200 elements at gap 4: eight pairs (M = comm(400) = 410, W + C = 8). Step 2
// with the accumulator restarting at each emission: pair 0, then pairs 1-7 fit its budget
// (7 x 8 = 56 <= 410): 2, 14. Step 3: R = 56, the first prefix already costs 410 > 56 (i = 0:
// no equal split), the rest is one group.
TEST(RgmergeModelPlan, FirstGroupThenTheRest) {
  RgmergeModelInputs in = Profile(std::vector<uint64_t>(16, 200), std::vector<int64_t>(16, 4), 10);
  EXPECT_EQ(RgmergeModelPlan(in), (std::vector<size_t>{2, 14}));
}

// The slack lets a pair close whose gaps (24) exceed one start-up (10): without it nothing ever
// closes and the four buckets are one group.
TEST(RgmergeModelPlan, Slack) {
  RgmergeModelInputs in = Profile({1, 1, 1, 1}, {12, 12, 12, 12}, 10);
  EXPECT_EQ(RgmergeModelPlan(in), (std::vector<size_t>{4}));
  in.slack_ns = 15;
  EXPECT_EQ(RgmergeModelPlan(in), (std::vector<size_t>{2, 2}));
}

TEST(RgmergeModelPlan, EdgeCases) {
  EXPECT_TRUE(RgmergeModelPlan(Profile({}, {}, 10)).empty());
  EXPECT_EQ(RgmergeModelPlan(Profile({5}, {0}, 10)), (std::vector<size_t>{1}));
  // Inputs that do not fit: one group per bucket.
  EXPECT_EQ(RgmergeModelPlan(Profile({5, 5}, {0}, 10)), (std::vector<size_t>{1, 1}));
  EXPECT_EQ(RgmergeModelPlan(Profile({5, 5}, {0, -1}, 10)), (std::vector<size_t>{1, 1}));
  // Every plan covers every bucket once.
  for (int L : {1, 2, 3, 7, 40, 161}) {
    std::vector<uint64_t> n(L);
    std::vector<int64_t> w(L);
    for (int b = 0; b < L; ++b) {
      n[b] = 1 + (b * 7919) % 100000;
      w[b] = (b * 104729) % 5000000;
    }
    RgmergeModelInputs in = Profile(n, w, 3780956);
    in.density = 0.01;
    in.nodes = 8;
    const std::vector<size_t> plan = RgmergeModelPlan(in);
    EXPECT_EQ(std::accumulate(plan.begin(), plan.end(), size_t{0}), static_cast<size_t>(L)) << L;
    for (size_t len : plan) EXPECT_GE(len, 1u) << L;
  }
}

TEST(MergeStatsTest, MedianAndLineFit) {
  EXPECT_EQ(MedianOf({}), 0);
  EXPECT_EQ(MedianOf({5}), 5);
  EXPECT_EQ(MedianOf({9, 1, 5}), 5);
  EXPECT_EQ(MedianOf({4, 1, 3, 2}), 2);  // the lower middle of an even count
  double a = 0, b = 0;
  EXPECT_FALSE(FitLine({1.0}, {2.0}, &a, &b));            // one sample
  EXPECT_FALSE(FitLine({3.0, 3.0}, {1.0, 2.0}, &a, &b));  // every x equal
  ASSERT_TRUE(FitLine({0, 1000, 2000, 4000}, {500, 1500, 2500, 4500}, &a, &b));
  EXPECT_NEAR(a, 500, 1e-9);
  EXPECT_NEAR(b, 1.0, 1e-12);
}

// rgmerge --rgmerge_plan=model (docs/merging.md 2.6, 5.2): `ready` until the plan step, then the
// plan computed from the agreed inputs as a static one, from the next step on.
std::unique_ptr<Merger> ModelMerger(uint64_t plan_step = 5) {
  MergeParams p;
  p.rgmerge_model = true;
  p.plan_step = plan_step;
  auto m = MakeMerger(MergerPolicy::kRgmerge, p);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

TEST(RgmergeModelMergerTest, MeasuresAgreesThenRunsThePlanFromTheNextStep) {
  std::unique_ptr<Merger> m = ModelMerger(5);
  ASSERT_NE(m, nullptr);
  MergeMeter* meter = m->meter();
  MergePlanner* planner = m->planner();
  ASSERT_NE(meter, nullptr);
  ASSERT_NE(planner, nullptr);
  EXPECT_TRUE(meter->measures());
  EXPECT_TRUE(m->AgreedAt(0));
  EXPECT_FALSE(planner->PlanDue(4));
  EXPECT_TRUE(planner->PlanDue(5));
  EXPECT_TRUE(planner->PlanDue(9));  // the first group at or after the plan step
  const uint64_t before = m->ConfigHash();
  // Four buckets in backprop order; bucket b ready 100 us after b-1 (except one outlier step),
  // selection 10 us each; exchanges of x bytes took 2 ms + 1 ns/B.
  const std::vector<PlanBucket> buckets = {{10, 1000}, {11, 2000}, {12, 3000}, {13, 4000}};
  for (uint64_t s = 0; s < 5; ++s) {
    const int64_t t0 = 1000000000 + static_cast<int64_t>(s) * 50000000;
    for (size_t b = 0; b < buckets.size(); ++b) {
      const int64_t gap = s == 2 ? 5000000 : 100000;  // the median drops the outlier
      meter->ObserveMember(buckets[b].bucket_id, s, t0 + static_cast<int64_t>(b) * gap,
                           10000 + static_cast<int64_t>(b));
    }
  }
  for (uint64_t bytes : {1000u, 5000u, 20000u}) {
    meter->ObserveExchange(bytes, 2000000 + static_cast<int64_t>(bytes));
  }
  std::vector<uint64_t> w = planner->PlanInputs(buckets);
  ASSERT_EQ(w.size(), 2 * buckets.size() + 2);
  EXPECT_EQ(w[0], 0u);  // the first bucket of a step has no gap
  EXPECT_EQ(w[1], 100000u);
  EXPECT_EQ(w[3], 100000u);
  EXPECT_EQ(w[4], 10000u);
  EXPECT_EQ(w[7], 10003u);
  EXPECT_NEAR(static_cast<double>(w[8]), 2000000, 2);  // alpha, ns
  EXPECT_NEAR(static_cast<double>(w[9]), 1000, 2);     // beta, ps per byte
  PlanContext ctx;
  ctx.nodes = 4;
  ctx.density = 0.01;
  planner->InstallPlan(buckets, w, 5, ctx);
  EXPECT_FALSE(planner->PlanDue(6));
  EXPECT_FALSE(meter->measures());  // later timings would never be used
  EXPECT_TRUE(m->AgreedAt(5));      // the plan step itself still runs as `ready`
  EXPECT_FALSE(m->AgreedAt(6));
  EXPECT_NE(m->ConfigHash(), before);
  EXPECT_NE(planner->PlanSummary(), "");
  // The plan is RgmergeModelPlan on the same inputs.
  RgmergeModelInputs in;
  in.elements = {1000, 2000, 3000, 4000};
  in.gap_ns = {0, 100000, 100000, 100000};
  in.select_ns = {10000, 10001, 10002, 10003};
  in.alpha_ns = static_cast<int64_t>(w[8]);
  in.beta_ps_per_byte = static_cast<int64_t>(w[9]);
  in.density = 0.01;
  in.nodes = 4;
  const std::vector<size_t> plan = RgmergeModelPlan(in);
  // gaps (0.1 ms) < alpha (2 ms): pairs [10 11] [12 13]; the rest as the generator says.
  ASSERT_FALSE(plan.empty());
  std::vector<MergeCandidate> c;
  for (const PlanBucket& b : buckets) c.push_back(Cand(b.bucket_id, 6, b.elements, false));
  size_t at = 0;
  for (size_t len : plan) {
    EXPECT_EQ(m->NextGroup(absl::MakeConstSpan(c).subspan(at)), len) << "group at " << at;
    at += len;
  }
  EXPECT_EQ(at, buckets.size());
  // A head in the middle of its plan group gets the rest of it; an unknown bucket goes alone;
  // a candidate out of the plan's order cuts the group.
  if (plan[0] > 1) {
    EXPECT_EQ(m->NextGroup(absl::MakeConstSpan(c).subspan(1)), plan[0] - 1);
    std::vector<MergeCandidate> odd = {c[0], Cand(99, 6, 10)};
    EXPECT_EQ(m->NextGroup(odd), 1u);
  }
  std::vector<MergeCandidate> unknown = {Cand(42, 6, 10), c[0]};
  EXPECT_EQ(m->NextGroup(unknown), 1u);
  // Another node given the same agreed words computes the same plan (hash).
  std::unique_ptr<Merger> twin = ModelMerger(5);
  twin->planner()->InstallPlan(buckets, w, 5, ctx);
  EXPECT_EQ(twin->ConfigHash(), m->ConfigHash());
  // Different words, a different hash (the group round then refuses the mix).
  std::vector<uint64_t> w2 = w;
  w2[1] += 1;
  std::unique_ptr<Merger> other = ModelMerger(5);
  other->planner()->InstallPlan(buckets, w2, 5, ctx);
  EXPECT_NE(other->ConfigHash(), m->ConfigHash());
}

TEST(RgmergeModelMergerTest, NoMeasurementsGiveTheDefaultsAndAnAbandonedPlanStaysReady) {
  std::unique_ptr<Merger> m = ModelMerger(3);
  ASSERT_NE(m, nullptr);
  MergePlanner* planner = m->planner();
  ASSERT_NE(planner, nullptr);
  const std::vector<PlanBucket> buckets = {{1, 100}, {2, 100}};
  std::vector<uint64_t> w = planner->PlanInputs(buckets);
  ASSERT_EQ(w.size(), 6u);
  RgmergeModelInputs defaults;
  EXPECT_EQ(w[4], static_cast<uint64_t>(defaults.alpha_ns));  // SAFusion's 3.78 ms
  EXPECT_EQ(w[5], static_cast<uint64_t>(defaults.beta_ps_per_byte));
  planner->AbandonPlan("the registered buckets differ");
  EXPECT_FALSE(planner->PlanDue(3));
  EXPECT_TRUE(m->AgreedAt(100));
  EXPECT_EQ(planner->PlanSummary(), "");
  // Words that do not match the bucket list: no plan either.
  std::unique_ptr<Merger> bad = ModelMerger(3);
  bad->planner()->InstallPlan(buckets, absl::MakeConstSpan(w).subspan(1), 3, PlanContext());
  EXPECT_TRUE(bad->AgreedAt(100));
}

TEST(RgmergeModelMergerTest, FlagsAreValidatedAndTheModeIsHashed) {
  MergeParams p;
  p.rgmerge_model = true;
  p.plan_step = 0;
  auto z = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("--merge_plan_step"), std::string::npos) << z.status();
  p.plan_step = 4;
  p.rgmerge_slack_us = -1;
  auto s = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--rgmerge_slack_us"), std::string::npos) << s.status();
  auto ready = MakeMerger(MergerPolicy::kRgmerge, MergeParams());
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ((*ready)->meter(), nullptr);  // ready without linger or late binding: no timings
  EXPECT_EQ((*ready)->planner(), nullptr);
  std::unique_ptr<Merger> model = ModelMerger(4);
  EXPECT_NE((*ready)->ConfigHash(), model->ConfigHash());
  EXPECT_NE(ModelMerger(5)->ConfigHash(), model->ConfigHash());
  EXPECT_STREQ(model->name(), "rgmerge");
}

// While it measures, the model plan runs as `ready`, its linger included: the timings reported
// to the model merger's meter reach the ready merger's linger.
TEST(RgmergeModelMergerTest, LingersAsReadyWhileItMeasures) {
  MergeParams p;
  p.rgmerge_model = true;
  p.plan_step = 100;
  p.rgmerge_linger_auto = true;
  p.merge_alpha_us = 1000;
  auto m = MakeMerger(MergerPolicy::kRgmerge, p);
  ASSERT_TRUE(m.ok()) << m.status();
  MergeMeter* meter = (*m)->meter();
  ASSERT_NE(meter, nullptr);
  for (uint64_t b = 0; b < 4; ++b) meter->ObserveMember(b, 4, 1000 * kUs + 300 * kUs * b, 0);
  const int64_t t0 = 10000 * kUs;
  meter->ExchangeIdleSince(t0 - 5000 * kUs);
  std::vector<MergeCandidate> c = {Stamped(0, 5, t0), Stamped(1, 5, 0)};
  int64_t deadline = 0;
  EXPECT_TRUE((*m)->AgreedAt(5));
  EXPECT_EQ((*m)->Offer(c, t0 + 10 * kUs, &deadline), 0u);  // bucket 1 due at t0 + 300 us
  EXPECT_EQ(deadline, t0 + 330 * kUs);
  meter->ExchangeIdleSince(t0 + 10 * kUs);  // a pack on the wire now: no linger
  EXPECT_EQ((*m)->Offer(c, t0 + 10 * kUs, &deadline), 1u);
}

// omgs --omgs_mode=mgs (docs/merging.md 4.3): hand-worked profiles of 4 buckets. Unless said
// otherwise: s = 0 (no selection time), alpha = 1000 ns, beta = 0, so tc(x) = 1000 ns and merging
// two buffers saves t_save = 1000 ns; with ts = 0 a buffer's selection ends when it is produced.
MgsInputs Mgs(std::vector<int64_t> gaps) {
  MgsInputs in;
  in.elements = {1000, 1000, 1000, 1000};
  in.gap_ns = std::move(gaps);
  in.dense = {false, false, false, false};
  in.select_fs = 0;
  in.alpha_ns = 1000;
  in.beta_ps_per_byte = 0;
  in.behind = false;
  return in;
}

TEST(MgsPlanTest, Log2InFixedPoint) {
  EXPECT_EQ(Log2Q16(0), 0);
  EXPECT_EQ(Log2Q16(1), 0);
  EXPECT_EQ(Log2Q16(2), 65536);
  EXPECT_EQ(Log2Q16(1024), 10 * 65536);
  EXPECT_NEAR(Log2Q16(1000), 9.965784 * 65536, 2);
  EXPECT_NEAR(Log2Q16(25557032), 24.607 * 65536, 70);
}

TEST(MgsPlanTest, MergesWhenTheWaitIsBelowTheSavedStartup) {
  // [0 500 3000 200]: bucket 1 comes 500 ns after 0 (< 1000 saved): merge, [0 1] (gap 500);
  // bucket 2 comes 3000 ns later: close; bucket 3 200 ns after 2: merge. [2 2].
  EXPECT_EQ(MgsPlan(Mgs({0, 500, 3000, 200})), (std::vector<size_t>{2, 2}));
  // The first pair is not forced together: bucket 1 1500 ns after 0 stays alone. [1 1 2].
  EXPECT_EQ(MgsPlan(Mgs({0, 1500, 3000, 200})), (std::vector<size_t>{1, 1, 2}));
  // A D bucket always joins its predecessor: bucket 1 dense gives [0 1] [2 3].
  MgsInputs d = Mgs({0, 1500, 3000, 200});
  d.dense[1] = true;
  EXPECT_EQ(MgsPlan(d), (std::vector<size_t>{2, 2}));
}

TEST(MgsPlanTest, TheWireBusyAnywayMakesWaitingFree) {
  // Bucket 0 is large: with beta = 1 ns/B, d = 0.01 and 2 nodes its exchange takes
  // tc(100000) = 1000 + 8 * 1000 = 9000 ns. Bucket 1 comes 5000 ns later (>= t_save: alone); its
  // exchange cannot start before bucket 0's ends at 9000, so it idles 4000 ns. Bucket 2 comes
  // 3000 ns after 1: t_wait = 3000 - 4000 < t_save = 1000, merge. Bucket 3 comes 2000 ns later:
  // the merged buffer (selected at 8000) idles 1000 ns; t_wait = 1000, not < 1000: alone.
  MgsInputs in = Mgs({0, 5000, 3000, 2000});
  in.elements = {100000, 1000, 1000, 1000};
  in.beta_ps_per_byte = 1000;
  EXPECT_EQ(MgsCommNs(in, 100000), 9000);
  EXPECT_EQ(MgsPlan(in), (std::vector<size_t>{1, 2, 1}));
  // Without the idle time (bucket 0 small) bucket 2 stays alone.
  in.elements[0] = 1000;
  EXPECT_EQ(MgsPlan(in), (std::vector<size_t>{1, 1, 1, 1}));
}

TEST(MgsPlanTest, SelectingBehindCountsTheMergedSelectionsExtraCost) {
  // s = 1 ns per element-log2: ts(1000) ~ 9966 ns, ts(2000) ~ 21932 ns, so selecting the pair as
  // one buffer costs ~2000 ns more than apart. Ahead (selection per bucket) that term is 0 and
  // the pair [0 1] merges (t_wait 500); behind it does not (t_wait ~2500 >= 1000).
  MgsInputs in = Mgs({0, 500, 3000, 200});
  in.select_fs = 1000000;
  EXPECT_NEAR(MgsSelectNs(in, 1000), 9966, 1);
  EXPECT_EQ(MgsPlan(in)[0], 2u);
  in.behind = true;
  EXPECT_EQ(MgsPlan(in)[0], 1u);
  // The fit of s through the origin recovers a proportional profile.
  const std::vector<uint64_t> n = {1000, 4000, 16000};
  std::vector<int64_t> sigma;
  for (uint64_t x : n) sigma.push_back(MgsSelectNs(in, x));
  EXPECT_NEAR(static_cast<double>(FitSelectFs(n, sigma, 7)), 1000000, 2000);
  EXPECT_EQ(FitSelectFs({1, 5}, {0, 0}, 7), 7);  // nothing to fit: the fallback
}

TEST(OmgsMgsMergerTest, OneBucketPerExchangeUntilThePlanThenThePlan) {
  MergeParams p;
  p.omgs_mode = OmgsMode::kMgs;
  p.plan_step = 3;
  auto made = MakeMerger(MergerPolicy::kOmgs, p);
  ASSERT_TRUE(made.ok()) << made.status();
  Merger& m = **made;
  EXPECT_FALSE(m.agreed());
  EXPECT_TRUE(m.behind());  // --omgs_select=behind by default
  MergeMeter* meter = m.meter();
  MergePlanner* planner = m.planner();
  ASSERT_NE(meter, nullptr);
  ASSERT_NE(planner, nullptr);
  EXPECT_TRUE(meter->measures());
  std::vector<MergeCandidate> c = {Cand(1, 0, 1000), Cand(2, 0, 1000), Cand(3, 0, 1000)};
  EXPECT_EQ(m.NextGroup(c), 1u);
  EXPECT_FALSE(planner->PlanDue(2));
  EXPECT_TRUE(planner->PlanDue(3));
  const std::vector<PlanBucket> buckets = {
      {1, 1000, K::kPatternB}, {2, 1000, K::kPatternB}, {3, 1000, K::kDense}};
  std::vector<uint64_t> w = planner->PlanInputs(buckets);
  ASSERT_EQ(w.size(), 2 * buckets.size() + 3);                        // g, sigma, alpha, beta, s
  EXPECT_EQ(w.back(), static_cast<uint64_t>(MgsInputs().select_fs));  // nothing measured
  // Gaps well under alpha (3.78 ms by default): everything merges.
  const uint64_t before = m.ConfigHash();
  PlanContext ctx;
  ctx.nodes = 2;
  planner->InstallPlan(buckets, w, 3, ctx);
  EXPECT_NE(m.ConfigHash(), before);
  EXPECT_NE(planner->PlanSummary(), "");
  for (MergeCandidate& x : c) x.step = 3;
  EXPECT_EQ(m.NextGroup(c), 1u);  // the plan step itself: as none
  for (MergeCandidate& x : c) x.step = 4;
  EXPECT_EQ(m.NextGroup(c), 3u);
  EXPECT_FALSE(planner->PlanDue(9));
}

// Absurd agreed inputs (a hostile trainer's ready stamps, maxed over nodes) make a poor plan,
// never a crash or an overflow (UBSan runs this): every bucket is planned exactly once.
TEST(PlanMergersTest, AbsurdAgreedInputsStillGiveAValidPlan) {
  std::vector<PlanBucket> buckets;
  for (uint64_t b = 0; b < 200; ++b) {
    buckets.push_back({b, (uint64_t{1} << 24) - b, b % 3 ? K::kPatternB : K::kDense});
  }
  for (uint64_t word : {~uint64_t{0}, uint64_t{1} << 63, uint64_t{0}}) {
    SCOPED_TRACE(word);
    MergeParams p;
    p.rgmerge_model = true;
    p.omgs_mode = OmgsMode::kMgs;
    p.plan_step = 1;
    for (MergerPolicy policy : {MergerPolicy::kRgmerge, MergerPolicy::kOmgs}) {
      auto m = MakeMerger(policy, p);
      ASSERT_TRUE(m.ok());
      MergePlanner* planner = (*m)->planner();
      ASSERT_NE(planner, nullptr);
      const size_t words = planner->PlanInputs(buckets).size();
      PlanContext ctx;
      ctx.nodes = 64;
      ctx.density = 1.0;
      planner->InstallPlan(buckets, std::vector<uint64_t>(words, word), 1, ctx);
      std::vector<MergeCandidate> c;
      for (const PlanBucket& b : buckets)
        c.push_back(Cand(b.bucket_id, 2, b.elements, true, b.kind));
      size_t at = 0, groups = 0;
      while (at < c.size()) {
        const size_t n = (*m)->NextGroup(
            absl::MakeConstSpan(c).subspan(at, std::min<size_t>(64, c.size() - at)));
        ASSERT_GE(n, 1u);
        at += n;
        ++groups;
      }
      EXPECT_EQ(at, c.size());
      EXPECT_GE(groups, 1u);
    }
  }
}
}  // namespace
}  // namespace spex
