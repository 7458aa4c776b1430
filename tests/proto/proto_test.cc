// The control channel's contract as spexd keeps it, not protoc's: requests encoded byte by byte
// as the shipped clients encode them (field numbers and wire types of spex.v1, which a change of
// proto/spex.proto must not move) go through the service's own handlers on a one-node engine and
// mean what the clients mean; the layout the daemon answers is proto/contract/layout.h's; a newer
// client (an unknown field, data type or protocol version) is ignored or refused naming the fix;
// and the limits the daemon relies on (request strings, checkpoint chunks under gRPC's default
// message size) hold.
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "daemon/engine/engine_options.h"
#include "daemon/service/spex_service.h"
#include "grpc/impl/codegen/grpc_types.h"
#include "gtest/gtest.h"
#include "proto/contract/layout.h"
#include "proto/spex.pb.h"
#include "tests/support/engine_cluster.h"

namespace spex::test {
namespace {

// Protocol-buffer wire encoding, written out so that the bytes are fixed here and not by protoc.
std::string Varint(uint64_t v) {
  std::string out;
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return out;
}
std::string Int(int field, uint64_t v) { return Varint(uint64_t(field) << 3 | 0) + Varint(v); }
std::string Bytes(int field, const std::string& s) {
  return Varint(uint64_t(field) << 3 | 2) + Varint(s.size()) + s;
}
std::string Double(int field, double d) {
  std::string out = Varint(uint64_t(field) << 3 | 1);
  out.append(reinterpret_cast<const char*>(&d), sizeof d);  // little-endian (x86-64, aarch64)
  return out;
}

// HelloRequest{job=1, local_rank=2, local_size=3, client=5, pid=6, protocol_version=7}.
std::string HelloBytes(uint32_t protocol_version) {
  return Bytes(1, "contract") + Int(2, 0) + Int(3, 1) + Bytes(5, "proto_test") +
         Int(6, static_cast<uint64_t>(getpid())) + Int(7, protocol_version);
}

// RegisterBucketRequest{session_id=1, bucket_id=2, elements=3, dtype=4,
// compressor=5: CompressorConfig{name=1, density=2, params=3: map entry{key=1, value=2}}}.
std::string RegisterBytes(uint64_t session, uint64_t bucket, uint64_t elements, int dtype,
                          const std::string& compressor, const std::string& extra = "") {
  const std::string config = Bytes(1, compressor) + Double(2, 0.25) +
                             Bytes(3, Bytes(1, "nonfinite") + Bytes(2, "propagate"));
  return Int(1, session) + Int(2, bucket) + Int(3, elements) + Int(4, dtype) + Bytes(5, config) +
         extra;
}

template <typename Message>
Message Parse(const std::string& bytes) {
  Message m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

class ProtoContract : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineClusterOptions o;
    o.nodes = 1;
    o.trainers = 1;
    o.cpu_primitives = true;
    o.engine.shm_tag = "prototest";
    o.engine.compressor = "dense";
    o.engine.density = 0.5;
    cluster_ = std::make_unique<EngineCluster>(o);
    ASSERT_TRUE(cluster_->status().ok()) << cluster_->status();
    service_ = std::make_unique<SpexService>(
        &cluster_->engine(0), "test",
        PeerCred{static_cast<uint32_t>(geteuid()), static_cast<uint32_t>(getegid()),
                 static_cast<uint32_t>(getpid())});
  }
  void TearDown() override {
    if (session_ != 0) {
      v1::GoodbyeRequest req;
      req.set_session_id(session_);
      v1::GoodbyeResponse resp;
      EXPECT_TRUE(service_->Goodbye(nullptr, &req, &resp).ok());
    }
    service_.reset();
    cluster_.reset();
  }

