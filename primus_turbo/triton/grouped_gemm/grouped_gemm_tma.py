"""Opt-in TMA variant of the grouped GEMM forward for Hopper (``PRIMUS_TURBO_GROUPED_GEMM_TMA=1``).

Same math and in-kernel tile walk as ``grouped_gemm_kernel`` (see that module), but A and B
tiles arrive through host-built TMA descriptors instead of pointer loads:
* A is one descriptor over ``[M, K]``; a tile that crosses the end of its group reads rows of
  the next group, which only feed output rows this tile does not store (the store is masked).
* B is one descriptor over ``b`` viewed as ``[G * N, K]`` (``trans_b``) or ``[G * K, N]``; a tile
  past ``N`` reads the next expert's rows, which only feed masked-out columns. Past ``K`` (the
  ``[G * K, N]`` view) the next expert's rows meet A columns that the descriptor zero-fills.
  Out-of-range tiles at the end of a tensor are zero-filled by the hardware.
The store stays a masked pointer store (a TMA store would overwrite a neighbouring group).
CUDA sm_90 only; not used for the fp8 path or the wgrad. Needs 16-byte aligned row strides.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from primus_turbo.pytorch.core.checks import env_flag
from primus_turbo.triton.gemm.gemm_configs import GemmConfig
from primus_turbo.triton.gemm.gemm_kernel import _tile_coords
from primus_turbo.triton.grouped_gemm.grouped_gemm_kernel import _group_rows
from primus_turbo.triton.grouped_gemm.grouped_gemm_walk import (
    UNSCALED,
    desc_tile_mma,
    find_tile,
    group_table,
    operand_descs,
    scale_tile,
    store_rows,
    store_tile,
    zero_tail,
)


@functools.cache
def tma_enabled() -> bool:
    return env_flag("PRIMUS_TURBO_GROUPED_GEMM_TMA", False)


def tma_usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool) -> bool:
    """Descriptor constraints: CUDA sm_90+, 2-byte dtypes, unit inner strides, 16-byte rows."""
    if not (tma_enabled() and a.is_cuda and torch.version.hip is None):
        return False
    if torch.cuda.get_device_capability(a.device)[0] < 9 or a.element_size() != 2:
        return False
    if not (a.is_contiguous() and b.is_contiguous()):
        return False
    return (a.shape[1] * 2) % 16 == 0 and (b.shape[2] * 2) % 16 == 0


@triton.jit
def grouped_gemm_tma_kernel(
    a_desc,
    b_desc,
    c_ptr,
    offs_ptr,
    M,
    N,
    K,
    G,
    stride_cm,
    stride_cn,
    num_programs,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TRANS_B: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    rot = 0
    for g in range(0, G + 1):
        start, end = _group_rows(offs_ptr, g, G, M)
        m_g = (end - start).to(tl.int32)
        num_pid_m = tl.cdiv(m_g, BLOCK_M)
        tiles_g = num_pid_m * num_pid_n
        first = (pid - rot + num_programs) % num_programs
        k_end = tl.where(g < G, k_tiles, 0)
        for t in range(first, tiles_g, num_programs):
            pid_m, pid_n = _tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
            row0 = start.to(tl.int32) + pid_m * BLOCK_M
            col0 = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for kt in range(0, k_end):
                a = a_desc.load([row0, kt * BLOCK_K])
                if TRANS_B:
                    b = b_desc.load([g * N + col0, kt * BLOCK_K])
                    acc = tl.dot(a, b.T, acc)
                else:
                    b = b_desc.load([g * K + kt * BLOCK_K, col0])
                    acc = tl.dot(a, b, acc)
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = col0 + tl.arange(0, BLOCK_N)
            rows = start + rm.to(tl.int64)
            c_ptrs = c_ptr + rows[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
            mask = (rm[:, None] < m_g) & (rn[None, :] < N)
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
        rot = (rot + tiles_g) % num_programs


def launch_tma(a, b, c, group_offs, trans_b: bool, cfg: GemmConfig, programs: int) -> None:
    """Launch the TMA kernel for ``c = grouped(a, op(b))`` (shapes as in grouped_gemm_triton)."""
    a_desc, b_desc, m, n, k, g = operand_descs(a, b, trans_b, cfg)
    grouped_gemm_tma_kernel[(programs,)](
        a_desc,
        b_desc,
        c,
        group_offs,
        m,
        n,
        k,
        g,
        c.stride(0),
        c.stride(1),
        programs,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        TRANS_B=trans_b,
        **cfg.options,
    )


@triton.jit
def grouped_gemm_flat_tma_kernel(
    a_desc, b_desc, c_ptr, offs_ptr, M, N, K, G, stride_cm, stride_cn, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, TRANS_B: tl.constexpr, G_PAD: tl.constexpr, FLATTEN: tl.constexpr,
    UPCAST: tl.constexpr, c_desc=None, TMA_STORE: tl.constexpr = False,
    N_MAJOR: tl.constexpr = False,
    sa_ptr=None, sb_ptr=None, stride_sa=None, stride_sbg=None, stride_sbn=None,
    SCALED: tl.constexpr = False,
):  # fmt: skip
    """The ``flat`` kernel's tile walk (constant K trip count, one-pass tile lookup, tail rows
    in a second loop) with TMA operand loads: fewer instructions and registers per K step
    than 16-byte ``cp.async`` pointer loads, and the flattened loop issues the next tile's
    first TMA loads during this tile's epilogue. A and B descriptors as for
    ``grouped_gemm_tma_kernel`` (rows of a neighbouring group or expert only feed output rows /
    columns that the masked store drops; NN needs ``K % BLOCK_K == 0``, see the launcher).

    Session-5 knobs (plans ``tmas`` / ``tman`` / ``tmasn`` of the tuner, ``TMA_VARIANTS``):
    ``TMA_STORE``: a tile whose rows all lie in its group leaves through a TMA store of
    ``c_desc`` (``[M, N]``, clipped at ``N`` by the hardware); a ragged last tile of a group
    keeps the masked pointer store (a TMA store would overwrite the next group's rows).
    ``N_MAJOR``: within a group, walk the tiles N-fastest over the whole N range (every
    program of a wave shares the same few A row blocks in L2; B of one expert, at most
    ``N * K`` elements, stays in L2 across the group) instead of ``GROUP_M`` bands.

    ``SCALED`` (plans ``f8tma`` / ``f8tmas`` of ``grouped_gemm_fp8_tma``: fp8 E4M3 operands,
    ``TRANS_B``): the tile times ``sa [M]`` per row and ``sb [G, N]`` per (group, column)
    before its store (the masked pointer store, or ``TMA_STORE`` as above)."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    gi, lo, hi, first, ends, total = group_table(offs_ptr, M, G, num_pid_n, BLOCK_M, G_PAD)
    for t_glob in tl.range(pid, total, num_programs, flatten=FLATTEN):
        g, start, stop, t0 = find_tile(t_glob, gi, lo, hi, first, ends)
        m_g = stop - start
        if N_MAJOR:
            pid_m = (t_glob - t0) // num_pid_n
            pid_n = (t_glob - t0) % num_pid_n
        else:
            pid_m, pid_n = _tile_coords(t_glob - t0, tl.cdiv(m_g, BLOCK_M), num_pid_n, GROUP_M)
        row0 = start + pid_m * BLOCK_M
        col0 = pid_n * BLOCK_N
        if SCALED:  # the scales' rows / columns, computed before the K loop
            rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M).to(tl.int64)
            rn = col0 + tl.arange(0, BLOCK_N)
            mask_m = rows < stop
            mask_n = rn < N
        acc = desc_tile_mma(a_desc, b_desc, g, row0, col0, N, K, k_tiles,
                            BLOCK_M, BLOCK_N, BLOCK_K, TRANS_B, UPCAST)  # fmt: skip
        if SCALED:
            acc = scale_tile(acc, sa_ptr, sb_ptr, g, rows, rn, mask_m, mask_n,
                             stride_sa, stride_sbg, stride_sbn)  # fmt: skip
            if TMA_STORE:
                store_tile(c_ptr, c_desc, acc, row0, col0, stop, N, stride_cm, stride_cn,
                           BLOCK_M, BLOCK_N, True)  # fmt: skip
            else:
                store_rows(c_ptr, acc, rows, rn, mask_m, mask_n, stride_cm, stride_cn)
        else:
            store_tile(c_ptr, c_desc, acc, row0, col0, stop, N, stride_cm, stride_cn,
                       BLOCK_M, BLOCK_N, TMA_STORE)  # fmt: skip
    zero_tail(c_ptr, offs_ptr, M, N, G, pid, num_programs, stride_cm, stride_cn, BLOCK_M, BLOCK_N)


