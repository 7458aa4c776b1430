// The C++ client of spexd: a trainer connects to its node's daemon, registers gradient
// buckets once, writes each step's gradients into the bucket's mapped input span and calls
// Exchange, then reads the average of every trainer of every node from the output span.
//
//   auto client = spex::Client::Connect({.local_rank = r, .local_size = 2});
//   auto bucket = (*client)->RegisterBucket(/*id=*/0, /*elements=*/n);
//   std::copy(grads, grads + n, (*bucket)->input().begin());
//   (*client)->Exchange(*bucket);            // doorbell; ExchangeMode::kRpc for the RPC path
//   use((*bucket)->output());
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "daemon/memory/layout.h"
#include "daemon/memory/shm_buffer.h"
#include "proto/spex.grpc.pb.h"

namespace spex {

struct ClientOptions {
  std::string socket;           // empty: $SPEX_SOCKET, else the default path for `job`
  std::string job;              // empty: $SPEX_JOB / $SLURM_JOB_ID / "default"
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  std::string client_name = "spex-cpp";
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration exchange_timeout = absl::Minutes(5);  // per exchange, either path
};

enum class ExchangeMode { kDoorbell, kRpc };

struct CompressorChoice {
  std::string name;    // empty: daemon default
  double density = 0;  // 0: daemon default
};

class Client;

// A registered bucket: its mapped input (this trainer's slot) and output (the shared result).
class Bucket {
 public:
  uint64_t id() const { return id_; }
  size_t elements() const { return elements_; }
  absl::Span<float> input() { return {input_, elements_}; }
  absl::Span<const float> output() const { return {output_, elements_}; }
  uint64_t next_step() const { return next_step_; }
  const std::string& compressor() const { return compressor_; }
  double density() const { return density_; }
  // Stats the daemon returned for the last exchange done through the RPC path.
  const v1::ExchangeStats& last_rpc_stats() const { return last_stats_; }

 private:
  friend class Client;
  uint64_t id_ = 0;
  size_t elements_ = 0;
  std::unique_ptr<ShmMapping> mapping_;
  BucketHeader* header_ = nullptr;
  float* input_ = nullptr;
  const float* output_ = nullptr;
  uint64_t next_step_ = 0;
  std::string compressor_;
  double density_ = 0;
  v1::ExchangeStats last_stats_;
};

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();  // says Goodbye

  absl::StatusOr<Bucket*> RegisterBucket(uint64_t id, size_t elements, const CompressorChoice& c = {});
  // One exchange of the bucket's next step. On success the output span holds the average.
  absl::Status Exchange(Bucket* bucket, ExchangeMode mode = ExchangeMode::kDoorbell);

  absl::StatusOr<v1::GetStatsResponse> Stats();
  absl::Status Goodbye();

  uint32_t node_rank() const { return hello_.node_rank(); }
  uint32_t node_count() const { return hello_.node_count(); }
  uint32_t local_rank() const { return options_.local_rank; }
  const std::string& socket() const { return socket_; }
  const v1::HelloResponse& hello() const { return hello_; }

 private:
  Client() = default;
  absl::Status ExchangeRpc(Bucket* b, uint64_t step);
  absl::Status WaitPublished(Bucket* b, uint64_t step);

  ClientOptions options_;
  std::string socket_;
  std::unique_ptr<v1::Spex::Stub> stub_;
  v1::HelloResponse hello_;
  std::unique_ptr<ShmMapping> doorbell_mapping_;
  DoorbellSegment* doorbell_ = nullptr;
  std::map<uint64_t, std::unique_ptr<Bucket>> buckets_;
  bool said_goodbye_ = false;
};

}  // namespace spex
