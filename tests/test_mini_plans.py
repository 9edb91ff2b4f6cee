"""The arithmetic miniature, CI-sized: a SPRINT model learned from random weights that plans each problem's own DAG.

`scripts/mini_demo.sh` with the arithmetic task (digit equations whose dependencies form a different DAG each time),
2,000 training traces, 50 held out, SPRINT only (RFT=0), the stream schedule, straight from the random init
(BASE_STEPS=0) and the packed main rows only (EXECUTOR_ROWS=none: in the demo's executor-view rows 8 of every 9
rows are single executions, so a step this short would see few plans), and no problem timed alone (TIMED=0: the
seconds are not asserted, and the warm-up and one-at-a-time runs cost about 15 s). Every stage runs for real: the
generator, the stand-in teacher over HTTP, stages 1-2, pack, the project's tokenizer, `swift sft`, vLLM,
`orchestrate`, `evaluate`, `view`, `mini-summary`. What is asserted is the planning the model learned, read against
each held-out problem's ideal packing (`sprint.mini.fidelity`):

- the structure varies with the problem: >= 3 distinct numbers of phases with prompts and of largest widths, no one
  shape on more than 40 % of the problems, and mean phases rising with the problem's depth;
- well-formed on >= 80 % of the problems (measured: 96 %; 94 % and 86 % in the recipe's other data orders);
- the plan equals the ideal packing (the same subtasks in each phase) on >= 30 % of the problems, and on more than
  twice what the best fixed template scores. The names go round by round in the question, so a problem's ideal
  packing is fixed by its widths and a template that writes one shape scores that shape's share of the problems
  (the commonest: 14 % of these 50). Measured at this size: 52 % with the recipe's data order (seed 0), 62 % and
  40 % with seeds 1 and 2, so the floor sits below the spread of orders (a CPU that rounds otherwise can send the
  run down another path, as another order does); the floors before (40 %, three times the template) held for two
  orders of three.
  Earlier trace designs: with bare openings (`Then C , D .`) 50 %; with bare prompts too (`Now C .`, before prompts
  copied their equation, which so short a run learns only in part) 82 %, 86 % after 328 steps; the traces with sums
  before: 94 % after 312 steps, 86 % after 234, 28 % after 156: the plans form late in so short a
  run (docs/experiments.md, "The arithmetic task").

Not asserted: the answers. At this size the executions have not learned to copy their equations (the demo's base
reasoner is what teaches that), so accuracy is about chance; `make demo`-sized runs measure it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.mini.fidelity import plan_figures, read_run
from tests.helpers import run_mini_demo

pytestmark = [pytest.mark.vllm, pytest.mark.swift, pytest.mark.slow]

N_TRAIN, N_TEST, MAX_STEPS = 2000, 50, 300  # SPRINT: the steps of as many tokens (sprint mini-steps)
FIDELITY_FLOOR = 0.3  # measured 0.52 (0.62, 0.40 in other data orders); a fixed template scores 0.14 at most
WELL_FORMED_FLOOR = 0.8  # measured 0.96 (0.94, 0.86)


@pytest.fixture(scope="module")
def plan_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return run_mini_demo(tmp_path_factory.mktemp("plans") / "run",
                         {"TASK": "arithmetic", "N_TRAIN": str(N_TRAIN), "N_TEST": str(N_TEST), "BASE_STEPS": "0",
                          "MAX_STEPS": str(MAX_STEPS), "RFT": "0", "SCHEDULES": "stream", "EXECUTOR_ROWS": "none",
                          "PROBLEM_WORKERS": "8", "TIMED": "0"},
                         timeout=1200, label="arithmetic mini demo (CI size)")


def test_a_sprint_model_trained_from_scratch_plans_each_problems_own_dag(plan_run: Path) -> None:
    run = plan_run / "runs" / "sprint-stream"
    assert len(list(iter_jsonl(run / "records.jsonl"))) == N_TEST
    figures = plan_figures(read_run(run))
    problems = list(iter_jsonl(plan_run / "data" / "test.jsonl"))
    template = Counter(tuple(p["widths"]) for p in problems).most_common(1)[0][1] / len(problems)
    print(f"well-formed {figures.well_formed:.0%}, plan = ideal packing {figures.fidelity:.0%} (best fixed template "
          f"{template:.0%}), phase counts {figures.phase_counts}, largest widths {figures.largest_widths}, "
          f"commonest shape {figures.top_shape}, phases by depth "
          f"{ {d: round(v['phases'], 2) for d, v in figures.by_depth.items()} }")
    assert figures.problems == N_TEST and figures.well_formed >= WELL_FORMED_FLOOR, figures
    assert len(figures.phase_counts) >= 3 and len(figures.largest_widths) >= 3, figures
    assert figures.top_shape[1] <= 0.4, figures
    assert figures.fidelity >= FIDELITY_FLOOR and figures.fidelity > 2 * template, (figures.fidelity, template)
    phases = [figures.by_depth[d]["phases"] for d in sorted(figures.by_depth)]
    assert len(phases) >= 3 and phases == sorted(phases) and phases[0] < phases[-1], figures.by_depth
    # the summary and the table the main job ends with are written for this task too
    assert "plan equals the ideal packing" in (plan_run / "miniature" / "miniature.md").read_text()
    table = json.loads((plan_run / "evaluation" / "table2.json").read_text())
    assert [r["method"] for r in table["rows"]] == ["SPRINT stream"]
