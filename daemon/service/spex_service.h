// The spex.v1.Spex gRPC service: translates requests to Engine calls and absl::Status to gRPC
// status codes at the edge, with messages that tell the caller what to fix. Every call is
// authorised by its caller's kernel credentials (PeerListener): sessions are opened only by the
// daemon's own user (or root) and bound to the opening process, so a session id from a log or a
// guess is useless to any other process; ListSessions shows ids only to their owner; density and
// timeline changes are the daemon user's. An Exchange waits at most --max_exchange_wait; a
// checkpoint stream stays open at most --checkpoint_stream_timeout, at most
// --max_checkpoint_streams are open at once, and their records' memory is charged against the
// engine's --max_session_bytes and --max_daemon_bytes before it is allocated.
#pragma once

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/engine/engine.h"
#include "daemon/observe/timeline.h"
#include "daemon/service/peer_listener.h"
#include "proto/spex.grpc.pb.h"

namespace spex {

class SpexService final : public v1::Spex::Service {
 public:
  struct Options {
    // Where StartTimeline may write (an existing directory; empty: the RPC is refused) and how
    // large a recording it starts may grow.
    std::string timeline_dir;
    uint64_t timeline_max_bytes = 0;
    // The longest an Exchange call waits, whatever deadline its client set.
    absl::Duration max_exchange_wait = absl::Minutes(10);
    // Calls that hold one of the server's threads while they wait, at once: Exchange calls and
    // checkpoint streams together; more are refused with RESOURCE_EXHAUSTED, so short calls
    // (Hello, GetStats, Goodbye) always find a thread (spexd: --rpc_threads - 3). 0: no bound.
    int max_waiting_exchanges = 0;
    // Checkpoint streams (SaveBucketState, LoadBucketState) open at once; more are refused with
    // RESOURCE_EXHAUSTED naming --max_checkpoint_streams. 0: no bound.
    int max_checkpoint_streams = 0;
    // The longest a checkpoint stream may stay open, whatever its client's deadline: then it is
    // cancelled (--checkpoint_stream_timeout).
    absl::Duration checkpoint_stream_timeout = absl::Minutes(1);
  };
  // `peers` names every call's caller (required: a call it cannot name is refused).
  // `timeline` (optional) serves StartTimeline/StopTimeline; without it they are UNIMPLEMENTED.
  SpexService(Engine* engine, std::string version, const PeerListener* peers, Options options,
              Timeline* timeline = nullptr)
      : engine_(engine),
        version_(std::move(version)),
        peers_(peers),
        options_(std::move(options)),
        timeline_(timeline) {}
  // In-process use (tests, the fuzzer, calls without a connection): every call is taken to come
  // from `caller`; no timeline.
  SpexService(Engine* engine, std::string version, PeerCred caller, Options options);
  SpexService(Engine* engine, std::string version, PeerCred caller)
      : SpexService(engine, std::move(version), caller, Options()) {}
  ~SpexService() override;

  grpc::Status Hello(grpc::ServerContext* ctx, const v1::HelloRequest* req,
                     v1::HelloResponse* resp) override;
  grpc::Status RegisterBucket(grpc::ServerContext* ctx, const v1::RegisterBucketRequest* req,
                              v1::RegisterBucketResponse* resp) override;
  grpc::Status UnregisterBucket(grpc::ServerContext* ctx, const v1::UnregisterBucketRequest* req,
                                v1::UnregisterBucketResponse* resp) override;
  grpc::Status SetDensity(grpc::ServerContext* ctx, const v1::SetDensityRequest* req,
                          v1::SetDensityResponse* resp) override;
  grpc::Status Exchange(grpc::ServerContext* ctx, const v1::ExchangeRequest* req,
                        v1::ExchangeResponse* resp) override;
  grpc::Status GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest* req,
                        v1::GetStatsResponse* resp) override;
  grpc::Status ListSessions(grpc::ServerContext* ctx, const v1::ListSessionsRequest* req,
                            v1::ListSessionsResponse* resp) override;
  grpc::Status Goodbye(grpc::ServerContext* ctx, const v1::GoodbyeRequest* req,
                       v1::GoodbyeResponse* resp) override;
  grpc::Status StartTimeline(grpc::ServerContext* ctx, const v1::StartTimelineRequest* req,
                             v1::TimelineResponse* resp) override;
  grpc::Status StopTimeline(grpc::ServerContext* ctx, const v1::StopTimelineRequest* req,
                            v1::TimelineResponse* resp) override;
  // Checkpoint records travel in chunks of kStateChunkBytes (a record is about 4 bytes per
  // element: one gRPC message would be hundreds of MB for a large bucket, and spexd takes none
  // over 1 MiB).
  static constexpr size_t kStateChunkBytes = size_t{1} << 19;
  grpc::Status SaveBucketState(grpc::ServerContext* ctx, const v1::SaveBucketStateRequest* req,
                               grpc::ServerWriter<v1::BucketStateChunk>* writer) override;
  grpc::Status LoadBucketState(grpc::ServerContext* ctx,
                               grpc::ServerReader<v1::BucketStateChunk>* reader,
                               v1::LoadBucketStateResponse* resp) override;

 private:
  // The caller's kernel credentials; UNAUTHENTICATED when the connection is unknown.
  absl::StatusOr<PeerCred> Caller(grpc::ServerContext* ctx) const;
  // The caller, PERMISSION_DENIED unless it is the daemon's user or root (`what` is refused).
  absl::StatusOr<PeerCred> OwnerCaller(grpc::ServerContext* ctx, const char* what) const;
  // The caller, PERMISSION_DENIED unless it opened `session_id`.
  absl::Status SessionCaller(grpc::ServerContext* ctx, uint64_t session_id) const;

  // A checkpoint stream's slot (one of --max_checkpoint_streams, and a held thread) and its
  // deadline; the slot is freed and the deadline dropped when it is destroyed.
  class StreamSlot;
  // RESOURCE_EXHAUSTED naming the flag when no slot is free.
  absl::Status OpenStream(grpc::ServerContext* ctx, const char* what, StreamSlot* slot);
  // Cancels the streams whose --checkpoint_stream_timeout passed (a stalled client leaves its
  // stream blocked in a Read or Write that only a cancellation ends).
  void WatchStreams();

  Engine* engine_;
  std::string version_;
  const PeerListener* peers_;
  const std::optional<PeerCred> fixed_caller_;  // the in-process constructor's
  const Options options_;
  Timeline* timeline_;
  std::atomic<int> waiting_exchanges_{0};   // Exchange calls and checkpoint streams now
  std::atomic<int> checkpoint_streams_{0};  // checkpoint streams open now

  // The checkpoint streams' deadlines (WatchStreams); the watcher starts with the first stream.
  struct Watched {
    grpc::ServerContext* ctx;
    absl::Time deadline;
    bool cancelled = false;
  };
  absl::Mutex watch_mu_;
  absl::CondVar watch_cv_;
  std::map<uint64_t, Watched> watched_ ABSL_GUARDED_BY(watch_mu_);
  uint64_t next_watch_id_ ABSL_GUARDED_BY(watch_mu_) = 0;
  bool watch_stop_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::thread watcher_;
};

grpc::Status ToGrpc(const absl::Status& s);
void ToProto(const ExchangeRecord& rec, v1::ExchangeStats* out);

}  // namespace spex
