// One factory per compressor (defined in its own file), used by the registry (registry.cc).
// A factory reads and validates its parameters from `r`; with prims == nullptr or a bad
// parameter it returns null after reading (so the registry can validate without building).
#pragma once

#include <memory>

#include "kernels/compressor.h"
#include "kernels/compressors/params.h"
#include "kernels/compressors/state_blob.h"
#include "kernels/compressors/threshold_control.h"

namespace spex {

// A compressor that carries nothing from step to step beyond the base's call count and density
// (its thresholds and samples are recomputed from acc and the step every time), so its saved
// state has no fields of its own.
class StatelessCompressor : public Compressor {
 protected:
  using Compressor::Compressor;
  bool SaveOwnState(StateWriter*) const override { return true; }
  bool LoadOwnState(StateReader& r) override { return r.complete(); }
};

using CompressorFactory = std::unique_ptr<Compressor> (*)(const CompressorSpec&, Primitives*,
                                                          ParamReader&);

std::unique_ptr<Compressor> MakeDense(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeTopK(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeGTopK(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeTopKUnion(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeRandomK(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeThresh(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeDgc(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeGaussianK(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeRedSync(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeRedSyncTrim(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeSidcoE(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeSidcoP(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeSidcoGP(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeMicro(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeExDyna(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeSage(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeCltk(const CompressorSpec&, Primitives*, ParamReader&);
std::unique_ptr<Compressor> MakeDeft(const CompressorSpec&, Primitives*, ParamReader&);

// threshold_control and histogram_trim, shared by micro and exdyna.
ThresholdControl ReadThresholdControl(ParamReader& r, bool* trim);

}  // namespace spex
