#!/usr/bin/env python3
"""Ahead-of-time compile check of every Triton kernel config for gfx942, gfx950 and sm_90.

Why: no AMD GPU is reachable from development machines or CI, so this check is our only view of
the code Triton generates for AMD. Triton's HIP backend runs on the CPU, so every config the
kernels can launch with is compiled here for gfx942 (MI300X/MI325X) and gfx950 (MI350X/MI355X),
and, for comparison with the lent H200, for sm_90. A config that spills registers or overflows
LDS would otherwise only show up as a slow or failing kernel on hardware we cannot test on.

What: for each module in ``primus_turbo.triton.KERNEL_MODULES``, ``aot_specs(target)`` lists the
specialisations (``AotSpec``: jit function, signature, constexprs, compile options). Each is
compiled with ``triton.compile(ASTSource(...), target=GPUTarget(...))`` in a process pool.

The compile mirrors a JIT launch: Triton specialises arguments at launch (pointers 16-byte
aligned, on AMD inside 2 GiB -> buffer ops; integers equal to 1 become constants; integers
divisible by 16 get a divisibility hint), and that changes register use a lot (unhinted strides
turn vector loads into per-element ones and can double the registers). Pointers get the JIT's
hints by default (``--no-jit-hints`` turns that off); integer arguments take Triton's AOT hint
syntax in the spec's type string: ``"i32:16"`` (divisible by 16), ``"i32:1"`` (equal to 1).

Then:

- AMD targets: the AMDGCN text's ``amdhsa.kernels`` metadata gives ``.vgpr_count``,
  ``.agpr_count``, ``.sgpr_count``, ``.vgpr_spill_count``, ``.sgpr_spill_count``,
  ``.private_segment_fixed_size`` (scratch bytes) and ``.group_segment_fixed_size`` (static LDS);
  Triton's dynamic LDS comes from ``compiled.metadata.shared``. ``v_mfma`` instructions are
  counted as a sanity check that the matrix cores are used (a ``tt.dot`` without MFMA is flagged).
- sm_90: ``ptxas -v`` on the PTX (the ptxas Triton itself uses, else the one on PATH) gives
  registers, spill stores/loads and stack; ``wgmma.mma_async`` instructions are counted.
- LDS/shared memory over the target's limit (gfx942 64 KiB, gfx950 160 KiB, sm_90 227 KiB) is an
  ERROR, as is a compile failure. Spilling configs are flagged SPILL (an error with
  ``--fail-on-spill``).

Compile options a backend does not know (``waves_per_eu`` and ``matrix_instr_nonkdim`` on CUDA)
are dropped for that target and noted. Compiles use a fresh Triton cache (unless ``--cache-dir``)
so that the compile times in the report are real. ``TRITON_INTERPRET`` is ignored here.

Output: a markdown report (``--out``, one table per target plus a summary), optional JSON
(``--json``) and the summary on stdout. Exit status 1 on any ERROR (or SPILL with
``--fail-on-spill``), else 0.

Usage: python scripts/aot_check.py [--targets gfx942 gfx950 sm_90] [--sample N] [--jobs 2]
                                   [--out build/aot_report.md] [--json PATH] [--fail-on-spill]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # check the kernels of this tree, installed or not

# LDS / shared memory per workgroup (CTA), bytes.
LDS_LIMITS: dict[str, int] = {"gfx942": 64 * 1024, "gfx950": 160 * 1024, "sm_90": 232448}
AMD_META_KEYS = (
    "vgpr_count",
    "agpr_count",
    "sgpr_count",
    "vgpr_spill_count",
    "sgpr_spill_count",
    "private_segment_fixed_size",
    "group_segment_fixed_size",
)
OK, SPILL, ERROR = "OK", "SPILL", "ERROR"


# ---- parsers (pure text, unit-tested) ------------------------------------------------------


def parse_amdgcn_metadata(asm: str) -> dict[str, dict[str, int]]:
    """Per-kernel register/memory figures from the ``amdhsa.kernels`` YAML block of AMDGCN text.

    Returns ``{kernel_name: {key: int}}`` with the keys of ``AMD_META_KEYS`` that are present
    (without the leading dot). Keys of nested entries (``.args``) are ignored.
    """
    kernels: dict[str, dict[str, int]] = {}
    in_block = False
    current: dict[str, Any] | None = None
    key_indent = None

    def flush() -> None:
        if current is not None:
            name = str(current.pop("name", f"kernel{len(kernels)}"))
            kernels[name] = current

    for line in asm.splitlines():
        stripped = line.strip()
        if stripped.startswith("amdhsa.kernels:"):
            in_block = True
            continue
        if not in_block:
            continue
        if stripped.startswith(".end_amdgpu_metadata") or (
            line[:1] not in ("", " ", "\t", "-") and not stripped.startswith("- ")
        ):
            break  # next top-level key (amdhsa.target, amdhsa.version) or end of block
        m = re.match(r"^(\s*)-\s+\.(\w+):\s*(.*)$", line)
        if m and (key_indent is None or len(m.group(1)) + 2 == key_indent):
            flush()  # "  - .first_key: value" starts the next kernel
            current = {}
            key_indent = len(m.group(1)) + 2
            key, value = m.group(2), m.group(3)
        else:
            m = re.match(r"^(\s*)\.(\w+):\s*(.*)$", line)
            if not m or current is None or len(m.group(1)) != key_indent:
                continue
            key, value = m.group(2), m.group(3)
        value = value.strip().strip("'\"")
        if key == "name":
            current["name"] = value
        elif key in AMD_META_KEYS:
            try:
                current[key] = int(value)
            except ValueError:
                pass
    flush()
    return kernels


def amdgcn_kernel_info(asm: str, kernel_name: str | None = None) -> dict[str, int]:
    """Metadata of ``kernel_name`` (or of the only/first kernel) plus MFMA count and occupancy."""
    kernels = parse_amdgcn_metadata(asm)
    if not kernels:
        raise ValueError("no amdhsa.kernels metadata in the AMDGCN text")
    info = dict(kernels.get(kernel_name) or next(iter(kernels.values())))
    info["mfma_count"] = count_mfma(asm)
    occ = re.search(r"^;\s*Occupancy:\s*(\d+)", asm, re.MULTILINE)
    if occ:
        info["occupancy"] = int(occ.group(1))
    return info


def count_mfma(asm: str) -> int:
    """Number of MFMA instructions (``v_mfma*``, incl. gfx950 scaled MFMA) in AMDGCN text."""
    return sum(1 for line in asm.splitlines() if line.lstrip().startswith("v_mfma"))


def count_wgmma(ptx: str) -> int:
    """Number of Hopper warpgroup MMA instructions (``wgmma.mma_async``) in PTX."""
    return sum(1 for line in ptx.splitlines() if "wgmma.mma_async" in line)


def ptx_target(ptx: str, default: str = "sm_90") -> str:
    """The ``.target`` of a PTX module (Triton emits ``sm_90a`` when it uses wgmma)."""
    m = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE)
    return m.group(1) if m else default


def parse_ptxas_output(text: str, kernel_name: str | None = None) -> dict[str, int]:
    """Registers, spills, stack and static smem of one entry from ``ptxas -v`` output.

    Handles both the CUDA 12/13 layout (spills on a "Function properties" line) and older
    ones. Picks ``kernel_name`` if given, else the first entry function.
    """
    blocks = re.split(r"Compiling entry function '([^']+)'", text)
    # blocks = [preamble, name1, body1, name2, body2, ...]
    entries = {blocks[i]: blocks[i + 1] for i in range(1, len(blocks) - 1, 2)}
    if not entries:
        raise ValueError("no entry function in ptxas output")
    body = entries.get(kernel_name) if kernel_name else None
    if body is None:
        body = next(iter(entries.values()))
    patterns = {
        "regs": r"Used (\d+) registers",
        "spill_stores": r"(\d+) bytes spill stores",
        "spill_loads": r"(\d+) bytes spill loads",
        "stack_bytes": r"(\d+) bytes stack frame",
        "smem_static": r"(\d+) bytes smem",
    }
    info = {}
    for key, pat in patterns.items():
        m = re.search(pat, body)
        info[key] = int(m.group(1)) if m else 0
    return info


# ---- compiling one spec --------------------------------------------------------------------


def find_ptxas() -> str | None:
    """The ptxas Triton uses (bundled, or ``TRITON_PTXAS_PATH``), else the one on PATH."""
    try:
        from triton import knobs

        path = knobs.nvidia.ptxas.path
        if path and os.path.exists(path):
            return path
    except Exception:
        pass
    return shutil.which("ptxas")


def run_ptxas(ptx: str, ptxas: str | None = None) -> dict[str, int]:
    """``ptxas -v --gpu-name <PTX .target>`` on ``ptx``; returns ``parse_ptxas_output``."""
    ptxas = ptxas or find_ptxas()
    if not ptxas:
        raise FileNotFoundError("ptxas not found (neither Triton's nor on PATH)")
    with tempfile.TemporaryDirectory(prefix="aot_ptxas_") as tmp:
        src = Path(tmp, "kernel.ptx")
        src.write_text(ptx)
        cmd = [ptxas, "-v", "--gpu-name", ptx_target(ptx), str(src), "-o", str(Path(tmp, "k.o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed ({proc.returncode}): {out.strip()[-2000:]}")
    return parse_ptxas_output(out)


def backend_options(target, options: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Split ``options`` into those the target's Triton backend knows and the dropped names."""
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)
    known = {f.name for f in dataclasses.fields(type(backend.parse_options({})))}
    kept = {k: v for k, v in options.items() if k in known}
    return kept, sorted(k for k in options if k not in known)


