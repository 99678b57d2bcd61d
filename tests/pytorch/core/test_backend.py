"""Dispatcher priority, env parsing, pinned-backend errors and fallback, on a toy op family."""

from __future__ import annotations

import logging

import pytest
import torch

from primus_turbo.pytorch.core import backend as be
from primus_turbo.pytorch.core.backend import (
    YES,
    AutoKernelDispatcher,
    BackendChoice,
    BackendType,
    GlobalBackendManager,
    KernelBackend,
    PrecisionType,
    no,
    parse_backend_env,
)
from primus_turbo.pytorch.core.logging import get_logger

T, H, C = BackendType.TRITON, BackendType.HIPBLASLT, BackendType.CK
ALL = list(PrecisionType)


class ToyDispatcher(AutoKernelDispatcher):
    family = "toy"
    calls: list[BackendType] = []

    @classmethod
    def precision(cls, x, **kw):
        return PrecisionType.FP8 if x.dtype == torch.float16 else PrecisionType.BF16_FP16_FP32

    @classmethod
    def default_backend(cls, **kw):
        return H

    @classmethod
    def make_key(cls, x, **kw):
        return (tuple(x.shape), x.dtype)


def _backend(kind: BackendType, accepts, autotune=True, cost=0):
    class _B(KernelBackend):
        backend_type = kind

        @staticmethod
        def can_handle(x, **kw):
            return YES if accepts(x) else no(f"{kind.name} refuses shape {tuple(x.shape)}")

        @staticmethod
        def execute(x, **kw):
            ToyDispatcher.calls.append(kind)
            y = x
            for _ in range(cost):
                y = y @ y
            return y

    _B.autotune = autotune
    return ToyDispatcher.register(_B)


_backend(C, lambda x: x.shape[0] == 64, cost=40)
_backend(H, lambda x: x.shape[0] != 7, cost=20)
_backend(T, lambda x: True, cost=1)


def _x(n=16, dtype=torch.float32):
    return torch.randn(n, n, dtype=dtype)


def _bare_dispatcher(name: str) -> type[AutoKernelDispatcher]:
    """A dispatcher with no default backend and one cache key for every input."""
    return type(
        name,
        (AutoKernelDispatcher,),
        {"family": name, "make_key": classmethod(lambda cls, **kw: ())},
    )


def _register(
    dispatcher, kind, can_handle=lambda **kw: YES, execute=lambda **kw: None, autotune=True
):
    body = {
        "backend_type": kind,
        "autotune": autotune,
        "can_handle": staticmethod(can_handle),
        "execute": staticmethod(execute),
    }
    dispatcher.register(type(f"{dispatcher.family}_{kind.name}", (KernelBackend,), body))


@pytest.fixture(autouse=True)
def _calls():
    ToyDispatcher.calls.clear()


# ---- env parsing ---------------------------------------------------------------------------


def test_parse_single_name_applies_to_all():
    assert parse_backend_env(" triton ", "E") == {p: BackendChoice(T) for p in ALL}


def test_parse_per_precision_and_other():
    table = parse_backend_env("fp8:TRITON, other:HIPBLASLT", "E")
    assert table[PrecisionType.FP8] == BackendChoice(T)
    assert table[PrecisionType.FP4] == BackendChoice(H)
    assert table[PrecisionType.BF16_FP16_FP32] == BackendChoice(H)


def test_parse_precision_without_other_leaves_rest_unset():
    table = parse_backend_env("bf16:ck", "E")
    assert table == {PrecisionType.BF16_FP16_FP32: BackendChoice(C)}


def test_parse_autotune_values():
    assert parse_backend_env("autotune", "E")[PrecisionType.FP8] == BackendChoice(auto_tune=True)
    table = parse_backend_env("fp8:autotune,other:ck", "E")
    assert table[PrecisionType.FP8].auto_tune and table[PrecisionType.FP4] == BackendChoice(C)


@pytest.mark.parametrize("value", ["", "   "])
def test_parse_empty_is_unset(value):
    assert parse_backend_env(value, "E") == {}


def test_parse_unknown_backend():
    with pytest.raises(ValueError, match=r"PRIMUS_TURBO_GEMM_BACKEND expected one of .*got 'cuda'"):
        parse_backend_env("cuda", "PRIMUS_TURBO_GEMM_BACKEND")


def test_parse_unknown_precision():
    with pytest.raises(ValueError, match=r"expected a precision in .*got 'int8'"):
        parse_backend_env("int8:TRITON", "E")


def test_parse_malformed_pair():
    with pytest.raises(ValueError, match=r"expected 'precision:backend' pairs, got 'TRITON'"):
        parse_backend_env("fp8:CK,TRITON", "E")


