"""Files sprint ships, and the helper environments that live beside a checkout.

The prompt templates (`prompts/`) and the training recipes (`configs/`) sit at the top of the
checkout, beside the `run_*.sh` scripts that name them: they are what a user reads and edits, not
code, and that one copy is their only source. A checkout and an editable install read them in place,
so an edited prompt or recipe counts without reinstalling; the wheel maps them into the package at
build time (pyproject.toml's package-dir: `sprint/prompts`, `sprint/configs`), so an installed wheel
has them in site-packages. `shipped_dir` picks the checkout's folder when there is a checkout, else
the package's copy; `prompt_file` / `config_file` are the way in. Files that are code of the package
(`package_file`: the RL plugin, the mini model's weights script) stay inside it.

The vLLM and ms-swift venvs (`.venv-vllm`, `.venv-swift`, `.venv-rl`) are different: they pin their
own torch/transformers, so they are never inside the package. A checkout keeps them beside itself
(`make install-*`); an installed wheel has no checkout, so there the user names them with an
environment variable, and a missing one is a `UserError` saying which variable to set rather than a
path into site-packages that never existed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from sprint.core.errors import UserError

PACKAGE = "sprint"


def package_file(*parts: str) -> Path:
    """A file shipped in the package, as a path on disk.

    A path, not a stream: it is shown as a flag's default, hashed into manifests and handed to
    subprocesses (ms-swift loads the RL plugin by file name). pip installs wheels unpacked, so the
    resource is a real file; only a zipped import could make it otherwise, and that is refused here.
    """
    resource = files(PACKAGE).joinpath(*parts)
    if not isinstance(resource, Path):
        raise UserError(f"sprint is imported from an archive ({resource}); install it with pip so its data files are on disk")
    return resource


def checkout_root() -> Path | None:
    """The source checkout this package is imported from (a plain checkout or an editable install), else None.

    Wheel installs put the package in site-packages, where no pyproject.toml sits beside it.
    """
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / PACKAGE / "__init__.py").is_file() else None


def shipped_dir(name: str) -> Path:
    """The folder NAME (`prompts`, `configs`): the checkout's top-level one, else the wheel's copy.

    Checkout first, so a checkout or an editable install reads the files it edits; a wheel has no
    checkout and carries them as `sprint/NAME` (mapped there at build time).
    """
    root = checkout_root()
    if root is not None and (root / name).is_dir():
        return root / name
    return package_file(name)


def prompt_file(name: str) -> Path:
    """The shipped prompt template NAME (`agent`, `component_separation`, `dag_creation`)."""
    return shipped_dir("prompts") / f"{name}.txt"


def config_file(name: str) -> Path:
    """The shipped recipe NAME (`finetune_full.yaml`, `finetune_lora.yaml`, `grpo.yaml`)."""
    return shipped_dir("configs") / name


@dataclass(frozen=True)
class HelperVenv:
    """A separate environment sprint runs as a subprocess: its folder in a checkout, its variable elsewhere."""

    folder: str  # where `make install-*` puts it in a checkout, e.g. .venv-vllm
    var: str  # the environment variable naming it anywhere, e.g. VLLM_VENV
    holds: str  # what it is for, in words

    def path(self) -> Path | None:
        """$VAR, else the checkout's folder; None when installed from a wheel and $VAR is unset."""
        if os.environ.get(self.var):
            return Path(os.environ[self.var]).expanduser()
        root = checkout_root()
        return root / self.folder if root is not None else None

    def require(self, alternatives: str = "") -> Path:
        """path(), or a UserError naming the variable to set (`alternatives`: other ways, e.g. a flag)."""
        venv = self.path()
        if venv is None:
            others = f" ({alternatives})" if alternatives else ""
            raise UserError(f"no {self.holds} environment: sprint is installed as a package, so there is no checkout "
                            f"with a {self.folder}; set {self.var} to a venv with {self.holds}{others}")
        return venv


VLLM_ENV = HelperVenv(".venv-vllm", "VLLM_VENV", "vLLM")
SWIFT_ENV = HelperVenv(".venv-swift", "SWIFT_VENV", "ms-swift")
RL_ENV = HelperVenv(".venv-rl", "RL_VENV", "ms-swift + vLLM")
