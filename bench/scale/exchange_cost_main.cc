// exchange_cost: the exchange cost model (daemon/engine/exchange_cost.h) from the command line,
// for bench/scale/spex_scale.py (its whatif command and the comparison with the simulation).
//   exchange_cost NODES GBIT_PER_S LATENCY_US ELEMENTS K VALUE_BYTES SKEW CONTROL(0|1) [INDEX]
// prints one JSON object: the model's times in seconds and the cheapest exchange (INDEX: the
// bytes a sparse index takes, 4 by default (uint32), or "delta" for the delta form's expected
// size, DeltaIndexBytes);
//   exchange_cost allreduce NODES GBIT_PER_S LATENCY_US BYTES...
// prints the model's time of one all-reduce of each size (the peers: DDP, PowerSGD).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/engine/exchange_cost.h"

int main(int argc, char** argv) {
  if (argc >= 5 && std::string(argv[1]) == "allreduce") {
    spex::LinkModel link;
    link.bytes_per_s = std::strtod(argv[3], nullptr) * 1e9 / 8;
    link.latency_s = std::strtod(argv[4], nullptr) * 1e-6;
    std::printf("[");
    for (int i = 5; i < argc; ++i) {
      std::printf("%s%.9g", i > 5 ? ", " : "",
                  spex::AllReduceTime(link, std::atoi(argv[2]), std::strtod(argv[i], nullptr)));
    }
    std::printf("]\n");
    return 0;
  }
  if (argc != 9 && argc != 10) {
    std::fprintf(stderr,
                 "usage: exchange_cost NODES GBIT_PER_S LATENCY_US ELEMENTS K VALUE_BYTES SKEW "
                 "CONTROL(0|1) [INDEX_BYTES|delta]\n");
    return 2;
  }
  spex::LinkModel link;
  link.bytes_per_s = std::strtod(argv[2], nullptr) * 1e9 / 8;
  link.latency_s = std::strtod(argv[3], nullptr) * 1e-6;
  spex::ExchangeShape s;
  s.nodes = std::atoi(argv[1]);
  s.elements = std::strtoull(argv[4], nullptr, 10);
  s.k = std::strtoull(argv[5], nullptr, 10);
  s.value_bytes = std::atoi(argv[6]);
  s.skew = std::strtod(argv[7], nullptr);
  s.control = std::atoi(argv[8]) != 0;
  if (argc == 10) {
    s.index_bytes = std::string(argv[9]) == "delta" ? spex::DeltaIndexBytes(s.elements, s.k)
                                                    : std::strtod(argv[9], nullptr);
  }
  if (absl::Status st = spex::CheckExchangeInputs(link, s); !st.ok()) {
    std::fprintf(stderr, "exchange_cost: %s\n", st.ToString().c_str());
    return 2;
  }
  const spex::ExchangeCosts c = spex::EstimateExchange(link, s);
  std::printf(
      "{\"control_s\": %.9g, \"dense_s\": %.9g, \"allgather_s\": %.9g, \"oktopk_s\": %.9g, "
      "\"best\": \"%s\"}\n",
      c.control_s, c.dense_s, c.allgather_s, c.oktopk_s, spex::ExchangeChoiceName(c.best));
  return 0;
}
