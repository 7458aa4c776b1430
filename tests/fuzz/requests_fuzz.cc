// libFuzzer target: every request a trainer can make of spexd, through the gRPC service's
// handlers (daemon/service/spex_service.h: Hello, RegisterBucket, UnregisterBucket, SetDensity,
// GetStats, ListSessions, Goodbye, the timeline calls) and the Engine behind them (Exchange is
// called on the Engine with a short deadline, as the service would), plus what a trainer can
// write into the shared bucket header (its ready counter, or any bytes at all). One in-process
// engine per input: 1 node over the in-process collective, the reference primitives, 1 or 2
// local trainers, small memory limits (so any size is refused before it is allocated), every
// compressor reachable with fuzzed parameters and gradients. Every answer must be OK or a
// clean status; the engine must stop cleanly after any sequence.
#include <fuzzer/FuzzedDataProvider.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "client/shm_mapping.h"
#include "daemon/engine/engine.h"
#include "daemon/service/spex_service.h"
#include "daemon/transport/inproc_collective.h"
#include "daemon/util/log.h"
#include "kernels/compressor.h"
#include "kernels/half.h"
#include "kernels/reference/reference_primitives.h"
#include "proto/contract/layout.h"

namespace {

// A failed check names itself on stderr before aborting, so a CI log shows which one it was.
void CheckAt(bool ok, const char* what, int line) {
  if (ok) return;
  std::fprintf(stderr, "requests_fuzz.cc:%d: check failed: %s\n", line, what);
  std::abort();
}
#define Check(cond) CheckAt((cond), #cond, __LINE__)

// A status the service may answer with; anything else (UNKNOWN, INTERNAL, ...) is a bug.
void CheckCode(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::UNIMPLEMENTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::ABORTED:
      break;
    default:
      std::fprintf(stderr, "requests_fuzz: unexpected status %d: %s\n",
                   static_cast<int>(s.error_code()), s.error_message().c_str());
      std::abort();
  }
  if (!s.ok()) Check(!s.error_message().empty());
}

const char* const kNames[] = {"",        "dense",   "micro",     "topk",       "gtopk", "randomk",
                              "thresh",  "dgc",     "deft",      "cltk",       "sage",  "exdyna",
                              "sidco_e", "redsync", "gaussiank", "topk_union", "nope"};
const char* const kKeys[] = {"seed",           "threshold_control",
                             "threshold",      "sample_ratio",
                             "units_per_node", "stages",
                             "trim",           "refine",
                             "nonfinite",      "sparse_allreduce",
                             "bogus"};
const char* const kValues[] = {"0",    "1", "7",     "-1",    "1e-3",      "nan",    "true",
                               "band", "",  "99999", "error", "propagate", "oktopk", "allgather"};

template <size_t N>
std::string Pick(FuzzedDataProvider& in, const char* const (&list)[N]) {
  if (in.ConsumeIntegralInRange<int>(0, 7))
    return list[in.ConsumeIntegralInRange<size_t>(0, N - 1)];
  return in.ConsumeRandomLengthString(300);  // past kMaxRequestString sometimes
}

