// Small helpers the benchmark programs share: comma-separated flag lists and medians.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace spex {
namespace bench {

// "a,b,c" -> values; numbers are parsed as doubles then converted, so "1e6" works for sizes.
// A malformed entry ends the program with exit code 2 and names the entry.
template <typename T>
std::vector<T> FlagList(const std::string& s) {
  std::vector<T> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    if constexpr (std::is_same_v<T, std::string>) {
      out.emplace_back(p);
    } else {
      double v;
      if (!absl::SimpleAtod(p, &v)) {
        std::fprintf(stderr, "bad list entry '%s'\n", std::string(p).c_str());
        std::exit(2);
      }
      out.push_back(static_cast<T>(v));
    }
  }
  return out;
}

// The upper median (the middle element after sorting); 0 for an empty vector.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace bench
}  // namespace spex
