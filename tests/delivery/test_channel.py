"""scripts/conda_pack.py + conda_channel.py: a test package lands in a channel whose
repodata.json is valid (checked field by field, and parsed by py-rattler when installed)."""

from __future__ import annotations

import hashlib
import json
import zipfile

import pytest

conda_channel = pytest.importorskip("conda_channel")
conda_pack = pytest.importorskip("conda_pack")


def _fake_wheel(tmp_path, version="1.0.0"):
    whl = tmp_path / f"primus_turbo-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr("primus_turbo/__init__.py", "__version__ = '1.0.0'\n")
        zf.writestr(f"primus_turbo-{version}.dist-info/METADATA", "Name: primus-turbo\n")
    return whl


@pytest.fixture
def package(tmp_path):
    variants = conda_pack.recipe_check.load_variants(
        conda_pack.recipe_check.RECIPE / "conda_build_config.yaml"
    )
    variant = dict(next(v for v in variants if v["gpu_archs"] == "gfx950"), python="3.12")
    return conda_pack.pack(_fake_wheel(tmp_path), tmp_path / "pkgs", variant, "3.12")


def test_pack_names_cpu_build(package):
    # no AMD code objects in the fake wheel: never labelled as a gfx950 build
    assert package.name == "primus-turbo-1.0.0-py312_torch28_cpu_0.conda"
    meta = conda_channel.read_index_json(package)
    assert meta["subdir"] == "linux-64"
    assert "pytorch >=2.8,<2.9.0a0" in meta["depends"]
    assert "python 3.12.*" in meta["depends"]


def test_publish_writes_valid_repodata(package, tmp_path):
    channel = tmp_path / "channel"
    placed = conda_channel.publish([package], channel)
    assert placed == {"linux-64": [package.name]}
    repodata = json.loads((channel / "linux-64" / "repodata.json").read_text())
    assert repodata["info"]["subdir"] == "linux-64"
    record = repodata["packages.conda"][package.name]
    data = (channel / "linux-64" / package.name).read_bytes()
    assert record["sha256"] == hashlib.sha256(data).hexdigest()
    assert record["md5"] == hashlib.md5(data).hexdigest()
    assert record["size"] == len(data)
    for key in ("name", "version", "build", "build_number", "depends", "subdir"):
        assert key in record
    assert (channel / "noarch" / "repodata.json").is_file()

    rattler = pytest.importorskip("rattler")
    repo = rattler.SparseRepoData(
        rattler.Channel(channel.as_uri()), "linux-64", channel / "linux-64" / "repodata.json"
    )
    records = repo.load_records(rattler.PackageName("primus-turbo"))
    assert [str(r.version) for r in records] == ["1.0.0"]


def test_publish_refuses_overwrite(package, tmp_path):
    channel = tmp_path / "channel"
    conda_channel.publish([package], channel)
    with pytest.raises(SystemExit, match="exists"):
        conda_channel.publish([package], channel)
    conda_channel.publish([package], channel, force=True)