struct Grant {
  uint64_t session, bucket, elements, next_step;
  uint32_t rank;
  std::unique_ptr<spex::ShmMapping> map;
  uint64_t input_offset;
  spex::DType dtype = spex::DType::kFloat32;  // what the slots hold
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  static std::unique_ptr<spex::Primitives> prims = spex::MakeReferencePrimitives();
  static const bool quiet = (spex::SetLogLevel(spex::LogLevel::kError), true);  // no session log
  (void)quiet;
  spex::InProcessHub hub(1, absl::Seconds(5));
  std::unique_ptr<spex::Collective> collective = hub.Connect(0);
  spex::EngineOptions o;
  o.local_trainers = in.ConsumeIntegralInRange<int>(1, 2);
  o.compressor = in.ConsumeBool() ? "dense" : "topk";
  o.density = 0.05;
  o.register_wait = absl::Milliseconds(20);
  o.shm_tag = "spexfuzz";
  o.min_sparse_elements = in.ConsumeBool() ? 0 : 64;
  o.dense_fallback = in.ConsumeBool() ? spex::DenseFallback::kOff : spex::DenseFallback::kAuto;
  o.probe_steps = 1;
  o.fp16_values = in.ConsumeBool();
  o.residual_norm_every = in.ConsumeIntegralInRange<int>(0, 2);
  o.max_bucket_bytes = 1 << 20;
  o.max_session_bytes = 2 << 20;
  o.max_daemon_bytes = 3 << 20;
  o.max_buckets_per_session = 8;
  spex::Engine engine(o, collective.get(), prims.get());
  Check(engine.Start().ok());
  // Every call as this process (the fuzzer calls the handlers directly, without a connection).
  spex::SpexService service(
      &engine, "fuzz",
      spex::PeerCred{static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid()),
                     static_cast<uint32_t>(getpid())});

  std::vector<uint64_t> sessions;
  std::vector<Grant> grants;
  // Buckets whose header a trainer scribbled on (case 7): the daemon writes a header once, when
  // it creates the bucket, so a later grant of that bucket maps what the scribbler left (the
  // client's header reader refuses it: header_fuzz), and the checks of the header's words below
  // do not apply to it.
  std::set<uint64_t> scribbled;
  auto session = [&]() -> uint64_t {
    if (!sessions.empty() && in.ConsumeIntegralInRange<int>(0, 7)) {
      return sessions[in.ConsumeIntegralInRange<size_t>(0, sessions.size() - 1)];
    }
    return in.ConsumeIntegralInRange<uint64_t>(0, 5);
  };
  int ops = 0;
  while (in.remaining_bytes() > 0 && ops++ < 24) {
    switch (in.ConsumeIntegralInRange<int>(0, 10)) {
      case 0: {
        spex::v1::HelloRequest req;
        spex::v1::HelloResponse resp;
        req.set_protocol_version(in.ConsumeIntegralInRange<uint32_t>(0, 2));
        req.set_job(in.ConsumeBool() ? "job" : in.ConsumeRandomLengthString(300));
        req.set_local_rank(in.ConsumeIntegralInRange<uint32_t>(0, 3));
        req.set_local_size(in.ConsumeIntegralInRange<uint32_t>(0, 3));
        req.set_pid(in.ConsumeBool() ? getpid() : in.ConsumeIntegral<uint32_t>());
        req.set_client(in.ConsumeRandomLengthString(300));
        req.set_device(static_cast<spex::v1::DeviceKind>(in.ConsumeIntegralInRange<int>(0, 2)));
        grpc::Status s = service.Hello(nullptr, &req, &resp);
        CheckCode(s);
        if (s.ok()) sessions.push_back(resp.session_id());
        break;
      }
      case 1:
      case 2: {
        spex::v1::RegisterBucketRequest req;
        spex::v1::RegisterBucketResponse resp;
        req.set_session_id(session());
        req.set_bucket_id(in.ConsumeIntegralInRange<uint64_t>(0, 3));
        req.set_elements(in.ConsumeIntegralInRange<int>(0, 3)
                             ? in.ConsumeIntegralInRange<uint64_t>(0, 5000)
                             : in.ConsumeIntegral<uint64_t>());
        // 0..3: unspecified, float32, bfloat16, float16; 4: an unknown type (refused).
        req.set_dtype(static_cast<spex::v1::DataType>(in.ConsumeIntegralInRange<int>(0, 4)));
        auto* c = req.mutable_compressor();
        c->set_name(Pick(in, kNames));
        c->set_density(in.ConsumeBool() ? 0.0 : in.ConsumeFloatingPoint<double>());
        const int np = in.ConsumeIntegralInRange<int>(0, 2);
        for (int i = 0; i < np; ++i) (*c->mutable_params())[Pick(in, kKeys)] = Pick(in, kValues);
        grpc::Status s = service.RegisterBucket(nullptr, &req, &resp);
        CheckCode(s);
        if (s.ok()) {
          Check(resp.layout().elements() == req.elements());
          Check(resp.buffer().has_shm());
          auto map =
              spex::ShmMapping::Attach(resp.buffer().shm().name(), resp.buffer().shm().size());
          Grant g{req.session_id(),
                  req.bucket_id(),
                  req.elements(),
                  resp.next_step(),
                  0,
                  nullptr,
                  resp.layout().input_offset()};
          if (map.ok()) {
            g.map = std::move(*map);
            // Slots hold the bucket's type: 2 bytes an element for bfloat16 and float16.
            g.dtype = req.dtype() == spex::v1::DTYPE_BFLOAT16  ? spex::DType::kBFloat16
                      : req.dtype() == spex::v1::DTYPE_FLOAT16 ? spex::DType::kFloat16
                                                               : spex::DType::kFloat32;
            const uint64_t esize = spex::DTypeSize(g.dtype);
            Check(g.input_offset + esize * g.elements <= g.map->size());
            Check(resp.layout().output_offset() + esize * g.elements <= g.map->size());
            const auto* h = static_cast<const spex::BucketHeader*>(g.map->data());
            if (!scribbled.count(g.bucket)) {
              Check(h->magic == spex::kBucketMagic && h->elements == g.elements);
            }
          }
          for (const auto& e : engine.Sessions()) {
            if (e.session_id == g.session) g.rank = e.local_rank;
          }
          grants.push_back(std::move(g));
        }
        break;
      }
      case 3: {
        spex::v1::UnregisterBucketRequest req;
        spex::v1::UnregisterBucketResponse resp;
        req.set_session_id(session());
        req.set_bucket_id(in.ConsumeIntegralInRange<uint64_t>(0, 3));
        CheckCode(service.UnregisterBucket(nullptr, &req, &resp));
        break;
      }
      case 4: {
        spex::v1::SetDensityRequest req;
        spex::v1::SetDensityResponse resp;
        req.set_density(in.ConsumeBool() ? in.ConsumeProbability<double>()
                                         : in.ConsumeFloatingPoint<double>());
        CheckCode(service.SetDensity(nullptr, &req, &resp));
        break;
      }
      case 5:
      case 6: {  // Exchange of a registered bucket, usually for its next step, input written
        uint64_t sid = session(), bucket = in.ConsumeIntegralInRange<uint64_t>(0, 3), step = 0;
        if (!grants.empty() && in.ConsumeIntegralInRange<int>(0, 7)) {
          Grant& g = grants[in.ConsumeIntegralInRange<size_t>(0, grants.size() - 1)];
          sid = g.session;
          bucket = g.bucket;
          step = g.next_step + in.ConsumeIntegralInRange<int>(-1, 1);
          if (g.map) {
            uint8_t* at = static_cast<uint8_t*>(g.map->data()) + g.input_offset;
            const float v = in.ConsumeFloatingPointInRange<float>(-4, 4);
            const bool nan = in.ConsumeIntegralInRange<int>(0, 15) == 0;
            for (uint64_t i = 0; i < g.elements; ++i) {
              const float f = nan && i == 0 ? NAN : v * std::sin(0.37f * i + step);
              if (g.dtype == spex::DType::kFloat32) {
                std::memcpy(at + 4 * i, &f, 4);
              } else {
                const uint16_t h =
                    g.dtype == spex::DType::kBFloat16 ? spex::FloatToBf16(f) : spex::FloatToF16(f);
                std::memcpy(at + 2 * i, &h, 2);
              }
            }
          }
        } else {
          step = in.ConsumeIntegral<uint64_t>();
        }
        auto rec = engine.Exchange(sid, bucket, step, absl::Now() + absl::Milliseconds(100));
        CheckCode(spex::ToGrpc(rec.status()));
        if (rec.ok()) {
          Check(rec->bucket_id == bucket && rec->step == step);
          for (Grant& g : grants) {
            if (g.session == sid && g.bucket == bucket && g.next_step == step) g.next_step++;
          }
        }
        break;
      }
      case 7: {  // a trainer writes anything into its ready counter, or scribbles on the header
        if (grants.empty()) break;
        Grant& g = grants[in.ConsumeIntegralInRange<size_t>(0, grants.size() - 1)];
        if (!g.map) break;
        auto* h = static_cast<spex::BucketHeader*>(g.map->data());
        if (in.ConsumeBool()) {
          h->ready[g.rank].value.store(in.ConsumeBool() ? g.next_step + 1
                                                        : in.ConsumeIntegral<uint64_t>());
        } else {
          scribbled.insert(g.bucket);
          const size_t at = in.ConsumeIntegralInRange<size_t>(0, sizeof(spex::BucketHeader) - 8);
          const uint64_t v = in.ConsumeIntegral<uint64_t>();
          std::memcpy(reinterpret_cast<uint8_t*>(h) + at, &v, 8);
        }
        break;
      }
      case 8: {
        spex::v1::GetStatsRequest req;
        spex::v1::GetStatsResponse resp;
        CheckCode(service.GetStats(nullptr, &req, &resp));
        spex::v1::ListSessionsRequest lreq;
        spex::v1::ListSessionsResponse lresp;
        CheckCode(service.ListSessions(nullptr, &lreq, &lresp));
        break;
      }
      case 9: {
        spex::v1::GoodbyeRequest req;
        spex::v1::GoodbyeResponse resp;
        req.set_session_id(session());
        CheckCode(service.Goodbye(nullptr, &req, &resp));
        break;
      }
      case 10: {
        spex::v1::StartTimelineRequest req;
        spex::v1::TimelineResponse resp;
        req.set_path(in.ConsumeRandomLengthString(40));
        CheckCode(service.StartTimeline(nullptr, &req, &resp));
        spex::v1::StopTimelineRequest sreq;
        CheckCode(service.StopTimeline(nullptr, &sreq, &resp));
        break;
      }
    }
  }
  for (uint64_t sid : sessions) engine.Goodbye(sid).IgnoreError();
  grants.clear();
  engine.RequestStop();
  Check(engine.JoinFor(absl::Seconds(10)));
  return 0;
}
