// A part of a test's socket names (paths under /tmp, abstract names) unique to this run: the pid
// and a random number drawn once per process. The pid alone repeats between concurrent runs of one
// test, since Bazel's sandbox starts each in its own PID namespace (bazel test --runs_per_test=N).
#pragma once

#include <unistd.h>

#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace spex::test {

inline const std::string& RunTag() {
  static const std::string tag = absl::StrCat(getpid(), "-", std::random_device{}());
  return tag;
}

}  // namespace spex::test
