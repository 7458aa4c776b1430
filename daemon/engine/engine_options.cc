// Parsing and validation of EngineOptions (engine_options.h): the flag spellings of its
// enumerations and the one check of every value before an Engine starts.
#include "daemon/engine/engine_options.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/contract/layout.h"

namespace spex {

bool AbslParseFlag(absl::string_view text, DenseFallback* out, std::string* error) {
  if (text == "auto") {
    *out = DenseFallback::kAuto;
    return true;
  }
  if (text == "off") {
    *out = DenseFallback::kOff;
    return true;
  }
  *error = absl::StrCat("'", text.substr(0, 64), "' is not a dense fallback; accepted: auto, off");
  return false;
}

std::string AbslUnparseFlag(DenseFallback v) { return v == DenseFallback::kAuto ? "auto" : "off"; }

bool AbslParseFlag(absl::string_view text, NonfinitePolicy* out, std::string* error) {
  if (text == "propagate") {
    *out = NonfinitePolicy::kPropagate;
    return true;
  }
  if (text == "error") {
    *out = NonfinitePolicy::kError;
    return true;
  }
  *error = absl::StrCat("'", text.substr(0, 64),
                        "' is not a non-finite policy; accepted: propagate, error");
  return false;
}

std::string AbslUnparseFlag(NonfinitePolicy v) {
  return v == NonfinitePolicy::kPropagate ? "propagate" : "error";
}

bool AbslParseFlag(absl::string_view text, SparseAllreduce* out, std::string* error) {
  if (text == "allgather") {
    *out = SparseAllreduce::kAllGather;
    return true;
  }
  if (text == "oktopk") {
    *out = SparseAllreduce::kOkTopk;
    return true;
  }
  if (text == "auto") {
    *out = SparseAllreduce::kAuto;
    return true;
  }
  *error = absl::StrCat("'", text.substr(0, 64),
                        "' is not a sparse all-reduce; accepted: allgather, oktopk, auto");
  return false;
}

bool AbslParseFlag(absl::string_view text, AutoDecide* out, std::string* error) {
  if (text == "model") {
    *out = AutoDecide::kModel;
    return true;
  }
  if (text == "probe") {
    *out = AutoDecide::kProbe;
    return true;
  }
  *error =
      absl::StrCat("'", text.substr(0, 64), "' is not a way to decide; accepted: model, probe");
  return false;
}

std::string AbslUnparseFlag(AutoDecide v) { return v == AutoDecide::kModel ? "model" : "probe"; }

bool AbslParseFlag(absl::string_view text, OkTopkSelect* out, std::string* error) {
  if (text == "topk") {
    *out = OkTopkSelect::kTopk;
    return true;
  }
  if (text == "all") {
    *out = OkTopkSelect::kAll;
    return true;
  }
  *error = absl::StrCat("'", text.substr(0, 64),
                        "' is not an Ok-Topk global selection; accepted: topk, all");
  return false;
}

std::string AbslUnparseFlag(OkTopkSelect v) { return v == OkTopkSelect::kTopk ? "topk" : "all"; }

std::string AbslUnparseFlag(SparseAllreduce v) {
  switch (v) {
    case SparseAllreduce::kOkTopk:
      return "oktopk";
    case SparseAllreduce::kAuto:
      return "auto";
    case SparseAllreduce::kAllGather:
      break;
  }
  return "allgather";
}

absl::Status CheckSparseAllreduce(const EngineOptions& o, const std::string& compressor) {
  return CheckSparseAllreduce(o.sparse_allreduce, /*from_param=*/false, compressor);
}

absl::Status CheckSparseAllreduce(SparseAllreduce mode, bool from_param,
                                  const std::string& compressor) {
  if (mode != SparseAllreduce::kOkTopk) return absl::OkStatus();
  const absl::string_view what =
      from_param ? "the bucket parameter sparse_allreduce=oktopk" : "--sparse_allreduce=oktopk";
  const absl::string_view instead =
      from_param ? "sparse_allreduce=allgather or auto" : "--sparse_allreduce=allgather or auto";
  if (CompressorCanUseOkTopk(compressor)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "compressor ", compressor, " cannot use ", what,
      " (it sums (index, value) selections of pattern-B compressors only); the compressors that "
      "can: ",
      absl::StrJoin(OkTopkCompressorNames(), ", "), "; or use ", instead));
}

