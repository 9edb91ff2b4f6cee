"""GRPO training rows for latency-aware RL:

    python -m sprint.rl.grpo_data --data INPUT --output OUT.jsonl --task countdown --reference-run DIR

One JSON line per problem, read by `swift rlhf` (ms-swift passes the extra columns to the rollout
scheduler and to the rewards):
- `messages`: the user turn the policy was fine-tuned on (agent prompt + question block), so
  ms-swift groups the GRPO generations of one problem and logs readable prompts;
- `question`, `task`, `problem_id`, `gold` (JSON text: a Countdown gold is a dict);
- `reference_tokens`: the problem's sequential length, the latency reward's reference: taken from
  a baseline run (`--reference-run DIR`, its records' `sequential_tokens` by problem id, e.g. from
  `sprint baseline`) or from a column of the input (`--reference-column NAME`). Problems without a
  reference are dropped (and counted) when the latency reward is wanted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import load_items
from sprint.core.errors import UserError
from sprint.core.options import HelpFormatter, add_options, config_from, option
from sprint.format.prompt_format import PromptFormat, load_agent_prompt
from sprint.tasks.registry import get_task, task_names


@dataclass
class RLDataConfig:
    source: str = option(help="input rows: a hub id, a .jsonl/.json/.parquet file or a stage folder",
                         flags=("--data",), var="DATA")
    output: str = option(help="the JSONL file to write", flags=("--output",))
    task: str = option("math", "task adapter (question, gold, grader)", choices=task_names(), var="TASK")
    split: str | None = option(None, "split (default: the task's usual one)")
    range: str | None = option(None, "`start:end` slice of the rows", var="RANGE")
    reference_run: str | None = option(None, "a baseline run folder (records.jsonl with `sequential_tokens`) "
                                       "giving each problem's reference length", var="REFERENCE_RUN")
    reference_column: str | None = option(None, "an input column holding each problem's reference length",
                                          var="REFERENCE_COLUMN")
    agent_prompt: str | None = option(None, "agent prompt file (default prompts/agent.txt; `none`: none)",
                                      var="AGENT_PROMPT")


def reference_lengths(run_dir: str) -> dict[str, int]:
    """problem id -> sequential tokens of the ok records of a baseline (or orchestration) run."""
    path = Path(run_dir) / "records.jsonl" if Path(run_dir).is_dir() else Path(run_dir)
    if not path.is_file():
        raise UserError(f"no records at {path}; pass the folder of a `sprint baseline` run as --reference-run")
    lengths: dict[str, int] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("status") == "ok" and record.get("sequential_tokens"):
            lengths[str(record["id"])] = int(record["sequential_tokens"])
    return lengths


def build_rows(cfg: RLDataConfig) -> tuple[list[dict[str, Any]], int]:
    """The training rows and how many problems were dropped for lack of a reference length."""
    if cfg.reference_run and cfg.reference_column:
        raise UserError("pass --reference-run or --reference-column, not both")
    task = get_task(cfg.task)
    fmt = PromptFormat(agent_prompt=load_agent_prompt(cfg.agent_prompt), mode="chat", api="chat")
    items = load_items(cfg.source, split=cfg.split or task.default_split, range_spec=cfg.range,
                       id_col=task.id_column, require=task.required)
    lengths = reference_lengths(cfg.reference_run) if cfg.reference_run else None
    rows, dropped = [], 0
    for item in items:
        problem = task.problem(item)
        row: dict[str, Any] = {
            "messages": [{"role": "user", "content": fmt.user_turn(problem.question)}],
            "question": problem.question,
            "task": task.name,
            "problem_id": problem.id,
            "gold": json.dumps(problem.gold),
        }
        if lengths is not None or cfg.reference_column:
            value = lengths.get(problem.id) if lengths is not None else item.row.get(cfg.reference_column)
            if value in (None, "") or int(value) <= 0:
                dropped += 1
                continue
            row["reference_tokens"] = int(value)
        rows.append(row)
    if not rows:
        raise UserError(f"no training rows left ({dropped} without a reference length); check the reference source")
    return rows, dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sprint.rl.grpo_data", description=__doc__,
                                     formatter_class=HelpFormatter)
    add_options(parser, RLDataConfig)
    cfg = config_from(RLDataConfig, parser.parse_args(argv))
    try:
        rows, dropped = build_rows(cfg)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(cfg.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} GRPO rows -> {out}" + (f" ({dropped} dropped: no reference length)" if dropped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
