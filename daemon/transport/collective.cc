#include "daemon/transport/collective.h"

namespace spex {

size_t ElemSize(ElemType t) {
  switch (t) {
    case ElemType::kFloat32:
      return 4;
    case ElemType::kFloat64:
      return 8;
    case ElemType::kInt64:
      return 8;
    case ElemType::kUint64:
      return 8;
  }
  return 0;
}

}  // namespace spex