def _check_args(spec) -> str | None:
    """An error message if signature + constexprs do not match the jit function's arguments."""
    params = getattr(spec.fn, "params", None)
    if params is None:
        return None
    names = [p.name for p in params]
    const = {p.name for p in params if p.is_constexpr}
    missing = [n for n in names if n not in spec.signature and n not in spec.constexprs]
    unknown = [n for n in list(spec.signature) + list(spec.constexprs) if n not in names]
    sig_const = [n for n in spec.signature if n in const]
    problems = []
    if missing:
        problems.append(f"arguments without signature or constexpr value: {missing}")
    if unknown:
        problems.append(f"names that are not arguments of {spec.fn.__name__}: {unknown}")
    if sig_const:
        problems.append(f"constexpr arguments typed in the signature: {sig_const}")
    return "; ".join(problems) or None


def _single_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def classify(rec: dict[str, Any], fail_on_spill: bool = False) -> tuple[str, bool]:
    """Sets ``rec['status']`` (OK / SPILL / ERROR) from the figures; returns (status, is_failure).

    ERROR: compile failed, or LDS/shared bytes over the target's limit. SPILL: any register
    spill (VGPR/SGPR spill counts on AMD, spill stores/loads on sm_90).
    """
    target = rec["target"]
    if rec.get("error"):
        rec["status"] = ERROR
    elif rec.get("lds_bytes", 0) > LDS_LIMITS[target]:
        rec["status"] = ERROR
        rec["error"] = f"LDS {rec['lds_bytes']} B > {target} limit {LDS_LIMITS[target]} B"
    elif (
        rec.get("vgpr_spill_count", 0)
        or rec.get("sgpr_spill_count", 0)
        or rec.get("spill_stores", 0)
        or rec.get("spill_loads", 0)
    ):
        rec["status"] = SPILL
    else:
        rec["status"] = OK
    failing = rec["status"] == ERROR or (fail_on_spill and rec["status"] == SPILL)
    return rec["status"], failing


