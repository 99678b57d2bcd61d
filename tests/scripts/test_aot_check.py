"""Tests of scripts/aot_check.py: its parsers on sample text, and one real AOT compile.

The full sweep (every kernel config for every target) is `make aot-check`, not a test.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton.language as tl

REPO = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("aot_check", REPO / "scripts" / "aot_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("aot_check", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


ac = _load_script()  # puts scripts/ on sys.path for its helper modules
import aot_parse  # noqa: E402
import aot_report  # noqa: E402

# Trimmed from a real Triton 3.6 gfx942 compile: two kernels, nested .args entries whose keys
# (incl. .name) must not leak into the kernel-level figures.
SAMPLE_AMDGCN = """\
\t.text
k0:
\tv_mfma_f32_16x16x16_bf16 a[0:3], v[2:3], v[4:5], a[0:3]
\tv_mfma_f32_16x16x16_bf16 a[4:7], v[2:3], v[6:7], a[4:7]
\ts_waitcnt lgkmcnt(0)
; v_mfma in a comment is not an instruction
; Kernel info:
; NumVgprs: 256
; ScratchSize: 556
; Occupancy: 2
\t.amdgpu_metadata
---
amdhsa.kernels:
  - .agpr_count:     4
    .args:
      - .address_space:  global
        .name:           a_ptr
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
      - .offset:         8
        .size:           4
        .value_kind:     by_value
    .group_segment_fixed_size: 0
    .kernarg_segment_size: 80
    .max_flat_workgroup_size: 512
    .name:           k0
    .private_segment_fixed_size: 556
    .sgpr_count:     76
    .sgpr_spill_count: 0
    .symbol:         k0.kd
    .vgpr_count:     256
    .vgpr_spill_count: 162
    .wavefront_size: 64
  - .agpr_count:     0
    .args:           []
    .group_segment_fixed_size: 1024
    .name:           k1
    .private_segment_fixed_size: 0
    .sgpr_count:     20
    .sgpr_spill_count: 3
    .vgpr_count:     32
    .vgpr_spill_count: 0
amdhsa.target:   amdgcn-amd-amdhsa--gfx942
amdhsa.version:
  - 1
  - 2
...
\t.end_amdgpu_metadata
"""

# ptxas 12.8/13.0 layout (spills on their own line) and an older one (smem on the Used line).
SAMPLE_PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'
ptxas info    : Function properties for gemm_kernel
    1040 bytes stack frame, 1400 bytes spill stores, 1284 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1040 bytes cumulative stack size
ptxas info    : Compile time = 705.322 ms
ptxas info    : Compiling entry function 'small' for 'sm_90a'
ptxas info    : Function properties for small
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 384 bytes smem, 376 bytes cmem[0]
"""


def test_parse_amdgcn_metadata_per_kernel():
    kernels = aot_parse.parse_amdgcn_metadata(SAMPLE_AMDGCN)
    assert list(kernels) == ["k0", "k1"]
    assert kernels["k0"] == {
        "agpr_count": 4,
        "group_segment_fixed_size": 0,
        "private_segment_fixed_size": 556,
        "sgpr_count": 76,
        "sgpr_spill_count": 0,
        "vgpr_count": 256,
        "vgpr_spill_count": 162,
    }
    assert kernels["k1"]["sgpr_spill_count"] == 3
    assert kernels["k1"]["group_segment_fixed_size"] == 1024


def test_amdgcn_kernel_info_counts_mfma_and_occupancy():
    info = aot_parse.amdgcn_kernel_info(SAMPLE_AMDGCN, "k1")
    assert info["vgpr_count"] == 32
    assert info["mfma_count"] == 2  # the comment line does not count
    assert info["occupancy"] == 2
    assert aot_parse.amdgcn_kernel_info(SAMPLE_AMDGCN)["vgpr_spill_count"] == 162  # first kernel
    with pytest.raises(ValueError, match="amdhsa.kernels"):
        aot_parse.amdgcn_kernel_info("\tv_mfma_f32_4x4x4f16 v[0:3]\n")


