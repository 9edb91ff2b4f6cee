"""Files shipped inside the package, and the helper environments that live beside a checkout.

The prompt templates (`sprint/prompts`) and the training recipes (`sprint/configs`) are package
data, found through `importlib.resources`, so a wheel installed anywhere has them; nothing may look
for them relative to a source checkout. The vLLM and ms-swift venvs (`.venv-vllm`, `.venv-swift`,
`.venv-rl`) are different: they pin their own torch/transformers, so they are never inside the
package. A checkout keeps them beside itself (`make install-*`); an installed wheel has no checkout,
so there the user names them with an environment variable, and a missing one is a `UserError`
saying which variable to set rather than a path into site-packages that never existed.
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


PROMPTS_DIR = package_file("prompts")
CONFIGS_DIR = package_file("configs")


def prompt_file(name: str) -> Path:
    """The shipped prompt template NAME (`agent`, `component_separation`, `dag_creation`)."""
    return PROMPTS_DIR / f"{name}.txt"


def config_file(name: str) -> Path:
    """The shipped recipe NAME (`finetune_full.yaml`, `finetune_lora.yaml`, `grpo.yaml`)."""
    return CONFIGS_DIR / name


def checkout_root() -> Path | None:
    """The source checkout this package is imported from (an editable install), else None.

    Wheel installs put the package in site-packages, where no pyproject.toml sits beside it.
    """
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / PACKAGE / "__init__.py").is_file() else None


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
