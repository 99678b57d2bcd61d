"""recipe/: renders offline for every variant with the required keys (scripts/recipe_check.py)."""

from __future__ import annotations

import pytest

recipe_check = pytest.importorskip("recipe_check")

VARIANTS = recipe_check.load_variants(recipe_check.RECIPE / "conda_build_config.yaml")


def test_variants_are_the_arch_sets():
    assert sorted(v["gpu_archs"] for v in VARIANTS) == ["gfx942", "gfx942;gfx950", "gfx950"]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v["gpu_archs"])
def test_renders_with_required_keys(variant):
    meta = recipe_check.render(variant, environ={})
    assert recipe_check.check(meta, variant) == []
    string = meta["build"]["string"]
    assert string.split("_")[-1] == "0"
    for arch in variant["gpu_archs"].split(";"):
        assert arch in string
    assert f"pytorch {variant['pytorch']}" in meta["requirements"]["host"]


def test_build_strings_distinct():
    strings = {recipe_check.render(v, environ={})["build"]["string"] for v in VARIANTS}
    assert len(strings) == len(VARIANTS)


def test_version_from_env_and_git_describe():
    v = VARIANTS[0]
    meta = recipe_check.render(v, environ={"PRIMUS_TURBO_BUILD_VERSION": "1.2.3"})
    assert meta["package"]["version"] == "1.2.3"
    git = {"GIT_DESCRIBE_TAG": "v0.4.0", "GIT_DESCRIBE_NUMBER": "7"}
    meta = recipe_check.render(v, environ=git)
    assert meta["package"]["version"] == "0.4.0.post7"
    assert recipe_check.render(v, environ={})["package"]["version"] == "0.1.0"


def test_check_flags_bad_variant_and_bad_recipe():
    v = dict(VARIANTS[0], gpu_archs="native")
    meta = recipe_check.render(v, environ={})
    assert any("native" in e for e in recipe_check.check(meta, v))
    meta = recipe_check.render(VARIANTS[0], environ={})
    meta["requirements"]["run"] = ["python", "pytorch"]
    assert any("bounded pytorch pin" in e for e in recipe_check.check(meta, VARIANTS[0]))


def test_run_pin_is_compatible():
    v = dict(VARIANTS[0], pytorch="2.8")
    run = recipe_check.render(v, environ={})["requirements"]["run"]
    assert "pytorch >=2.8,<2.9.0a0" in run


def test_cli_ok(capsys):
    assert recipe_check.main([]) == 0
    assert capsys.readouterr().out.count(" ok") == len(VARIANTS)
