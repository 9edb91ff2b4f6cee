"""Figure 6 by quartiles of the baseline's length, and the plan shapes: buckets, ratios and distributions worked
out by hand on synthetic results, then the same block end to end (metrics.json, report.md, the PNG, the viewer)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from sprint.evaluation import metrics as M
from sprint.evaluation.evaluate import evaluate
from sprint.evaluation.quartile_report import TITLE, SHAPES_TITLE, markdown_lines, shape_markdown_lines
from sprint.evaluation.quartiles import MIN_PAIRED, by_quartile, quartile_edges, quartile_of
from sprint.evaluation.shapes import plan_shapes, shape_of
from sprint.format.trajectory import Execution, Phase, Trajectory, render_prompt
from sprint.viewer.site import ViewConfig, build
from tests.helpers import write_run

STATS = {"resamples": 2000, "seed": 0, "confidence": 0.95}


@dataclass
class Run:
    """What the block reads of a run (evaluate's RunResult)."""

    label: str
    results: list[M.ProblemResult]
    manifest: dict = field(default_factory=dict)


# Eight problems. The baseline's lengths 100..800 have linear quartiles 275, 450 and 625, so each quartile holds
# two problems: Q1 {p1, p2}, Q2 {p3, p4}, Q3 {p5, p6}, Q4 {p7, p8}.
BASE_TOKENS = [100, 200, 300, 400, 500, 600, 700, 800]
SPRINT_TOKENS = [110, 210, 210, 190, 300, 250, 300, 300]
# Measured seconds: SPRINT timed p1-p6 alone, the baseline p2-p8; both only on p2-p6.
SPRINT_SECONDS = [9.0, 2.0, 1.0, 3.0, 2.0, 2.0, None, None]
BASE_SECONDS = [None, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 8.0]
SPRINT_CORRECT = [True, True, False, True, True, True, False, True]


def results() -> tuple[Run, Run]:
    sprint, base = [], []
    for i in range(8):
        pid = f"p{i + 1}"
        sprint.append(M.ProblemResult(pid, SPRINT_CORRECT[i], True, sequential=SPRINT_TOKENS[i],
                                      measured_seconds=SPRINT_SECONDS[i], modelled_seconds=SPRINT_TOKENS[i] / 100,
                                      phases=2, prompts_per_phase=[2, 0]))
        base.append(M.ProblemResult(pid, True, True, sequential=BASE_TOKENS[i], measured_seconds=BASE_SECONDS[i],
                                    modelled_seconds=BASE_TOKENS[i] / 100, modelled_by_schedule={}))
    return Run("S", sprint, {"config": {"schedule": "stream"}}), Run("B", base)


def test_edges_and_buckets_by_hand() -> None:
    assert quartile_edges(BASE_TOKENS) == [100.0, 275.0, 450.0, 625.0, 800.0]
    edges = quartile_edges(BASE_TOKENS)
    assert [quartile_of(t, edges) for t in BASE_TOKENS] == ["Q1", "Q1", "Q2", "Q2", "Q3", "Q3", "Q4", "Q4"]
    assert quartile_of(275, edges) == "Q1" and quartile_of(275.5, edges) == "Q2"  # the upper edge is inclusive
    assert quartile_of(None, edges) is None
    same = quartile_edges([284] * 8)  # one length for every problem (the Countdown miniature): one bucket
    assert same == [284.0] * 5 and quartile_of(284, same) == "Q1"


def test_ratios_by_hand() -> None:
    sprint, base = results()
    reference = M.baseline_reference([base.results])
    block = by_quartile([sprint], [base], reference, STATS)
    assert block["edges"] == [100.0, 275.0, 450.0, 625.0, 800.0] and block["skipped"] is None
    assert [(q["quartile"], q["lower"], q["upper"], q["baseline_problems"]) for q in block["quartiles"]] == [
        ("Q1", 100.0, 275.0, 2), ("Q2", 275.0, 450.0, 2), ("Q3", 450.0, 625.0, 2), ("Q4", 625.0, 800.0, 2)]
    (c,) = block["comparisons"]
    assert (c["run"], c["baseline"], c["schedule"], c["paired"]) == ("S", "B", "stream", 8)
    q = {e["quartile"]: e for e in c["quartiles"]}
    assert [q[k]["problems"] for k in ("Q1", "Q2", "Q3", "Q4")] == [2, 2, 2, 2]
    # Sequential tokens: ratio of means per quartile. With two problems a resample's ratio is one problem's, the
    # other's, or the pair's, so the 95% interval runs from the smaller single ratio to the larger.
    assert q["Q1"]["tokens"] == {"value": pytest.approx(320 / 300), "ci": [pytest.approx(1.05), pytest.approx(1.1)],
                                 "n": 2, "sprint": 160.0, "baseline": 150.0}
    assert q["Q2"]["tokens"]["value"] == pytest.approx(400 / 700)
    assert q["Q2"]["tokens"]["ci"] == [pytest.approx(190 / 400), pytest.approx(210 / 300)]
    assert q["Q3"]["tokens"]["value"] == pytest.approx(550 / 1100)
    assert q["Q4"]["tokens"]["value"] == pytest.approx(600 / 1500)
    assert q["Q4"]["tokens"]["ci"] == [pytest.approx(300 / 800), pytest.approx(300 / 700)]
    assert c["overall"]["tokens"]["value"] == pytest.approx(1870 / 3600) and c["overall"]["tokens"]["n"] == 8
    # the same machinery as the fixed buckets: the ratio is 1 - their reduction, its interval flipped
    fixed = M.compare(M.pair(sprint.results, base.results, reference), **STATS)["overall"]
    assert c["overall"]["tokens"]["value"] == pytest.approx(1 - fixed["reduction"])
    assert c["overall"]["tokens"]["ci"] == pytest.approx([1 - fixed["reduction_ci"][1], 1 - fixed["reduction_ci"][0]])
    # Measured seconds only where both ran alone: p2 in Q1, p3-p4 in Q2, p5-p6 in Q3, none in Q4.
    assert q["Q1"]["measured_seconds"] == {"value": 0.5, "ci": [0.5, 0.5], "n": 1, "sprint": 2.0, "baseline": 4.0}
    assert q["Q2"]["measured_seconds"]["value"] == pytest.approx(4 / 8) and q["Q2"]["measured_seconds"]["n"] == 2
    assert q["Q3"]["measured_seconds"]["value"] == pytest.approx(4 / 10)
    assert q["Q4"]["measured_seconds"] is None
    assert c["overall"]["measured_seconds"]["value"] == pytest.approx(10 / 22) and c["overall"]["measured_seconds"]["n"] == 5
    # Modelled seconds are tokens / 100 on both sides here: the same ratios as the tokens, on every problem.
    for e in [c["overall"], *c["quartiles"]]:
        assert e["modelled_seconds"]["value"] == pytest.approx(e["tokens"]["value"])
        assert e["modelled_seconds"]["n"] == e["problems"]
    assert q["Q2"]["sprint_accuracy"] == 0.5 and q["Q4"]["sprint_accuracy"] == 0.5 and q["Q1"]["sprint_accuracy"] == 1.0
    assert json.loads(json.dumps(block, allow_nan=False)) == block  # metrics.json can hold it


def test_report_rows_by_hand() -> None:
    sprint, base = results()
    block = by_quartile([sprint], [base], M.baseline_reference([base.results]), STATS)
    lines = markdown_lines(block, "modelled: hand GPU, one problem at a time")
    assert lines[0].startswith("| Method | Quartile | Baseline tokens | Problems |")
    assert "| S / B | all | [100, 800] | 8 | 450 | 234 | 0.52 [" in lines[2]
    assert lines[3] == ("| S / B | Q1 | [100, 275] | 2 | 150 | 160 | 1.07 [1.05–1.10] | 0.50 [0.50–0.50] (n=1) | "
                        "1.07 [1.05–1.10] (n=2) |")
    assert lines[4].startswith("| S / B | Q2 | (275, 450] | 2 | 350 | 200 | 0.57 [0.47–0.70] | 0.50 [")
    assert lines[6].endswith("| – | 0.40 [0.38–0.43] (n=2) |")  # Q4: neither run timed a problem there alone
    assert any("min 100, Q1 275, median 450, Q3 625, max 800" in line for line in lines)


def test_too_few_pairs_are_skipped_with_a_note() -> None:
    sprint, base = results()
    few = Run("few", sprint.results[: MIN_PAIRED - 1])
    block = by_quartile([sprint, few], [base], M.baseline_reference([base.results]), STATS)
    assert "quartiles" in block["comparisons"][0] and block["comparisons"][1]["paired"] == 7
    assert block["comparisons"][1]["skipped"].startswith("only 7 problems have tokens on both sides")
    assert any(line.startswith("few / B: skipped, only 7") for line in markdown_lines(block))
    short = Run("B", base.results[:5])
    tiny = by_quartile([sprint], [short], M.baseline_reference([short.results]), STATS)
    assert tiny["edges"] is None and tiny["comparisons"] == [] and "only 5 problems" in tiny["skipped"]
    assert markdown_lines(tiny) == ["Skipped: the baseline has a length for only 5 problems; quartiles need at least 8."]
    assert by_quartile([sprint], [], None, STATS) is None and markdown_lines(None) == []


def test_plan_shapes_by_hand() -> None:
    assert shape_of([3, 0]) == (3,) and shape_of([0, 2, 0, 1]) == (2, 1) and shape_of([0]) == ()
    per_phase = [[3, 0], [3, 0], [2, 1, 0], [0], [1, 4, 0], [3, 0]]
    rows = [M.ProblemResult(f"p{i}", True, True, sequential=10, phases=len(k), prompts_per_phase=k)
            for i, k in enumerate(per_phase)]
    rows.append(M.ProblemResult("failed", False, False, status="server_error"))  # no text: not counted
    (s,) = plan_shapes([Run("S", rows)])
    assert s["problems"] == 6
    assert s["phases_with_prompts"] == {"0": 1, "1": 3, "2": 2}
    assert s["largest_phase_width"] == {"0": 1, "2": 1, "3": 3, "4": 1}
    assert (s["distinct_phase_counts"], s["distinct_largest_widths"], s["distinct_shapes"]) == (3, 4, 4)
    assert s["commonest_shape"] == {"shape": [3], "problems": 3, "share": 0.5}
    assert s["mean_phases_with_prompts"] == pytest.approx(7 / 6)
    assert s["mean_largest_phase_width"] == pytest.approx(15 / 6)
    lines = shape_markdown_lines([s])
    assert lines[2] == "| S | 6 | 0: 1, 1: 3, 2: 2 | 0: 1, 2: 1, 3: 3, 4: 1 | 4 | [3]: 50.0% (3) |"


# --------------------------------------------------------------------------- end to end

T0 = 1_700_000_000.0


def call(role: str, start: float, end: float, prompt: str | None = None) -> dict:
    return {"role": role, "phase": 1, "prompt": prompt, "prompt_tokens": 5, "completion_tokens": 7,
            "finish_reason": "stop", "start": T0 + start, "end": T0 + end, "cached": False, "kept": True}


def sprint_text(i: int) -> str:
    """Problem i: i + 1 prompts in phase 1, a second phase of one prompt for odd i."""
    k = i % 3 + 1
    phases = [Phase(1, "Split it. " + " ".join(render_prompt(f"1.{j}", f"part {j}") for j in range(1, k + 1)),
                    [Execution(f"1.{j}", "work " * (5 + i)) for j in range(1, k + 1)])]
    if i % 2:
        phases.append(Phase(2, "Then. " + render_prompt("2.1", "join"), [Execution("2.1", "joined")]))
    return Trajectory("What is 2 + 2?", phases, "So the answer is \\boxed{4}.").render()


def base_text(i: int) -> str:
    return "Let me think. " + "step " * (20 * (i + 1)) + "So \\boxed{4}."


@pytest.fixture
def run_dirs(tmp_path: Path) -> dict[str, Path]:
    """Twelve problems; each ran alone: SPRINT in 1 s, the baseline in 2 s (every other one), so the measured
    ratio is 0.5 wherever both have seconds."""
    n = 12
    srows = [{"id": f"p{i}", "index": i, "question": "What is 2 + 2?", "gold": "4", "trajectory": sprint_text(i),
              "status": "ok", "forced_final": False, "calls": [call("planner", 10 * i, 10 * i + 1)], "start": T0}
             for i in range(n)]
    brows = [{"id": f"p{i}", "index": i, "question": "What is 2 + 2?", "gold": "4", "generation": base_text(i),
              "status": "ok", "calls": [call("baseline", 10 * i, 10 * i + 2)] if i % 2 == 0 else [], "start": T0}
             for i in range(n)]
    return {"sprint": write_run(tmp_path / "sprint", srows, config={"task": "math", "schedule": "stream"}),
            "base": write_run(tmp_path / "base", brows, stage="baseline", config={"task": "math"})}


def test_evaluate_writes_the_block(run_dirs: dict[str, Path], tmp_path: Path, tok_dir: Path) -> None:
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    lengths = [len(tok.encode(base_text(i), add_special_tokens=False).ids) for i in range(12)]
    ev = evaluate(run_dirs["sprint"], baseline=f"{run_dirs['base']}=RFT", planner_tokenizer=str(tok_dir),
                  out_dir=tmp_path / "out", resamples=200, workers=1, plots=True)
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    block = metrics["by_quartile"]
    assert block["edges"] == pytest.approx([float(v) for v in np.quantile(lengths, [0, 0.25, 0.5, 0.75, 1])])
    assert block["baseline"] == "RFT" and block["baseline_problems"] == 12
    (c,) = block["comparisons"]
    assert [q["problems"] for q in c["quartiles"]] == [3, 3, 3, 3]  # lengths all differ: three a quartile
    rows = {r["id"]: r for r in metrics["runs"][0]["problems"]}
    for q in c["quartiles"]:  # each quartile's tokens ratio from the per-problem rows, by hand
        ids = [f"p{i}" for i in range(12) if quartile_of(lengths[i], block["edges"]) == q["quartile"]]
        assert q["tokens"]["value"] == pytest.approx(sum(rows[i]["sequential"] for i in ids)
                                                     / sum(lengths[int(i[1:])] for i in ids))
    assert c["overall"]["measured_seconds"] == {"value": 0.5, "ci": [0.5, 0.5], "n": 6, "sprint": 1.0,
                                                "baseline": 2.0}
    assert rows["p1"]["measured_seconds"] == 1.0
    assert c["overall"]["modelled_seconds"]["n"] == 12
    (s,) = metrics["plan_shapes"]
    assert s["phases_with_prompts"] == {"1": 6, "2": 6} and s["largest_phase_width"] == {"1": 4, "2": 4, "3": 4}
    assert s["commonest_shape"]["share"] == pytest.approx(2 / 12)  # six shapes, two problems each
    report = (tmp_path / "out" / "report.md").read_text()
    assert f"## {TITLE}" in report and f"## {SHAPES_TITLE}" in report
    assert report.index("## Reduction by baseline length") < report.index(f"## {TITLE}")
    assert "| sprint / RFT | Q4 |" in report and "(ratio_by_quartile.png)" in report
    assert (tmp_path / "out" / "ratio_by_quartile.png").read_bytes()[:4] == b"\x89PNG"
    assert ev.metrics["by_quartile"] == block


def test_viewer_index_shows_the_quartiles(run_dirs: dict[str, Path], tmp_path: Path, tok_dir: Path) -> None:
    result = build(ViewConfig(runs=[str(run_dirs["sprint"])], baseline=[f"{run_dirs['base']}=RFT"],
                              planner_tokenizer=str(tok_dir), out=str(tmp_path / "site"), bootstrap=100))
    index = result.index.read_text()
    section = re.search(r'<section class="quartiles">.*?</section>', index, re.DOTALL)
    assert section and TITLE.replace("'", "&#x27;") in section.group(0)
    rows = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(<td>.*?)</tr>", section.group(0))]
    assert [r[1] for r in rows] == ["all", "Q1", "Q2", "Q3", "Q4"]
    report = (tmp_path / "site" / "evaluation" / "report.md").read_text()
    for row in rows:  # the same cells as report.md
        assert "| " + " | ".join(row) + " |" in report
    assert '<section class="shapes">' in index and 'src="evaluation/ratio_by_quartile.png"' in index
