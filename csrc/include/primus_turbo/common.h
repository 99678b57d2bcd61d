// Framework-free declarations shared by the kernels library and the PyTorch bindings.
// Nothing here includes torch or a GPU runtime header, so host-only code (the CPU kernels,
// the CPU-only build) can use it.
#pragma once

#include <cstdint>

namespace primus_turbo {

// Element types the kernels accept; the bindings map torch dtypes onto these.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int64_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

}  // namespace primus_turbo
