"""Help that teaches: every flag of every subcommand has help text and shows its default, every
option is reachable from its script (a variable, or named as an extra argument in the header), and
every variable a script passes names the flag's own variable, so errors point at the line to fix."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sprint.cli import COMMANDS, build_parser
from sprint.core.options import HelpFormatter

REPO = Path(__file__).resolve().parents[1]

# script -> the subcommand it runs
SCRIPTS = {
    "run_component_separation.sh": "components",
    "run_dag_creation.sh": "dag",
    "run_finetuning_data_preparation.sh": "pack",
    "run_finetune.sh": "finetune",
    "run_agent_orchestration.sh": "orchestrate",
    "run_baseline_evaluation.sh": "baseline",
    "run_time_replay.sh": "time-replay",
    "run_grpo.sh": "grpo",
}


def subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser([], every_command=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def listed_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    """command -> its line in `sprint --help`."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a.help for a in sub._choices_actions}


def test_every_command_registers_the_same_way() -> None:
    """One module per command with `register(parser)` and `handle(args)`; its one-line help is written once,
    in the table, and `sprint --help` shows that line whether the module was loaded or not."""
    modules = [c.module for c in COMMANDS.values()]
    assert len(set(modules)) == len(modules)
    built = subparsers()
    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module)
        assert built[name].get_default("func") is module.handle, name
        assert command.help not in inspect.getsource(module), f"{name}: its one-line help is written twice"
    expected = {name: c.help for name, c in COMMANDS.items()}
    assert listed_help(build_parser([], every_command=True)) == expected == listed_help(build_parser([]))


def test_only_the_chosen_commands_module_is_imported() -> None:
    """`sprint --help` and `sprint pack …` stay fast: no other command's module is loaded."""
    code = ("import json, sys; from sprint.cli import COMMANDS, build_parser; build_parser(sys.argv[1:]); "
            "print(json.dumps(sorted(c.module for c in COMMANDS.values() if c.module in sys.modules)))")
    for argv, loaded in (([], []), (["pack", "--help"], ["sprint.curation.packing"])):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                              cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == loaded, argv


def test_every_command_is_built_with_the_help_formatter() -> None:
    built = subparsers()
    assert set(COMMANDS) <= set(built)
    for name, parser in built.items():
        assert issubclass(parser.formatter_class, HelpFormatter), name


def test_every_flag_of_every_subcommand_has_help_text() -> None:
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}"
               for name, parser in subparsers().items() for a in options(parser)
               if not (a.help or "").strip() or a.help == argparse.SUPPRESS]
    assert not missing, f"flags without help text: {missing}"


def test_every_option_with_a_default_shows_it() -> None:
    hidden = []
    for name, parser in subparsers().items():
        formatter = parser.formatter_class(prog=parser.prog)
        for a in options(parser):
            switch = isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))
            if not a.option_strings or switch or a.required or a.default in (None, argparse.SUPPRESS):
                continue
            text = formatter._get_help_string(a) % {"default": a.default}
            if str(a.default) not in text:
                hidden.append(f"{name} {a.option_strings[0]} (default {a.default!r})")
    assert not hidden, f"defaults not shown in --help: {hidden}"


