"""The on-disk autotune cache: round trip, corruption, concurrent writers, keys."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp

import pytest

from primus_turbo.pytorch.core.autotune import CACHE_FILE_NAME, DiskCache, TuneCache, cache_dir
from primus_turbo.pytorch.core.logging import get_logger


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE_DIR", str(tmp_path))
    assert cache_dir() == tmp_path


def test_round_trip(tmp_path):
    a = TuneCache("gemm")
    a.disk = DiskCache(tmp_path / CACHE_FILE_NAME)
    a.put((128, 256, "bf16"), "NVIDIA H200", "TRITON")
    b = TuneCache("gemm")
    b.disk = DiskCache(tmp_path / CACHE_FILE_NAME)
    assert b.get((128, 256, "bf16"), "NVIDIA H200") == "TRITON"
    assert b.get((128, 256, "bf16"), "AMD Instinct MI300X") is None  # device is in the key
    other = TuneCache("grouped_gemm")
    other.disk = DiskCache(tmp_path / CACHE_FILE_NAME)
    assert other.get((128, 256, "bf16"), "NVIDIA H200") is None  # family is in the key
    data = json.loads((tmp_path / CACHE_FILE_NAME).read_text())
    (key,) = data
    from primus_turbo import __version__

    assert key.startswith(f"{__version__}|NVIDIA H200|gemm|")


def test_disk_level_can_be_disabled(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE", "0")
    c = TuneCache("gemm")
    c.disk = DiskCache(tmp_path / CACHE_FILE_NAME)
    c.put((1,), "dev", "TORCH")
    assert not (tmp_path / CACHE_FILE_NAME).exists()
    assert c.get((1,), "dev") == "TORCH"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"k": 3}', ""])
def test_corrupt_file_is_ignored_with_warning(tmp_path, content):
    path = tmp_path / CACHE_FILE_NAME
    path.write_text(content)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    get_logger().addHandler(handler)
    try:
        c = TuneCache("gemm")
        c.disk = DiskCache(path)
        assert c.get((1,), "dev") is None
        c.put((1,), "dev", "TRITON")  # the next writer replaces the corrupt file
    finally:
        get_logger().removeHandler(handler)
    assert any("is corrupt" in r.getMessage() for r in records)
    assert json.loads(path.read_text()) != {}
    fresh = TuneCache("gemm")
    fresh.disk = DiskCache(path)
    assert fresh.get((1,), "dev") == "TRITON"


def test_memory_lru_capacity(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_AUTOTUNE_CACHE", "0")
    c = TuneCache("gemm", capacity=3)
    for i in range(5):
        c.put((i,), "dev", "TORCH")
    assert len(c) == 3
    assert c.get((0,), "dev") is None and c.get((4,), "dev") == "TORCH"


def _writer(path: str, worker: int, n: int) -> None:
    c = TuneCache("gemm")
    c.disk = DiskCache(__import__("pathlib").Path(path))
    for i in range(n):
        c.put((worker, i), "dev", f"B{worker}_{i}")


def test_concurrent_writers_keep_every_entry(tmp_path):
    path = tmp_path / CACHE_FILE_NAME
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)  # each spawned child imports torch + the package: slow on a loaded 2-core CI
        assert p.exitcode == 0, f"writer {p.name} exit code {p.exitcode}"

    data = json.loads(path.read_text())
    assert len(data) == 4 * 15
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
