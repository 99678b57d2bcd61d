"""Bad-argument calls of the raw C++ ops, run as a child process by test_extension.py (a crash on
the error path then fails that test with this script's output instead of killing pytest).

Run it directly to see every stage on a machine where the test fails:

    python tests/native/bad_args_child.py cpu|meta|cuda

Each stage is printed (flushed, on stdout and stderr) before it runs, with the exception type and
message it raised, so a crash log names the layer that died: torch's own error path, a throw
caught inside _C, a throw through the dispatcher from _C (std / c10::Error / c10::ValueError),
a valid op call, then each bad-argument case. The shared libraries the process mapped (two
libstdc++ / libgcc_s copies would explain an unwinder crash) are listed first.
"""

from __future__ import annotations

import faulthandler
import sys


def say(msg: str) -> None:
    print(msg, flush=True)
    print(msg, file=sys.stderr, flush=True)


def mapped_libs() -> list[str]:
    keys = ("libstdc++", "libgcc_s", "libgomp", "libcudart", "libc10", "primus_turbo", "libunwind")
    seen: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if any(k in path for k in keys) and path not in seen:
                    seen.append(path)
    except OSError:
        pass
    return seen


def expect_error(stage: str, call, needle: str) -> None:
    say(f"STAGE {stage}")
    try:
        call()
    except Exception as e:  # noqa: BLE001 - reported with its type
        say(f"  -> {type(e).__module__}.{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        assert needle in str(e), (stage, needle, str(e))
        return
    raise SystemExit(f"{stage}: no error raised")


def main(dev: str) -> None:
    faulthandler.enable()
    import torch

    from primus_turbo.build_info import build_info, native_ops

    ops = native_ops()
    import primus_turbo.pytorch._C as ext

    ext._install_crash_handler()  # a crash prints the native stack, then faulthandler's
    say(f"torch {torch.__version__}, build {build_info()}, device {dev}")
    for path in mapped_libs():
        say(f"  mapped {path}")

    expect_error("torch builtin error", lambda: torch.mm(torch.ones(2, 3), torch.ones(2, 3)), "")
    for k in (0, 1):
        stage = f"self-test throw {k} (caught inside _C)"
        expect_error(stage, lambda k=k: ext._self_test_throw(k), "self-test")
    if hasattr(ops, "_throw_test"):  # 0 std, 1 c10::Error, 2 c10::ValueError
        for k in (0, 1, 2):
            stage = f"throw {k} through the dispatcher"
            expect_error(stage, lambda k=k: ops._throw_test(k), "self-test")

    x = torch.randn(3, 16).to(dev)
    w = torch.randn(16).to(dev)
    rstd = torch.ones(3, device=dev)
    say("STAGE valid call")
    ops.rmsnorm_fwd(x, w, 1e-6)
    cases = [
        ("weight", lambda: ops.rmsnorm_fwd(x, w[:8], 1e-6)),  # contiguous, wrong hidden size
        ("weight", lambda: ops.rmsnorm_fwd(x, w.half(), 1e-6)),
        ("x", lambda: ops.rmsnorm_fwd(x.t(), w[:3], 1e-6)),
        ("x", lambda: ops.rmsnorm_fwd(x.double(), w.double(), 1e-6)),
        ("dy", lambda: ops.rmsnorm_bwd(x[:2], x, w, rstd)),
        ("rstd", lambda: ops.rmsnorm_bwd(x, x, w, rstd[:2])),
    ]
    for i, (arg, call) in enumerate(cases):
        expect_error(f"op case {i} ({arg})", call, f"argument '{arg}'")
    say("BAD-ARGS-OK")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu")
