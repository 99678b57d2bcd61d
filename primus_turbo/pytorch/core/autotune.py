"""Autotune support: timing helper and the two-level (memory + disk) tune cache.

The disk cache is one JSON file per user (``$PRIMUS_TURBO_AUTOTUNE_CACHE_DIR`` or
``~/.cache/primus_turbo``), keyed by package version, device name, op family and the dispatcher's
shape/dtype/layout key. Writers take an exclusive ``flock`` and replace the file atomically, so
concurrent xdist workers never see a torn file; a corrupt file is ignored with a warning and
rewritten by the next writer. ``PRIMUS_TURBO_AUTOTUNE_CACHE=0`` disables the disk level.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import statistics
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path

import torch

from primus_turbo.pytorch.core.checks import env_flag
from primus_turbo.pytorch.core.logging import get_logger, warn_once

CACHE_FILE_NAME = "autotune_v1.json"


def cache_dir() -> Path:
    env = os.environ.get("PRIMUS_TURBO_AUTOTUNE_CACHE_DIR", "").strip()
    return Path(env) if env else Path.home() / ".cache" / "primus_turbo"


def disk_cache_enabled() -> bool:
    return env_flag("PRIMUS_TURBO_AUTOTUNE_CACHE", True)


def time_fn(
    fn: Callable[[], object], device: torch.device, warmup: int = 5, rep: int = 20
) -> float:
    """Median time of ``fn()`` in milliseconds; ``inf`` if it raises.

    On a GPU each repetition is bracketed by events on the current stream; on the CPU a
    ``perf_counter`` pair is used.
    """
    try:
        for _ in range(warmup):
            fn()
        times: list[float] = []
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            for _ in range(rep):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        else:
            for _ in range(rep):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    except Exception as exc:  # a failing candidate loses the race
        get_logger().info("autotune candidate failed: %r", exc)
        return math.inf


def _entry_key(version: str, device: str, family: str, key: Hashable) -> str:
    return f"{version}|{device}|{family}|{key!r}"


class DiskCache:
    """The shared on-disk map ``entry key -> backend name``."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path

    @property
    def path(self) -> Path:
        return self._path if self._path is not None else cache_dir() / CACHE_FILE_NAME

    def _read(self) -> dict[str, str]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            warn_once(f"autotune cache {self.path} unreadable ({exc}); ignoring it")
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
                raise ValueError("not a JSON object of strings")
            return data
        except ValueError as exc:
            warn_once(f"autotune cache {self.path} is corrupt ({exc}); ignoring it")
            return {}

    def get(self, entry: str) -> str | None:
        return self._read().get(entry)

    def put(self, entry: str, value: str) -> None:
        path = self.path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(str(path) + ".lock", "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                data = self._read()
                data[entry] = value
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".autotune.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump(data, f, indent=0, sort_keys=True)
                    os.replace(tmp, path)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
        except OSError as exc:
            warn_once(f"autotune cache {path} not writable ({exc}); keeping results in memory")


class TuneCache:
    """LRU memory cache in front of the disk cache, one per dispatcher."""

    def __init__(self, family: str, capacity: int = 1024) -> None:
        self.family = family
        self.capacity = capacity
        self._mem: OrderedDict[Hashable, str] = OrderedDict()
        self.disk = DiskCache()

    def _entry(self, key: Hashable, device_name: str) -> str:
        from primus_turbo import __version__

        return _entry_key(__version__, device_name, self.family, key)

    def get(self, key: Hashable, device_name: str) -> str | None:
        full = (device_name, key)
        if full in self._mem:
            self._mem.move_to_end(full)
            return self._mem[full]
        if disk_cache_enabled():
            value = self.disk.get(self._entry(key, device_name))
            if value is not None:
                self._remember(full, value)
            return value
        return None

    def put(self, key: Hashable, device_name: str, value: str) -> None:
        self._remember((device_name, key), value)
        if disk_cache_enabled():
            self.disk.put(self._entry(key, device_name), value)

    def _remember(self, full: Hashable, value: str) -> None:
        self._mem[full] = value
        self._mem.move_to_end(full)
        while len(self._mem) > self.capacity:
            self._mem.popitem(last=False)

    def clear(self) -> None:
        self._mem.clear()

    def __len__(self) -> int:
        return len(self._mem)
