// spexctl watch's per-bucket rates (client/watch_rates.h) are deltas of the daemon's running
// totals over the interval: right with several exchanges of different sizes per refresh, with
// none, for a bucket registered in between or registered again (counts restart), and unknown
// ("-") on the first refresh and from a daemon without the totals.
#include "client/watch_rates.h"

#include "gtest/gtest.h"

namespace spex {
namespace {

v1::BucketStats* AddBucket(v1::GetStatsResponse* r, uint64_t id, uint64_t exchanges, uint64_t sent,
                           uint64_t received, uint64_t last_sent) {
  v1::BucketStats* b = r->add_buckets();
  b->set_bucket_id(id);
  b->set_exchanges(exchanges);
  b->set_bytes_sent_total(sent);
  b->set_bytes_received_total(received);
  b->mutable_last()->set_bytes_sent(last_sent);
  b->mutable_last()->set_bytes_received(last_sent);
  return b;
}

TEST(WatchRatesTest, FirstRefreshIsUnknown) {
  WatchRates w;
  v1::GetStatsResponse r;
  AddBucket(&r, 0, 3, 300, 600, 100);
  const auto rates = w.Update(r, 1.0);
  ASSERT_EQ(rates.size(), 1u);
  EXPECT_LT(rates.at(0).exchanges, 0);
  EXPECT_LT(rates.at(0).bytes_sent, 0);
  EXPECT_LT(rates.at(0).bytes_received, 0);
}

TEST(WatchRatesTest, SeveralExchangesOfDifferentSizesPerRefresh) {
  WatchRates w;
  v1::GetStatsResponse a, b;
  AddBucket(&a, 7, 10, 1000, 2000, 100);
  // Three exchanges of 100, 400 and 50 bytes sent (and twice that received) in 2 s: the last
  // one's 50 bytes times 1.5 exchanges/s (75 B/s) would be wrong; 550 B / 2 s is right.
  AddBucket(&b, 7, 13, 1550, 3100, 50);
  w.Update(a, 1.0);
  const auto rates = w.Update(b, 2.0);
  EXPECT_DOUBLE_EQ(rates.at(7).exchanges, 1.5);
  EXPECT_DOUBLE_EQ(rates.at(7).bytes_sent, 275);
  EXPECT_DOUBLE_EQ(rates.at(7).bytes_received, 550);
}

TEST(WatchRatesTest, NoExchangeIsZero) {
  WatchRates w;
  v1::GetStatsResponse a;
  AddBucket(&a, 1, 5, 500, 500, 100);
  w.Update(a, 1.0);
  const auto rates = w.Update(a, 0.5);
  EXPECT_EQ(rates.at(1).exchanges, 0);
  EXPECT_EQ(rates.at(1).bytes_sent, 0);
  EXPECT_EQ(rates.at(1).bytes_received, 0);
}

TEST(WatchRatesTest, NewAndReregisteredBucketsCountFromZero) {
  WatchRates w;
  v1::GetStatsResponse a, b;
  AddBucket(&a, 1, 50, 5000, 5000, 100);
  w.Update(a, 1.0);
  AddBucket(&b, 1, 2, 300, 200, 100);  // registered again: its counts restarted
  AddBucket(&b, 2, 4, 400, 800, 100);  // new
  const auto rates = w.Update(b, 1.0);
  EXPECT_EQ(rates.at(1).exchanges, 2);
  EXPECT_EQ(rates.at(1).bytes_sent, 300);
  EXPECT_EQ(rates.at(1).bytes_received, 200);
  EXPECT_EQ(rates.at(2).exchanges, 4);
  EXPECT_EQ(rates.at(2).bytes_sent, 400);
  EXPECT_EQ(rates.at(2).bytes_received, 800);
}

TEST(WatchRatesTest, ForgetMakesTheNextRefreshUnknown) {
  WatchRates w;
  v1::GetStatsResponse a;
  AddBucket(&a, 1, 5, 500, 500, 100);
  w.Update(a, 1.0);
  w.Forget();
  EXPECT_LT(w.Update(a, 1.0).at(1).exchanges, 0);
  EXPECT_EQ(w.Update(a, 1.0).at(1).exchanges, 0);
}

TEST(WatchRatesTest, DaemonWithoutTotalsGivesUnknownBytes) {
  WatchRates w;
  v1::GetStatsResponse a, b;
  AddBucket(&a, 1, 5, 0, 0, 100)->clear_bytes_sent_total();
  AddBucket(&b, 1, 9, 0, 0, 100)->clear_bytes_sent_total();
  a.mutable_buckets(0)->clear_bytes_received_total();
  b.mutable_buckets(0)->clear_bytes_received_total();
  w.Update(a, 1.0);
  const auto rates = w.Update(b, 2.0);
  EXPECT_EQ(rates.at(1).exchanges, 2);
  EXPECT_LT(rates.at(1).bytes_sent, 0);
  EXPECT_LT(rates.at(1).bytes_received, 0);
}

// The table's type column: the bucket's data type as `spexctl stats` shows it (float32 from a
// daemon that leaves the field empty), under a "type" heading, before the state.
TEST(WatchRowTest, ShowsTheBucketsDataType) {
  v1::GetStatsResponse r;
  v1::BucketStats* half = AddBucket(&r, 3, 5, 500, 500, 100);
  half->set_compressor("micro");
  half->set_dtype("bfloat16");
  half->set_state("exchanging");
  v1::BucketStats* old = AddBucket(&r, 4, 5, 500, 500, 100);
  old->set_compressor("dense");
  BucketRates rates;
  rates.exchanges = 2.5;
  rates.bytes_sent = 1500;
  const std::string header = WatchHeader();
  const std::string row = WatchRow(*half, rates);
  EXPECT_NE(header.find("compressor   type     state"), std::string::npos) << header;
  EXPECT_NE(row.find("       3 micro        bfloat16 exchanging"), std::string::npos) << row;
  EXPECT_NE(row.find("1.5K"), std::string::npos) << row;
  EXPECT_NE(WatchRow(*old, rates).find(" dense        float32  -"), std::string::npos)
      << WatchRow(*old, rates);
  // The column sits where the header puts it.
  EXPECT_EQ(row.find("bfloat16"), header.find("type"));
}

}  // namespace
}  // namespace spex