def specialization(
    spec, backend: str, jit_hints: bool = True
) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list]]:
    """``(signature, constexprs, attrs)`` for ``ASTSource``, mirroring what a JIT launch sees.

    Type strings may carry Triton's AOT hints (as in ``triton/tools/compile.py``): ``i32:16``
    (value divisible by 16 -> ``tt.divisibility``) and ``i32:1`` (value is 1 -> constexpr 1,
    as the JIT specialises it). With ``jit_hints``, pointers are assumed 16-byte aligned (torch
    allocations are) and, on AMD, inside a 2 GiB range (buffer loads/stores), which is what
    the JIT infers for ordinary tensors. Constexpr arguments appear in the signature as
    ``"constexpr"`` (Triton 3.6).
    """
    arg_names = list(spec.fn.arg_names)
    signature: dict[str, str] = {}
    constexprs = dict(spec.constexprs)
    attrs: dict[tuple[int, ...], list] = {}
    buffer_ops = False
    if backend == "hip" and jit_hints:
        from triton import knobs

        buffer_ops = bool(knobs.amd.use_buffer_ops)
    for name, ty in spec.signature.items():
        base, _, hint = str(ty).partition(":")
        idx = (arg_names.index(name),)
        if hint not in ("", "1", "16"):
            raise ValueError(f"{name}: hint {hint!r} in {ty!r}; only :16 and :1 are valid")
        if hint == "1":
            signature[name] = "constexpr"
            constexprs[name] = 1
            continue
        signature[name] = base
        hints = []
        if hint == "16" or (jit_hints and base.startswith("*")):
            hints.append(["tt.divisibility", 16])
        if buffer_ops and base.startswith("*"):
            hints.append(["tt.pointer_range", 32])
        if hints:
            attrs[idx] = hints
    signature.update({k: "constexpr" for k in spec.constexprs})
    return signature, constexprs, attrs