  v1::HelloResponse Hello() {
    const auto req = Parse<v1::HelloRequest>(HelloBytes(1));
    v1::HelloResponse resp;
    const grpc::Status s = service_->Hello(nullptr, &req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    session_ = resp.session_id();
    return resp;
  }

  grpc::Status Register(const std::string& bytes, v1::RegisterBucketResponse* resp) {
    const auto req = Parse<v1::RegisterBucketRequest>(bytes);
    return service_->RegisterBucket(nullptr, &req, resp);
  }

  std::unique_ptr<EngineCluster> cluster_;
  std::unique_ptr<SpexService> service_;
  uint64_t session_ = 0;
};

TEST_F(ProtoContract, HelloAsClientsEncodeIt) {
  const v1::HelloResponse resp = Hello();
  EXPECT_NE(resp.session_id(), 0u);
  EXPECT_EQ(resp.node_rank(), 0u);
  EXPECT_EQ(resp.node_count(), 1u);
  EXPECT_EQ(resp.local_trainers(), 1u);
  EXPECT_EQ(resp.defaults().name(), "dense");
  EXPECT_EQ(resp.defaults().density(), 0.5);
  EXPECT_EQ(resp.device(), v1::DEVICE_CPU);
  ASSERT_TRUE(resp.doorbell().has_shm());
  EXPECT_EQ(resp.doorbell().shm().size(), kPageBytes);  // the doorbell segment of layout.h
  EXPECT_EQ(resp.daemon_version(), "test");
  // ListSessions shows the session with the fields the request carried.
  v1::ListSessionsRequest lreq;
  v1::ListSessionsResponse lresp;
  ASSERT_TRUE(service_->ListSessions(nullptr, &lreq, &lresp).ok());
  ASSERT_EQ(lresp.sessions_size(), 1);
  EXPECT_EQ(lresp.sessions(0).session_id(), resp.session_id());
  EXPECT_EQ(lresp.sessions(0).client(), "proto_test");
  EXPECT_EQ(lresp.sessions(0).local_rank(), 0u);
  EXPECT_EQ(lresp.sessions(0).pid(), static_cast<uint32_t>(getpid()));
}

TEST_F(ProtoContract, RegisterAnswersLayoutH) {
  const uint64_t session = Hello().session_id();
  for (auto [dtype, elem, name] :
       {std::tuple<int, size_t, const char*>{v1::DTYPE_FLOAT32, 4, "float32"},
        {v1::DTYPE_BFLOAT16, 2, "bfloat16"},
        {v1::DTYPE_FLOAT16, 2, "float16"}}) {
    SCOPED_TRACE(name);
    const uint64_t n = 10000 + static_cast<uint64_t>(dtype);
    v1::RegisterBucketResponse resp;
    const grpc::Status s = Register(RegisterBytes(session, 40 + dtype, n, dtype, "topk"), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.compressor().name(), "topk");
    EXPECT_EQ(resp.compressor().density(), 0.25);
    EXPECT_EQ(resp.next_step(), 0u);
    ASSERT_TRUE(resp.buffer().has_shm());
    EXPECT_EQ(resp.layout().header_offset(), 0u);
    EXPECT_EQ(resp.layout().elements(), n);
    EXPECT_EQ(resp.layout().input_offset(), InputOffset(n, 0, elem));
    EXPECT_EQ(resp.layout().output_offset(), OutputOffset(n, 1, elem));
    EXPECT_EQ(resp.buffer().shm().size(), BucketBytes(n, 1, elem));
    EXPECT_FALSE(resp.has_device_buffer());
  }
  // GetStats reports each bucket with the type its request carried.
  v1::GetStatsRequest greq;
  greq.set_session_id(session);
  v1::GetStatsResponse gresp;
  ASSERT_TRUE(service_->GetStats(nullptr, &greq, &gresp).ok());
  ASSERT_EQ(gresp.buckets_size(), 3);
  for (const auto& b : gresp.buckets()) {
    EXPECT_EQ(b.dtype(), b.bucket_id() == 41   ? "float32"
                         : b.bucket_id() == 42 ? "bfloat16"
                                               : "float16");
  }
}

TEST_F(ProtoContract, NewerClientIgnoredOrRefusedNamingTheFix) {
  // A field this daemon does not know (number 99) is carried and ignored.
  const uint64_t session = Hello().session_id();
  v1::RegisterBucketResponse resp;
  grpc::Status s =
      Register(RegisterBytes(session, 7, 4096, v1::DTYPE_FLOAT32, "dense", Int(99, 1)), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.layout().elements(), 4096u);
  // A data type from the future (proto3 enums keep unknown numbers) is refused by name.
  s = Register(RegisterBytes(session, 8, 4096, 9, "dense"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown data type 9"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("DTYPE_BFLOAT16"), std::string::npos) << s.error_message();
  // A later protocol version: upgrade the daemon.
  const auto hello = Parse<v1::HelloRequest>(HelloBytes(2));
  v1::HelloResponse hresp;
  s = service_->Hello(nullptr, &hello, &hresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("upgrade the daemon"), std::string::npos) << s.error_message();
}

TEST_F(ProtoContract, LimitsTheDaemonReliesOn) {
  const uint64_t session = Hello().session_id();
  // Strings from the wire are bounded before anything is allocated; the message quotes a prefix.
  const std::string name(kMaxRequestString + 1, 'x');
  v1::RegisterBucketResponse resp;
  grpc::Status s = Register(RegisterBytes(session, 9, 4096, v1::DTYPE_FLOAT32, name), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_LT(s.error_message().size(), 200u) << s.error_message();
  EXPECT_TRUE(Register(RegisterBytes(session, 9, 4096, v1::DTYPE_FLOAT32, "dense"), &resp).ok());
  // A session id that was never opened is NOT_FOUND, not someone else's session.
  s = Register(RegisterBytes(session + 1000, 10, 4096, v1::DTYPE_FLOAT32, "dense"), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND) << s.error_message();
  // Checkpoint chunks (SaveBucketState / LoadBucketState) fit gRPC's default message size with
  // room for the chunk's other fields, so neither side needs a raised limit.
  EXPECT_LE(SpexService::kStateChunkBytes + 1024, size_t{GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH});
}

TEST(ProtoWire, EncodingHelpersMatchTheFormat) {
  // The helpers above against bytes from the protocol-buffer encoding documentation.
  EXPECT_EQ(Int(1, 150), std::string("\x08\x96\x01", 3));
  EXPECT_EQ(Bytes(2, "testing"), std::string("\x12\x07testing", 9));
  const auto r = Parse<v1::RegisterBucketRequest>(RegisterBytes(5, 6, 7, 2, "micro"));
  EXPECT_EQ(r.session_id(), 5u);
  EXPECT_EQ(r.bucket_id(), 6u);
  EXPECT_EQ(r.elements(), 7u);
  EXPECT_EQ(r.dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(r.compressor().name(), "micro");
  EXPECT_EQ(r.compressor().density(), 0.25);
  EXPECT_EQ(r.compressor().params().at("nonfinite"), "propagate");
}

}  // namespace
}  // namespace spex::test
