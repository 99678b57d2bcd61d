"""Backend registry and dispatcher.

Resolution order for one call (DESIGN.md section 4):
  1. code setter (``GlobalBackendManager.set_backend`` / ``set_gemm_backend`` ...),
  2. env var ``PRIMUS_TURBO_<FAMILY>_BACKEND`` (``"TRITON"``, ``"fp8:TRITON,other:HIPBLASLT"``,
     ``"autotune"``),
  3. autotune (per-op choice or ``PRIMUS_TURBO_AUTO_TUNE=1`` / ``set_auto_tune(True)``), skipped
     while tracing or during graph capture,
  4. the op's default backend,
  5. fallback: the first registered backend that can handle the input (warned once).
A pinned backend (1 or 2) that cannot handle the input raises, listing every backend's reason.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import os
from collections.abc import Hashable
from typing import Any, ClassVar

import torch

from primus_turbo.pytorch.core.autotune import TuneCache, time_fn
from primus_turbo.pytorch.core.checks import env_flag
from primus_turbo.pytorch.core.logging import get_logger, reset_warn_once, warn_once
from primus_turbo.pytorch.core.platform import device_name, is_graph_capturing


def eager_or_op(impl, op):
    """A callable that runs ``impl`` directly in eager mode and the ``torch.library`` custom op
    ``op`` (registered from ``impl``, with its fake) while torch.compile traces: the custom-op
    dispatch costs tens of microseconds of host time per call (dev CPU: 17 us for the GLU
    forward), and only the compiler needs the opaque op."""

    def call(*args):
        return op(*args) if torch.compiler.is_compiling() else impl(*args)

    call.__doc__ = impl.__doc__
    return call


class BackendType(enum.Enum):
    """Kernel providers. CK, TURBO, AITER and DEEP_EP are optional libraries."""

    CK = 1
    HIPBLASLT = 2  # vendor BLAS-Lt through torch: hipBLASLt on ROCm, cuBLASLt on CUDA
    AITER = 3
    TRITON = 4
    DEEP_EP = 5
    TURBO = 6
    TORCH = 7  # pure-torch reference, runs anywhere

    @classmethod
    def parse(cls, name: str | BackendType, where: str = "backend") -> BackendType:
        if isinstance(name, BackendType):
            return name
        key = str(name).strip().upper()
        if key not in cls.__members__:
            raise ValueError(
                f"primus_turbo: {where} expected one of {sorted(cls.__members__)}, got {name!r}"
            )
        return cls[key]


class PrecisionType(enum.Enum):
    FP4 = "fp4"
    FP8 = "fp8"
    BF16_FP16_FP32 = "bf16_fp16_fp32"


_PRECISION_KEYS: dict[str, PrecisionType] = {
    "fp4": PrecisionType.FP4,
    "fp8": PrecisionType.FP8,
    "bf16": PrecisionType.BF16_FP16_FP32,
    "fp16": PrecisionType.BF16_FP16_FP32,
    "fp32": PrecisionType.BF16_FP16_FP32,
}


@dataclasses.dataclass(frozen=True)
class BackendChoice:
    """A pinned backend, or ``auto_tune=True`` for "time the candidates"."""

    backend: BackendType | None = None
    auto_tune: bool = False

    def __post_init__(self) -> None:
        if self.backend is not None and self.auto_tune:
            raise ValueError(
                "primus_turbo: BackendChoice expected either a backend or auto_tune=True, got both"
            )

    @property
    def empty(self) -> bool:
        return self.backend is None and not self.auto_tune


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a backend can handle an input, and why not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


YES = Verdict(True)


def no(reason: str) -> Verdict:
    return Verdict(False, reason)


def env_var_name(family: str) -> str:
    return f"PRIMUS_TURBO_{family.upper()}_BACKEND"


def _parse_choice(token: str, env_name: str) -> BackendChoice:
    if token.strip().lower() == "autotune":
        return BackendChoice(auto_tune=True)
    return BackendChoice(BackendType.parse(token, where=env_name))


def parse_backend_env(value: str | None, env_name: str) -> dict[PrecisionType, BackendChoice]:
    """Parse a backend env value into a per-precision table (empty when unset).

    ``"TRITON"`` applies to every precision; ``"fp8:TRITON,other:HIPBLASLT"`` sets fp8 and fills
    the rest; a precision with no entry and no ``other`` stays unset (op default).
    """
    if value is None or not value.strip():
        return {}
    text = value.strip()
    if ":" not in text:
        choice = _parse_choice(text, env_name)
        return {p: choice for p in PrecisionType}
    table: dict[PrecisionType, BackendChoice] = {}
    other: BackendChoice | None = None
    for item in text.split(","):
        if not item.strip():
            continue
        if ":" not in item:
            raise ValueError(
                f"primus_turbo: {env_name} expected 'precision:backend' pairs, got {item!r}"
            )
        key, _, name = item.partition(":")
        key = key.strip().lower()
        choice = _parse_choice(name, env_name)
        if key == "other":
            other = choice
        elif key in _PRECISION_KEYS:
            table[_PRECISION_KEYS[key]] = choice
        else:
            raise ValueError(
                f"primus_turbo: {env_name} expected a precision in "
                f"{sorted([*_PRECISION_KEYS, 'other'])}, got {key!r}"
            )
    if other is not None:
        for p in PrecisionType:
            table.setdefault(p, other)
    return table


class GlobalBackendManager:
    """Process-wide backend choices per op family (code settings win over env vars).

    Env vars are read on first use and kept (the dispatch path runs on every op call);
    ``reset()`` drops them so the next call reads the environment again.
    """

    _code: ClassVar[dict[str, dict[PrecisionType, BackendChoice]]] = {}
    _auto_tune: ClassVar[bool | None] = None
    _env_cache: ClassVar[dict[str, dict[PrecisionType, BackendChoice]]] = {}
    _auto_tune_env: ClassVar[bool | None] = None
    generation: ClassVar[int] = 0  # bumped on every change; keys the dispatchers' memo

    @classmethod
    def set_backend(
        cls,
        family: str,
        backend: BackendType | str | None = None,
        precision: PrecisionType | None = None,
        auto_tune: bool = False,
    ) -> None:
        """Pin ``backend`` (or request autotune) for one op family.

        ``precision=None`` applies to every precision. ``backend=None`` with ``auto_tune=False``
        clears the code setting, so the env var and defaults apply again.
        """
        pinned = None if backend is None else BackendType.parse(backend)
        choice = BackendChoice(pinned, auto_tune)
        cls.generation += 1
        table = cls._code.setdefault(family, {})
        for p in PrecisionType if precision is None else (precision,):
            if choice.empty:
                table.pop(p, None)
            else:
                table[p] = choice
        if not table:
            cls._code.pop(family, None)

    @classmethod
    def get_backend(cls, family: str, precision: PrecisionType) -> BackendChoice | None:
        """The code setting for ``(family, precision)``, else the env var's, else ``None``."""
        code = cls._code.get(family)
        if code is not None and precision in code:
            return code[precision]
        parsed = cls._env_cache.get(family)
        if parsed is None:  # env vars are read once; reset() reads them again
            name = env_var_name(family)
            parsed = parse_backend_env(os.environ.get(name, ""), name)
            if not torch.compiler.is_compiling():  # tracing must not mutate class state
                cls._env_cache[family] = parsed
        return parsed.get(precision)

    @classmethod
    def set_auto_tune(cls, enabled: bool | None) -> None:
        """Global autotune switch; ``None`` returns control to ``PRIMUS_TURBO_AUTO_TUNE``."""
        cls._auto_tune = enabled
        cls.generation += 1

    @classmethod
    def auto_tune_enabled(cls) -> bool:
        if cls._auto_tune is not None:
            return cls._auto_tune
        if cls._auto_tune_env is not None:
            return cls._auto_tune_env
        enabled = env_flag("PRIMUS_TURBO_AUTO_TUNE", False)
        if not torch.compiler.is_compiling():  # tracing must not mutate class state
            cls._auto_tune_env = enabled
        return enabled

    @classmethod
    def reset(cls) -> None:
        """Clear code settings, parsed env values, tune caches and warn-once state."""
        cls._code.clear()
        cls._auto_tune = None
        cls._auto_tune_env = None
        cls.generation += 1
        cls._env_cache.clear()
        AutoKernelDispatcher.clear_all_caches()
        reset_warn_once()

    # Thin names over set_backend / get_backend for the op families.
    @classmethod
    def set_gemm_backend(cls, backend=None, precision=None, auto_tune: bool = False) -> None:
        cls.set_backend("gemm", backend, precision, auto_tune)

    @classmethod
    def get_gemm_backend(cls, precision: PrecisionType) -> BackendChoice | None:
        return cls.get_backend("gemm", precision)

    @classmethod
    def set_grouped_gemm_backend(cls, backend=None, precision=None, auto_tune=False) -> None:
        cls.set_backend("grouped_gemm", backend, precision, auto_tune)

    @classmethod
    def set_attn_backend(cls, backend=None, precision=None) -> None:
        cls.set_backend("attn", backend, precision)


