"""Rewards of latency-aware GRPO, computed from one SPRINT trajectory.

Every record ms-swift trains on (one per planner or executor call) carries the same trajectory
facts in `rollout_infos`, so every record of one trajectory gets the same reward, as GRPO's
request-aware advantages require. The facts are built here from the rendered trajectory by the
trajectory model (parse + token accounting); nothing else parses the tags.

- correctness: 1 when the answer the model gave (the last `\\boxed{}` after the question) is right
  by the task's grader (Math-Verify for math, the exact checker for Countdown), else 0;
- format: the mean of three 0/1 checks: the trajectory parses strictly; every prompt got a
  non-empty execution (and the run ended without error); the model closed the run with its own
  `<Final_answer>` holding an answer (a final answer forced at the phase limit, or after a plan
  with neither prompts nor answer, does not count);
- latency: `max(0, 1 - sequential_tokens / reference_tokens)` when the answer is correct, else 0
  (the acceleration term of P-GRPO): a correct trajectory whose critical path is half the
  problem's sequential length earns 0.5. A trajectory that does not parse strictly earns 0 too:
  its critical path cannot be measured (blocks the parser skips would cost nothing). The
  reference is the problem's own sequential length, from a dataset column or a baseline run
  (see sprint.rl.grpo_data).

Weights are ms-swift's `--reward_weights` (configs/grpo.yaml), one per reward, in this order.

- critical path (`sprint_critical_path`): not a reward but a measurement, the trajectory's
  sequential tokens; given weight 0 (configs/grpo_mini.yaml) it changes no advantage, and
  ms-swift logs its mean per step beside the rewards, so the curve of the critical path is in the
  trainer's own log.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping

from sprint.core.errors import UserError
from sprint.tasks.registry import TaskAdapter, get_task
from sprint.format.trajectory import TrajectoryError, count_tokens, parse

Counter = Callable[[str], int]

REWARD_NAMES = ("sprint_correct", "sprint_format", "sprint_latency", "sprint_critical_path")  # `--reward_funcs`


def trajectory_infos(
    text: str,
    count: Counter,
    *,
    status: str = "ok",
    forced_final: bool | None = False,
) -> dict[str, Any]:
    """The facts the rewards read, for `rollout_infos` (JSON-serialisable).

    `text` is the rendered trajectory (`<Question>…` then phases and the final answer), `count`
    the policy tokenizer's counter; `status` and `forced_final` come from the orchestration record.
    """
    try:
        traj = parse(text, strict=True)
        parses = True
    except TrajectoryError:
        traj = parse(text, strict=False)
        parses = False
    counts = count_tokens(traj, count)
    executed = sum(
        1 for ph in traj.phases for pr in ph.prompts
        if (ex := ph.execution(pr.name)) is not None and ex.text.strip()
    )
    return {
        "trajectory": text,
        "status": status,
        "forced_final": bool(forced_final),
        "parses": parses,
        "num_phases": len(traj.phases),
        "num_prompts": traj.prompt_count,
        "executed_prompts": executed,
        "final_answer": traj.final_answer,
        **counts.as_dict(),
    }


def model_answer(infos: Mapping[str, Any], task: TaskAdapter) -> str | None:
    """The answer the model gave: the task's extraction over the text after the question.

    The question is left out on purpose: a Countdown question shows an example `\\boxed{}`, which
    must not count as the model's answer when the model gives none.
    """
    body = parse(str(infos.get("trajectory") or ""), strict=False).render_body()
    return task.extract(body)


def correctness(infos: Mapping[str, Any], task: TaskAdapter, gold: Any) -> float:
    if infos.get("status") != "ok":
        return 0.0
    return 1.0 if task.grade(model_answer(infos, task), gold) else 0.0


def format_score(infos: Mapping[str, Any], task: TaskAdapter) -> float:
    parses = bool(infos.get("parses"))
    executed = infos.get("status") == "ok" and infos.get("executed_prompts") == infos.get("num_prompts")
    final = infos.get("final_answer")
    answered = not infos.get("forced_final") and final is not None and task.extract(str(final)) is not None
    return (parses + executed + answered) / 3


def latency(infos: Mapping[str, Any], task: TaskAdapter, gold: Any, reference_tokens: Any) -> float:
    """`max(0, 1 - sequential/reference)` for a correct answer; 0 otherwise."""
    try:
        reference = float(reference_tokens)
    except (TypeError, ValueError):
        reference = 0.0
    if not reference > 0:
        raise UserError(
            f"the latency reward needs a positive reference length per problem, got {reference_tokens!r}; "
            "build the data with `python -m sprint.rl.grpo_data --reference-run BASELINE_DIR` (or a reference column)"
        )
    if not infos.get("parses") or correctness(infos, task, gold) < 1:
        return 0.0
    return max(0.0, 1.0 - float(infos["sequential_tokens"]) / reference)


def decode_gold(gold: Any) -> Any:
    """Gold answers travel as JSON strings in the training rows (a Countdown gold is a dict)."""
    if isinstance(gold, str):
        try:
            return json.loads(gold)
        except json.JSONDecodeError:
            return gold
    return gold


def batch_rewards(name: str, rollout_infos: list[Mapping[str, Any]], tasks: list[str], golds: list[Any],
                  references: list[Any] | None = None) -> list[float]:
    """One reward per record of an ms-swift batch (`name` in REWARD_NAMES)."""
    if len(tasks) != len(rollout_infos) or len(golds) != len(rollout_infos):
        raise UserError("each training row needs `task` and `gold` columns; build the data with sprint.rl.grpo_data")
    scores = []
    for i, infos in enumerate(rollout_infos):
        if not infos or "trajectory" not in infos:
            raise UserError("a record has no SPRINT rollout infos; run `swift rollout` with "
                            "--multi_turn_scheduler sprint (see run_grpo.sh)")
        task = get_task(tasks[i])
        gold = decode_gold(golds[i])
        if name == "sprint_correct":
            scores.append(correctness(infos, task, gold))
        elif name == "sprint_format":
            scores.append(format_score(infos, task))
        elif name == "sprint_critical_path":
            scores.append(float(infos.get("sequential_tokens") or 0))
        elif name == "sprint_latency":
            if references is None:
                raise UserError("the latency reward needs a `reference_tokens` column; "
                                "build the data with sprint.rl.grpo_data")
            scores.append(latency(infos, task, gold, references[i]))
        else:
            raise UserError(f"unknown reward {name!r}; use one of {', '.join(REWARD_NAMES)}")
    return scores


__all__ = ["REWARD_NAMES", "batch_rewards", "correctness", "decode_gold", "format_score", "latency",
           "model_answer", "trajectory_infos"]
