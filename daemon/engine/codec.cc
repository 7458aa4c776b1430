#include "daemon/engine/codec.h"

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"

namespace spex {
namespace {

// A compressor of the library behind the engine's Codec seam.
class CompressorCodec : public Codec {
 public:
  explicit CompressorCodec(std::unique_ptr<Compressor> c) : c_(std::move(c)) {}

  WirePattern pattern() const override { return c_->pattern(); }
  absl::Status SetDensity(double density) override {
    if (density == c_->density()) return absl::OkStatus();
    return c_->SetDensity(density);
  }
  absl::Status Select(float* acc, size_t n, uint64_t step, bool zero_selected,
                      CodecSelection* out) override {
    if (n != c_->elements()) {
      return absl::InternalError(absl::StrCat("compressor ", c_->name(), " was built for ",
                                              c_->elements(), " elements, asked to select from ",
                                              n));
    }
    return c_->Select(step, acc, /*add=*/nullptr, zero_selected, out);
  }
  absl::Status Update(uint64_t step, const std::vector<uint64_t>& counts,
                      const std::vector<uint32_t>& gathered) override {
    Gathered g;
    g.counts = absl::MakeConstSpan(counts);
    g.indices = absl::MakeConstSpan(gathered);
    return c_->Update(step, g);
  }

 private:
  std::unique_ptr<Compressor> c_;
};

}  // namespace

absl::Status ValidateCodec(const std::string& name, double density,
                           const std::map<std::string, std::string>& params) {
  return ValidateCompressor(name, density, params);
}

absl::StatusOr<std::unique_ptr<Codec>> MakeCodec(const CodecSpec& spec, Primitives* prims) {
  if (absl::Status s = ValidateCodec(spec.name, spec.density, spec.params); !s.ok()) return s;
  if (spec.name == "dense") return std::unique_ptr<Codec>();
  CompressorSpec cs;
  cs.name = spec.name;
  cs.density = spec.density;
  cs.params = spec.params;
  cs.node_rank = spec.node_rank;
  cs.node_count = spec.node_count;
  cs.elements = spec.elements;
  auto c = MakeCompressor(cs, prims);
  if (!c.ok()) return c.status();
  if ((*c)->pattern() == Pattern::kDense) return std::unique_ptr<Codec>();
  return std::unique_ptr<Codec>(new CompressorCodec(std::move(*c)));
}

}  // namespace spex
