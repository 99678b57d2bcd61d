// Framework-free declarations shared by the kernels library and the PyTorch bindings.
// Nothing here includes torch or a GPU runtime header, so host-only code (the CPU kernels,
// the CPU-only build) can use it.
//
// Error model: the kernels library never throws. Its entry points are noexcept and return a
// Status; the torch glue (csrc/pytorch) validates every argument before the call and turns a
// non-zero Status into a TORCH_CHECK error. (An exception thrown inside libprimus_turbo_kernels.so
// would have to unwind through a library that links neither libc10 nor torch's C++ runtime
// flags, and through extern-facing frames the glue does not control.)
#pragma once

#include <cstdint>

namespace primus_turbo {

// Element types the kernels accept; the bindings map torch dtypes onto these.
enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline int64_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// 0: success. > 0: the GPU runtime's error code (cudaError_t / hipError_t) of the failing call.
// < 0: a library error (the values below).
using Status = int;
constexpr Status kOk = 0;
constexpr Status kUnsupportedDType = -1;
constexpr Status kBadArgument = -2;

// A static string for `s` (never freed, safe to keep); the GPU runtime's text for codes > 0.
const char* status_string(Status s) noexcept;

}  // namespace primus_turbo
