// The spex.v1.Spex gRPC service: translates requests to Engine calls and absl::Status to gRPC
// status codes at the edge, with messages that tell the caller what to fix. Every call is
// authorised by its caller's kernel credentials (PeerListener): sessions are opened only by the
// daemon's own user (or root) and bound to the opening process, so a session id from a log or a
// guess is useless to any other process; ListSessions shows ids only to their owner; density and
// timeline changes are the daemon user's. An Exchange waits at most --max_exchange_wait.
#pragma once

#include <atomic>
#include <optional>
#include <string>

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
    // Exchange calls waiting at once (each holds one of the server's threads); more are refused
    // with RESOURCE_EXHAUSTED, so short calls (Hello, GetStats, Goodbye) always find a thread
    // (spexd: --rpc_threads - 3). 0: no bound.
    int max_waiting_exchanges = 0;
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
  // from `caller`; default options, no timeline.
  SpexService(Engine* engine, std::string version, PeerCred caller);

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

  Engine* engine_;
  std::string version_;
  const PeerListener* peers_;
  const std::optional<PeerCred> fixed_caller_;  // the in-process constructor's
  const Options options_;
  Timeline* timeline_;
  std::atomic<int> waiting_exchanges_{0};  // Exchange calls inside the engine now
};

grpc::Status ToGrpc(const absl::Status& s);
void ToProto(const ExchangeRecord& rec, v1::ExchangeStats* out);

}  // namespace spex
