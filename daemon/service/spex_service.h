// The spex.v1.Spex gRPC service: translates requests to Engine calls and absl::Status to gRPC
// status codes at the edge, with messages that tell the caller what to fix.
#pragma once

#include <string>

#include "daemon/engine/engine.h"
#include "daemon/observe/timeline.h"
#include "proto/spex.grpc.pb.h"

namespace spex {

class SpexService final : public v1::Spex::Service {
 public:
  // `timeline` (optional) serves StartTimeline/StopTimeline; without it they are UNIMPLEMENTED.
  SpexService(Engine* engine, std::string version, Timeline* timeline = nullptr)
      : engine_(engine), version_(std::move(version)), timeline_(timeline) {}

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

 private:
  Engine* engine_;
  std::string version_;
  Timeline* timeline_;
};

grpc::Status ToGrpc(const absl::Status& s);
void ToProto(const ExchangeRecord& rec, v1::ExchangeStats* out);

}  // namespace spex
