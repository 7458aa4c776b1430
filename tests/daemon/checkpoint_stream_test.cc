// Checkpoint streams (SaveBucketState, LoadBucketState) against spexd's bounds, over a real gRPC
// server on a unix socket with spexd's thread quota (6 threads, 3 for calls that wait): at most
// --max_checkpoint_streams are open, and they count with waiting Exchange calls against the
// thread bound, so GetStats is served with every slot taken; a stream whose client stops sending
// or reading is cancelled at --checkpoint_stream_timeout; a record's memory is charged against
// --max_daemon_bytes before it is allocated (a registration that fits without it is refused while
// a stalled stream holds it) and freed when the client cancels.
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/service/spex_service.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "proto/spex.grpc.pb.h"
#include "tests/support/engine_cluster.h"
#include "tests/support/run_tag.h"

namespace spex::test {
namespace {

constexpr int kThreads = 6;                     // --rpc_threads
constexpr uint64_t kN = uint64_t{1} << 20;      // a large bucket's elements
constexpr uint64_t kChunk = uint64_t{1} << 19;  // SpexService::kStateChunkBytes

std::chrono::system_clock::time_point In(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoSeconds(d);
}

// One node's engine behind the service, served as spexd serves it.
class Daemon {
 public:
  Daemon(SpexService::Options so, uint64_t max_daemon_bytes = 0) {
    EngineClusterOptions o;
    o.nodes = 1;
    o.trainers = 1;
    o.cpu_primitives = true;
    o.engine.shm_tag = "ckptstream";
    o.engine.min_sparse_elements = 0;
    o.engine.dense_fallback = DenseFallback::kOff;
    o.engine.max_daemon_bytes = max_daemon_bytes;
    cluster_ = std::make_unique<EngineCluster>(o);
    so.max_waiting_exchanges = kThreads - 3;  // spexd: --rpc_threads - 3
    service_ = std::make_unique<SpexService>(
        &cluster_->engine(0), "test",
        PeerCred{static_cast<uint32_t>(geteuid()), static_cast<uint32_t>(getegid()),
                 static_cast<uint32_t>(getpid())},
        so);
    socket_ = absl::StrCat("/tmp/spex-ckptstream-", RunTag(), ".sock");
    unlink(socket_.c_str());
    grpc::ResourceQuota quota("ckptstream");
    quota.SetMaxThreads(kThreads);
    grpc::ServerBuilder builder;
    builder.SetResourceQuota(quota);
    builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
  }
  ~Daemon() {
    if (server_ != nullptr) server_->Shutdown(In(absl::Seconds(1)));
    server_.reset();
    service_.reset();
    unlink(socket_.c_str());
  }

  bool ok() const { return cluster_->status().ok() && server_ != nullptr; }
  Engine& engine() { return cluster_->engine(0); }

  // A stub on its own connection whose receive windows stay small (no BDP probing), so a
  // stream it does not read stalls the server's writes.
  std::unique_ptr<v1::Spex::Stub> Stub() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::Spex::NewStub(
        grpc::CreateCustomChannel("unix:" + socket_, grpc::InsecureChannelCredentials(), args));
  }

 private:
  std::unique_ptr<EngineCluster> cluster_;
  std::unique_ptr<SpexService> service_;
  std::string socket_;
  std::unique_ptr<grpc::Server> server_;
};

uint64_t Hello(v1::Spex::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(5)));
  v1::HelloRequest req;
  req.set_local_rank(0);
  req.set_local_size(1);
  req.set_protocol_version(1);
  v1::HelloResponse resp;
  grpc::Status s = stub->Hello(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.session_id();
}

grpc::Status Register(v1::Spex::Stub* stub, uint64_t session, uint64_t bucket, uint64_t n) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::RegisterBucketRequest req;
  req.set_session_id(session);
  req.set_bucket_id(bucket);
  req.set_elements(n);
  req.mutable_compressor()->set_name("topk");
  req.mutable_compressor()->set_density(0.01);
  v1::RegisterBucketResponse resp;
  return stub->RegisterBucket(&ctx, req, &resp);
}

grpc::Status Stats(v1::Spex::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(3)));
  v1::GetStatsResponse resp;
  return stub->GetStats(&ctx, v1::GetStatsRequest(), &resp);
}

