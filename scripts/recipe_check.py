#!/usr/bin/env python3
"""Renders recipe/meta.yaml offline for every variant and checks its required keys.

conda-build is not needed: the jinja2 context mimics the parts of conda-build the recipe uses
(``environ``, the variant keys, ``py``, ``compiler()``, ``pin_compatible()``), line selectors
(``# [linux]``) are evaluated for linux-64, and the result is parsed as YAML.

    recipe_check.py                      # check every variant, one line each (make lint)
    recipe_check.py --show gfx950        # also print the rendered recipe of that variant
    recipe_check.py --json out.json      # rendered variants as JSON (used by conda_from_wheel.py)

Exit status 1 lists every problem found.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
from pathlib import Path

import jinja2
import yaml

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipe"
ARCH_RE = re.compile(r"^gfx[0-9a-f]+$")
# conda version: no '-' and no spaces (conda-build rejects them)
CONDA_VERSION_RE = re.compile(r"^[0-9A-Za-z_.+!]+$")
SELECTOR_RE = re.compile(r"^(?P<line>.*?)\s*#\s*\[(?P<expr>[^\]]+)\]\s*$")
SELECTOR_NS = {"linux": True, "linux64": True, "unix": True, "x86_64": True, "win": False,
               "osx": False, "aarch64": False}  # fmt: skip


def apply_selectors(text: str, variant: dict) -> str:
    """Drops lines whose ``# [expr]`` selector is false (conda-build semantics, linux-64)."""
    ns = dict(SELECTOR_NS, **variant)
    out = []
    for line in text.splitlines():
        m = SELECTOR_RE.match(line)
        if m and not line.lstrip().startswith("#"):
            if not eval(m.group("expr"), {"__builtins__": {}}, ns):  # noqa: S307 (own file)
                continue
            line = m.group("line")
        out.append(line)
    return "\n".join(out) + "\n"


def load_variants(config: Path) -> list[dict]:
    """Cross product of the keys of conda_build_config.yaml."""
    raw = yaml.safe_load(apply_selectors(config.read_text(), {})) or {}
    keys = sorted(k for k in raw if k not in ("zip_keys", "pin_run_as_build"))
    values = [[str(v) for v in raw[k]] for k in keys]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


def pin_compatible_factory(variant: dict):
    def pin_compatible(name: str, max_pin: str = "x", min_pin: str = "x.x.x.x.x.x", **_):
        ver = variant.get(name.replace("-", "_"))
        if ver is None:
            return name
        parts = ver.split(".")
        n = max_pin.count("x")
        upper = parts[:n] + ["0"] * max(0, n - len(parts))
        upper[-1] = str(int(upper[-1]) + 1)
        return f"{name} >={ver},<{'.'.join(upper)}.0a0"

    return pin_compatible


def render(variant: dict, environ: dict | None = None) -> dict:
    """The recipe rendered for ``variant`` as a dict (raises on a template/YAML error)."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    text = apply_selectors((RECIPE / "meta.yaml").read_text(), variant)
    ctx = dict(variant)
    ctx.update(
        environ=dict(environ if environ is not None else os.environ),
        py=variant.get("python", "3.12").replace(".", ""),
        compiler=lambda lang: f"{lang}_compiler_stub",
        pin_compatible=pin_compatible_factory(variant),
    )
    return yaml.safe_load(env.from_string(text).render(**ctx))


def check(meta: dict, variant: dict) -> list[str]:
    """Problems in one rendered variant."""
    errs = []

    def get(path: str):
        cur = meta
        for part in path.split("."):
            if not isinstance(cur, dict) or part not in cur:
                errs.append(f"missing key {path}")
                return None
            cur = cur[part]
        if cur in (None, "", []):
            errs.append(f"empty key {path}")
        return cur

    name = get("package.name")
    version = str(get("package.version") or "")
    if name and name != "primus-turbo":
        errs.append(f"package.name is {name!r}, expected 'primus-turbo'")
    if version and not CONDA_VERSION_RE.match(version):
        errs.append(f"package.version {version!r} is not a valid conda version")
    get("source.path")
    get("build.number")
    string = str(get("build.string") or "")
    archs = variant["gpu_archs"].split(";")
    for arch in archs:
        if not ARCH_RE.match(arch):
            errs.append(f"variant arch {arch!r} is not a gfx arch (never 'native')")
        if arch not in string.split("_"):
            errs.append(f"build.string {string!r} does not carry arch {arch}")
    env_lines = get("build.script_env") or []
    if f"GPU_ARCHS={variant['gpu_archs']}" not in env_lines:
        errs.append("build.script_env does not pass GPU_ARCHS of the variant")
    host = [str(x) for x in get("requirements.host") or []]
    run = [str(x) for x in get("requirements.run") or []]
    torch_host = [r for r in host if r.split()[0] == "pytorch"]
    if torch_host != [f"pytorch {variant['pytorch']}"]:
        errs.append(f"requirements.host pins pytorch as {torch_host}, want the variant's")
    torch_run = [r for r in run if r.split()[0] == "pytorch"]
    if len(torch_run) != 1 or "<" not in torch_run[0] or ">=" not in torch_run[0]:
        errs.append(f"requirements.run needs one bounded pytorch pin, got {torch_run}")
    if "primus_turbo" not in (get("test.imports") or []):
        errs.append("test.imports lacks primus_turbo")
    commands = " ".join(get("test.commands") or [])
    if "check_code_objects.py" not in commands or variant["gpu_archs"] not in commands:
        errs.append("test.commands do not check the code objects of the variant's archs")
    get("about.license")
    return errs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--show", metavar="GPU_ARCHS", help="print the rendered recipe of a variant")
    ap.add_argument("--json", type=Path, help="write the rendered variants to this JSON file")
    args = ap.parse_args(argv)

    variants = load_variants(RECIPE / "conda_build_config.yaml")
    problems, rendered, strings = [], [], {}
    for v in variants:
        tag = ",".join(f"{k}={v[k]}" for k in sorted(v))
        try:
            meta = render(v)
        except (jinja2.TemplateError, yaml.YAMLError) as exc:
            problems.append(f"[{tag}] does not render: {exc}")
            continue
        errs = check(meta, v)
        string = str(meta.get("build", {}).get("string"))
        if string in strings:
            errs.append(f"build.string {string} also used by [{strings[string]}]")
        strings[string] = tag
        problems += [f"[{tag}] {e}" for e in errs]
        status = "ok" if not errs else f"{len(errs)} problem(s)"
        print(f"recipe variant {tag}: {meta['package']['version']} {string} {status}")
        rendered.append({"variant": v, "meta": meta})
        if args.show is not None and v.get("gpu_archs") == args.show:
            print(yaml.safe_dump(meta, sort_keys=False))
    if not variants:
        problems.append("conda_build_config.yaml defines no variants")
    if args.json:
        args.json.write_text(json.dumps(rendered, indent=1))
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
