// Typed, validated compressor parameters from the string map of a CompressorSpec. Each
// compressor's factory reads the keys it accepts (with default, range and a help line); Finish()
// then rejects unknown keys and bad values with InvalidArgument listing everything accepted.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace spex {

class ParamReader {
 public:
  ParamReader(std::string compressor, const std::map<std::string, std::string>& params);

  double Double(const std::string& key, double def, double lo, double hi, const std::string& help);
  int64_t Int(const std::string& key, int64_t def, int64_t lo, int64_t hi, const std::string& help);
  uint64_t Seed(uint64_t def = 1);  // key "seed": any unsigned 64-bit integer
  std::string Choice(const std::string& key, const std::string& def,
                     const std::vector<std::string>& choices, const std::string& help);
  bool Bool(const std::string& key, bool def, const std::string& help);

  // Records an error found while building (e.g. a size the compressor cannot handle).
  void Reject(const std::string& msg) { Fail(msg); }

  // OK, or the first bad value / unknown key (with the list of accepted keys).
  absl::Status Finish() const;
  bool ok() const { return error_.empty(); }

 private:
  const std::string* Find(const std::string& key) const;
  void Accept(const std::string& key, const std::string& desc);
  void Fail(const std::string& msg);

  std::string compressor_;
  const std::map<std::string, std::string>& params_;
  std::vector<std::pair<std::string, std::string>> accepted_;
  std::string error_;
};

}  // namespace spex
