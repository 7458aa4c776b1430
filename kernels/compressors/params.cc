// Typed, validated compressor parameters from a CompressorSpec's string map (params.h).
#include "kernels/compressors/params.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace spex {

ParamReader::ParamReader(std::string compressor, const std::map<std::string, std::string>& params)
    : compressor_(std::move(compressor)), params_(params) {}

const std::string* ParamReader::Find(const std::string& key) const {
  auto it = params_.find(key);
  return it == params_.end() ? nullptr : &it->second;
}

void ParamReader::Accept(const std::string& key, const std::string& desc) {
  accepted_.emplace_back(key, desc);
}

void ParamReader::Fail(const std::string& msg) {
  if (error_.empty()) error_ = msg;
}

double ParamReader::Double(const std::string& key, double def, double lo, double hi,
                           const std::string& help) {
  Accept(key, absl::StrCat("number in [", lo, ", ", hi, "], default ", def, ": ", help));
  const std::string* v = Find(key);
  if (v == nullptr) return def;
  double d;
  if (!absl::SimpleAtod(*v, &d) || !std::isfinite(d) || d < lo || d > hi) {
    Fail(absl::StrCat(compressor_, ": parameter ", key, "='", *v, "' must be a number in [", lo,
                      ", ", hi, "] (", help, ")"));
    return def;
  }
  return d;
}

int64_t ParamReader::Int(const std::string& key, int64_t def, int64_t lo, int64_t hi,
                         const std::string& help) {
  Accept(key, absl::StrCat("integer in [", lo, ", ", hi, "], default ", def, ": ", help));
  const std::string* v = Find(key);
  if (v == nullptr) return def;
  int64_t i;
  if (!absl::SimpleAtoi(*v, &i) || i < lo || i > hi) {
    Fail(absl::StrCat(compressor_, ": parameter ", key, "='", *v, "' must be an integer in [", lo,
                      ", ", hi, "] (", help, ")"));
    return def;
  }
  return i;
}

uint64_t ParamReader::Seed(uint64_t def) {
  const std::string help = "random seed; the same seed gives the same selections";
  Accept("seed", absl::StrCat("unsigned integer, default ", def, ": ", help));
  const std::string* v = Find("seed");
  if (v == nullptr) return def;
  uint64_t s;
  if (!absl::SimpleAtoi(*v, &s)) {
    Fail(absl::StrCat(compressor_, ": parameter seed='", *v,
                      "' must be an unsigned 64-bit integer"));
    return def;
  }
  return s;
}

std::string ParamReader::Choice(const std::string& key, const std::string& def,
                                const std::vector<std::string>& choices, const std::string& help) {
  const std::string list = absl::StrJoin(choices, "|");
  Accept(key, absl::StrCat(list, ", default ", def, ": ", help));
  const std::string* v = Find(key);
  if (v == nullptr) return def;
  for (const std::string& c : choices) {
    if (*v == c) return c;
  }
  Fail(absl::StrCat(compressor_, ": parameter ", key, "='", *v, "' must be one of ", list, " (",
                    help, ")"));
  return def;
}

bool ParamReader::Bool(const std::string& key, bool def, const std::string& help) {
  Accept(key, absl::StrCat("true|false, default ", def ? "true" : "false", ": ", help));
  const std::string* v = Find(key);
  if (v == nullptr) return def;
  if (*v == "true" || *v == "1") return true;
  if (*v == "false" || *v == "0") return false;
  Fail(absl::StrCat(compressor_, ": parameter ", key, "='", *v, "' must be true or false (", help,
                    ")"));
  return def;
}

absl::Status ParamReader::Finish() const {
  auto accepted = [&] {
    if (accepted_.empty()) return std::string(" (it takes no parameters)");
    std::vector<std::string> parts;
    for (const auto& [k, d] : accepted_) parts.push_back(absl::StrCat(k, " (", d, ")"));
    return absl::StrCat("; accepted: ", absl::StrJoin(parts, "; "));
  };
  if (!error_.empty()) return absl::InvalidArgumentError(error_);
  for (const auto& [key, value] : params_) {
    bool known = false;
    for (const auto& a : accepted_) known = known || a.first == key;
    if (!known) {
      return absl::InvalidArgumentError(
          absl::StrCat(compressor_, ": unknown parameter '", key, "'", accepted()));
    }
  }
  return absl::OkStatus();
}

}  // namespace spex
