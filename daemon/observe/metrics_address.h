// --metrics_address: where spexd serves its Prometheus metrics. Checked at start-up without
// pulling in the HTTP server (daemon/config.cc uses it).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace spex {

struct MetricsAddress {
  std::string host;  // an IP literal: "127.0.0.1", "::1", "0.0.0.0", ...
  int port = 0;      // 0: any free port (tests)
  bool loopback = true;
  // The bind string of prometheus-cpp's Exposer (civetweb's listening_ports) for `port`.
  std::string Bind(int port) const;
};

// Parses "HOST:PORT" ("localhost:9400", "127.0.0.1:9400", "[::1]:9400", "0.0.0.0:9400"). HOST
// must be an IP literal or "localhost". A host other than loopback is refused unless
// `allow_remote` (--metrics_allow_remote): the endpoint has no authentication. Errors name the
// flags.
absl::StatusOr<MetricsAddress> ParseMetricsAddress(const std::string& text, bool allow_remote);

}  // namespace spex
