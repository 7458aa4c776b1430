// spexd's Prometheus metrics (metrics.h): the registry, the series per bucket and phase, and the
// pull exposer that serves them on --metrics_address.
#include "daemon/observe/metrics.h"

#include <exception>
#include <map>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace spex {
namespace {

// Phase and exchange times: 5 us to 10 s.
const prometheus::Histogram::BucketBoundaries& TimeBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
      1e-2, 2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1,    2.5,  10};
  return *b;
}

prometheus::MetricFamily Family(const std::string& name, const std::string& help,
                                prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

prometheus::ClientMetric Sample(const std::string& node, double value,
                                std::vector<prometheus::ClientMetric::Label> extra = {}) {
  prometheus::ClientMetric m;
  m.label.push_back({"node", node});
  for (auto& l : extra) m.label.push_back(std::move(l));
  m.gauge.value = value;
  m.counter.value = value;
  return m;
}

}  // namespace

// Per-node values read from the Engine at scrape time.
class NodeCollectable final : public prometheus::Collectable {
 public:
  explicit NodeCollectable(std::string node) : node_(std::move(node)) {}
  void Attach(const Engine* engine) {
    std::lock_guard<std::mutex> lock(mu_);
    engine_ = engine;
  }
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (engine_ == nullptr) return {};
    using prometheus::MetricType;
    auto sessions =
        Family("spex_sessions", "Trainer sessions open on this node (Hello without Goodbye).",
               MetricType::Gauge);
    sessions.metric.push_back(Sample(node_, engine_->Sessions().size()));
    auto nodes =
        Family("spex_nodes", "Nodes (daemons) in this job's MPI world.", MetricType::Gauge);
    nodes.metric.push_back(Sample(node_, engine_->node_count()));
    auto exchanges =
        Family("spex_node_exchanges_total", "Exchanges this node's engine published, every bucket.",
               MetricType::Counter);
    exchanges.metric.push_back(Sample(node_, engine_->total_exchanges()));
    auto reused = Family("spex_merge_reduces_reused_total",
                         "Merge group members whose local reduce a later round reused: offered "
                         "by this node but left by the agreement round for a later group (this "
                         "node's trainers ahead of another node's).",
                         MetricType::Counter);
    reused.metric.push_back(Sample(node_, engine_->reduces_reused()));
    std::map<std::string, int> states = {
        {"registering", 0}, {"waiting", 0}, {"exchanging", 0}, {"failed", 0}};
    for (const BucketSummary& b : engine_->Buckets()) ++states[b.state];
    auto buckets = Family("spex_buckets",
                          "Buckets registered on this node by state (failed: a step failed in its "
                          "middle, every later step gets the same error).",
                          MetricType::Gauge);
    for (const auto& [state, n] : states) {
      buckets.metric.push_back(Sample(node_, n, {{"state", state}}));
    }
    return {std::move(sessions), std::move(nodes), std::move(exchanges), std::move(reused),
            std::move(buckets)};
  }

 private:
  const std::string node_;
  mutable std::mutex mu_;
  const Engine* engine_ = nullptr;
};

struct Metrics::BucketSeries {
  prometheus::Counter* exchanges;
  prometheus::Counter* sent;
  prometheus::Counter* received;
  prometheus::Counter* gathered_total;
  prometheus::Counter* fallbacks;
  prometheus::Gauge* target_density;
  prometheus::Gauge* achieved_density;
  prometheus::Gauge* gathered;
  prometheus::Gauge* residual_norm;
  prometheus::Gauge* elements;
  prometheus::Histogram* phase[kPhaseCount];
  prometheus::Histogram* exchange;
  std::map<absl::StatusCode, prometheus::Counter*> errors;
  std::string id;
};