@triton.jit
def store_wgrad_halves(c_desc, acc, g, p0, q0, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The wgrad tile ``acc`` into ``C[g]`` through ``c_desc`` (``[G, P, Q]``, block
    ``[1, BLOCK_M, BLOCK_N / 2]``): two asynchronous TMA stores of the column halves, rows /
    columns past ``P`` / ``Q`` clipped by the descriptor."""
    half: tl.constexpr = BLOCK_N // 2
    out = acc.to(c_desc.dtype).reshape(BLOCK_M, 2, half).permute(0, 2, 1)
    lo_half, hi_half = out.split()
    c_desc.store([g, p0, q0], lo_half.reshape(1, BLOCK_M, half))
    c_desc.store([g, p0, q0 + half], hi_half.reshape(1, BLOCK_M, half))


@triton.jit
def variable_k_tma_kernel(
    x_desc, y_desc, x_ptr, y_ptr, c_ptr, offs_ptr, M, P, Q, G,
    stride_xm, stride_ym, stride_cg, stride_cp, stride_cq, num_programs,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, UPCAST: tl.constexpr,
    c_desc=None, TMA_STORE: tl.constexpr = False,
):  # fmt: skip
    """``C[g] = X_g^T @ Y_g`` (the wgrad) with TMA loads for the whole ``BLOCK_K``-row steps of
    each group (no mask: they never leave the group) and one masked pointer step for the last
    ``m_g % BLOCK_K`` rows. ``X [M, P]`` and ``Y [M, Q]`` have unit column strides; the X tile
    arrives as ``[BLOCK_K, BLOCK_M]`` and enters the MMA transposed (an M-major operand).
    ``TMA_STORE`` (session 8, plan ``tmavs``): the tile leaves through ``c_desc``
    (``[G, P, Q]``, block ``[1, BLOCK_M, BLOCK_N / 2]``: two asynchronous TMA stores of the
    column halves, the rows / columns past ``P`` / ``Q`` clipped by the descriptor) instead of
    masked pointer stores, so the store can drain while the next tile's loads start."""
    pid = tl.program_id(0)
    num_pid_p = tl.cdiv(P, BLOCK_M)
    num_pid_q = tl.cdiv(Q, BLOCK_N)
    per_group = num_pid_p * num_pid_q
    offs_k = tl.arange(0, BLOCK_K)
    for w in range(pid, G * per_group, num_programs):
        g = w // per_group
        pid_p, pid_q = _tile_coords(w % per_group, num_pid_p, num_pid_q, GROUP_M)
        start, end = _group_rows(offs_ptr, g, G, M)
        m_g = (end - start).to(tl.int32)
        row0 = start.to(tl.int32)
        p0 = pid_p * BLOCK_M
        q0 = pid_q * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, m_g // BLOCK_K):
            x = x_desc.load([row0 + kt * BLOCK_K, p0])
            y = y_desc.load([row0 + kt * BLOCK_K, q0])
            if UPCAST:
                x = x.to(tl.float32)
                y = y.to(tl.float32)
            acc = tl.dot(x.T, y, acc)
        rp = p0 + tl.arange(0, BLOCK_M)
        rq = q0 + tl.arange(0, BLOCK_N)
        rp64 = rp.to(tl.int64)
        rq64 = rq.to(tl.int64)
        mask_p = rp[:, None] < P
        mask_q = rq[None, :] < Q
        rem = m_g % BLOCK_K
        if rem > 0:
            r = start + (m_g - rem) + offs_k.to(tl.int64)
            x = tl.load(x_ptr + r[None, :] * stride_xm + rp64[:, None],
                        mask=mask_p & (offs_k[None, :] < rem), other=0.0)  # fmt: skip
            y = tl.load(y_ptr + r[:, None] * stride_ym + rq64[None, :],
                        mask=mask_q & (offs_k[:, None] < rem), other=0.0)  # fmt: skip
            if UPCAST:
                x = x.to(tl.float32)
                y = y.to(tl.float32)
            acc = tl.dot(x, y, acc)
        if TMA_STORE:
            store_wgrad_halves(c_desc, acc, g, p0, q0, BLOCK_M, BLOCK_N)
        else:
            c_ptrs = c_ptr + g.to(tl.int64) * stride_cg + rp64[:, None] * stride_cp
            c_ptrs += rq64[None, :] * stride_cq
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_p & mask_q)