// A LoadBucketState stream that sends `first` (when it has a total) and then nothing; Finish
// runs on a thread, which records when and how the stream ended.
struct StalledLoad {
  grpc::ClientContext ctx;
  v1::LoadBucketStateResponse resp;
  std::unique_ptr<grpc::ClientWriter<v1::BucketStateChunk>> writer;
  std::thread finish;
  grpc::Status status;
  absl::Duration took;
  std::atomic<bool> done{false};

  StalledLoad(v1::Spex::Stub* stub, const v1::BucketStateChunk& first) {
    ctx.set_deadline(In(absl::Seconds(10)));
    writer = stub->LoadBucketState(&ctx, &resp);
    if (first.total_bytes() > 0) writer->Write(first);
    const absl::Time start = absl::Now();
    finish = std::thread([this, start] {
      status = writer->Finish();
      took = absl::Now() - start;
      done = true;
    });
  }
  ~StalledLoad() {
    if (finish.joinable()) finish.join();
  }
};

template <typename Pred>
bool WaitFor(Pred pred, absl::Duration d) {
  for (const absl::Time end = absl::Now() + d; absl::Now() < end;) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return pred();
}

TEST(CheckpointStreams, BeyondTheCapRefusedAndStalledOnesCancelledAtTheTimeout) {
  SpexService::Options so;
  so.max_checkpoint_streams = 2;
  so.checkpoint_stream_timeout = absl::Seconds(1);
  Daemon d(so);
  ASSERT_TRUE(d.ok());
  auto stub = d.Stub();
  const uint64_t session = Hello(stub.get());
  ASSERT_TRUE(Register(stub.get(), session, 0, 1000).ok());
  std::vector<std::unique_ptr<StalledLoad>> loads;
  for (int i = 0; i < 3; ++i) {
    loads.push_back(std::make_unique<StalledLoad>(stub.get(), v1::BucketStateChunk()));
    if (i < 2) absl::SleepFor(absl::Milliseconds(100));  // the first two hold the slots
  }
  ASSERT_TRUE(WaitFor([&] { return loads[2]->done.load(); }, absl::Seconds(3)))
      << "the stream beyond --max_checkpoint_streams was not refused";
  EXPECT_EQ(loads[2]->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(loads[2]->status.error_message().find("--max_checkpoint_streams=2"), std::string::npos)
      << loads[2]->status.error_message();
  const grpc::Status stats = Stats(stub.get());
  EXPECT_TRUE(stats.ok()) << "GetStats with every stream slot taken: " << stats.error_message();
  for (int i = 0; i < 2; ++i) {
    loads[i]->finish.join();
    EXPECT_EQ(loads[i]->status.error_code(), grpc::StatusCode::CANCELLED)
        << i << ": " << loads[i]->status.error_message();
    EXPECT_GE(loads[i]->took, absl::Milliseconds(800)) << i;
    EXPECT_LT(loads[i]->took, absl::Seconds(5)) << i << ": the stalled stream was not cancelled";
  }
  // The slots are free again: a whole (if wrong) record is answered by the engine.
  v1::BucketStateChunk junk;
  junk.set_session_id(session);
  junk.set_bucket_id(0);
  junk.set_total_bytes(4);
  junk.set_data("junk");
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(5)));
  v1::LoadBucketStateResponse resp;
  auto w = stub->LoadBucketState(&ctx, &resp);
  w->Write(junk);
  w->WritesDone();
  const grpc::Status s = w->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_EQ(d.engine().checkpoint_bytes(), 0u);
}

TEST(CheckpointStreams, StreamsCountAgainstTheThreadsSoShortCallsAreServed) {
  SpexService::Options so;  // no stream cap: the thread bound alone (3 of 6 threads)
  so.checkpoint_stream_timeout = absl::Seconds(2);
  Daemon d(so);
  ASSERT_TRUE(d.ok());
  auto stub = d.Stub();
  std::vector<std::unique_ptr<StalledLoad>> loads;
  for (int i = 0; i < 5; ++i) {
    loads.push_back(std::make_unique<StalledLoad>(stub.get(), v1::BucketStateChunk()));
  }
  absl::SleepFor(absl::Milliseconds(500));
  const grpc::Status stats = Stats(stub.get());
  EXPECT_TRUE(stats.ok()) << "GetStats during 5 stalled streams: " << stats.error_message();
  int refused = 0;
  for (auto& l : loads) {
    l->finish.join();
    if (l->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      EXPECT_NE(l->status.error_message().find("--rpc_threads"), std::string::npos)
          << l->status.error_message();
      EXPECT_LT(l->took, absl::Seconds(1));
    } else {
      EXPECT_EQ(l->status.error_code(), grpc::StatusCode::CANCELLED) << l->status.error_message();
    }
  }
  EXPECT_EQ(refused, 2);
}

