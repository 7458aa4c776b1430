// --metrics_address checked at start-up (metrics_address.h) without linking the HTTP server.
#include "daemon/observe/metrics_address.h"

#include <arpa/inet.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace spex {

std::string MetricsAddress::Bind(int p) const {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", p);
  return absl::StrCat(host, ":", p);
}

absl::StatusOr<MetricsAddress> ParseMetricsAddress(const std::string& text, bool allow_remote) {
  const auto bad = [&text](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_address=", text, ": ", why,
                     "; give HOST:PORT with an IP address, e.g. 127.0.0.1:9400 or [::1]:9400"));
  };
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("an IPv6 address needs [ADDRESS]:PORT");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  MetricsAddress out;
  if (!absl::SimpleAtoi(port, &out.port) || out.port < 0 || out.port > 65535 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad(absl::StrCat("'", port, "' is not a port number (0-65535)"));
  }
  if (host.empty()) return bad("no host (an empty host would serve every interface)");
  if (host == "localhost") host = "127.0.0.1";
  in_addr v4;
  in6_addr v6;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    out.loopback = (ntohl(v4.s_addr) >> 24) == 127;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    out.loopback = IN6_IS_ADDR_LOOPBACK(&v6);
  } else {
    return bad(absl::StrCat("'", host, "' is not an IP address or localhost"));
  }
  out.host = host;
  if (!out.loopback && !allow_remote) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_address=", text,
        " is not a loopback address: the metrics endpoint has no authentication, so spexd "
        "serves it on loopback only; add --metrics_allow_remote to serve it on ",
        host));
  }
  return out;
}

}  // namespace spex