# ---- launchers of the descriptor kernels (chosen by grouped_gemm_kernel's plans) -------------


def _descriptor_device(t: torch.Tensor) -> bool:
    """Host TMA descriptors: CUDA sm_90+ (not ROCm), or the CPU interpreter (tests)."""
    if t.device.type == "cpu":
        from primus_turbo.pytorch.core.platform import triton_interpret

        return triton_interpret()
    if not t.is_cuda or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(t.device)[0] >= 9


def _tma_layout_ok(t: torch.Tensor) -> bool:
    """2-byte elements, unit inner stride, 16-byte aligned base and outer strides."""
    if t.element_size() != 2 or t.stride(-1) != 1 or t.data_ptr() % 16:
        return False
    return all((s * 2) % 16 == 0 for s in t.stride()[:-1])


def flat_tma_usable(a: torch.Tensor, b: torch.Tensor, trans_b: bool, scaled: bool) -> bool:
    """Whether ``launch_flat_tma`` can take these operands (``b`` must be contiguous: it is
    viewed as ``[G * N, K]`` / ``[G * K, N]``)."""
    if scaled or not _descriptor_device(a) or not b.is_contiguous():
        return False
    return _tma_layout_ok(a) and _tma_layout_ok(b)


def flat_tma_config_ok(cfg: GemmConfig, k: int, trans_b: bool) -> bool:
    """NN (dgrad): a K tile past the expert's K rows would read the next expert's rows; they
    meet zero-filled A columns, but 0 * inf = nan, so only whole K tiles are allowed."""
    return trans_b or k % cfg.block_k == 0


