"""What the mini experiment's task generators share: their options and the rows they write.

Both generators (`countdown`, `arithmetic`) turn a `MiniDataConfig` into `ProblemRows`: training
traces in the input layout stages 1-3 read, the stand-in teacher's answers about each trace (its
components and DAG, which only a generator knows), a text corpus for the tokenizer, and held-out
problems. `sprint mini-data` (`sprint.mini.generate`) writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sprint.core.options import option

TASKS = ("arithmetic", "countdown")


@dataclass(kw_only=True)
class MiniDataConfig:
    """`sprint mini-data`: problems, traces and teacher answers for the mini experiment."""

    out: str = option(help="output folder (train_traces.jsonl, test.jsonl, teacher.jsonl, corpus.jsonl)",
                      flags=("--out",), var="OUT_DIR")
    task: str = option("arithmetic", "arithmetic: digit equations whose dependencies form a different DAG each time "
                       "(make demo's task); countdown: three numbers and a target, always three pair searches",
                       choices=TASKS, var="TASK")
    n_test: int = option(200, "held-out problems, drawn like the training ones and never trained on", var="N_TEST")
    n_train: int = option(0, "training traces (0: the task's default: arithmetic 4,000; countdown every other "
                          "solvable problem)", var="N_TRAIN")
    seed: int = option(0, "seed of the draw and the shuffle", var="SEED")
    recheck_share: float = option(
        0.25, "share of traces that check their last step once more before answering, as R1 often does: a habit "
        "that lengthens the critical path and changes no answer, the slack latency-aware GRPO can remove "
        "(greedy decoding follows the majority, which does not)", var="RECHECK_SHARE")
    max_rounds: int = option(3, "arithmetic: most rounds of subtasks (the DAG's depth)", var="MAX_ROUNDS")
    max_width: int = option(4, "arithmetic: most subtasks in one round", var="MAX_WIDTH")
    max_subtasks: int = option(8, "arithmetic: most subtasks in a problem (of three rounds or more: 4)", var="MAX_SUBTASKS")
    shuffle_rounds: bool = option(False, "arithmetic: work each round's subtasks in an order drawn per problem, not "
                                  "the question's, so that the next equation is found by its name, not as the line "
                                  "after the last one", var="SHUFFLE_ROUNDS")
    beyond: int = option(0, "arithmetic: also write test_beyond.jsonl, this many held-out problems one round deeper "
                         "or one subtask wider than any training problem (generalisation; reported, no target)",
                         var="BEYOND")
    low: int = option(1, "countdown: smallest number", var="LOW")
    high: int = option(6, "countdown: largest number (1-6: 2,435 problems; products stay small)", var="HIGH")


@dataclass
class ProblemRows:
    """What a generator produced, in the order it is written."""

    traces: list[dict[str, Any]] = field(default_factory=list)
    answers: list[dict[str, Any]] = field(default_factory=list)  # the teacher's, one per trace
    corpus: list[dict[str, str]] = field(default_factory=list)
    held_out: list[dict[str, Any]] = field(default_factory=list)
    beyond: list[dict[str, Any]] = field(default_factory=list)

    def add_trace(self, row: dict[str, Any], answer: dict[str, Any]) -> None:
        """A training trace (id, question, thought, solution, ...) and the teacher's components + dag about it."""
        self.traces.append(row)
        self.answers.append({"id": row["id"], "question": row["question"], **answer})
        self.corpus.append({"text": "\n".join([row["question"], row["thought"], row["solution"]])})
