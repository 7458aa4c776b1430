// A plain scalar implementation of every primitive: obviously correct, slow. The oracle the
// fast implementations are tested against, and a fallback that needs nothing but the STL.
#pragma once

#include <memory>

#include "kernels/primitives.h"

namespace spex {

std::unique_ptr<Primitives> MakeReferencePrimitives();

}  // namespace spex
