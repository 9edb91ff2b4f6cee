"""The curation stages' prompt templates: where they are read from and how their placeholders are filled."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from sprint.core.errors import UserError
from sprint.core.resources import prompt_file


def load_prompt(name: str, path: str | Path | None = None) -> str:
    """The shipped template prompts/NAME.txt, or `path` when the user brings their own."""
    file = Path(path).expanduser() if path else prompt_file(name)
    if not file.is_file():
        raise UserError(f"prompt template {file} not found; pass an existing file with --prompt")
    return file.read_text(encoding="utf-8")


def fill(template: str, required: Sequence[str] = (), **values: str) -> str:
    """Replace `{name}` placeholders for the given names, in one pass.

    Not `str.format`: templates show JSON and Python dicts whose braces must stay as written, and
    one pass means a question that happens to contain `{lines}` is not expanded again.
    """
    missing = [name for name in required if "{" + name + "}" not in template]
    if missing:
        raise UserError(
            f"the prompt template lacks the placeholder(s) {', '.join('{' + m + '}' for m in missing)}; add them"
        )
    if not values:
        return template
    pattern = re.compile(r"\{(" + "|".join(re.escape(name) for name in values) + r")\}")
    return pattern.sub(lambda m: values[m.group(1)], template)