TEST(CheckpointStreams, RecordMemoryCountsAgainstTheLimitUntilTheClientCancels) {
  // A sparse 1 Mi-element bucket takes 24 MiB and a bit; a stream of its largest record
  // (8 bytes an element + 512 KiB) is charged twice that (the record and its decoded copy):
  // 17 MiB. Two buckets fit in 56 MiB, a bucket and a stream do, not two buckets and a stream.
  SpexService::Options so;
  so.max_checkpoint_streams = 4;
  so.checkpoint_stream_timeout = absl::Seconds(30);
  Daemon d(so, uint64_t{56} << 20);
  ASSERT_TRUE(d.ok());
  auto stub = d.Stub();
  const uint64_t session = Hello(stub.get());
  ASSERT_TRUE(Register(stub.get(), session, 0, kN).ok());
  v1::BucketStateChunk first;
  first.set_session_id(session);
  first.set_bucket_id(0);
  first.set_total_bytes(8 * kN + kChunk);
  first.set_data(std::string(100, 'x'));
  auto stalled = std::make_unique<StalledLoad>(stub.get(), first);
  ASSERT_TRUE(WaitFor([&] { return d.engine().checkpoint_bytes() == 2 * (8 * kN + kChunk); },
                      absl::Seconds(3)))
      << "charged: " << d.engine().checkpoint_bytes();
  grpc::Status s = Register(stub.get(), session, 1, kN);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  // The session's limit is the daemon's here (--max_session_bytes 0), and the session's is checked
  // first.
  EXPECT_NE(s.error_message().find("--max_session_bytes"), std::string::npos) << s.error_message();
  auto second = std::make_unique<StalledLoad>(stub.get(), first);
  second->finish.join();
  EXPECT_EQ(second->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << second->status.error_message();
  EXPECT_NE(second->status.error_message().find("a checkpoint stream needs"), std::string::npos)
      << second->status.error_message();
  EXPECT_FALSE(stalled->done.load());
  // The client gives up: the stream ends at once and its memory is released.
  stalled->ctx.TryCancel();
  stalled->finish.join();
  EXPECT_EQ(stalled->status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_LT(stalled->took, absl::Seconds(10));
  ASSERT_TRUE(WaitFor([&] { return d.engine().checkpoint_bytes() == 0; }, absl::Seconds(3)))
      << "still charged: " << d.engine().checkpoint_bytes();
  s = Register(stub.get(), session, 1, kN);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST(CheckpointStreams, AnUnreadSaveStreamIsCancelledAtTheTimeout) {
  SpexService::Options so;
  so.max_checkpoint_streams = 4;
  so.checkpoint_stream_timeout = absl::Seconds(1);
  Daemon d(so);
  ASSERT_TRUE(d.ok());
  auto stub = d.Stub();
  const uint64_t session = Hello(stub.get());
  ASSERT_TRUE(Register(stub.get(), session, 0, kN).ok());
  grpc::ClientContext ctx;
  ctx.set_deadline(In(absl::Seconds(10)));
  v1::SaveBucketStateRequest req;
  req.set_session_id(session);
  req.set_bucket_id(0);
  auto reader = stub->SaveBucketState(&ctx, req);  // a 4 MiB record, not read for 3 s
  // Once encoded, the copy is released and the record stays charged until it is sent.
  ASSERT_TRUE(WaitFor(
      [&] {
        const uint64_t b = d.engine().checkpoint_bytes();
        return b > 4 * kN && b < 5 * kN;
      },
      absl::Seconds(3)))
      << "charged: " << d.engine().checkpoint_bytes();
  // The server gives up on the stream at the timeout (its writes blocked on the client's
  // windows), releasing its thread and the record.
  EXPECT_TRUE(WaitFor([&] { return d.engine().checkpoint_bytes() == 0; }, absl::Seconds(3)))
      << "the unread stream still holds " << d.engine().checkpoint_bytes() << " bytes";
  absl::SleepFor(absl::Milliseconds(500));
  v1::BucketStateChunk chunk;
  uint64_t got = 0;
  while (reader->Read(&chunk)) got += chunk.data().size();
  const grpc::Status s = reader->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  EXPECT_LT(got, 4 * kN) << "the whole record came although the stream timed out";
}

}  // namespace
}  // namespace spex::test
