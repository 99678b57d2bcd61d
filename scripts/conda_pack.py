#!/usr/bin/env python3
"""Packs a built primus_turbo wheel as a conda package (.conda), without conda-build.

`make conda-build` uses conda-build on recipe/ where it is installed; on machines without it
(CI here) it builds the wheel and runs this script, so the channel flow is exercised for real:

    conda_pack.py --wheel dist/primus_turbo-*.whl --gpu-archs "gfx942;gfx950" --out build/conda

Name, version, build string and run requirements come from recipe/meta.yaml rendered for the
variant (scripts/recipe_check.py), with ``--variant pytorch=2.13`` etc. to match the torch the
wheel was really built against. A wheel whose extension holds no AMD code objects (a CPU build)
gets ``cpu`` instead of the arch set in its build string, so it can never pass for a GPU build.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import check_code_objects  # noqa: E402
import recipe_check  # noqa: E402


def wheel_version(whl: Path) -> str:
    """The version field of a wheel file name (name-version-tags.whl)."""
    return whl.name.split("-")[1]


def pack(whl: Path, out_dir: Path, variant: dict, python: str) -> Path:
    """Writes <name>-<version>-<build>.conda into ``out_dir``; returns its path."""
    from conda_package_handling import api as cph

    version = wheel_version(whl)
    meta = recipe_check.render(variant, environ={"PRIMUS_TURBO_BUILD_VERSION": version})
    errs = recipe_check.check(meta, variant)
    if errs:
        raise SystemExit("error: recipe does not render cleanly: " + "; ".join(errs))
    name, build = meta["package"]["name"], str(meta["build"]["string"])
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp)
        site = prefix / "lib" / f"python{python}" / "site-packages"
        site.mkdir(parents=True)
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(site)
        ext_names = check_code_objects.EXTENSION_NAMES
        sos = [p for p in site.rglob("*.so") if p.name.startswith(ext_names)]
        if not any(check_code_objects.archs_in(p) for p in sos):
            arch_tag = variant["gpu_archs"].replace(";", "_")
            build = build.replace(f"_{arch_tag}_", "_cpu_")
            print(f"note: no AMD code objects in {whl.name}: build string {build}")
        depends = [f"python {python}.*"]
        for req in meta["requirements"]["run"]:
            if str(req).split()[0] != "python":
                depends.append(str(req))
        files = sorted(str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file())
        paths = []
        for rel in files:
            data = (prefix / rel).read_bytes()
            paths.append({"_path": rel, "path_type": "hardlink",
                          "sha256": hashlib.sha256(data).hexdigest(),
                          "size_in_bytes": len(data)})  # fmt: skip
        info = prefix / "info"
        info.mkdir()
        index = {
            "name": name,
            "version": version,
            "build": build,
            "build_number": int(meta["build"]["number"]),
            "depends": depends,
            "arch": "x86_64",
            "platform": "linux",
            "subdir": "linux-64",
            "license": meta["about"]["license"],
            "timestamp": int(time.time() * 1000),
        }
        (info / "index.json").write_text(json.dumps(index, indent=2))
        (info / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}))
        (info / "files").write_text("\n".join(files) + "\n")
        (info / "about.json").write_text(json.dumps(meta["about"]))
        out_dir.mkdir(parents=True, exist_ok=True)
        fn = f"{name}-{version}-{build}.conda"
        all_files = [str(p.relative_to(prefix)) for p in prefix.rglob("*") if p.is_file()]
        cph.create(str(prefix), all_files, fn, out_folder=str(out_dir))
    print(f"packed {out_dir / fn}")
    return out_dir / fn


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheel", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("build/conda"))
    ap.add_argument("--gpu-archs", default="gfx942;gfx950")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                    help="override a variant key (e.g. pytorch=2.13)")  # fmt: skip
    ap.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    args = ap.parse_args(argv)
    variants = recipe_check.load_variants(recipe_check.RECIPE / "conda_build_config.yaml")
    variant = next((v for v in variants if v["gpu_archs"] == args.gpu_archs), None)
    if variant is None:
        raise SystemExit(f"error: no recipe variant with gpu_archs={args.gpu_archs!r}")
    variant = dict(variant, python=args.python)
    for kv in args.variant:
        key, _, value = kv.partition("=")
        variant[key] = value
    if not re.fullmatch(r"\d+\.\d+", variant["pytorch"]):
        raise SystemExit(f"error: pytorch variant must be X.Y, got {variant['pytorch']!r}")
    pack(args.wheel, args.out, variant, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
