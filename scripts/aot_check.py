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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # aot_parse / aot_report beside us

from aot_parse import (  # noqa: E402  (the parsers are re-exported: the tests use them here)
    ERROR,
    amdgcn_kernel_info,
    count_wgmma,
    find_ptxas,
    run_ptxas,
)
from aot_report import classify, summarize, write_markdown  # noqa: E402


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
