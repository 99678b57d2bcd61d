// Status texts of the kernels library (common.h). GPU runtime codes (> 0) get the runtime's own
// text in GPU builds (runtime.cu).
#include "primus_turbo/common.h"

namespace primus_turbo {

#ifdef PRIMUS_TURBO_WITH_GPU
const char* gpu_error_string(int code) noexcept;
#endif

const char* status_string(Status s) noexcept {
  switch (s) {
    case kOk: return "success";
    case kUnsupportedDType: return "unsupported dtype (expected float32, float16 or bfloat16)";
    case kBadArgument: return "invalid argument";
    default: break;
  }
#ifdef PRIMUS_TURBO_WITH_GPU
  if (s > 0) return gpu_error_string(s);
#endif
  return s > 0 ? "GPU runtime error (CPU-only build)" : "unknown error";
}

}  // namespace primus_turbo