def script_flags(text: str) -> dict[str, str]:
    """flag -> the variable a script passes it from (`flag --x "$VAR"`, `--x "$VAR"`, the VAR loops)."""
    found = dict((f, v) for f, v in re.findall(r'(--[a-z][a-z0-9-]*)[ =]"\$\{?([A-Z_]+)', text))
    for loop in re.findall(r"for var in ([A-Z_ ]+);", text):
        found.update({"--" + v.lower().replace("_", "-"): v for v in loop.split()})
    for var, flag in re.findall(r"is_true ([A-Z_]+); then args\+=\((--[a-z-]+)\)", text):
        found[flag] = var
    return found


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_option_is_reachable_from_its_script(script: str) -> None:
    """Set by one of the script's variables, or named in its header as an extra argument."""
    text = (REPO / script).read_text()
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    passed = script_flags(text)
    unreachable = [a.option_strings[0] for a in options(subparsers()[SCRIPTS[script]])
                   if a.option_strings and not any(f in passed or re.search(re.escape(f) + r"\b", header)
                                                   for f in a.option_strings)]
    assert not unreachable, f"{script}: no variable sets, and the header does not mention: {unreachable}"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_script_variable_is_the_flags_own_variable(script: str) -> None:
    """Errors name `--flag (VAR)` from the field's `var=`: it must be the variable the script reads."""
    parser = subparsers()[SCRIPTS[script]]
    wrong = []
    for flag, var in script_flags((REPO / script).read_text()).items():
        action = parser._option_string_actions.get(flag)
        if action is None:
            wrong.append(f"{flag} is not a flag of `sprint {SCRIPTS[script]}`")
        elif getattr(action, "script_var", None) != var:
            wrong.append(f"{flag}: the script reads {var}, the option names {getattr(action, 'script_var', None)}")
    assert not wrong, f"{script}: {wrong}"


def test_a_usage_error_names_the_scripts_variable(capsys) -> None:
    from sprint.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["orchestrate", "--planner-model", "m", "--out-dir", "o", "--max-phases", "many"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: argument --max-phases (MAX_PHASES): invalid int value: 'many'") and "\n" not in err


@pytest.mark.parametrize("argv, expected", [
    (["orchestrate", "--planner-model", "m", "--out-dir", "o", "--timeout", "0"], "--timeout (TIMEOUT) must be at least"),
    (["orchestrate", "--planner-model", "m", "--out-dir", "o", "--max-problem-workers", "0"],
     "--max-problem-workers (MAX_PROBLEM_WORKERS) must be at least 1"),
    (["orchestrate", "--planner-model", "m", "--out-dir", "o", "--executor-top-p", "1.5"],
     "--executor-top-p (EXECUTOR_TOP_P) must be between"),
    (["baseline", "--model", "m", "--out-dir", "o", "--temp", "-1"], "--temp (TEMP) must be at least 0"),
])
def test_out_of_range_values_are_refused_never_replaced(argv: list[str], expected: str, capsys, tmp_path: Path,
                                                        monkeypatch) -> None:
    from sprint.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err and not (tmp_path / "o").exists()


def recorded_sprint(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose PYTHON only records the `sprint` command lines a script runs (scripts/run_env.sh
    runs `$PYTHON -c CODE ARGS...`), one line each."""
    log = tmp_path / "sprint_calls.txt"
    stub = tmp_path / "python"
    stub.write_text(f'#!/usr/bin/env bash\nshift 2\necho "$*" >> "{log}"\n')
    stub.chmod(0o755)
    return {"PATH": "/usr/bin:/bin", "PYTHON": str(stub), "OUT_DIR": "from-var"}, log


@pytest.mark.parametrize("extra, fit_dir", [(["--warmup", "0"], "from-var"), (["--out", "elsewhere"], "elsewhere"),
                                            (["--out=other", "--limit", "2"], "other")])
def test_time_replay_script_fits_the_folder_time_replay_wrote(tmp_path: Path, extra: list[str], fit_dir: str) -> None:
    env, log = recorded_sprint(tmp_path)
    done = subprocess.run(["bash", str(REPO / "run_time_replay.sh"), *extra], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("time-replay ") and calls[0].endswith(" ".join(extra)) and calls[1] == f"fit-latency {fit_dir}"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_time_replay_script_help_shows_the_help_and_stops(tmp_path: Path, flag: str) -> None:
    env, log = recorded_sprint(tmp_path)
    done = subprocess.run(["bash", str(REPO / "run_time_replay.sh"), flag], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("time-replay ") and calls[0].endswith(flag)
    real = subprocess.run(["bash", str(REPO / "run_time_replay.sh"), flag], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHON"}, "OUT_DIR": str(tmp_path / "none")})
    assert real.returncode == 0 and "error" not in real.stderr.lower() and "usage: sprint time-replay" in real.stdout
