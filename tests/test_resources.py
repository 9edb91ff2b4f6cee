"""Shipped files: a checkout reads the top-level prompts/ and configs/, and the wheel's mapping carries them.

`scripts/wheel_smoke.sh` checks the built wheel itself (the mapped files byte-identical to the
top-level ones); these tests check the checkout side and the pyproject.toml lines behind the wheel.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from sprint.core import resources
from sprint.core.resources import checkout_root, config_file, prompt_file, shipped_dir

REPO = Path(__file__).resolve().parents[1]


def test_a_checkout_reads_the_top_level_folders() -> None:
    assert checkout_root() == REPO
    assert prompt_file("agent") == REPO / "prompts" / "agent.txt"
    assert config_file("grpo.yaml") == REPO / "configs" / "grpo.yaml"
    for name in ("agent", "component_separation", "dag_creation"):
        assert prompt_file(name).is_file(), name
    for name in ("finetune_full.yaml", "finetune_lora.yaml", "finetune_mini.yaml", "grpo.yaml", "grpo_mini.yaml"):
        assert config_file(name).is_file(), name


def test_the_package_holds_no_second_copy() -> None:
    """One source: the folders live beside sprint/, never inside it (the wheel maps them in)."""
    assert not (REPO / "sprint" / "prompts").exists()
    assert not (REPO / "sprint" / "configs").exists()


def test_without_a_checkout_the_package_copy_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    package = Path(str(files("sprint")))
    assert shipped_dir("prompts") == package / "prompts"
    assert prompt_file("agent") == package / "prompts" / "agent.txt"
    assert config_file("grpo.yaml") == package / "configs" / "grpo.yaml"


def test_pyproject_lists_every_package_and_maps_the_folders() -> None:
    """The mapped folders rule out package discovery, so the list must follow the tree by hand."""
    tomllib = pytest.importorskip("tomllib")
    setup = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    tree = {".".join(d.relative_to(REPO).parts) for d in [REPO / "sprint", *(REPO / "sprint").rglob("*")]
            if d.is_dir() and "__pycache__" not in d.parts}
    assert set(setup["packages"]) == tree | {"sprint.prompts", "sprint.configs"}
    assert setup["package-dir"] == {"sprint.prompts": "prompts", "sprint.configs": "configs"}
    assert setup["package-data"]["sprint.prompts"] == ["*.txt"]
    assert setup["package-data"]["sprint.configs"] == ["*.yaml"]
    assert {p.suffix for p in (REPO / "prompts").iterdir()} == {".txt"}
    assert {p.suffix for p in (REPO / "configs").iterdir()} == {".yaml"}
