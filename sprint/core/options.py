"""Dataclass fields as the one source of a stage's defaults, CLI flags and help (the open-r1 habit).

A stage's config is a dataclass whose fields are declared with `option(...)`: the default is written
once, beside its reason, and `add_options` turns the fields into argparse flags whose help shows
that default. A handler then builds its config in one line: `config_from(Config, args)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from typing import Any, Callable, Protocol, Sequence

from sprint.core.errors import UserError

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(value: str) -> bool:
    """`1/true/yes/on` or `0/false/no/off` (any case); anything else is an error, never a guess."""
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise argparse.ArgumentTypeError(f"expected one of {'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}, got {value!r}")


def env_switch(value: str | None) -> bool:
    """An environment switch (HF_HUB_OFFLINE, SPRINT_RL_CPU_WEIGHT_SYNC): on for one of TRUE_WORDS,
    off for anything else, unset included, as the libraries that read such variables treat them."""
    return (value or "").strip().lower() in TRUE_WORDS


def optional_int(value: str) -> int | None:
    """An int, or `none`/empty for "let the server choose" (e.g. seeds)."""
    return None if str(value).strip().lower() in ("none", "") else int(value)


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flags: Sequence[str] | None = None,
    choices: Sequence[Any] | None = None,
    type: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    var: str | None = None,
    cli: bool = True,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field that is also a CLI flag.

    `flags` default to `--field-name`; `var` names the shell-script variable that sets it (used in
    error messages); `cli=False` keeps a field out of the parser (set from Python only). A bool
    field becomes a switch: `--flag` when its default is False, `--no-…` (give it in `flags`) when True.
    """
    meta = {"help": help, "flags": tuple(flags) if flags else None, "choices": choices, "type": type,
            "metavar": metavar, "var": var, "cli": cli}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Descriptions keep their line breaks; every option's help ends with its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        var = getattr(action, "script_var", None)
        script = f"script variable {var}" if var else ""
        if "%(default)" in text or action.default in (None, argparse.SUPPRESS) or not action.option_strings or \
                isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):  # a switch: its absence
            return f"{text} ({script})" if script else text
        shown = "; ".join(filter(None, ["default: %(default)s", script]))
        return f"{text} ({shown})" if text else f"({shown})"


def _field_type(cls: type, field: dataclasses.Field) -> Any:
    """The field's type with `Optional` removed (`int | None` -> int)."""
    hint = typing.get_type_hints(cls).get(field.name, str)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return hint


def add_options(parser: argparse.ArgumentParser, cls: type, skip: Sequence[str] = ()) -> None:
    """Add one flag per `option(...)` field of `cls` (in field order), defaults and help from the field."""
    for field in dataclasses.fields(cls):
        meta = field.metadata
        if not meta or not meta.get("cli", True) or field.name in skip:
            continue
        flags = meta["flags"] or ("--" + field.name.replace("_", "-"),)
        kwargs: dict[str, Any] = {"dest": field.name, "help": meta["help"]}
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = field.default_factory()  # type: ignore[misc]
        else:
            default = dataclasses.MISSING
        ftype = _field_type(cls, field)
        if ftype is bool and meta["type"] is None:
            kwargs["action"] = "store_false" if default is True else "store_true"
            kwargs["default"] = bool(default) if default is not dataclasses.MISSING else False
        else:
            if default is dataclasses.MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = default
            conv = meta["type"] or (ftype if ftype in (int, float) else None)
            if conv is not None:
                kwargs["type"] = conv
            if meta["choices"] is not None:
                kwargs["choices"] = list(meta["choices"])
            if meta["metavar"]:
                kwargs["metavar"] = meta["metavar"]
            if typing.get_origin(ftype) is list:  # a list field takes one or more values
                kwargs["nargs"] = "+"
        if not flags[0].startswith("-"):  # a positional (flags=("name",)): argparse names it and takes no `required`
            kwargs.pop("dest")
            kwargs.pop("required", None)
            flags = (field.name,)
        action = parser.add_argument(*flags, **kwargs)
        action.script_var = meta.get("var")  # type: ignore[attr-defined]  # named in usage errors


def with_variable(parser: argparse.ArgumentParser, message: str) -> str:
    """A usage error (`argument --lr: invalid float value: 'abc'`) that also names the script variable
    feeding the flag (`argument --lr (LR): …`), so a user of run_*.sh knows which line to fix."""
    m = re.match(r"argument ([^:]+):", message)
    if not m:
        return message
    action = next((parser._option_string_actions.get(f) for f in m.group(1).split("/")
                   if f in parser._option_string_actions), None)
    var = getattr(action, "script_var", None)
    return message if not var else f"argument {m.group(1)} ({var}):{message[m.end():]}"


def config_from(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """Build `cls` from parsed args: every field the parser knows, plus `overrides`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if f.init and hasattr(args, f.name)}
    values.update(overrides)
    return cls(**values)


def flag_name(cls: type, name: str) -> str:
    """How a user set field `name`: `--flag` (and `VAR` when a script variable feeds it), for error messages."""
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if field is None or not field.metadata:
        return name
    flag = (field.metadata["flags"] or ("--" + name.replace("_", "-"),))[0]
    var = field.metadata.get("var")
    return f"{flag} ({var})" if var else flag


def check_range(cls: type, name: str, value: float, low: float | None = None, high: float | None = None) -> None:
    """Reject an out-of-range value with the flag (and script variable) that set it; never replace it."""
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"at most {high}" if low is None else f"between {low} and {high}"
        raise UserError(f"{flag_name(cls, name)} must be {bounds}, got {value}")


class CommandModule(Protocol):
    """What the module behind a `sprint` command provides. sprint.cli's table names the module and
    writes the command's one-line help; the module is imported only when its command is chosen."""

    def register(self, parser: argparse.ArgumentParser) -> None:
        """Give the command's parser its description and arguments."""

    def handle(self, args: argparse.Namespace) -> int:
        """Run the command; returns its exit code (sprint.core.errors)."""


def add_command(subparsers: argparse._SubParsersAction, name: str, help: str,
                module: CommandModule) -> argparse.ArgumentParser:
    """The one way a subcommand is made, so every command has the same help formatter, its one-line `help`
    written once (in the table) and its handler under one name: `module.register(parser)` adds the
    description and flags, `module.handle(args)` runs it."""
    parser = subparsers.add_parser(name, help=help, formatter_class=HelpFormatter)
    module.register(parser)
    parser.set_defaults(func=module.handle)
    return parser