class KernelBackend(abc.ABC):
    """One implementation of an op family. Subclasses register with their dispatcher."""

    backend_type: ClassVar[BackendType]
    autotune: ClassVar[bool] = True  # False: never timed, but can be pinned or fall back
    # True when execute() is built from differentiable torch ops whose own backward runs on
    # this same backend: ops may then skip their autograd.Function (less per-call overhead).
    differentiable: ClassVar[bool] = False

    @staticmethod
    @abc.abstractmethod
    def can_handle(**kwargs: Any) -> Verdict: ...

    @staticmethod
    @abc.abstractmethod
    def execute(**kwargs: Any) -> Any: ...


class AutoKernelDispatcher:
    """Generic dispatcher; one subclass per op family defines the family hooks."""

    family: ClassVar[str]
    # True when make_key() covers everything can_handle() looks at: resolve() then memoises
    # its answer per key until a backend setting changes (the per-call fast path).
    memoize_resolution: ClassVar[bool] = False
    _backends: ClassVar[dict[BackendType, type[KernelBackend]]]
    _cache: ClassVar[TuneCache]
    _memo: ClassVar[dict[Hashable, BackendType]]
    _all: ClassVar[list[type[AutoKernelDispatcher]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._backends = {}
        cls._memo = {}
        cls._cache = TuneCache(cls.family)
        AutoKernelDispatcher._all.append(cls)

    # ---- family hooks -------------------------------------------------------------------
    @classmethod
    def precision(cls, **kwargs: Any) -> PrecisionType:
        return PrecisionType.BF16_FP16_FP32

    @classmethod
    def default_backend(cls, **kwargs: Any) -> BackendType | None:
        return None

    @classmethod
    def make_key(cls, **kwargs: Any) -> Hashable:
        raise NotImplementedError

    @classmethod
    def describe(cls, **kwargs: Any) -> str:
        """A short description of the input for error messages."""
        return ", ".join(
            f"{k}={tuple(v.shape)}:{str(v.dtype).replace('torch.', '')}"
            if isinstance(v, torch.Tensor)
            else f"{k}={v}"
            for k, v in kwargs.items()
        )

    @classmethod
    def tune_device(cls, **kwargs: Any) -> torch.device:
        for v in kwargs.values():
            if isinstance(v, torch.Tensor):
                return v.device
        return torch.device("cpu")

    # ---- registry -----------------------------------------------------------------------
    @classmethod
    def register(cls, backend_cls: type[KernelBackend]) -> type[KernelBackend]:
        """Class decorator: ``@GemmDispatcher.register`` on a ``KernelBackend``."""
        cls._backends[backend_cls.backend_type] = backend_cls
        return backend_cls

    @classmethod
    def backends(cls) -> tuple[BackendType, ...]:
        return tuple(cls._backends)

    @classmethod
    def verdicts(cls, **kwargs: Any) -> dict[BackendType, Verdict]:
        return {b: impl.can_handle(**kwargs) for b, impl in cls._backends.items()}

    @classmethod
    def _reasons(cls, **kwargs: Any) -> str:
        parts = []
        for b, v in cls.verdicts(**kwargs).items():
            parts.append(f"{b.name}: {'can handle' if v.ok else v.reason}")
        return "; ".join(parts)

    @classmethod
    def clear_all_caches(cls) -> None:
        for d in AutoKernelDispatcher._all:
            d._cache.clear()
            d._memo.clear()

    # ---- resolution ---------------------------------------------------------------------
    @classmethod
    def resolve(cls, user: BackendChoice | None = None, **kwargs: Any) -> BackendType:
        """Pick the backend for one call (see the module docstring for the order)."""
        if user is None and cls.memoize_resolution and not torch.compiler.is_compiling():
            memo_key = (GlobalBackendManager.generation, cls.make_key(**kwargs))
            hit = cls._memo.get(memo_key)
            if hit is None:
                hit, final = cls._resolve(None, **kwargs)
                if final:
                    if len(cls._memo) >= 4096:
                        cls._memo.clear()
                    cls._memo[memo_key] = hit
            return hit
        return cls._resolve(user, **kwargs)[0]

    @classmethod
    def _resolve(cls, user: BackendChoice | None, **kwargs: Any) -> tuple[BackendType, bool]:
        """The resolution itself; the flag says whether the answer may be memoised (it may
        not when autotune was wanted but skipped during graph capture)."""
        choice = user
        if choice is None or choice.empty:
            choice = GlobalBackendManager.get_backend(cls.family, cls.precision(**kwargs))
        if choice is not None and choice.backend is not None:
            return cls._pinned(choice.backend, **kwargs), True
        want_tune = (choice is not None and choice.auto_tune) or (
            GlobalBackendManager.auto_tune_enabled()
        )
        if want_tune:
            if not torch.compiler.is_compiling() and not is_graph_capturing():
                return cls.tune(**kwargs), True
        final = not want_tune
        default = cls.default_backend(**kwargs)
        if default in cls._backends and cls._backends[default].can_handle(**kwargs):
            return default, final
        for b, impl in cls._backends.items():
            if impl.can_handle(**kwargs):
                if not torch.compiler.is_compiling():
                    warn_once(
                        f"primus_turbo.{cls.family}: default backend "
                        f"{default.name if default else None} cannot handle "
                        f"({cls.describe(**kwargs)}); falling back to {b.name}"
                    )
                return b, final
        raise NotImplementedError(
            f"primus_turbo.{cls.family}: no backend can handle ({cls.describe(**kwargs)}): "
            f"{cls._reasons(**kwargs)}"
        )

    @classmethod
    def _pinned(cls, backend: BackendType, **kwargs: Any) -> BackendType:
        impl = cls._backends.get(backend)
        if impl is None:
            raise ValueError(
                f"primus_turbo.{cls.family}: backend expected one of "
                f"{[b.name for b in cls._backends]}, got {backend.name} (not registered)"
            )
        if not impl.can_handle(**kwargs):
            raise ValueError(
                f"primus_turbo.{cls.family}: pinned backend {backend.name} cannot handle the "
                f"given inputs ({cls.describe(**kwargs)}): {cls._reasons(**kwargs)}"
            )
        return backend

    @classmethod
    def tune(cls, **kwargs: Any) -> BackendType:
        """Time every autotune-eligible backend that can handle the input; cache the fastest."""
        device = cls.tune_device(**kwargs)
        dev_name = device_name(device)
        key = cls.make_key(**kwargs)
        cached = cls._cache.get(key, dev_name)
        if cached is not None and cached in BackendType.__members__:
            b = BackendType[cached]
            if b in cls._backends and cls._backends[b].can_handle(**kwargs):
                return b
        candidates = [
            b for b, impl in cls._backends.items() if impl.autotune and impl.can_handle(**kwargs)
        ]
        if not candidates:
            return cls._no_tune(**kwargs)
        timings = cls.time_candidates(candidates, device, **kwargs)
        best = min(timings, key=timings.get)  # type: ignore[arg-type]
        get_logger().info(
            "primus_turbo.%s autotune %s -> %s (%s)",
            cls.family,
            key,
            best.name,
            ", ".join(f"{b.name}={t:.4f}ms" for b, t in timings.items()),
        )
        cls._cache.put(key, dev_name, best.name)
        return best

    @classmethod
    def _no_tune(cls, **kwargs: Any) -> BackendType:
        raise NotImplementedError(
            f"primus_turbo.{cls.family}: autotune found no eligible backend for "
            f"({cls.describe(**kwargs)}): {cls._reasons(**kwargs)}"
        )

    @classmethod
    def time_candidates(
        cls, candidates: list[BackendType], device: torch.device, **kwargs: Any
    ) -> dict[BackendType, float]:
        """``{backend: ms}`` for ``tune``: each candidate timed on its own (``time_backend``).
        A dispatcher may time them together instead (interleaved rounds)."""
        return {b: cls.time_backend(b, device, **kwargs) for b in candidates}

    @classmethod
    def time_backend(cls, backend: BackendType, device: torch.device, **kwargs: Any) -> float:
        impl = cls._backends[backend]
        return time_fn(lambda: impl.execute(**kwargs), device)

    @classmethod
    def backend_class(cls, backend: BackendType) -> type[KernelBackend]:
        return cls._backends[backend]

    @classmethod
    def execute(cls, backend: BackendType, **kwargs: Any) -> Any:
        return cls._backends[backend].execute(**kwargs)

    @classmethod
    def dispatch(cls, user: BackendChoice | None = None, **kwargs: Any) -> Any:
        return cls.execute(cls.resolve(user, **kwargs), **kwargs)
