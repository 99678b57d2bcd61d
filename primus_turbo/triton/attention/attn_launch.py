"""Launchers of the Triton flash attention kernels, per-shape config tuning and the AOT specs.

Tensors: dense q ``[B, Sq, Hq, Dqk]``, k ``[B, Sk, Hkv, Dqk]``, v ``[B, Sk, Hkv, Dv]`` (any
strides with innermost stride 1); varlen q ``[Tq, Hq, Dqk]`` etc. with int32 ``cu_seqlens``.
lse is ``[B, Hq, Sq]`` (dense) or ``[Hq, Tq]`` (varlen), fp32, natural log.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch
import triton

from primus_turbo.pytorch.core.platform import (
    ArchFamily,
    arch_family,
    is_graph_capturing,
    triton_interpret,
)
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec, triton_dtype_name
from primus_turbo.triton.attention.attn_bwd_kernel import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
from primus_turbo.triton.attention.attn_configs import (
    AttnConfig,
    attn_configs,
    dim_class,
    parse_config,
    select_config,
)
from primus_turbo.triton.attention.attn_fwd_kernel import LOG2E, attn_fwd_kernel

_tuned: dict[tuple, Any] = {}  # kind/shape key -> AttnConfig (or "fused"/"parts" for dK/dV)
FP8_SCALE_BLOCK = 64  # tokens per fp8 scale block (per batch and head); FP8 needs BLOCK_N <= it


@functools.cache
def _interpreting() -> bool:
    return triton_interpret()


@functools.cache
def _tuning_enabled() -> bool:
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_TRITON_TUNE", True)


@functools.cache
def _p_fp8() -> bool:
    """``PRIMUS_TURBO_ATTN_FP8_PV=1``: P V as an fp8 dot (P quantised); default bf16 P V with V
    dequantised in registers (out SNR ~28 dB vs ~24-26 dB with fp8 P on random inputs)."""
    from primus_turbo.pytorch.core.checks import env_flag

    return env_flag("PRIMUS_TURBO_ATTN_FP8_PV", False)


def _pow2(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def _split_dim(d: int, kind: str = "bwd") -> tuple[int, int]:
    """``(BLOCK_DQK, BLOCK_DQK2)``: a qk head dim that is not a power of two runs as two
    power-of-two chunks when that pads less (192 = 128 + 64 instead of 256: 25% fewer dot
    columns, Q/K registers and dK/dQ accumulator registers); ``(pow2, 0)`` otherwise, or when
    ``PRIMUS_TURBO_ATTN_SPLIT_D`` (``1`` default: fwd and bwd; ``fwd``; ``bwd``; ``0``: none,
    the padded kernels of before) leaves ``kind`` (``fwd``/``bwd``) out."""
    p = _pow2(d)
    if p == d or kind not in _split_kinds():
        return p, 0
    hi = p // 2
    lo = _pow2(d - hi)
    return (hi, lo) if hi + lo < p else (p, 0)


@functools.cache
def _split_kinds() -> tuple[str, ...]:
    import os

    val = os.environ.get("PRIMUS_TURBO_ATTN_SPLIT_D", "1").strip().lower() or "1"
    kinds = {"1": ("fwd", "bwd"), "0": (), "none": (), "fwd": ("fwd",), "bwd": ("bwd",)}
    if val not in kinds:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_ATTN_SPLIT_D expected one of {tuple(kinds)}, got {val!r}"
        )
    return kinds[val]


def _strides3(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, seq, head) strides; varlen tensors have no batch stride."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def _window_flags(causal: bool, window: tuple[int, int]) -> tuple[int, int, bool, bool]:
    left, right = window
    if causal:
        right = 0
    return max(left, 0), max(right, 0), left >= 0, right >= 0


def _pick(kind: str, family: ArchFamily, block_d: int, key: tuple, launch,
          max_block_n: int = 1 << 30) -> AttnConfig:  # fmt: skip
    """Heuristic config, or the fastest candidate for this shape (timed once, cached); a config
    pinned by ``PRIMUS_TURBO_ATTN_<KIND>_CONFIG`` (e.g. ``m16n64w8s1``) wins over both."""
    pinned = _pinned(kind)
    if pinned and family != ArchFamily.CPU:
        return parse_config(pinned, select_config(family, kind, block_d))
    cands = [c for c in attn_configs(family, kind, block_d) if c.block_n <= max_block_n]
    if not cands:
        cands = [dataclasses.replace(select_config(family, kind, block_d), block_n=max_block_n)]
    if len(cands) == 1 or family == ArchFamily.CPU or is_graph_capturing():
        return cands[0]  # one candidate (e.g. the pinned sm_90 split-192 tiles): nothing to time
    if not _tuning_enabled():
        return cands[0]
    full_key = (kind, block_d, *key)
    cfg = _tuned.get(full_key)
    if cfg is None:
        timings = {}
        for cand in cands:
            try:
                timings[cand] = triton.testing.do_bench(
                    lambda cand=cand: launch(cand), warmup=3, rep=15, return_mode="median"
                )
            except Exception:  # e.g. out of shared memory for this tile on this chip
                continue
        cfg = min(timings, key=timings.get)
        _tuned[full_key] = cfg
    return cfg


@functools.cache
def _pinned(kind: str) -> str:
    """``PRIMUS_TURBO_ATTN_FWD_CONFIG`` / ``_DQ_CONFIG`` / ``_DKDV_CONFIG``: one tile for every
    shape (no tuning; for A/B timing), empty = tune / heuristic."""
    import os
    import re

    var = f"PRIMUS_TURBO_ATTN_{kind.upper()}_CONFIG"
    value = os.environ.get(var, "").strip()
    if value and re.fullmatch(r"m(\d+)n(\d+)w(\d+)s(\d+)", value) is None:
        raise ValueError(
            f"primus_turbo: {var} expected m<BLOCK_M>n<BLOCK_N>w<warps>s<stages> "
            f"(e.g. m16n64w8s1) or empty, got {value!r}"
        )
    return value


def _bucket(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def attn_fwd_triton(q, k, v, cu_q, cu_k, max_sq, max_sk, scale, causal, window, fp8=None):
    """Forward; returns ``(out, lse)``. ``cu_q``/``cu_k`` None means dense bshd.

    ``fp8=(q_scale, k_scale, v_scale, p_max)``: q/k/v are fp8 (dense only) with fp32 dequant
    scales ``[B, H, ceil(S / FP8_SCALE_BLOCK)]``; P is quantised as ``p * p_max``; the output
    dtype is bf16.
    """
    varlen = cu_q is not None
    if varlen:
        batch = cu_q.numel() - 1
        hq, dqk = q.shape[1], q.shape[2]
        hkv, dv = v.shape[1], v.shape[2]
        out = torch.empty((q.shape[0], hq, dv), dtype=q.dtype, device=q.device)
        lse = torch.empty((hq, q.shape[0]), dtype=torch.float32, device=q.device)
        ls = (0, lse.stride(0), lse.stride(1))
    else:
        batch, max_sq, hq, dqk = q.shape
        max_sk, hkv, dv = k.shape[1], k.shape[2], v.shape[3]
        out_dtype = torch.bfloat16 if fp8 is not None else q.dtype
        out = torch.empty((batch, max_sq, hq, dv), dtype=out_dtype, device=q.device)
        lse = torch.empty((batch, hq, max_sq), dtype=torch.float32, device=q.device)
        ls = lse.stride()
    if out.numel() == 0 or max_sq == 0 or batch == 0:
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    wl, wr, has_l, has_r = _window_flags(causal, window)
    (bdq, bdq2), bdv = _split_dim(dqk, "fwd"), _pow2(dv)
    family = arch_family(q.device)
    dummy = cu_q if varlen else q
    if fp8 is None:
        scale_ptrs, n_sblk, fp8_consts = (lse, lse, lse), (0, 0), {}
    else:
        scale_ptrs = fp8[:3]
        n_sblk = (fp8[0].shape[-1], fp8[1].shape[-1])
        fp8_consts = {"FP8": True, "SCALE_BLK": FP8_SCALE_BLOCK, "P_MAX": float(fp8[3]),
                      "P_FP8": _p_fp8()}  # fmt: skip

    def launch(cfg: AttnConfig):
        grid = (triton.cdiv(max_sq, cfg.block_m), batch * hq)
        attn_fwd_kernel[grid](
            q, k, v, out, lse, dummy, cu_k if varlen else dummy, *scale_ptrs, *n_sblk,
            *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen),
            *_strides3(out, varlen), *ls,
            hq, hq // hkv, max_sq, max_sk, scale * LOG2E, wl, wr, dqk, dv,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_DQK=bdq, BLOCK_DV=bdv,
            VARLEN=varlen, HAS_L=has_l, HAS_R=has_r,
            UPCAST=_interpreting() and (q.dtype == torch.bfloat16 or fp8 is not None),
            BLOCK_DQK2=bdq2, **fp8_consts, **cfg.options,
        )  # fmt: skip

    key = (batch, _bucket(max_sq), _bucket(max_sk), hq, hkv, dqk, dv, q.dtype, varlen,
           has_l, has_r, q.device, fp8 is not None)  # fmt: skip
    cfg = _pick("fwd", family, max(bdq + bdq2, bdv), key, launch,
                FP8_SCALE_BLOCK if fp8 is not None else 1 << 30)  # fmt: skip
    launch(cfg)
    return out, lse


def attn_bwd_triton(do, q, k, v, out, lse, cu_q, cu_k, max_sq, max_sk, scale, causal, window):
    """Backward; returns ``(dq, dk, dv)`` in the input dtype (deterministic: no atomics)."""
    varlen = cu_q is not None
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    if varlen:
        batch = cu_q.numel() - 1
        hq, dqk, hkv, dvd = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
    else:
        batch, max_sq, hq, dqk = q.shape
        max_sk, hkv, dvd = k.shape[1], k.shape[2], v.shape[3]
    if q.numel() == 0 or k.numel() == 0 or batch == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    # delta = rowsum(dO * O) in lse's layout ([B, Hq, Sq] or [Hq, Tq]), fp32: written by the dQ
    # kernel (which reads dO and O rows anyway), read by the dK/dV kernel launched after it
    delta = torch.empty_strided(lse.shape, lse.stride(), dtype=torch.float32, device=q.device)
    if out.stride(-1) != 1:
        out = out.contiguous()
    ls = (0, lse.stride(0), lse.stride(1)) if varlen else lse.stride()
    wl, wr, has_l, has_r = _window_flags(causal, window)
    bdq, bdv = _pow2(dqk), _pow2(dvd)
    family = arch_family(q.device)
    dummy = cu_q if varlen else q
    cu_k_arg = cu_k if varlen else dummy
    upcast = _interpreting() and q.dtype == torch.bfloat16
    common = (hq // hkv, max_sq, max_sk, scale * LOG2E, scale, wl, wr, dqk, dvd)
    bdq, bdq2 = _split_dim(dqk, "bwd")

    def launch_dkdv(cfg: AttnConfig, part: int = 0):
        grid = (triton.cdiv(max_sk, cfg.block_n), batch * hkv)
        attn_bwd_dkdv_kernel[grid](
            q, k, v, do, lse, delta, dk, dv, dummy, cu_k_arg,
            *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen),
            *_strides3(do, varlen), *_strides3(dk, varlen), *_strides3(dv, varlen), *ls,
            hkv, *common,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_DQK=bdq, BLOCK_DV=bdv,
            VARLEN=varlen, HAS_L=has_l, HAS_R=has_r, UPCAST=upcast, BLOCK_DQK2=bdq2,
            PART=part, **cfg.options,
        )  # fmt: skip

    def launch_dq(cfg: AttnConfig):
        grid = (triton.cdiv(max_sq, cfg.block_m), batch * hq)
        attn_bwd_dq_kernel[grid](
            q, k, v, out, do, lse, delta, dq, dummy, cu_k_arg,
            *_strides3(q, varlen), *_strides3(k, varlen), *_strides3(v, varlen),
            *_strides3(out, varlen), *_strides3(do, varlen), *_strides3(dq, varlen), *ls,
            hq, *common,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_DQK=bdq, BLOCK_DV=bdv,
            VARLEN=varlen, HAS_L=has_l, HAS_R=has_r, UPCAST=upcast, BLOCK_DQK2=bdq2,
            **cfg.options,
        )  # fmt: skip

    key = (batch, _bucket(max_sq), _bucket(max_sk), hq, hkv, dqk, dvd, q.dtype, varlen,
           has_l, has_r, q.device)  # fmt: skip
    width = max(bdq + bdq2, bdv)  # 192 when split: the "mid" configs
    launch_dq(_pick("dq", family, width, key, launch_dq))  # also writes delta

    def fused():
        launch_dkdv(_pick("dkdv", family, width, key, launch_dkdv))

    def parts():  # dV, then dK: each launch holds one accumulator set, so wider tiles fit
        launch_dkdv(_pick("dv", family, width, key, lambda c: launch_dkdv(c, 1)), 1)
        launch_dkdv(_pick("dk", family, width, key, lambda c: launch_dkdv(c, 2)), 2)

    mode = _dkdv_mode(family, width)
    if mode == "auto":
        mode = _tuned.get(("dkdv_mode", width, *key))
        if mode is None and (is_graph_capturing() or not _tuning_enabled()):
            mode = "parts"
        if mode is None:
            parts()  # tunes both kinds' tiles first
            fused()
            t_parts = triton.testing.do_bench(parts, warmup=3, rep=15, return_mode="median")
            t_fused = triton.testing.do_bench(fused, warmup=3, rep=15, return_mode="median")
            mode = "parts" if t_parts < t_fused else "fused"
            _tuned[("dkdv_mode", width, *key)] = mode
    (parts if mode == "parts" else fused)()
    return dq, dk, dv


@functools.cache
def _dkdv_env() -> str:
    import os

    value = os.environ.get("PRIMUS_TURBO_ATTN_DKDV_PARTS", "").strip().lower()
    allowed = ("", "0", "fused", "1", "parts", "auto")
    if value not in allowed:
        raise ValueError(
            f"primus_turbo: PRIMUS_TURBO_ATTN_DKDV_PARTS expected one of {allowed} "
            f"('' = unset: per-arch default), got {value!r}"
        )
    return value


def _dkdv_mode(family: ArchFamily, width: int) -> str:
    """``fused`` (one dK/dV kernel), ``parts`` (a dV launch, then a dK launch: S is computed
    twice, but each holds half the accumulators, so the split-192 tiles can be 2-4x wider) or
    ``auto`` (time both per shape). ``PRIMUS_TURBO_ATTN_DKDV_PARTS``: ``0`` fused, ``1``
    parts, ``auto``: time both per shape for the split 192 ("mid") class on a GPU. Unset
    (default): parts for the mid class on sm_90 (the autotune's pick on the H200, DeepSeek-V3
    S4096), auto for it on other GPUs, fused otherwise."""
    env = _dkdv_env()
    if env in ("0", "fused"):
        return "fused"
    if env in ("1", "parts"):
        return "parts"
    if family == ArchFamily.CPU or dim_class(width) != "mid":
        return "fused"
    if env != "auto" and family == ArchFamily.HOPPER:
        return "parts"
    return "auto"


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)


# ---- ahead-of-time check -------------------------------------------------------------------

_AOT_FAMILY = {"gfx942": ArchFamily.CDNA3, "gfx950": ArchFamily.CDNA4, "sm_90": ArchFamily.HOPPER}
_STRIDE_ARGS = ("stride_{}b", "stride_{}s", "stride_{}h")


def _sig(ptrs: dict[str, str], tensors: tuple[str, ...], scalars: tuple[str, ...]) -> dict:
    sig = dict(ptrs)
    for t in tensors:
        for s in _STRIDE_ARGS:
            sig[s.format(t)] = "i32:16" if s != "stride_{}s" or t != "l" else "i32:1"
    sig["stride_lb"], sig["stride_lh"], sig["stride_ls"] = "i32", "i32", "i32:1"
    for s in scalars:
        sig[s] = "fp32" if "scale" in s else "i32"
    return sig


_FWD_CONST = {"FP8": False, "SCALE_BLK": FP8_SCALE_BLOCK, "P_MAX": 448.0, "P_FP8": False}


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 causal dense specs of every config per kernel, for head dims 128 and 192/128."""
    assert target in AOT_TARGETS, target
    family = _AOT_FAMILY[target]
    t = triton_dtype_name(torch.bfloat16)
    specs = []
    head = ("group", "seqlen_q", "seqlen_k")
    for dqk, dv in ((128, 128), (192, 128), (256, 256)):
        bdq, bdv = _pow2(dqk), _pow2(dv)
        const = {"BLOCK_DQK": bdq, "BLOCK_DV": bdv, "DQK": dqk, "DV": dv, "VARLEN": False,
                 "HAS_L": False,
                 "HAS_R": True, "UPCAST": False}  # fmt: skip
        chunks = _split_dim(dqk)  # the qk chunks (192 = 128 + 64), fwd and bwd alike
        const.update(BLOCK_DQK=chunks[0], BLOCK_DQK2=chunks[1])
        width = max(sum(chunks), bdv)
        kinds = {
            "fwd": (
                attn_fwd_kernel,
                _sig({n: f"*{t}" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr")}
                     | {"lse_ptr": "*fp32", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
                        "qs_ptr": "*fp32", "ks_ptr": "*fp32", "vs_ptr": "*fp32",
                        "n_sblk_q": "i32", "n_sblk_k": "i32"},
                     ("q", "k", "v", "o"),
                     ("num_heads", *head, "qk_scale", "win_l", "win_r")),
            ),
            "dkdv": (
                attn_bwd_dkdv_kernel,
                _sig({n: f"*{t}" for n in ("q_ptr", "k_ptr", "v_ptr", "do_ptr")}
                     | {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "dk_ptr": f"*{t}",
                        "dv_ptr": f"*{t}", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32"},
                     ("q", "k", "v", "do", "dk", "dv"),
                     ("num_kv_heads", *head, "qk_scale", "sm_scale", "win_l", "win_r")),
            ),
            "dq": (
                attn_bwd_dq_kernel,
                _sig({n: f"*{t}" for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr")}
                     | {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "dq_ptr": f"*{t}",
                        "cu_q_ptr": "*i32", "cu_k_ptr": "*i32"},
                     ("q", "k", "v", "o", "do", "dq"),
                     ("num_heads", *head, "qk_scale", "sm_scale", "win_l", "win_r")),
            ),
        }  # fmt: skip
        if dim_class(width) == "mid":  # the one-accumulator dK/dV launches (PART 1 / 2)
            kinds["dv"] = kinds["dk"] = kinds["dkdv"]
        for kind, (fn, sig) in kinds.items():
            sig = {a: sig[a] for a in fn.arg_names if a in sig}
            part = {"dkdv": {"PART": 0}, "dv": {"PART": 1}, "dk": {"PART": 2}}.get(kind, {})
            for i, cfg in enumerate(attn_configs(family, kind, width)):
                specs.append(
                    AotSpec(
                        name=f"attn_{kind}_{t}_d{dqk}x{dv}_{cfg.name}",
                        fn=fn,
                        signature=sig,
                        constexprs={
                            **const,
                            **part,
                            **(_FWD_CONST if kind == "fwd" else {}),
                            "BLOCK_M": cfg.block_m,
                            "BLOCK_N": cfg.block_n,
                        },
                        options=cfg.options,
                        default=i == 0,
                    )
                )
    # the FP8 forward (d128, E4M3 q/k/v: FNUZ on gfx942), first config with BLOCK_N <= 64
    f8 = triton_dtype_name(torch.float8_e4m3fnuz if target == "gfx942" else torch.float8_e4m3fn)
    fwd = next(x for x in specs if x.name.startswith(f"attn_fwd_{t}_d128x128"))
    cfg = next(c for c in attn_configs(family, "fwd", 128) if c.block_n <= FP8_SCALE_BLOCK)
    sig = {**fwd.signature, "q_ptr": f"*{f8}", "k_ptr": f"*{f8}", "v_ptr": f"*{f8}"}
    fmax = 240.0 if target == "gfx942" else 448.0
    const = {**fwd.constexprs, "FP8": True, "P_MAX": fmax, "BLOCK_M": cfg.block_m,
             "BLOCK_N": cfg.block_n}  # fmt: skip
    specs.append(AotSpec(f"attn_fwd_fp8_d128x128_{cfg.name}", attn_fwd_kernel, sig, const,
                         cfg.options, default=True))  # fmt: skip
    return specs
