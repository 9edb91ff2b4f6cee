"""`python -m sprint <stage>`: every stage module registers its own subcommand."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import NoReturn

from sprint.errors import UserError

# Each module here defines `register(subparsers)` which adds one or more subcommands whose
# handler is stored as `func` in the parsed namespace and returns an exit code.
STAGE_MODULES = [
    "sprint.components",
    "sprint.dag",
    "sprint.packing",
    "sprint.sft_check",
    "sprint.finetune",
    "sprint.orchestration",
    "sprint.evaluate",
    "sprint.replay",
    "sprint.serve",
]


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in the same one-line `error: …` form as every other user error.

    Subcommand parsers are made with the parent's class, so they inherit this.
    """

    def error(self, message: str) -> NoReturn:
        print(f"error: {one_line(message)}; see `{self.prog} --help`", file=sys.stderr)
        raise SystemExit(2)


def one_line(text: object) -> str:
    """An error message on one line, whatever the exception text held (server bodies, paths)."""
    return " ".join(str(text).split())


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m sprint", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in STAGE_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # stage not written yet
                continue
            raise
        register = getattr(module, "register", None)
        if register is not None:  # a module still being written may not register yet
            register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The pipeline venv has no torch on purpose; transformers' advice to install it is noise on stderr.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai", "httpcore"):  # one line per request would drown the progress bar
        logging.getLogger(noisy).setLevel(logging.WARNING)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted; finished records are kept, re-run the same command to resume", file=sys.stderr)
        return 130
