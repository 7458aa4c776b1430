// spexd's Prometheus metrics (--metrics_address): prometheus-cpp's registry, served in the text
// exposition format by its pull Exposer (an HTTP server on its own threads). Every series has
// the label node="<rank>"; per-bucket series also bucket="<id>" (names and meanings:
// docs/operations.md, "Metrics and timeline").
//
// Per exchange (OnExchange, on the engine thread): counters (exchanges, bytes, fallbacks,
// gathered elements, errors by status code), gauges of the last exchange (densities, gathered
// elements, residual norm) and one histogram observation per phase and for the whole exchange.
// The series of a bucket are created at its first exchange and then reached through a cached
// pointer, so an exchange costs a hash lookup and a few atomic increments and uncontended locks.
// Per node (read from the Engine at scrape time, on the exposer's thread): sessions, buckets by
// state, nodes, exchanges.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/observer.h"
#include "daemon/observe/metrics_address.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace spex {

class NodeCollectable;

class Metrics final : public ExchangeObserver {
 public:
  explicit Metrics(int node_rank);
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The engine whose sessions and buckets are read at scrape time; nullptr detaches (before the
  // engine goes away). Safe against concurrent scrapes.
  void Attach(const Engine* engine);
  // Serves GET /metrics on `bind` (civetweb's form: "127.0.0.1:9400", "[::1]:0"). Returns the
  // port it listens on. Unavailable when the port cannot be bound.
  absl::StatusOr<int> Serve(const std::string& bind);
  // Stops the HTTP server (also done by the destructor).
  void StopServing();

  // The exposition text the endpoint serves (tests).
  std::string Render() const;

  void OnExchange(const ExchangeEvent& event) override;

 private:
  struct BucketSeries;
  BucketSeries& Series(uint64_t bucket);

  const std::string node_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<NodeCollectable> node_collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;

  prometheus::Family<prometheus::Counter>* exchanges_;
  prometheus::Family<prometheus::Counter>* sent_;
  prometheus::Family<prometheus::Counter>* received_;
  prometheus::Family<prometheus::Counter>* gathered_total_;
  prometheus::Family<prometheus::Counter>* fallbacks_;
  prometheus::Family<prometheus::Counter>* errors_;
  prometheus::Family<prometheus::Gauge>* target_density_;
  prometheus::Family<prometheus::Gauge>* achieved_density_;
  prometheus::Family<prometheus::Gauge>* gathered_;
  prometheus::Family<prometheus::Gauge>* residual_norm_;
  prometheus::Family<prometheus::Gauge>* elements_;
  prometheus::Family<prometheus::Histogram>* phase_seconds_;
  prometheus::Family<prometheus::Histogram>* exchange_seconds_;
  // Node-wide: one per exchange the engine ran (a merge group, or a bucket exchanged alone).
  prometheus::Counter* groups_;
  prometheus::Counter* group_seconds_;
  prometheus::Counter* group_phase_[kPhaseCount];      // per phase, once per group
  prometheus::Counter* group_phase_cpu_[kPhaseCount];  // their CPU time, once per group

  // The engine thread's only.
  std::unordered_map<uint64_t, std::unique_ptr<BucketSeries>> buckets_;
};

}  // namespace spex