uint64_t DefaultMemoryLimit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  uint64_t limit = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * page / 2 : 8ull << 30;
  struct statvfs v;
  if (statvfs("/dev/shm", &v) == 0) {
    limit = std::min<uint64_t>(limit, static_cast<uint64_t>(v.f_bavail) * v.f_frsize);
  }
  return limit;
}

std::string QuotePrefix(absl::string_view s) {
  if (s.size() <= kQuotedPrefix) return absl::StrCat("'", s, "'");
  return absl::StrCat("'", s.substr(0, kQuotedPrefix), "...' (", s.size(), " bytes)");
}

absl::Status ValidateEngineOptions(const EngineOptions& o) {
  if (o.max_buckets_per_session < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_buckets_per_session must be >= 1, got ", o.max_buckets_per_session));
  }
  if (o.local_trainers < 1 || o.local_trainers > static_cast<int>(kMaxLocalTrainers)) {
    return absl::InvalidArgumentError(absl::StrCat("--local_trainers must be in 1..",
                                                   kMaxLocalTrainers, ", got ", o.local_trainers));
  }
  if (o.probe_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--probe_steps must be >= 1, got ", o.probe_steps));
  }
  if (!(o.link_gbps >= 0) || !std::isfinite(o.link_gbps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link_gbps must be >= 0 (0: measure the link), got ", o.link_gbps));
  }
  if (!(o.link_latency_us >= 0) || !std::isfinite(o.link_latency_us)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link_latency_us must be >= 0, got ", o.link_latency_us));
  }
  if (o.residual_norm_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--residual_norm_every must be >= 0, got ", o.residual_norm_every));
  }
  if (o.oktopk_recompute_every < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--oktopk_recompute_every must be >= 1, got ", o.oktopk_recompute_every));
  }
  if (o.oktopk_rebalance_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--oktopk_rebalance_every must be >= 0 (0: never), got ", o.oktopk_rebalance_every));
  }
  if (!o.compressor_factory) {
    if (absl::Status s = ValidateCompressor(o.compressor, o.density, {}); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--compressor/--density: ", s.message()));
    }
    // The default compressor must be able to use the chosen exchange (dense never exchanges
    // sparse); a bucket registering another one is checked at registration.
    if (o.compressor != "dense") {
      if (absl::Status s = CheckSparseAllreduce(o, o.compressor); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--compressor: ", s.message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SplitBucketParams(const EngineOptions& o,
                               const std::map<std::string, std::string>& params,
                               std::map<std::string, std::string>* compressor_params,
                               BucketPolicy* policy) {
  policy->nonfinite = o.nonfinite;
  policy->sparse_allreduce = o.sparse_allreduce;
  policy->sparse_allreduce_param = false;
  policy->dense_fallback = o.dense_fallback;
  policy->dtype = DType::kFloat32;
  policy->wire_float32 = false;
  compressor_params->clear();
  for (const auto& [key, value] : params) {
    std::string error;
    if (key == kBucketParamNonfinite) {
      if (!AbslParseFlag(value, &policy->nonfinite, &error)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", kBucketParamNonfinite, "=", QuotePrefix(value),
            ": accepted values propagate, error (it overrides spexd --nonfinite for this bucket)"));
      }
    } else if (key == kBucketParamSparseAllreduce) {
      if (!AbslParseFlag(value, &policy->sparse_allreduce, &error)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", kBucketParamSparseAllreduce, "=", QuotePrefix(value),
                         ": accepted values allgather, oktopk, auto (it overrides spexd "
                         "--sparse_allreduce for this bucket)"));
      }
      policy->sparse_allreduce_param = true;
    } else if (key == kBucketParamDenseFallback) {
      if (!AbslParseFlag(value, &policy->dense_fallback, &error)) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", kBucketParamDenseFallback, "=", QuotePrefix(value),
                         ": accepted values auto, off (it overrides spexd --dense_fallback for "
                         "this bucket)"));
      }
    } else if (key == kBucketParamDType) {
      absl::StatusOr<DType> t = ParseDType(value);
      if (!t.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("parameter ", kBucketParamDType, "=", QuotePrefix(value),
                         ": accepted values float32, bfloat16, float16"));
      }
      policy->dtype = *t;
    } else if (key == kBucketParamWireValues) {
      if (value != "native" && value != "float32") {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", kBucketParamWireValues, "=", QuotePrefix(value),
            ": accepted values native (a half bucket's own type on the wire), float32"));
      }
      policy->wire_float32 = value == "float32";
    } else {
      compressor_params->emplace(key, value);
    }
  }
  return absl::OkStatus();
}

}  // namespace spex