def test_parse_ptxas_output():
    big = aot_parse.parse_ptxas_output(SAMPLE_PTXAS)
    assert big == {
        "regs": 255,
        "spill_stores": 1400,
        "spill_loads": 1284,
        "stack_bytes": 1040,
        "smem_static": 0,
    }
    small = aot_parse.parse_ptxas_output(SAMPLE_PTXAS, "small")
    assert small["regs"] == 40 and small["smem_static"] == 384 and small["spill_stores"] == 0
    with pytest.raises(ValueError):
        aot_parse.parse_ptxas_output("ptxas fatal : nothing")


def test_ptx_helpers():
    ptx = (
        ".version 8.7\n.target sm_90a\n.address_size 64\n\twgmma.fence.sync.aligned;\n"
        "\twgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%r1}, %rd1, %rd2, p, 1;\n"
        "\twgmma.commit_group.sync.aligned;\n"
    )
    assert aot_parse.ptx_target(ptx) == "sm_90a"
    assert aot_parse.ptx_target("no target here") == "sm_90"
    assert aot_parse.count_wgmma(ptx) == 1


@pytest.mark.parametrize(
    "figures, status, fails, fails_strict",
    [
        ({"lds_bytes": 65536, "vgpr_spill_count": 0, "sgpr_spill_count": 0}, "OK", False, False),
        ({"lds_bytes": 65537, "vgpr_spill_count": 0, "sgpr_spill_count": 0}, "ERROR", True, True),
        ({"lds_bytes": 1024, "vgpr_spill_count": 5, "sgpr_spill_count": 0}, "SPILL", False, True),
        ({"error": "CompilationError: boom"}, "ERROR", True, True),
    ],
)
def test_classify(figures, status, fails, fails_strict):
    assert aot_report.classify({"target": "gfx942", **figures}) == (status, fails)
    assert (
        aot_report.classify({"target": "gfx942", **figures}, fail_on_spill=True)[1] is fails_strict
    )


def test_lds_limits_and_sm90_spill():
    assert aot_report.classify({"target": "gfx950", "lds_bytes": 160 * 1024})[0] == "OK"
    assert aot_report.classify({"target": "sm_90", "lds_bytes": 232449})[0] == "ERROR"
    rec = {"target": "sm_90", "lds_bytes": 0, "spill_stores": 0, "spill_loads": 8}
    assert aot_report.classify(rec)[0] == "SPILL"


def test_select_indices():
    defaults = [False, True, False, False, False, False, True]
    assert ac.select_indices(defaults, None) == list(range(7))
    assert ac.select_indices(defaults, 0) == [1, 6]
    picked = ac.select_indices(defaults, 2)
    assert {1, 6} <= set(picked) and len(picked) == 4
    assert ac.select_indices(defaults, 99) == list(range(7))


def test_specialization_hints():
    fn = SimpleNamespace(arg_names=["x_ptr", "n", "stride", "one", "BLOCK"])
    spec = SimpleNamespace(
        fn=fn,
        signature={"x_ptr": "*bf16", "n": "i32", "stride": "i32:16", "one": "i32:1"},
        constexprs={"BLOCK": 64},
    )
    sig, consts, attrs = ac.specialization(spec, "cuda", jit_hints=True)
    assert sig == {
        "x_ptr": "*bf16",
        "n": "i32",
        "stride": "i32",
        "one": "constexpr",
        "BLOCK": "constexpr",
    }
    assert consts == {"BLOCK": 64, "one": 1}
    assert attrs == {(0,): [["tt.divisibility", 16]], (2,): [["tt.divisibility", 16]]}
    _, _, attrs = ac.specialization(spec, "cuda", jit_hints=False)
    assert attrs == {(2,): [["tt.divisibility", 16]]}
    _, _, attrs = ac.specialization(spec, "hip", jit_hints=True)
    assert ["tt.divisibility", 16] in attrs[(0,)]
    bad = SimpleNamespace(fn=fn, signature={"n": "i32:8"}, constexprs={})
    with pytest.raises(ValueError, match="only :16 and :1"):
        ac.specialization(bad, "hip")


def test_backend_options_drop_amd_only_on_cuda():
    from triton.backends.compiler import GPUTarget

    opts = {"num_warps": 8, "num_stages": 3, "waves_per_eu": 2, "matrix_instr_nonkdim": 16}
    kept, dropped = ac.backend_options(GPUTarget("cuda", 90, 32), opts)
    assert kept == {"num_warps": 8, "num_stages": 3}
    assert dropped == ["matrix_instr_nonkdim", "waves_per_eu"]
    kept, dropped = ac.backend_options(GPUTarget("hip", "gfx942", 64), opts)
    assert kept == opts and dropped == []


