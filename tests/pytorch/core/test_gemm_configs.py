"""The Triton GEMM config data and the pure heuristic (no GPU needed)."""

from __future__ import annotations

import math

import pytest

from primus_turbo.pytorch.core.platform import ArchFamily
from primus_turbo.triton.gemm.gemm_configs import gemm_configs, select_config

GPU_FAMILIES = [ArchFamily.CDNA3, ArchFamily.CDNA4, ArchFamily.HOPPER]
CUS = {ArchFamily.CDNA3: 304, ArchFamily.CDNA4: 256, ArchFamily.HOPPER: 132}


@pytest.mark.parametrize("family", GPU_FAMILIES + [ArchFamily.CPU])
def test_configs_are_well_formed(family):
    configs = gemm_configs(family)
    assert configs and len(set(configs)) == len(configs)
    for cfg in configs:
        for v in (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps):
            assert v & (v - 1) == 0, cfg  # powers of two
        assert cfg.block_k >= 16 and cfg.num_stages >= 1


@pytest.mark.parametrize("family", [ArchFamily.CDNA3, ArchFamily.CDNA4])
def test_amd_configs_carry_amd_options(family):
    for cfg in gemm_configs(family):
        assert cfg.options["matrix_instr_nonkdim"] == 16
        assert cfg.num_stages <= 2  # LDS pipelining depth that fits 64/160 KiB


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_large_shape_takes_a_large_tile(family):
    cfg = select_config(8192, 8192, 8192, family, CUS[family])
    assert cfg.block_m * cfg.block_n >= 128 * 256


@pytest.mark.parametrize("family", GPU_FAMILIES)
def test_small_output_takes_a_small_tile(family):
    big = select_config(8192, 8192, 8192, family, CUS[family])
    small = select_config(256, 512, 8192, family, CUS[family])
    assert small.block_m * small.block_n < big.block_m * big.block_n


def test_heuristic_is_pure_and_deterministic():
    a = select_config(3000, 5000, 1000, ArchFamily.HOPPER, 132)
    b = select_config(3000, 5000, 1000, ArchFamily.HOPPER, 132)
    assert a == b


def test_cpu_family_uses_interpreter_tiles():
    assert select_config(4096, 4096, 4096, ArchFamily.CPU, 2).block_m <= 32


def test_split_k_only_when_tiles_do_not_fill_the_machine():
    from primus_turbo.triton.gemm.gemm_configs import GemmConfig, select_split_k

    cfg = gemm_configs(ArchFamily.HOPPER)[0]  # 128x256
    assert select_split_k(8192, 8192, 8192, cfg, 132) == 1  # 2048 tiles
    assert select_split_k(4096, 576, 7168, cfg, 132) == 4  # 96 tiles, long K
    assert select_split_k(128, 256, 8192, cfg, 132) == 8  # one tile, very long K
    assert select_split_k(128, 256, 512, cfg, 132) == 1  # K too short to share
    assert select_split_k(4096, 7168, 576, cfg, 132) == 1  # kv_a dgrad: many tiles, short K
    # kv_a with 128x64 tiles, 2 per SM: 288 tiles = 1.09 waves -> 7 slices of 16 K tiles
    assert select_split_k(4096, 576, 7168, GemmConfig(128, 64, 64, programs_per_cu=2), 132) == 7
    # one wave exactly filled, two waves needed for the plain kernel otherwise: no gain
    assert select_split_k(128 * 12, 128 * 11, 4096, GemmConfig(128, 128, 64), 132) == 1


def test_split_k_rule_properties():
    """Every split the rule returns keeps >= SPLIT_K_MIN_SLICE K tiles per slice and lowers the
    modelled time by >= 10% against the plain kernel; ineligible shapes never split."""
    from primus_turbo.triton.gemm import gemm_configs as gc

    for cfg in gemm_configs(ArchFamily.HOPPER) + gemm_configs(ArchFamily.CDNA3):
        for m, n, k in [(4096, 576, 7168), (576, 7168, 4096), (4096, 1536, 7168), (256, 256, 2048),
                        (1000, 3000, 5000), (64, 64, 100000)]:  # fmt: skip
            for cus in (132, 304):
                split = gc.select_split_k(m, n, k, cfg, cus)
                assert 1 <= split <= gc.SPLIT_K_MAX
                if not gc.split_k_eligible(m, n, k, cfg, cus):
                    assert split == 1
                if split > 1:
                    k_tiles = math.ceil(k / cfg.block_k)
                    assert math.ceil(k_tiles / split) >= gc.SPLIT_K_MIN_SLICE
                    plain = gc.split_k_cost(m, n, k, cfg, cus, 1)
                    assert gc.split_k_cost(m, n, k, cfg, cus, split) <= 0.9 * plain


def test_stream_k_only_for_a_poorly_filled_last_wave():
    from primus_turbo.triton.gemm.gemm_configs import GemmConfig, use_stream_k

    cfg = GemmConfig(128, 128, 64)
    # DeepSeek-V3 kv_a 4096x576x7168: 160 tiles on 132 SMs -> 2 waves, 61% filled
    assert use_stream_k(4096, 576, 7168, cfg, 132)
    # 8192^2: 4096 tiles = 31 waves, the tail is amortised
    assert not use_stream_k(8192, 8192, 8192, cfg, 132)
    # exactly one full wave: nothing to balance
    assert not use_stream_k(128 * 12, 128 * 11, 4096, cfg, 132)
    # too little K work to share between the programs
    assert not use_stream_k(128, 128, 64, cfg, 132)