# Plan names of the flat TMA kernel's variants (the tuner's candidates / config filter
# ``variant:name``): kernel constexprs on top of the ``tma`` plan.
TMA_VARIANTS = {
    "tma": {},
    "tmas": {"TMA_STORE": True},
    "tman": {"N_MAJOR": True},
    "tmasn": {"TMA_STORE": True, "N_MAJOR": True},
}


def tma_store_ok(n: int) -> bool:
    """A TMA store of ``c [M, N]`` (contiguous, fresh) needs 16-byte rows."""
    return (n * 2) % 16 == 0


def launch_flat_tma(
    a, b, c, group_offs, trans_b, cfg, programs, flatten, upcast, variant: str = "tma"
) -> None:
    """``c = grouped(a, op(b))`` with ``grouped_gemm_flat_tma_kernel`` (``variant``: a key of
    ``TMA_VARIANTS``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(a.device)
    knobs = dict(TMA_VARIANTS[variant])
    if knobs.get("TMA_STORE"):
        knobs["c_desc"] = TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2])
    a_desc, b_desc, m, n, k, g = operand_descs(a, b, trans_b, cfg)
    grouped_gemm_flat_tma_kernel[(programs,)](
        a_desc, b_desc, c, group_offs, m, n, k, g, c.stride(0), c.stride(1), programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        TRANS_B=trans_b, G_PAD=triton.next_power_of_2(max(g, 2)), FLATTEN=flatten,
        UPCAST=upcast, **knobs, **cfg.options,
    )  # fmt: skip


def variable_k_tma_usable(x: torch.Tensor, y: torch.Tensor, scaled: bool) -> bool:
    return not scaled and _descriptor_device(x) and _tma_layout_ok(x) and _tma_layout_ok(y)


def launch_variable_k_tma(
    x, y, c, group_offs, num_groups, cfg, programs, upcast, tma_store: bool = False
) -> None:
    """``c[g] = x_g^T @ y_g`` with ``variable_k_tma_kernel`` (``tma_store``: plan ``tmavs``,
    ``c`` fresh and contiguous with 16-byte rows, ``vk_tma_store_ok``)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from primus_turbo.triton.host_tma import ensure_context

    ensure_context(x.device)
    m, p = x.shape
    q = y.shape[1]
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_k, cfg.block_m])
    y_desc = TensorDescriptor.from_tensor(y, [cfg.block_k, cfg.block_n])
    knobs = {}
    if tma_store:
        c_block = [1, cfg.block_m, cfg.block_n // 2]
        knobs = {"TMA_STORE": True, "c_desc": TensorDescriptor.from_tensor(c, c_block)}
    variable_k_tma_kernel[(programs,)](
        x_desc, y_desc, x, y, c, group_offs, m, p, q, num_groups, x.stride(0), y.stride(0),
        c.stride(0), c.stride(1), c.stride(2), programs,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        UPCAST=upcast, **knobs, **cfg.options,
    )  # fmt: skip


def vk_tma_store_ok(c: torch.Tensor) -> bool:
    """Plan ``tmavs`` of the wgrad: a TMA store of ``c [G, P, Q]`` (contiguous, 2-byte
    elements, 16-byte aligned rows and base)."""
    return c.is_contiguous() and _tma_layout_ok(c)


def aot_specs(target: str) -> list:
    """sm_90 only (TMA descriptors are CUDA-only): the flat TMA forward for NT (GroupedLinear)
    and NN (dgrad) and the TMA wgrad, bf16, every TMA config."""
    from primus_turbo.pytorch.core.platform import ArchFamily
    from primus_turbo.triton.aot import AotSpec
    from primus_turbo.triton.grouped_gemm.grouped_gemm_configs import (
        _tma_extra_ok,
        tma_configs,
        vk_tma_store_cfg_ok,
    )

    if target != "sm_90":
        return []
    specs = []
    ints = {"M": "i32", "N": "i32:16", "K": "i32:16", "G": "i32"}
    for cfg in tma_configs(ArchFamily.HOPPER):
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        for lay, trans_b in (("nt", True), ("nn", False)):
            b_block = f"[{bn},{bk}]" if trans_b else f"[{bk},{bn}]"
            sig = {"a_desc": f"tensordesc<bf16[{bm},{bk}]>", "b_desc": f"tensordesc<bf16{b_block}>",
                   "c_ptr": "*bf16", "offs_ptr": "*i64", **ints, "stride_cm": "i32:16",
                   "stride_cn": "i32:1", "num_programs": "i32"}  # fmt: skip
            constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                          "TRANS_B": trans_b, "G_PAD": 256, "FLATTEN": True,
                          "UPCAST": False}  # fmt: skip
            for variant, knobs in TMA_VARIANTS.items():
                if variant != "tma" and not _tma_extra_ok(cfg):
                    continue
                off = {"TMA_STORE": False, "N_MAJOR": False}
                sig_v, cx = dict(sig), {**constexprs, **off, **knobs, **UNSCALED}
                if knobs.get("TMA_STORE"):
                    sig_v["c_desc"] = f"tensordesc<bf16[{bm},{bn // 2}]>"
                else:
                    cx["c_desc"] = None
                tag = "" if variant == "tma" else f"{variant}_"
                name = f"grouped_gemm_flat_tma_bf16_{lay}_{tag}{cfg.name}"
                specs.append(AotSpec(name, grouped_gemm_flat_tma_kernel, sig_v, cx,
                                     cfg.options))  # fmt: skip
    for cfg in tma_configs(ArchFamily.HOPPER, wgrad=True):  # + the session-8 wgrad tiles
        bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
        sig = {"x_desc": f"tensordesc<bf16[{bk},{bm}]>", "y_desc": f"tensordesc<bf16[{bk},{bn}]>",
               "x_ptr": "*bf16", "y_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i64",
               "M": "i32", "P": "i32:16", "Q": "i32:16", "G": "i32", "stride_xm": "i32:16",
               "stride_ym": "i32:16", "stride_cg": "i32:16", "stride_cp": "i32:16",
               "stride_cq": "i32:1", "num_programs": "i32"}  # fmt: skip
        constexprs = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": cfg.group_m,
                      "UPCAST": False, "c_desc": None, "TMA_STORE": False}  # fmt: skip
        specs.append(AotSpec(f"grouped_gemm_variable_k_tma_bf16_{cfg.name}",
                             variable_k_tma_kernel, sig, constexprs, cfg.options))  # fmt: skip
        if vk_tma_store_cfg_ok(cfg):  # session 8 plan tmavs (VK_STORE_TILES)
            sig_s = {**sig, "c_desc": f"tensordesc<bf16[1,{bm},{bn // 2}]>"}
            cx = {k: v for k, v in constexprs.items() if k != "c_desc"}
            specs.append(AotSpec(f"grouped_gemm_variable_k_tmavs_bf16_{cfg.name}",
                                 variable_k_tma_kernel, sig_s, {**cx, "TMA_STORE": True},
                                 cfg.options))  # fmt: skip
    return specs
