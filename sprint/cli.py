"""`sprint <command>`: the SPRINT pipeline's stages and tools (`sprint <command> --help` shows one's options)."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

from sprint.core.errors import EXIT_INTERRUPTED, EXIT_USER, SprintExit
from sprint.core.options import add_command, with_variable
from sprint.core.files import disk_error


@dataclass(frozen=True)
class Command:
    """A `sprint` command: the module that implements it (`register(parser)`, `handle(args)`; see
    `sprint.core.options.CommandModule`) and its one-line help, written here and nowhere else."""

    module: str
    help: str


# name -> command. A module is imported only when its command is chosen, so `sprint --help` and a
# small `pack` start at once; every other command gets a stub parser holding just its help line.
COMMANDS: dict[str, Command] = {
    "components": Command("sprint.curation.components", "stage 1: split reasoning traces into plan/execution components with an LLM"),
    "dag": Command("sprint.curation.dag", "stage 2: ask an LLM which components depend on which (a parent dictionary)"),
    "pack": Command("sprint.curation.packing", "stage 3: pack components + DAGs into trajectories and write the SFT dataset"),
    "check-sft": Command("sprint.training.sft_check", "check an SFT dataset (roles, empty turns, token lengths vs --max-length) before training"),
    "finetune": Command("sprint.training.finetune", "fine-tune with ms-swift (check the data, then run `swift sft` with configs/finetune_<tuner>.yaml)"),
    "orchestrate": Command("sprint.inference.orchestration", "SPRINT inference: planner/executor phases on an OpenAI-compatible server"),
    "baseline": Command("sprint.inference.baseline", "sequential baseline: one generation per problem with the same agent prompt"),
    "evaluate": Command("sprint.evaluation.evaluate", "grade runs, count sequential/total tokens, compare with a baseline, write report.md"),
    "replay-server": Command("sprint.timing.replay_server", "serve recorded trajectories over an OpenAI-compatible API with GPU-like timing"),
    "serve": Command("sprint.llm.fleet", "serve a local model with vLLM in the foreground, --replicas N behind vllm-router (Ctrl-C stops it)"),
    "view": Command("sprint.viewer.site", "write a static HTML viewer of runs: problem table, phases, call timelines"),
    "time-replay": Command("sprint.timing.time_replay", "time recorded runs on a real engine with forced output lengths"),
    "fit-latency": Command("sprint.timing.latency_fit", "fit the latency model to time-replay measurements or to a step-cost table"),
    "gpu-probe": Command("sprint.latency.probe_command", "measure a GPU's decode and prefill step costs with PyTorch alone (no vLLM) into a latency file"),
    "grpo": Command("sprint.rl.launch", "latency-aware GRPO with ms-swift: SPRINT rollouts, shorter critical paths rewarded (in .venv-rl)"),
    "mini-data": Command("sprint.mini.generate", "generate the mini experiment's problems (arithmetic or Countdown), R1-style traces and teacher answers"),
    "mini-tokenizer": Command("sprint.mini.tokenizer", "learn the mini experiment's own small byte-level BPE tokenizer from a corpus (tags and numbers one token each)"),
    "mini-model": Command("sprint.mini.model", "write a random-init Qwen2 of given size for a tokenizer folder (safetensors, via a torch venv)"),
    "mini-summary": Command("sprint.mini.summary", "the mini experiment's closing summary: Table 2 and what the SPRINT model learned"),
    "mini-grpo-data": Command("sprint.mini.grpo", "GRPO problems of the mini experiment: training problems with their sequential reference lengths"),
    "mini-steps": Command("sprint.mini.budget", "the training steps that give one training file another's token budget (equal-token comparisons)"),
    "teacher-server": Command("sprint.mini.teacher", "serve stages 1-2 from given answers over the OpenAI API: a deterministic stand-in for GPT-4o"),
}


class _Parser(argparse.ArgumentParser):
    """argparse with usage errors in the same one-line `error: …` form as every other user error.

    Subcommand parsers are made with the parent's class, so they inherit this.
    """

    def error(self, message: str) -> NoReturn:
        print(f"error: {one_line(with_variable(self, message))}; see `{self.prog} --help`", file=sys.stderr)
        raise SystemExit(2)


def one_line(text: object) -> str:
    """An error message on one line, whatever the exception text held (server bodies, paths)."""
    return " ".join(str(text).split())


def _chosen(argv: list[str]) -> str | None:
    """The subcommand named in argv (its first non-option word), if it is one of ours."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(argv: list[str] | None = None, *, every_command: bool = False) -> argparse.ArgumentParser:
    """The parser with the chosen command's real arguments and a one-line stub for every other.

    `every_command=True` imports every stage and builds every real subparser (tests of help texts).
    """
    parser = _Parser(prog="sprint", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = _chosen(sys.argv[1:] if argv is None else argv)
    for name, command in COMMANDS.items():
        if every_command or name == chosen:
            add_command(sub, name, command.help, importlib.import_module(command.module))
        else:
            sub.add_parser(name, help=command.help, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The pipeline venv has no torch on purpose; transformers' advice to install it is noise on stderr.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "httpx2", "openai", "httpcore"):  # one line per request would drown the progress bar
        logging.getLogger(noisy).setLevel(logging.WARNING)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USER
    # the command as typed, for "retry with: sprint ..." lines (in-process callers pass argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    # Exit codes (README "Exit codes"): 0 all ok, 2 user error, 3 some items failed, 4 a server
    # stopped answering, 130 interrupted, 1 a bug (traceback). Handlers return 0 or 3.
    try:
        return int(args.func(args) or 0)
    except SprintExit as exc:  # UserError (2), ServerStopped (4)
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # a full, read-only or forbidden disk met outside the stage writers
        err = disk_error(exc)
        if err is None:
            raise
        print(f"error: {one_line(err)}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("interrupted; finished records are kept, re-run the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
