#include "daemon/engine/codec.h"

#include "absl/strings/str_cat.h"

namespace spex {

const char* PatternName(WirePattern p) {
  switch (p) {
    case WirePattern::kIndexUnion: return "A";
    case WirePattern::kSparseGather: return "B";
    case WirePattern::kDense: return "D";
  }
  return "?";
}

absl::Status ValidateCodec(const std::string& name, double density, const std::map<std::string, std::string>& params) {
  if (!(density > 0 && density <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("density must be in (0, 1], got ", density));
  }
  if (name == "dense") {
    if (!params.empty()) return absl::InvalidArgumentError("compressor dense takes no parameters");
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown compressor '", name, "'; accepted: dense"));
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const CodecSpec& spec, Primitives* prims) {
  if (absl::Status s = ValidateCodec(spec.name, spec.density, spec.params); !s.ok()) return s;
  return std::unique_ptr<Codec>();
}

}  // namespace spex
