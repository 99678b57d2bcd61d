// primus_turbo.pytorch._C: the op schemas (namespace primus_turbo_cpp), the CPU and Meta
// implementations, and a minimal Python module object so `import primus_turbo.pytorch._C` loads
// the registrations. The kernels themselves live in libprimus_turbo_kernels.so (found through
// the rpath $ORIGIN: it sits next to this module).
#include <Python.h>
#include <execinfo.h>
#include <unistd.h>

#include <csignal>

#include <stdexcept>

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "primus_turbo/rmsnorm.h"
#include "rmsnorm_op.h"

namespace primus_turbo::pytorch {
namespace {

std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_cpu_impl(const at::Tensor& x, const at::Tensor& w,
                                                        double eps) {
  auto [rows, hidden] = check_fwd(x, w);
  at::Tensor y = at::empty_like(x);
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  if (rows > 0 && hidden > 0) {
    check_status(rmsnorm_fwd_cpu(x.data_ptr(), w.data_ptr(), y.data_ptr(),
                                 rstd.data_ptr<float>(), rows, hidden, static_cast<float>(eps),
                                 to_dtype(x, "x")),
                 "CPU forward");
  }
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_cpu_impl(const at::Tensor& dy, const at::Tensor& x,
                                                        const at::Tensor& w,
                                                        const at::Tensor& rstd) {
  check_bwd(dy, x, w, rstd);
  const int64_t rows = x.size(0), hidden = x.size(1);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = at::empty_like(w);
  if (hidden > 0) {
    at::Tensor part =
        at::empty({rmsnorm_bwd_cpu_partials(rows), hidden}, x.options().dtype(at::kFloat));
    check_status(rmsnorm_bwd_cpu(dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                                 rstd.data_ptr<float>(), dx.data_ptr(), dw.data_ptr(),
                                 part.data_ptr<float>(), rows, hidden, to_dtype(x, "x")),
                 "CPU backward");
  }
  return {dx, dw};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_meta(const at::Tensor& x, const at::Tensor& w,
                                                    double eps) {
  check_fwd(x, w);  // the same argument errors as the CPU/GPU registrations
  return {at::empty_like(x), at::empty({x.size(0)}, x.options().dtype(at::kFloat))};
}

std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd_meta(const at::Tensor& dy, const at::Tensor& x,
                                                    const at::Tensor& w, const at::Tensor& rstd) {
  check_bwd(dy, x, w, rstd);
  return {at::empty_like(x), at::empty_like(w)};
}

// Diagnostics (tests/native): throws from inside a dispatcher call of this library, so a crash on
// the error path can be pinned to the exception kind. 0: std::runtime_error, 1: TORCH_CHECK
// (c10::Error from libc10), 2: c10::ValueError via TORCH_CHECK_VALUE; any other kind returns.
void throw_test(int64_t kind) {
  if (kind == 0) {
    throw std::runtime_error("primus_turbo self-test: std::runtime_error via dispatcher");
  }
  TORCH_CHECK(kind != 1, "primus_turbo self-test: c10::Error via dispatcher");
  TORCH_CHECK_VALUE(kind != 2, "primus_turbo self-test: c10::ValueError via dispatcher");
}

bool has_gpu_kernels() {
#ifdef PRIMUS_TURBO_WITH_GPU
  return true;
#else
  return false;
#endif
}

}  // namespace
}  // namespace primus_turbo::pytorch

TORCH_LIBRARY(primus_turbo_cpp, m) {
  m.def("rmsnorm_fwd(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rmsnorm_bwd(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  m.def("_throw_test(int kind) -> ()", &primus_turbo::pytorch::throw_test);  // diagnostics
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, CPU, m) {
  m.impl("rmsnorm_fwd", &primus_turbo::pytorch::rmsnorm_fwd_cpu_impl);
  m.impl("rmsnorm_bwd", &primus_turbo::pytorch::rmsnorm_bwd_cpu_impl);
}

TORCH_LIBRARY_IMPL(primus_turbo_cpp, Meta, m) {
  m.impl("rmsnorm_fwd", &primus_turbo::pytorch::rmsnorm_fwd_meta);
  m.impl("rmsnorm_bwd", &primus_turbo::pytorch::rmsnorm_bwd_meta);
}

namespace {
PyObject* py_has_gpu_kernels(PyObject*, PyObject*) {
  return PyBool_FromLong(primus_turbo::pytorch::has_gpu_kernels() ? 1 : 0);
}
// Diagnostics for the error path (tests/native bisect a crash while raising with it): kind 0
// throws and catches a std::runtime_error inside _C; kind 1 a c10::Error thrown by libc10's
// torchCheckFail (TORCH_CHECK), caught inside _C. Both return the message as a Python
// RuntimeError, without the dispatcher or torch's Python error translation in between.
PyObject* py_self_test_throw(PyObject*, PyObject* arg) {
  const long kind = PyLong_AsLong(arg);
  if (kind == -1 && PyErr_Occurred()) return nullptr;
  try {
    if (kind == 0) throw std::runtime_error("primus_turbo self-test: std::runtime_error");
    TORCH_CHECK(false, "primus_turbo self-test: c10::Error ", kind);
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}
// Diagnostics: on SIGSEGV/SIGBUS/SIGABRT print the native stack (glibc backtrace, symbols from the
// dynamic tables) to stderr, then hand the signal to the previous handler (faulthandler prints the
// Python stack). For machines without gdb; the bad-argument child test installs it.
struct sigaction g_prev[3];
constexpr int kCrashSignals[3] = {SIGSEGV, SIGBUS, SIGABRT};
void crash_handler(int sig) {
  static const char kHead[] = "\n--- primus_turbo native stack ---\n";
  (void)!write(2, kHead, sizeof(kHead) - 1);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  for (int i = 0; i < 3; ++i) {
    if (kCrashSignals[i] == sig) sigaction(sig, &g_prev[i], nullptr);
  }
  raise(sig);
}
PyObject* py_install_crash_handler(PyObject*, PyObject*) {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc_s now, not inside the handler
  for (int i = 0; i < 3; ++i) {
    struct sigaction sa {};
    sa.sa_handler = crash_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_ONSTACK;
    sigaction(kCrashSignals[i], &sa, &g_prev[i]);
  }
  Py_RETURN_NONE;
}
// Re-reads PRIMUS_TURBO_RMSNORM_CPP_*PLAN at the next GPU call (benchmarks compare plans in one
// process); a no-op in CPU-only builds.
PyObject* py_rmsnorm_reload_plans(PyObject*, PyObject*) {
#ifdef PRIMUS_TURBO_WITH_GPU
  primus_turbo::rmsnorm_gpu_reload_plans();
#endif
  Py_RETURN_NONE;
}
PyMethodDef kMethods[] = {
    {"_rmsnorm_reload_plans", py_rmsnorm_reload_plans, METH_NOARGS,
     "Re-reads the PRIMUS_TURBO_RMSNORM_CPP_*PLAN environment variables at the next GPU call."},
    {"_install_crash_handler", py_install_crash_handler, METH_NOARGS,
     "Prints the native stack on SIGSEGV/SIGBUS/SIGABRT (then the previous handler runs)."},
    {"has_gpu_kernels", py_has_gpu_kernels, METH_NOARGS,
     "True when this build carries the CUDA/HIP kernels."},
    {"_self_test_throw", py_self_test_throw, METH_O,
     "Raises RuntimeError through a C++ throw/catch inside _C (0: std, 1: c10::Error)."},
    {nullptr, nullptr, 0, nullptr}};
PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C",
                       "Primus-Turbo C++ ops (torch.ops.primus_turbo_cpp).", -1, kMethods};
}  // namespace

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&kModule); }
