"""docker/Dockerfile structure: stages, pinned base, GPU_ARCHS at build and link, Triton guard."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO

dockerfile_parse = pytest.importorskip("dockerfile_parse")

DOCKERFILE = REPO / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def parsed():
    p = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    stages: dict[str, list[dict]] = {}
    current = None
    for ins in p.structure:
        if ins["instruction"] == "FROM":
            m = re.match(r"(\S+)\s+AS\s+(\S+)", ins["value"], re.IGNORECASE)
            assert m, f"every FROM names its stage: {ins['value']}"
            current = m.group(2).lower()
            stages[current] = [ins]
        elif current is not None:
            stages[current].append(ins)
    global_args = {}
    for ins in p.structure:
        if ins["instruction"] == "FROM":
            break
        if ins["instruction"] == "ARG":
            key, _, val = ins["value"].partition("=")
            global_args[key.strip()] = val.strip().strip('"')
    return stages, global_args


def _runs(stage):
    return [i["value"] for i in stage if i["instruction"] == "RUN"]


def _arg_default(stage, name):
    for ins in stage:
        if ins["instruction"] == "ARG" and ins["value"].split("=")[0].strip() == name:
            return ins["value"].partition("=")[2].strip().strip('"')
    return None


def test_stages_present_on_one_base(parsed):
    stages, _ = parsed
    assert {"base", "builder", "runtime", "dev"} <= set(stages)
    assert stages["base"][0]["value"].split()[0] == "${BASE_IMAGE}"
    for name in ("builder", "runtime", "dev"):
        assert stages[name][0]["value"].split()[0] == "base", f"{name} not on the same base"


def test_base_image_is_pinned_rocm7(parsed):
    _, global_args = parsed
    base = global_args.get("BASE_IMAGE", "")
    assert re.fullmatch(
        r"rocm/pytorch:rocm7\.\d+(\.\d+)?_ubuntu\d+\.\d+_py3\.\d+_pytorch_release_\d+\.\d+\.\d+",
        base,
    ), f"BASE_IMAGE default {base!r} is not a pinned rocm/pytorch ROCm 7 tag"
    assert "latest" not in base


def test_gpu_archs_default_and_used_at_build_and_link(parsed):
    stages, _ = parsed
    builder = stages["builder"]
    archs = _arg_default(builder, "GPU_ARCHS")
    assert archs == "gfx942;gfx950"
    assert _arg_default(builder, "MAX_JOBS") is not None
    wheel_runs = [r for r in _runs(builder) if "pip wheel" in r]
    assert len(wheel_runs) == 1
    run = wheel_runs[0]
    assert "--mount=type=cache" in run and "ccache" in run
    assert "GPU_ARCHS" in run and "PYTORCH_ROCM_ARCH" in run  # compile
    assert "HIPCC_LINK_FLAGS_APPEND" in run and "--offload-arch" in run  # link
    assert "native" in run and "exit 1" in run  # native is refused
    assert "check_code_objects.py" in run and "--archs" in run


def test_runtime_installs_only_the_wheel(parsed):
    stages, _ = parsed
    runtime = stages["runtime"]
    copies = [i["value"] for i in runtime if i["instruction"] == "COPY"]
    assert any(c.startswith("--from=builder") for c in copies)
    assert not any(c.split()[0] == "." for c in copies), "runtime must not copy the source tree"
    runs = " ".join(_runs(runtime))
    assert "--no-deps" in runs and ".whl" in runs
    assert "base-constraints.txt" in runs


def test_triton_never_replaces_the_base_one(parsed):
    stages, _ = parsed
    runs = " ".join(_runs(stages["base"]))
    assert "import triton" in runs
    guard = runs.index("import triton")
    assert runs.index("triton==${TRITON_VERSION}") > guard
    assert "pip list --format=freeze" in runs


def test_dev_stage_has_source_and_make(parsed):
    stages, _ = parsed
    dev = stages["dev"]
    copies = [i["value"] for i in dev if i["instruction"] == "COPY"]
    assert any(c.split()[0] == "." for c in copies)
    assert any("make setup" in r for r in _runs(dev))


def test_dockerignore_at_context_root():
    ignore = (REPO / ".dockerignore").read_text().split()
    for entry in (".git", ".venv", "build"):
        assert entry in ignore