def test_backend_choice_rejects_both():
    with pytest.raises(ValueError, match="either a backend or auto_tune"):
        BackendChoice(T, auto_tune=True)


# ---- priority ------------------------------------------------------------------------------


def test_default_backend_used():
    assert ToyDispatcher.resolve(x=_x()) == H


def test_env_beats_default(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_TOY_BACKEND", "TRITON")
    assert ToyDispatcher.resolve(x=_x()) == T


def test_env_per_precision(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_TOY_BACKEND", "fp8:TRITON")
    assert ToyDispatcher.resolve(x=_x(dtype=torch.float16)) == T
    assert ToyDispatcher.resolve(x=_x()) == H  # bf16 bucket unset -> default


def test_code_beats_env(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_TOY_BACKEND", "TRITON")
    GlobalBackendManager.set_backend("toy", C)
    assert ToyDispatcher.resolve(x=_x(64)) == C
    GlobalBackendManager.set_backend("toy", None)  # clearing returns control to the env
    assert ToyDispatcher.resolve(x=_x(64)) == T


def test_code_per_precision():
    GlobalBackendManager.set_backend("toy", T, precision=PrecisionType.FP8)
    assert ToyDispatcher.resolve(x=_x(dtype=torch.float16)) == T
    assert ToyDispatcher.resolve(x=_x()) == H


def test_user_choice_beats_code():
    GlobalBackendManager.set_backend("toy", C)
    assert ToyDispatcher.resolve(BackendChoice(T), x=_x()) == T


def test_reset_clears_code():
    GlobalBackendManager.set_backend("toy", T)
    GlobalBackendManager.reset()
    assert ToyDispatcher.resolve(x=_x()) == H


def test_set_backend_accepts_names():
    GlobalBackendManager.set_gemm_backend("triton")
    assert GlobalBackendManager.get_gemm_backend(PrecisionType.FP8) == BackendChoice(T)
    with pytest.raises(ValueError, match="expected one of"):
        GlobalBackendManager.set_gemm_backend("nope")


def test_pinned_cannot_handle_lists_every_reason():
    GlobalBackendManager.set_backend("toy", C)
    with pytest.raises(ValueError) as info:
        ToyDispatcher.resolve(x=_x(16))
    msg = str(info.value)
    assert "primus_turbo.toy: pinned backend CK cannot handle the given inputs" in msg
    assert "CK: CK refuses shape (16, 16)" in msg
    assert "HIPBLASLT: can handle" in msg and "TRITON: can handle" in msg


def test_pinned_unregistered_backend():
    GlobalBackendManager.set_backend("toy", BackendType.AITER)
    with pytest.raises(ValueError, match=r"got AITER \(not registered\)"):
        ToyDispatcher.resolve(x=_x())


def test_fallback_warns_once():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    get_logger().addHandler(handler)
    try:
        assert ToyDispatcher.resolve(x=_x(7)) == T
        assert ToyDispatcher.resolve(x=_x(7)) == T
    finally:
        get_logger().removeHandler(handler)
    fallbacks = [r for r in records if "falling back to" in r.getMessage()]
    assert len(fallbacks) == 1
    assert "default backend HIPBLASLT cannot handle" in fallbacks[0].getMessage()


def test_no_backend_can_handle():
    Empty = _bare_dispatcher("empty")

    def refuse(**kw):
        return no("never")

    def unreachable(**kw):
        raise AssertionError

    _register(Empty, BackendType.TORCH, refuse, unreachable)
    with pytest.raises(NotImplementedError, match=r"empty: no backend can handle .*TORCH: never"):
        Empty.resolve(x=_x())


# ---- autotune ------------------------------------------------------------------------------


def test_autotune_picks_fastest_and_caches():
    GlobalBackendManager.set_backend("toy", auto_tune=True)
    x = _x(64)
    assert ToyDispatcher.resolve(x=x) == T
    timed = len(ToyDispatcher.calls)
    assert set(ToyDispatcher.calls) == {C, H, T}
    assert ToyDispatcher.resolve(x=x) == T
    assert len(ToyDispatcher.calls) == timed  # served from the memory cache


def test_autotune_skips_non_autotune_backends():
    Only = _bare_dispatcher("only")
    _register(Only, C, autotune=False)
    _register(Only, H)
    GlobalBackendManager.set_auto_tune(True)
    assert Only.resolve(x=_x()) == H


def test_global_autotune_flag_and_env(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_AUTO_TUNE", "1")
    assert GlobalBackendManager.auto_tune_enabled()
    assert ToyDispatcher.resolve(x=_x(64)) == T
    GlobalBackendManager.set_auto_tune(False)  # code beats env
    assert not GlobalBackendManager.auto_tune_enabled()
    assert ToyDispatcher.resolve(x=_x(64)) == H


def test_autotune_env_value(monkeypatch):
    monkeypatch.setenv("PRIMUS_TURBO_TOY_BACKEND", "autotune")
    assert ToyDispatcher.resolve(x=_x(64)) == T


def test_autotune_skipped_during_graph_capture(monkeypatch):
    monkeypatch.setattr(be, "is_graph_capturing", lambda: True)
    GlobalBackendManager.set_auto_tune(True)
    assert ToyDispatcher.resolve(x=_x(64)) == H
    assert ToyDispatcher.calls == []


def test_autotune_uses_disk_cache_across_processes(monkeypatch):
    GlobalBackendManager.set_auto_tune(True)
    x = _x(64)
    assert ToyDispatcher.resolve(x=x) == T
    ToyDispatcher._cache.clear()  # a new process: empty memory, same disk
    ToyDispatcher.calls.clear()
    assert ToyDispatcher.resolve(x=x) == T
    assert ToyDispatcher.calls == []


def test_autotune_failing_candidate_loses():
    Flaky = _bare_dispatcher("flaky")

    def boom(**kw):
        raise RuntimeError("kernel failed")

    _register(Flaky, C, execute=boom)
    _register(Flaky, H)
    GlobalBackendManager.set_auto_tune(True)
    assert Flaky.resolve(x=_x()) == H


def test_dispatch_executes_resolved_backend():
    GlobalBackendManager.set_backend("toy", T)
    x = _x()
    torch.testing.assert_close(ToyDispatcher.dispatch(x=x), x @ x)
    assert ToyDispatcher.calls == [T]


# ---- memoised resolution (the per-call fast path) --------------------------------------------


class MemoDispatcher(ToyDispatcher):
    family = "memo"
    memoize_resolution = True


for _kind in (H, T):
    MemoDispatcher.register(ToyDispatcher._backends[_kind])


def test_memo_follows_setting_changes():
    x = _x()
    assert MemoDispatcher.resolve(x=x) == H
    assert MemoDispatcher.resolve(x=x) == H  # served from the memo
    GlobalBackendManager.set_backend("memo", T)
    assert MemoDispatcher.resolve(x=x) == T
    GlobalBackendManager.set_backend("memo", None)
    assert MemoDispatcher.resolve(x=x) == H
    GlobalBackendManager.set_auto_tune(True)
    assert MemoDispatcher.resolve(x=x) == T  # tuned: T is the cheapest


def test_memo_not_kept_when_tuning_was_skipped(monkeypatch):
    monkeypatch.setattr(be, "is_graph_capturing", lambda: True)
    GlobalBackendManager.set_auto_tune(True)
    x = _x()
    assert MemoDispatcher.resolve(x=x) == H  # capture: default, not remembered
    monkeypatch.setattr(be, "is_graph_capturing", lambda: False)
    assert MemoDispatcher.resolve(x=x) == T  # after capture the tuner runs


def test_env_is_read_once_until_reset(monkeypatch):
    x = _x()
    assert MemoDispatcher.resolve(x=x) == H
    monkeypatch.setenv("PRIMUS_TURBO_MEMO_BACKEND", "TRITON")
    assert MemoDispatcher.resolve(x=x) == H  # documented: env vars are read on first use
    GlobalBackendManager.reset()
    assert MemoDispatcher.resolve(x=x) == T


@pytest.mark.parametrize(
    "value,expected",
    [
        ("", True),
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("0", False),
        ("false", False),
        ("Off", False),
    ],  # fmt: skip
)
def test_env_flag_values(value, expected, monkeypatch):
    from primus_turbo.pytorch.core.checks import env_flag

    monkeypatch.setenv("PRIMUS_TURBO_TEST_FLAG", value)
    assert env_flag("PRIMUS_TURBO_TEST_FLAG", True) is expected


def test_env_flag_rejects_other_values(monkeypatch):
    from primus_turbo.pytorch.core.checks import env_flag

    monkeypatch.setenv("PRIMUS_TURBO_TEST_FLAG", "maybe")
    with pytest.raises(ValueError, match=r"PRIMUS_TURBO_TEST_FLAG expected one of .*got 'maybe'"):
        env_flag("PRIMUS_TURBO_TEST_FLAG", False)
    monkeypatch.delenv("PRIMUS_TURBO_TEST_FLAG")
    assert env_flag("PRIMUS_TURBO_TEST_FLAG", False) is False
