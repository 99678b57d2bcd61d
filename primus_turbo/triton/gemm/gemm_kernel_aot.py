"""Ahead-of-time specs of the dense Triton GEMM kernels (``gemm_kernel.aot_specs``).

Split out of ``gemm_kernel.py`` to keep that module short; scripts/aot_check.py reaches this
through ``gemm_kernel.aot_specs``.
"""

from __future__ import annotations

import dataclasses

import torch

from primus_turbo.pytorch.core.platform import ArchFamily
from primus_turbo.triton.aot import AOT_TARGETS, AotSpec, triton_dtype_name
from primus_turbo.triton.gemm.gemm_configs import (
    STREAM_K_MAX_TILE,
    GemmConfig,
    gemm_configs,
    narrow_candidates,
    narrow_config,
    select_config,
)
from primus_turbo.triton.gemm.gemm_kernel import _red_m, gemm_kernel, gemm_streamk_kernel

_AOT_FAMILY = {"gfx942": ArchFamily.CDNA3, "gfx950": ArchFamily.CDNA4, "sm_90": ArchFamily.HOPPER}


def aot_specs(target: str) -> list[AotSpec]:
    """Every config of the target's family, as launched for bf16 NT (weights ``[N, K]``) and
    fp16 NN: the integer hints (``:16`` divisible by 16, ``:1`` equal to 1) are what Triton's
    launcher specialises on for contiguous operands with 16-aligned sizes."""
    assert target in AOT_TARGETS, target
    family = _AOT_FAMILY[target]
    default = select_config(8192, 8192, 8192, family, 304 if family != ArchFamily.HOPPER else 132)
    streamk_cfg = max(
        (c for c in gemm_configs(family) if c.block_m * c.block_n <= STREAM_K_MAX_TILE),
        key=lambda c: c.block_m * c.block_n * c.block_k,
    )
    layouts = {
        torch.bfloat16: {"stride_ak": "i32:1", "stride_bk": "i32:1", "stride_bn": "i32:16"},
        torch.float16: {"stride_ak": "i32:1", "stride_bk": "i32:16", "stride_bn": "i32:1"},
    }
    specs = []
    for dtype, strides in layouts.items():
        t = triton_dtype_name(dtype)
        signature = {
            "a_ptr": f"*{t}",
            "b_ptr": f"*{t}",
            "c_ptr": f"*{t}",
            "ws_ptr": f"*{t}",  # the launcher passes c for the unused workspace/counters
            "cnt_ptr": f"*{t}",
            "M": "i32:16",
            "N": "i32:16",
            "K": "i32:16",
            "stride_am": "i32:16",
            **strides,
            "stride_cm": "i32:16",
            "stride_cn": "i32:1",
            "num_programs": "i32",
            "split_k": "i32:1",
            "k_per_split": "i32",
        }
        signature = {k: signature[k] for k in _KERNEL_ARGS}
        split_sig = {**signature, "ws_ptr": "*fp32", "cnt_ptr": "*i32", "split_k": "i32"}
        for cfg in gemm_configs(family):
            constexprs = {
                **cfg.tile_constexprs,
                "EVEN_K": True,
                "UPCAST": False,
                "SPLIT": False,
                "RED_M": _red_m(cfg),
                "BLOCK_N2": 0,
                "FLATTEN": False,
            }
            name = f"gemm_{t}_{cfg.name}"
            specs.append(AotSpec(name, gemm_kernel, signature, constexprs, cfg.options,
                                 default=cfg == default))  # fmt: skip
            if cfg == streamk_cfg:  # the largest tile the stream-K candidates use
                sk_sig = {
                    "a_ptr": f"*{t}", "b_ptr": f"*{t}", "c_ptr": f"*{t}", "ws_ptr": "*fp32",
                    "flag_ptr": "*i32", "iters_per_program": "i32",
                    **{k: v for k, v in signature.items() if k in _STREAMK_ARGS},
                }  # fmt: skip
                specs.append(
                    AotSpec(f"gemm_streamk_{t}_{cfg.name}", gemm_streamk_kernel,
                            {k: sk_sig[k] for k in _STREAMK_ARGS},
                            {k: v for k, v in constexprs.items()
                             if k not in ("SPLIT", "RED_M", "BLOCK_N2", "FLATTEN")},
                            cfg.options)
                )  # fmt: skip
            if dtype == torch.bfloat16:  # split-K: every config can get a split plan
                specs.append(
                    AotSpec(f"{name}_splitk", gemm_kernel, split_sig,
                            {**constexprs, "SPLIT": True}, cfg.options)
                )  # fmt: skip
        if dtype == torch.bfloat16:  # composite N tiles: kv_a's choice and a 128+64 one
            for cfg in (c for c in _aot_narrow_configs(family) if not c.tma):
                constexprs = {
                    **cfg.tile_constexprs, "EVEN_K": True, "UPCAST": False, "SPLIT": False,
                    "RED_M": _red_m(cfg), "BLOCK_N2": cfg.block_n2, "FLATTEN": False,
                }  # fmt: skip
                specs.append(AotSpec(f"gemm_{t}_{cfg.name}", gemm_kernel, signature, constexprs,
                                     cfg.options))  # fmt: skip
            if family == ArchFamily.HOPPER:
                # flattened plain tiles as PRIMUS_TURBO_GEMM_FLATTEN=auto (default) launches them,
                # and the first composite one (=1); CUDA only
                for cfg in (*gemm_configs(family), _aot_narrow_configs(family)[0]):
                    constexprs = {
                        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                        "GROUP_M": cfg.group_m, "EVEN_K": True, "UPCAST": False, "SPLIT": False,
                        "RED_M": _red_m(cfg), "BLOCK_N2": cfg.block_n2, "FLATTEN": True,
                    }  # fmt: skip
                    specs.append(AotSpec(f"gemm_{t}_{cfg.name}_flat", gemm_kernel, signature,
                                         constexprs, cfg.options))  # fmt: skip
                # TMA kernel (sm_90): the composite candidates with tma, and TMA versions of the
                # widest plain tile and of the k128 composite (PRIMUS_TURBO_GEMM_TMA=1 / explore)
                from primus_turbo.triton.gemm.gemm_tma_kernel import aot_specs_sm90

                tma = [c for c in _aot_narrow_configs(family) if c.tma]
                tma += [dataclasses.replace(default, tma=True)]
                tma += [narrow_config(family, 128, 128, 16, 128, 8, 3, tma=True)]
                tma += [narrow_config(family, 128, 128, 16, 64, 4, 4, ws=True)]
                specs += aot_specs_sm90(tma)
    return specs


def _aot_narrow_configs(family: ArchFamily) -> list[GemmConfig]:
    """Composite configs the AOT check compiles: the ones the tuner times for DeepSeek-V3 kv_a
    (4096x576x7168, ``narrow_candidates``) on the family's usual CU count, and 128x(128+64)."""
    cus = {ArchFamily.HOPPER: 132, ArchFamily.CDNA3: 304, ArchFamily.CDNA4: 256}[family]
    picked = list(narrow_candidates(4096, 576, 7168, family, cus))
    extra = narrow_config(family, 128, 128, 64, 64)
    return picked + [extra] if extra not in picked else picked


_KERNEL_ARGS = (
    "a_ptr", "b_ptr", "c_ptr", "ws_ptr", "cnt_ptr", "M", "N", "K", "stride_am", "stride_ak",
    "stride_bk", "stride_bn", "stride_cm", "stride_cn", "num_programs", "split_k", "k_per_split",
)  # fmt: skip

_STREAMK_ARGS = (
    "a_ptr", "b_ptr", "c_ptr", "ws_ptr", "flag_ptr", "M", "N", "K", "stride_am", "stride_ak",
    "stride_bk", "stride_bn", "stride_cm", "stride_cn", "iters_per_program",
)  # fmt: skip
