"""AOT specs of ``permute_v2_kernel.py`` (bf16 rows; the permute at Qwen3-MoE's 128 experts)."""

from __future__ import annotations

import torch

from primus_turbo.triton.aot import AotSpec, triton_dtype_name
from primus_turbo.triton.moe.permute_v2_kernel import (
    permute_fused_kernel,
    reduce_v2_kernel,
    rows_to_src_kernel,
    unpermute_bwd_kernel,
    v2_hist_kernel,
)
from primus_turbo.triton.moe.permute_v2_plan import _plan_v2


def aot_specs(target: str) -> list[AotSpec]:
    """bf16 rows; the fused permute at Qwen3-MoE's 128 experts (T=4096, K=8, with probs)."""
    dt = triton_dtype_name(torch.bfloat16)
    e_pad, sub, chunk, _, cb = _plan_v2(4096 * 8, 128)
    # the fused permute (COPY: maps and row copy in one launch) and its maps-only form (the
    # rows then move in a separate gather through src_ptr) share every argument but src_ptr
    sig = {
        "idx_ptr": "*i64",
        "counts_ptr": "*i32",
        "probs_ptr": "*fp32",
        "x_ptr": f"*{dt}",
        "out_ptr": f"*{dt}",
        "row_map_ptr": "*i64",
        "pprobs_ptr": "*fp32",
        "tpe_ptr": "*i64",
        "disp_ptr": "*i64",
        "flag_ptr": "*u8",
        "TK": "i32",
        "E": "i32",
        "C": "i32",
        "N_OUT": "i32",
        "PAD": "i32",
        "H": "i32",
        "s_t": "i32",
        "s_k": "i32",
        "p_t": "i32",
        "p_k": "i32",
        "stride_x": "i64:16",
        "stride_out": "i64:16",
        "COLS": "i32",
    }
    const = {
        "K": 8,
        "CHUNK": chunk,
        "SUB": sub,
        "E_PAD": e_pad,
        "CB": cb,
        "BLOCK_H": 1024,
        "HAS_PROBS": True,
        "HAS_PAD": False,
        "EVEN_H": True,
    }
    return [
        AotSpec(
            name="moe_v2_permute_fused_e128_probs",
            fn=permute_fused_kernel,
            signature=sig,
            constexprs={**const, "COPY": True, "src_ptr": None},
            options={"num_warps": 8},
        ),
        AotSpec(
            name="moe_v2_permute_maps_e128_probs",
            fn=permute_fused_kernel,
            signature={**sig, "src_ptr": "*i64"},
            constexprs={**const, "COPY": False},
            options={"num_warps": 4},
            default=True,
        ),
        AotSpec(
            name="moe_v2_hist_e128",
            fn=v2_hist_kernel,
            signature={"idx_ptr": "*i64", "counts_ptr": "*i32", "TK": "i32", "E": "i32",
                       "s_t": "i32", "s_k": "i32"},
            constexprs={"K": 8, "CHUNK": chunk, "SUB": max(sub, min(chunk, 8192 // e_pad)),
                        "E_PAD": e_pad},
            options={"num_warps": 4},
        ),
        AotSpec(
            name="moe_v2_reduce_bf16_wp",
            fn=reduce_v2_kernel,
            signature={"y_ptr": f"*{dt}", "map_ptr": "*i64", "w_ptr": "*fp32",
                       "out_ptr": f"*{dt}", "p_out_ptr": "*fp32", "src_ptr": "*i64", "T": "i32",
                       "H": "i32", "stride_y": "i64:16", "stride_out": "i64:16"},
            constexprs={"K": 8, "MUL_W": True, "WRITE_P": True, "ROWS": 4, "BLOCK_H": 512,
                        "EVEN_H": True, "WRITE_SRC": True, "LATE": True, "K_PAD": 8,
                        "COL_FAST": True},
            options={"num_warps": 4},
        ),
        AotSpec(
            name="moe_v2_unpermute_bwd_bf16",
            fn=unpermute_bwd_kernel,
            signature={"dout_ptr": f"*{dt}", "y_ptr": f"*{dt}", "map_ptr": "*i64",
                       "w_ptr": "*fp32", "src_ptr": "*i64", "dy_ptr": f"*{dt}",
                       "dw_ptr": "*fp32", "T": "i32", "N": "i32", "H": "i32",
                       "stride_dout": "i64:16", "stride_y": "i64:16", "stride_dy": "i64:16",
                       "num_tok_programs": "i32", "SPLITS": "i32", "COLS": "i32"},
            constexprs={"K": 8, "K_PAD": 8, "ROWS": 8, "ZROWS": 32, "BLOCK_H": 512,
                        "NEED_DW": False, "HAS_W": True, "FAST": True, "VERIFY": True},
            options={"num_warps": 8},
        ),
        AotSpec(
            name="moe_v2_rows_to_src",
            fn=rows_to_src_kernel,
            signature={"map_ptr": "*i64", "src_ptr": "*i64", "TK": "i32"},
            constexprs={"BLOCK": 1024},
            options={"num_warps": 4},
        ),
    ]  # fmt: skip