def test_summary_and_markdown(tmp_path):
    results = [
        {
            "target": "gfx942",
            "kernel": "k",
            "config": "big",
            "default": True,
            "vgpr_count": 256,
            "agpr_count": 0,
            "sgpr_count": 70,
            "vgpr_spill_count": 12,
            "sgpr_spill_count": 0,
            "private_segment_fixed_size": 48,
            "lds_bytes": 32768,
            "mfma_count": 64,
            "compile_s": 2.5,
            "notes": [],
        },
        {"target": "gfx942", "kernel": "k", "config": "bad", "error": "E: x", "notes": []},
    ]
    for r in results:
        aot_report.classify(r)
    lines, code = aot_report.summarize(results, ["gfx942"], 3.0, fail_on_spill=False)
    text = "\n".join(lines)
    assert code == 1 and "1 SPILL, 1 ERROR" in text and "big (default)" in text
    assert aot_report.summarize(results[:1], ["gfx942"], 1.0, False)[1] == 0
    assert aot_report.summarize(results[:1], ["gfx942"], 1.0, True)[1] == 1
    out = tmp_path / "r.md"
    aot_report.write_markdown(out, results, ["gfx942"], lines, {"triton": "x"})
    md = out.read_text()
    assert "## gfx942" in md and "| 12/0 |" in md and "| SPILL |" in md and "| ERROR |" in md


# ---- one real compile ---------------------------------------------------------------------


def _tiny_dot(x_ptr, y_ptr, out_ptr, stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs[:, None] * stride + offs[None, :])
    y = tl.load(y_ptr + offs[:, None] * stride + offs[None, :])
    acc = tl.dot(x, y)
    tl.store(out_ptr + offs[:, None] * stride + offs[None, :], acc)


@functools.cache
def _tiny_jit():
    # Wrapped explicitly: under TRITON_INTERPRET=1 (the CPU test tier) @triton.jit would give
    # an interpreter function, which cannot be compiled ahead of time.
    from triton.runtime.jit import JITFunction

    return JITFunction(_tiny_dot)


def aot_specs(target: str):
    """Lets this module stand in for a kernel module (``--modules`` in the CLI test)."""
    from primus_turbo.triton.aot import AotSpec

    return [
        AotSpec(
            name="tiny_dot_b32",
            fn=_tiny_jit(),
            signature={"x_ptr": "*fp16", "y_ptr": "*fp16", "out_ptr": "*fp32", "stride": "i32:16"},
            constexprs={"BLOCK": 32},
            options={"num_warps": 4, "num_stages": 1, "waves_per_eu": 0},
            default=True,
        )
    ]


@pytest.mark.timeout(30)
def test_real_compile_through_cli(tmp_path):
    """One real AOT compile of a tiny dot kernel for gfx942 (and sm_90, through ptxas).

    Runs the CLI in a subprocess: the test tier imports Triton under TRITON_INTERPRET=1, which
    turns Triton's own library functions into interpreter objects, so no in-process compile.
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "unused-cache")
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "aot_check.py"),
        "--modules",
        __name__,
        "--targets",
        "gfx942,sm_90",
        "--jobs",
        "1",
        "--out",
        str(md),
        "--json",
        str(js),
        "--fail-on-spill",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=28)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: PASS" in proc.stdout
    amd, nv = json.loads(js.read_text())["results"]
    assert amd["target"] == "gfx942" and amd["config"] == "tiny_dot_b32"
    assert amd["status"] == "OK" and amd.get("error") is None
    assert 0 < amd["vgpr_count"] <= 512 and amd["sgpr_count"] > 0
    assert amd["vgpr_spill_count"] == 0 and amd["private_segment_fixed_size"] == 0
    assert amd["mfma_count"] > 0  # the dot runs on the matrix cores
    assert 0 <= amd["lds_bytes"] <= aot_parse.LDS_LIMITS["gfx942"]
    assert nv["target"] == "sm_90" and nv["status"] == "OK" and 0 < nv["regs"] <= 255
    assert "dropped waves_per_eu" in nv["notes"]
    text = md.read_text()
    assert "## gfx942" in text and "## sm_90" in text and "tiny_dot_b32" in text
