#!/usr/bin/env python3
"""Publishes conda packages into a private channel directory and indexes it (conda-index).

    conda_channel.py --channel /shared/conda-channel build/conda/*.conda
    conda install -c file:///shared/conda-channel primus-turbo

Each package (``.conda`` or ``.tar.bz2``) is copied into ``<channel>/<subdir>/``, the subdir
read from the package's own ``info/index.json`` (linux-64, noarch, ...); an existing file of the
same name is replaced only with ``--force``. ``noarch/`` always exists (conda clients read it).
Then ``python -m conda_index`` writes ``repodata.json`` per subdir; where conda-index cannot run
(it imports ``conda``, which some machines lack: CI here), a built-in indexer writes the same
``repodata.json`` layout (each package's index.json plus md5, sha256 and size). Either way the
script then checks that every published package is listed. Serve the directory over HTTP or a
shared filesystem.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from conda_package_streaming.package_streaming import stream_conda_info


def read_index_json(pkg: Path) -> dict:
    """The ``info/index.json`` of a .conda or .tar.bz2 package."""
    if not (pkg.suffix == ".conda" or pkg.name.endswith(".tar.bz2")):
        raise ValueError(f"{pkg}: not a .conda or .tar.bz2 package")
    with open(pkg, "rb") as fh:
        for tar, member in stream_conda_info(pkg.name, fh):
            if member.name == "info/index.json":
                return json.load(tar.extractfile(member))
    raise ValueError(f"{pkg}: no info/index.json")


def conda_index_usable() -> bool:
    """True when ``python -m conda_index`` can run (it needs the ``conda`` package too)."""
    probe = [sys.executable, "-c", "import conda_index.index"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def builtin_index(channel: Path) -> None:
    """Writes <subdir>/repodata.json for every subdir of ``channel`` (conda-index's layout)."""
    for subdir in sorted(p for p in channel.iterdir() if p.is_dir()):
        packages: dict[str, dict] = {}
        packages_conda: dict[str, dict] = {}
        for pkg in sorted(subdir.iterdir()):
            if not (pkg.suffix == ".conda" or pkg.name.endswith(".tar.bz2")):
                continue
            record = read_index_json(pkg)
            data = pkg.read_bytes()
            record.update(
                md5=hashlib.md5(data).hexdigest(),
                sha256=hashlib.sha256(data).hexdigest(),
                size=len(data),
            )
            (packages_conda if pkg.suffix == ".conda" else packages)[pkg.name] = record
        repodata = {
            "info": {"subdir": subdir.name},
            "packages": packages,
            "packages.conda": packages_conda,
            "removed": [],
            "repodata_version": 1,
        }
        (subdir / "repodata.json").write_text(json.dumps(repodata, indent=2, sort_keys=True))
        print(f"indexed {subdir.name}/: {len(packages) + len(packages_conda)} package(s)")


def index(channel: Path, use_conda_index: bool | None = None) -> None:
    """Indexes ``channel`` with conda-index, else with the built-in indexer."""
    if use_conda_index is None:
        use_conda_index = conda_index_usable()
    if use_conda_index:
        cmd = [sys.executable, "-m", "conda_index", "--no-progress", str(channel)]
        subprocess.run(cmd, check=True)
    else:
        print("conda-index unusable here (no `conda` package): built-in indexer")
        builtin_index(channel)


def publish(packages: list[Path], channel: Path, force: bool = False) -> dict[str, list[str]]:
    """Copies packages into the channel, indexes it, checks repodata; returns {subdir: [file]}."""
    placed: dict[str, list[str]] = {}
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    for pkg in packages:
        meta = read_index_json(pkg)
        subdir = meta.get("subdir") or "noarch"
        dest = channel / subdir / pkg.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists() and not force:
            raise SystemExit(f"error: {dest} exists (a published build is immutable; --force)")
        shutil.copy2(pkg, dest)
        placed.setdefault(subdir, []).append(pkg.name)
        print(f"published {pkg.name} -> {subdir}/ ({meta['name']} {meta['version']} "
              f"{meta['build']})")  # fmt: skip
    index(channel)
    for subdir, names in placed.items():
        repodata = json.loads((channel / subdir / "repodata.json").read_text())
        listed = set(repodata.get("packages", {})) | set(repodata.get("packages.conda", {}))
        missing = sorted(set(names) - listed)
        if missing:
            raise SystemExit(f"error: {subdir}/repodata.json does not list {missing}")
    return placed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--channel", type=Path, required=True, help="channel directory")
    ap.add_argument("--force", action="store_true", help="replace packages of the same name")
    ap.add_argument("packages", nargs="*", type=Path, help=".conda / .tar.bz2 files")
    args = ap.parse_args(argv)
    if not args.packages:
        print("no packages given: indexing the channel as it is")
        args.channel.mkdir(parents=True, exist_ok=True)
        (args.channel / "noarch").mkdir(exist_ok=True)
        index(args.channel)
        return 0
    publish(args.packages, args.channel, args.force)
    url = args.channel.resolve().as_uri()
    print(f"channel ready: conda install -c {url} primus-turbo")
    return 0


if __name__ == "__main__":
    sys.exit(main())