def compile_spec(
    spec, target_name: str, ptxas: str | None = None, jit_hints: bool = True
) -> dict[str, Any]:
    """Compiles one ``AotSpec`` for one target and returns its figures as a plain dict.

    Never raises: a failure lands in ``rec['error']`` (one line) and ``rec['traceback']``.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from primus_turbo.triton.aot import AOT_TARGETS

    rec: dict[str, Any] = {
        "target": target_name,
        "kernel": getattr(spec.fn, "__name__", str(spec.fn)),
        "config": spec.name,
        "default": bool(spec.default),
        "constexprs": {k: repr(v) for k, v in spec.constexprs.items()},
        "options": dict(spec.options),
        "notes": [],
    }
    t0 = time.perf_counter()
    try:
        problem = _check_args(spec)
        if problem:
            raise ValueError(problem)
        target = GPUTarget(*AOT_TARGETS[target_name])
        options, dropped = backend_options(target, dict(spec.options))
        ints = [t for t in spec.signature.values() if not str(t).startswith("*")]
        if ints and not any(":" in str(t) for t in ints):
            rec["notes"].append("no :16/:1 hints on integer args")
        if dropped:
            rec["notes"].append("dropped " + ",".join(dropped))
        signature, constexprs, attrs = specialization(spec, target.backend, jit_hints)
        src = ASTSource(fn=spec.fn, signature=signature, constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(src, target=target, options=options)
        rec["compile_s"] = round(time.perf_counter() - t0, 2)
        shared = int(getattr(compiled.metadata, "shared", 0) or 0)
        has_dot = "tt.dot" in str(compiled.asm.get("ttir", ""))
        if target.backend == "hip":
            info = amdgcn_kernel_info(compiled.asm["amdgcn"], compiled.metadata.name)
            rec.update(info)
            rec["lds_bytes"] = max(shared, info.get("group_segment_fixed_size", 0))
            if info.get("private_segment_fixed_size", 0) and not (
                info.get("vgpr_spill_count", 0) or info.get("sgpr_spill_count", 0)
            ):
                rec["notes"].append("scratch without spills")
            if has_dot and info["mfma_count"] == 0:
                rec["notes"].append("tt.dot without MFMA")
        else:
            ptx = compiled.asm["ptx"]
            rec["wgmma_count"] = count_wgmma(ptx)
            info = run_ptxas(ptx, ptxas)
            rec.update(info)
            rec["lds_bytes"] = max(shared, info.get("smem_static", 0))
            if has_dot and rec["wgmma_count"] == 0:
                on = "mma.sync" if "mma.sync" in ptx else "no tensor-core MMA"
                rec["notes"].append(f"tt.dot without wgmma ({on})")
    except Exception as exc:  # a compile failure is a result, not a crash of the check
        rec.setdefault("compile_s", round(time.perf_counter() - t0, 2))
        rec["error"] = f"{type(exc).__name__}: {_single_line(str(exc))}"
        rec["traceback"] = traceback.format_exc()
    classify(rec)
    return rec


# ---- spec enumeration and the pool ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Task:
    module: str
    target: str
    index: int  # position in aot_specs(target)
    name: str


def select_indices(defaults: Sequence[bool], sample: int | None) -> list[int]:
    """All indices, or every default plus up to ``sample`` others spread evenly over the list."""
    if sample is None:
        return list(range(len(defaults)))
    chosen = [i for i, d in enumerate(defaults) if d]
    others = [i for i, d in enumerate(defaults) if not d]
    n = min(max(sample, 0), len(others))
    if n:
        step = len(others) / n
        chosen += [others[int(j * step)] for j in range(n)]
    return sorted(set(chosen))


def enumerate_tasks(
    modules: Iterable[str], targets: Iterable[str], sample: int | None
) -> tuple[list[Task], list[dict[str, Any]]]:
    """The tasks to compile, and ERROR records for modules whose ``aot_specs`` fails."""
    tasks, errors = [], []
    for target in targets:
        for mod_name in modules:
            try:
                specs = importlib.import_module(mod_name).aot_specs(target)
            except Exception as exc:
                errors.append(
                    {
                        "target": target,
                        "kernel": mod_name,
                        "config": "aot_specs()",
                        "default": False,
                        "error": f"{type(exc).__name__}: {_single_line(str(exc))}",
                        "traceback": traceback.format_exc(),
                        "notes": [],
                    }
                )
                continue
            for i in select_indices([s.default for s in specs], sample):
                tasks.append(Task(mod_name, target, i, specs[i].name))
    return tasks, errors


def _worker_init(cache_dir: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ["TRITON_CACHE_DIR"] = cache_dir


def run_task(task: Task, ptxas: str | None = None, jit_hints: bool = True) -> dict[str, Any]:
    """Worker entry: rebuild the spec in this process (jit functions do not pickle) and compile."""
    specs = importlib.import_module(task.module).aot_specs(task.target)
    spec = specs[task.index]
    if spec.name != task.name:  # aot_specs must be deterministic
        raise RuntimeError(f"aot_specs({task.target}) order changed: {spec.name} != {task.name}")
    rec = compile_spec(spec, task.target, ptxas, jit_hints)
    rec["module"] = task.module
    return rec


def _crash_record(task: Task, why: str) -> dict[str, Any]:
    return {
        "target": task.target,
        "module": task.module,
        "kernel": task.module.rsplit(".", 1)[-1],
        "config": task.name,
        "default": False,
        "error": why,
        "notes": [],
    }


def run_tasks(
    tasks: Sequence[Task],
    jobs: int,
    cache_dir: str,
    ptxas: str | None,
    jit_hints: bool = True,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Compiles ``tasks`` in a spawn-based process pool (``jobs`` workers).

    A compiler crash (e.g. a segfault in LLVM) breaks the pool; the unfinished tasks are then
    retried one per fresh process, so only the crashing config is reported as an ERROR.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    results: list[dict[str, Any]] = []
    done = 0

    def report(rec: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        results.append(rec)
        if progress:
            print(
                f"[{done}/{len(tasks)}] {rec['target']:<7} {rec['config']:<58} "
                f"{rec.get('status', ERROR):<5} {rec.get('compile_s', 0):6.1f}s",
                flush=True,
            )

    def pool(n: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=n, mp_context=ctx, initializer=_worker_init, initargs=(cache_dir,)
        )

    retry: list[Task] = []
    with pool(max(1, jobs)) as ex:
        futures = {ex.submit(run_task, t, ptxas, jit_hints): t for t in tasks}
        for fut in as_completed(futures):
            task = futures[fut]
            try:
                report(fut.result())
            except BrokenProcessPool:
                retry.append(task)
            except Exception as exc:
                rec = _crash_record(task, f"{type(exc).__name__}: {_single_line(str(exc))}")
                classify(rec)
                report(rec)
    for task in retry:  # isolate: one process per task
        with pool(1) as ex:
            try:
                report(ex.submit(run_task, task, ptxas, jit_hints).result())
            except BrokenProcessPool:
                rec = _crash_record(task, "compiler process crashed (BrokenProcessPool)")
                classify(rec)
                report(rec)
    return results


# ---- report --------------------------------------------------------------------------------


def _fmt(v: Any) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def _notes(rec: dict[str, Any]) -> str:
    parts = list(rec.get("notes", []))
    if rec.get("error"):
        parts.insert(0, rec["error"])
    return "; ".join(parts).replace("|", "\\|")


def _row(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(_fmt(c) for c in cells) + " |"


def target_table(target: str, recs: Sequence[dict[str, Any]]) -> list[str]:
    amd = target != "sm_90"
    if amd:
        head = [
            "kernel", "config", "default", "VGPR", "AGPR", "SGPR", "spill (v/s)",
            "scratch B", "LDS B", "occ", "MFMA", "compile s", "status", "notes",
        ]  # fmt: skip
    else:
        head = [
            "kernel", "config", "default", "regs", "spill st/ld B", "stack B", "smem B",
            "wgmma", "compile s", "status", "notes",
        ]  # fmt: skip
    lines = [f"## {target} (LDS limit {LDS_LIMITS[target]} B)", "", _row(head)]
    lines.append("|" + "---|" * len(head))
    for r in recs:
        ok = r.get("lds_bytes") is not None  # figures exist (compiled, maybe over LDS)
        common = [r["kernel"], f"`{r['config']}`", "yes" if r.get("default") else ""]
        if amd:
            spill = f"{r.get('vgpr_spill_count')}/{r.get('sgpr_spill_count')}" if ok else None
            figs = [
                r.get("vgpr_count"), r.get("agpr_count"), r.get("sgpr_count"), spill,
                r.get("private_segment_fixed_size"), r.get("lds_bytes"), r.get("occupancy"),
                r.get("mfma_count"),
            ]  # fmt: skip
        else:
            spill = f"{r.get('spill_stores')}/{r.get('spill_loads')}" if ok else None
            figs = [
                r.get("regs"), spill, r.get("stack_bytes"), r.get("lds_bytes"),
                r.get("wgmma_count"),
            ]  # fmt: skip
        lines.append(_row(common + figs + [r.get("compile_s"), r["status"], _notes(r)]))
    return lines + [""]


def summarize(
    results: Sequence[dict[str, Any]], targets: Sequence[str], elapsed: float, fail_on_spill: bool
) -> tuple[list[str], int]:
    """Summary lines (markdown-compatible plain text) and the exit code."""
    lines = [f"AOT check: {len(results)} results in {elapsed:.1f} s"]
    failing = 0
    for t in targets:
        recs = [r for r in results if r["target"] == t]
        counts = {s: sum(r["status"] == s for r in recs) for s in (OK, SPILL, ERROR)}
        lines.append(
            f"- {t}: {len(recs)} configs, {counts[OK]} OK, {counts[SPILL]} SPILL, "
            f"{counts[ERROR]} ERROR"
        )
    for r in results:
        failing += classify(r, fail_on_spill)[1]
    spills = [r for r in results if r["status"] == SPILL]
    errors = [r for r in results if r["status"] == ERROR]
    warns = [r for r in results if r["status"] != ERROR and r.get("notes")]
    if spills:
        lines.append("")
        lines.append("Spilling configs" + (" (errors: --fail-on-spill)" if fail_on_spill else ""))
        for r in spills:
            if r["target"] == "sm_90":
                detail = (
                    f"{r['regs']} regs, spill stores {r['spill_stores']} B / loads "
                    f"{r['spill_loads']} B, stack {r['stack_bytes']} B"
                )
            else:
                detail = (
                    f"VGPR {r['vgpr_count']} AGPR {r['agpr_count']}, spills "
                    f"v{r['vgpr_spill_count']}/s{r['sgpr_spill_count']}, "
                    f"scratch {r['private_segment_fixed_size']} B"
                )
            star = " (default)" if r.get("default") else ""
            lines.append(f"- {r['target']} {r['config']}{star}: {detail}")
    if errors:
        lines.append("")
        lines.append("Errors")
        for r in errors:
            lines.append(f"- {r['target']} {r['config']}: {r['error']}")
    if warns:
        by_note: dict[str, list[str]] = {}
        for r in warns:
            for note in r["notes"]:
                by_note.setdefault(note, []).append(f"{r['target']} {r['config']}")
        lines.append("")
        lines.append("Notes")
        for note, where in by_note.items():
            shown = ", ".join(where[:4]) + (
                f", ... ({len(where)} in all)" if len(where) > 4 else ""
            )
            lines.append(f"- {note}: {shown}")
    lines.append("")
    lines.append("RESULT: " + ("FAIL" if failing else "PASS") + f" ({failing} failing)")
    return lines, 1 if failing else 0


def write_markdown(
    path: Path,
    results: Sequence[dict[str, Any]],
    targets: Sequence[str],
    summary: Sequence[str],
    header: dict[str, Any],
) -> None:
    lines = ["# Triton AOT compile report", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines.append("")
    for t in targets:
        lines += target_table(t, [r for r in results if r["target"] == t])
    lines += ["## Summary", ""]
    lines += list(summary)
    tracebacks = [r for r in results if r.get("traceback")]
    if tracebacks:
        lines += ["", "## Error details", ""]
        for r in tracebacks:
            lines += [f"### {r['target']} {r['config']}", "", "```", r["traceback"].rstrip(), "```"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# ---- CLI -----------------------------------------------------------------------------------


def _sort_key(targets: Sequence[str], order: dict[tuple[str, str], int]):
    def key(r: dict[str, Any]):
        t = r["target"]
        return (targets.index(t) if t in targets else 99, order.get((t, r["config"]), 10**6))

    return key


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from primus_turbo.triton.aot import AOT_TARGETS

    p = argparse.ArgumentParser(
        description="Compile every Triton kernel config ahead of time for gfx942/gfx950/sm_90 "
        "and report registers, spills and LDS.",
    )
    p.add_argument(
        "--targets",
        nargs="+",
        default=list(AOT_TARGETS),
        help=f"targets, space or comma separated (default: {' '.join(AOT_TARGETS)})",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=None,
        metavar="N",
        help="per module and target, compile the default spec(s) plus up to N others "
        "(default: all specs)",
    )
    p.add_argument("--jobs", type=int, default=2, help="compile processes (default 2)")
    p.add_argument("--out", default="build/aot_report.md", help="markdown report path")
    p.add_argument("--json", default=None, help="also write the raw figures as JSON here")
    p.add_argument("--fail-on-spill", action="store_true", help="a spilling config is an error")
    p.add_argument(
        "--modules",
        nargs="+",
        default=None,
        help="kernel modules to check (default: primus_turbo.triton.KERNEL_MODULES)",
    )
    p.add_argument("--filter", default=None, help="only configs whose name matches this regex")
    p.add_argument(
        "--cache-dir",
        default=None,
        help="Triton cache dir to use (default: a fresh temporary one, so times are real)",
    )
    p.add_argument(
        "--no-jit-hints",
        action="store_true",
        help="do not assume what a JIT launch of ordinary tensors implies (16-byte aligned "
        "pointers; on AMD, buffer ops within 2 GiB); only the specs' own :16/:1 hints apply",
    )
    p.add_argument("--ptxas", default=None, help="ptxas for the sm_90 figures (default: Triton's)")
    args = p.parse_args(argv)
    targets = [t for item in args.targets for t in item.split(",") if t]
    unknown = [t for t in targets if t not in AOT_TARGETS]
    if unknown:
        p.error(f"unknown target(s) {unknown}; choose from {list(AOT_TARGETS)}")
    args.targets = list(dict.fromkeys(targets))
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    # AOT needs real jit functions: the interpreter would turn @triton.jit into something else.
    os.environ.pop("TRITON_INTERPRET", None)
    args = parse_args(argv)
    import triton

    from primus_turbo.triton import KERNEL_MODULES

    modules = args.modules or list(KERNEL_MODULES)
    t0 = time.perf_counter()
    tasks, results = enumerate_tasks(modules, args.targets, args.sample)
    if args.filter:
        rx = re.compile(args.filter)
        tasks = [t for t in tasks if rx.search(t.name)]
    for r in results:
        classify(r)
    order = {(t.target, t.name): i for i, t in enumerate(tasks)}
    ptxas = args.ptxas or (find_ptxas() if "sm_90" in args.targets else None)
    print(
        f"AOT check: {len(tasks)} specs from {len(modules)} module(s) for "
        f"{', '.join(args.targets)}, {args.jobs} job(s), triton {triton.__version__}",
        flush=True,
    )
    tmp_cache = None
    cache_dir = args.cache_dir
    if cache_dir is None:
        tmp_cache = tempfile.mkdtemp(prefix="aot_check_cache_")
        cache_dir = tmp_cache
    try:
        results += run_tasks(tasks, args.jobs, cache_dir, ptxas, not args.no_jit_hints)
    finally:
        if tmp_cache:
            shutil.rmtree(tmp_cache, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    results.sort(key=_sort_key(args.targets, order))
    summary, code = summarize(results, args.targets, elapsed, args.fail_on_spill)
    header = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "triton": triton.__version__,
        "targets": ", ".join(args.targets),
        "modules": ", ".join(modules),
        "sample": "all" if args.sample is None else args.sample,
        "jobs": args.jobs,
        "ptxas": ptxas or "-",
        "jit hints": "off" if args.no_jit_hints else "on (aligned pointers; AMD buffer ops)",
        "wall time": f"{elapsed:.1f} s",
    }
    out = Path(args.out)
    write_markdown(out, results, args.targets, summary, header)
    if args.json:
        jpath = Path(args.json)
        jpath.parent.mkdir(parents=True, exist_ok=True)
        jpath.write_text(json.dumps({"header": header, "results": results}, indent=2) + "\n")
    print()
    print("\n".join(summary))
    print(f"report: {out}" + (f", json: {args.json}" if args.json else ""))
    return code


if __name__ == "__main__":
    sys.exit(main())