Metrics::Metrics(int node_rank)
    : node_(absl::StrCat(node_rank)),
      registry_(std::make_shared<prometheus::Registry>()),
      node_collectable_(std::make_shared<NodeCollectable>(node_)) {
  const prometheus::Labels node = {{"node", node_}};
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Labels(node).Register(*registry_);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Labels(node).Register(*registry_);
  };
  auto histogram = [&](const char* name, const char* help) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Labels(node).Register(*registry_);
  };
  exchanges_ = counter("spex_exchanges_total",
                       "Exchanges of the bucket published to its trainers (failed ones too).");
  sent_ = counter("spex_sent_bytes_total", "Bytes this node sent for the bucket's exchanges.");
  received_ =
      counter("spex_received_bytes_total", "Bytes this node received for the bucket's exchanges.");
  gathered_total_ = counter("spex_gathered_elements_total",
                            "Elements gathered over all exchanges (pattern A: the index union; "
                            "B: every node's selection; dense: the bucket).");
  fallbacks_ = counter("spex_dense_fallbacks_total",
                       "Exchanges of a sparse compressor's bucket that went dense (the "
                       "dense-fallback probes and a fallback decision).");
  errors_ = counter("spex_exchange_errors_total",
                    "Exchanges that failed, by the status code the trainers got.");
  target_density_ =
      gauge("spex_target_density", "Target density of the bucket's last exchange (k / n).");
  achieved_density_ = gauge("spex_achieved_density",
                            "Density this node's compressor selected at the last exchange.");
  gathered_ = gauge("spex_gathered_elements", "Elements gathered at the bucket's last exchange.");
  residual_norm_ = gauge("spex_residual_norm",
                         "L2 norm of the error-feedback residual, computed every "
                         "--residual_norm_every steps (0 for dense buckets).");
  elements_ = gauge("spex_bucket_elements", "Elements (float32) of the bucket.");
  phase_seconds_ = histogram("spex_phase_seconds",
                             "Time of each phase of an exchange (wait_local, reduce_local, "
                             "compress, collective, decode, publish).");
  exchange_seconds_ =
      histogram("spex_exchange_seconds", "Time of a whole exchange, from start to published.");
  groups_ = &counter("spex_merge_groups_total",
                     "Exchanges the engine ran: one per merge group (--merger), one per bucket "
                     "exchanged alone.")
                 ->Add({});
  group_seconds_ = &counter("spex_merge_group_seconds_total",
                            "Time the engine spent in those exchanges, from a group's start to its "
                            "first member published.")
                        ->Add({});
  prometheus::Family<prometheus::Counter>* group_phase =
      counter("spex_merge_phase_seconds_total",
              "Time the engine spent in each phase of those exchanges, counted once per merge "
              "group (spex_phase_seconds gives every member a group's whole phase).");
  prometheus::Family<prometheus::Counter>* group_phase_cpu =
      counter("spex_phase_cpu_seconds_total",
              "CPU time (user + system) of the daemon thread that ran each phase of those "
              "exchanges, over the phase, counted once per merge group: its rate is the cores "
              "each phase takes (a wait inside MPI polls, a passive one sleeps).");
  for (int p = 0; p < kPhaseCount; ++p) {
    group_phase_[p] = &group_phase->Add({{"phase", PhaseName(static_cast<Phase>(p))}});
    group_phase_cpu_[p] = &group_phase_cpu->Add({{"phase", PhaseName(static_cast<Phase>(p))}});
  }
}

Metrics::~Metrics() { StopServing(); }

void Metrics::Attach(const Engine* engine) { node_collectable_->Attach(engine); }

absl::StatusOr<int> Metrics::Serve(const std::string& bind) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_address: cannot serve metrics on ", bind, ": ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  exposer_->RegisterCollectable(node_collectable_);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::StopServing() { exposer_.reset(); }

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& f : node_collectable_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

Metrics::BucketSeries& Metrics::Series(uint64_t bucket) {
  std::unique_ptr<BucketSeries>& slot = buckets_[bucket];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<BucketSeries>();
  BucketSeries& s = *slot;
  s.id = absl::StrCat(bucket);
  const prometheus::Labels l = {{"bucket", s.id}};
  s.exchanges = &exchanges_->Add(l);
  s.sent = &sent_->Add(l);
  s.received = &received_->Add(l);
  s.gathered_total = &gathered_total_->Add(l);
  s.fallbacks = &fallbacks_->Add(l);
  s.target_density = &target_density_->Add(l);
  s.achieved_density = &achieved_density_->Add(l);
  s.gathered = &gathered_->Add(l);
  s.residual_norm = &residual_norm_->Add(l);
  s.elements = &elements_->Add(l);
  for (int p = 0; p < kPhaseCount; ++p) {
    s.phase[p] = &phase_seconds_->Add(
        {{"bucket", s.id}, {"phase", PhaseName(static_cast<Phase>(p))}}, TimeBuckets());
  }
  s.exchange = &exchange_seconds_->Add(l, TimeBuckets());
  return s;
}

void Metrics::OnExchange(const ExchangeEvent& e) {
  const ExchangeRecord& rec = *e.record;
  BucketSeries& s = Series(rec.bucket_id);
  s.exchanges->Increment();
  s.elements->Set(static_cast<double>(e.elements));
  if (e.code != absl::StatusCode::kOk) {
    prometheus::Counter*& c = s.errors[e.code];
    if (c == nullptr) {
      c = &errors_->Add({{"bucket", s.id}, {"code", absl::StatusCodeToString(e.code)}});
    }
    c->Increment();
  }
  s.sent->Increment(static_cast<double>(rec.bytes_sent));
  s.received->Increment(static_cast<double>(rec.bytes_received));
  s.gathered_total->Increment(static_cast<double>(rec.gathered_elements));
  if (rec.fell_back_to_dense) s.fallbacks->Increment();
  s.target_density->Set(rec.target_density);
  s.achieved_density->Set(rec.achieved_density);
  s.gathered->Set(static_cast<double>(rec.gathered_elements));
  s.residual_norm->Set(rec.residual_norm);
  for (int p = 0; p < kPhaseCount; ++p) s.phase[p]->Observe(rec.phase_seconds[p]);
  s.exchange->Observe((e.end_ns - e.begin_ns) * 1e-9);
  if (e.group_size <= 1 || rec.bucket_id == e.group_first) {
    groups_->Increment();
    group_seconds_->Increment((e.end_ns - e.begin_ns) * 1e-9);
    for (int p = 0; p < kPhaseCount; ++p) {
      group_phase_[p]->Increment(rec.phase_seconds[p]);
      group_phase_cpu_[p]->Increment(rec.phase_cpu_seconds[p]);
    }
  }
}

}  // namespace spex
