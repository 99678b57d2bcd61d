"""Test-suite wiring: one GPU per xdist worker, tier selection, state reset between tests.

- Under xdist each worker ``gwN`` sees one GPU (``N % num_gpus``), set before CUDA initialises.
- With no GPU, Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``, set before any
  kernel module is imported) at small shapes, and GPU-only cases skip with a reason.
- ``--deterministic-only`` runs only ``@pytest.mark.deterministic`` tests (and a plain run skips
  them); ``--dist-only`` runs only ``@pytest.mark.multigpu`` tests (skipped under xdist).
"""

from __future__ import annotations

import os
import zlib

_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER is None:
    import torch

    os.environ["PRIMUS_TURBO_TEST_NUM_GPUS"] = str(torch.cuda.device_count())
else:
    _num = int(os.environ.get("PRIMUS_TURBO_TEST_NUM_GPUS", "0"))
    if _num > 0:
        # pick among the GPUs this run may use: an inherited CUDA_VISIBLE_DEVICES="1" means
        # physical GPU 1, not "0" (session 3 ran two pytest lanes on one GPU that way)
        _env = (
            "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in os.environ else "CUDA_VISIBLE_DEVICES"
        )
        _ids = [v.strip() for v in os.environ.get(_env, "").split(",") if v.strip()]
        _ids = _ids[:_num] if len(_ids) >= _num else [str(i) for i in range(_num)]
        gpu = _ids[int(_WORKER.removeprefix("gw")) % _num]
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        os.environ["HIP_VISIBLE_DEVICES"] = gpu

import pytest  # noqa: E402
import torch  # noqa: E402

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # Correctness tests run each Triton kernel at its heuristic config: per-shape config tuning
    # (compile and time every candidate for every new shape) dominated the GPU suite's time.
    # Tests of the tuned paths enable it themselves (test_gemm_triton_tuned_gpu, the "every
    # candidate" tests); PRIMUS_TURBO_TEST_TRITON_TUNE=1 tunes everywhere.
    os.environ.setdefault(
        "PRIMUS_TURBO_TRITON_TUNE", os.environ.get("PRIMUS_TURBO_TEST_TRITON_TUNE", "0")
    )

from primus_turbo.pytorch.core import GlobalBackendManager  # noqa: E402

GPU_SKIP_REASON = (
    "needs a GPU (none visible); the CPU tier runs the TORCH backend and the Triton kernels "
    "under TRITON_INTERPRET=1"
)


def pytest_addoption(parser):
    parser.addoption("--deterministic-only", action="store_true", help="run only deterministic")
    parser.addoption("--dist-only", action="store_true", help="run only multi-GPU tests")


def pytest_configure(config):
    config.addinivalue_line("markers", "deterministic: bitwise-determinism test")
    config.addinivalue_line("markers", "multigpu: needs several GPUs (torch.distributed)")
    config.addinivalue_line("markers", "gpu: needs a GPU")
    if config.getoption("--deterministic-only") and config.getoption("--dist-only"):
        raise pytest.UsageError("--deterministic-only and --dist-only are mutually exclusive")


def pytest_collection_modifyitems(config, items):
    det_only = config.getoption("--deterministic-only")
    dist_only = config.getoption("--dist-only")
    under_xdist = _WORKER is not None or getattr(config.option, "numprocesses", None)
    for item in items:
        is_det = item.get_closest_marker("deterministic") is not None
        is_dist = item.get_closest_marker("multigpu") is not None
        if det_only and not is_det:
            item.add_marker(pytest.mark.skip(reason="--deterministic-only"))
        elif not det_only and is_det:
            item.add_marker(
                pytest.mark.skip(reason="deterministic test: run with make test-deterministic")
            )
        if dist_only and not is_dist:
            item.add_marker(pytest.mark.skip(reason="--dist-only"))
        elif is_dist and under_xdist:
            item.add_marker(pytest.mark.skip(reason="multi-GPU test: run with make test-dist"))
        if item.get_closest_marker("gpu") is not None and not HAS_GPU:
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


@pytest.fixture(autouse=True)
def _fresh_state(request, tmp_path_factory, monkeypatch):
    """Seed the RNGs per test and reset backend choices and tune caches around each test."""
    cache = tmp_path_factory.getbasetemp() / "autotune-cache"
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE_DIR", str(cache))
    for var in ("PRIMUS_TURBO_AUTO_TUNE",) + tuple(
        k for k in os.environ if k.startswith("PRIMUS_TURBO_") and k.endswith("_BACKEND")
    ):
        monkeypatch.delenv(var, raising=False)
    # crc32, not hash(): Python salts str hashes per process, so a failure must replay with the
    # same inputs in the next run
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    GlobalBackendManager.reset()
    yield
    GlobalBackendManager.reset()


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_GPU else "cpu"
