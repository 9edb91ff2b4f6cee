"""Modelled seconds in every evaluation: checked by hand on a small trajectory, and printed for a run in the
authors' released layout (planner_trajectory_<id>.txt / base_model_trajectory_<id>.txt) that was never timed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sprint import cli
from sprint.evaluation.evaluate import evaluate
from sprint.format import tags
from sprint.format.trajectory import parse, render_question
from sprint.latency.simulate import line_counts
from tests.test_evaluate import BASELINE, TRAJECTORY

GOLD = {"1": "14", "2": "14"}

FAST = {"resamples": 100, "workers": 1, "plots": False}
# 1 s a decode step whatever the batch and the contexts, 0.01 s per new prompt token, nothing else
HAND = {"latency_model": {"step_base_s": 1.0, "step_per_seq_s": 0.0, "step_per_context_s": 0.0, "prefill_base_s": 0.0,
                          "prefill_floor_s": 0.0, "prefill_per_token_s": 0.01, "prefill_per_pair_s": 0.0,
                          "gpu": "hand GPU"}}


@pytest.fixture(scope="module")
def n_tokens(tok_dir: Path):
    """An independent counter: the `tokenizers` library straight from the file."""
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def released(folder: Path, ids: dict[str, tuple[str, str]]) -> Path:
    """The authors' layout: one planner and one baseline text per problem id (and a gold CSV beside it)."""
    folder.mkdir()
    (folder.parent / "gold.csv").write_text("id,answer\n" + "".join(f"{pid},14\n" for pid in ids))
    for pid, (sprint_text, base_text) in ids.items():
        (folder / f"planner_trajectory_{pid}.txt").write_text(sprint_text)
        (folder / f"base_model_trajectory_{pid}.txt").write_text(base_text)
    return folder


def test_modelled_seconds_by_hand(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    logs = released(tmp_path / "logs", {"1": (TRAJECTORY, BASELINE)})
    (tmp_path / "hand.json").write_text(json.dumps(HAND))
    ev = evaluate(logs, gold=GOLD, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out",
                  latency=str(tmp_path / "hand.json"), **FAST)
    traj = parse(TRAJECTORY, strict=True)
    p1, p2 = traj.phases

    def n(text: str) -> int:  # the timeline's counts: the sum of the text's lines
        return line_counts(str(tok_dir), [text])[text]

    # The agent prompt is cached and KV reads are free here: it costs nothing. Phase 1's planner prefills the
    # question, <think> and <Plan_1>, then decodes the plan and </Plan_1>, one second a token.
    head = n(render_question(traj.question)) + n(tags.THINK)
    plan1 = n(p1.plan) + n(tags.plan_close(1))
    planner1 = 0.01 * (head + n(tags.plan_open(1))) + plan1
    # barrier: both executors prefill their two opening tags (the same count), then decode together
    opening = n(tags.executions_open(1)) + n(tags.execution_open("1.1"))
    assert opening == n(tags.executions_open(1)) + n(tags.execution_open("1.2"))
    execs = [n(p1.execution(k).text) + n(tags.execution_close(k)) for k in ("1.1", "1.2")]
    phase1 = planner1 + 0.01 * opening + max(execs)
    # phase 2's planner prefills what it did not write: phase 1 rendered, less its plan and tags, and <Plan_2>
    new2 = n(p1.render()) - n(tags.plan_open(1)) - plan1 + n(tags.plan_open(2))
    plan2 = n(p2.plan) + n(tags.plan_close(2))
    # the answer: phase 2 rendered, less what the planner wrote, and <Final_answer>; then the answer and its tag
    new3 = n(p2.render()) - n(tags.plan_open(2)) - plan2 + n(tags.FINAL)
    final = n(traj.final_answer) + n(tags.FINAL_END)
    barrier = phase1 + 0.01 * new2 + plan2 + 0.01 * new3 + final
    # stream: executor k starts when the planner has written its </prompt_1.k> (s_k tokens after its prefill),
    # prefills, and joins at the planner's next step: it ends 1 + e_k seconds after that mark
    marks = [n(p1.plan[: pr.end]) for pr in p1.prompts]
    stream1 = 0.01 * (head + n(tags.plan_open(1))) + max([plan1] + [s + 1 + e for s, e in zip(marks, execs)])
    stream = stream1 + 0.01 * new2 + plan2 + 0.01 * new3 + final
    base = 0.01 * (head) + n_tokens(BASELINE)

    row = ev.metrics["runs"][0]["problems"][0]
    assert row["modelled_by_schedule"]["barrier"] == pytest.approx(barrier)
    assert row["modelled_by_schedule"]["stream"] == pytest.approx(stream)
    assert row["modelled_seconds"] == pytest.approx(barrier)  # the authors' logs name no schedule: barrier
    assert ev.metrics["baselines"][0]["problems"][0]["modelled_seconds"] == pytest.approx(base)
    block = ev.metrics["modelled"]
    assert block["label"] == "modelled: hand GPU, one problem at a time" and block["gpu"] == "hand GPU"
    ratio = block["comparisons"][0]["by_schedule"]["barrier"]["overall"]
    assert ratio["value"] == pytest.approx(barrier / base) and ratio["n"] == 1
    bucket = ev.metrics["runs"][0]["problems"][0]["bucket"]
    assert block["runs"][0]["buckets"][bucket]["value"] == pytest.approx(barrier)
    rows = {r["method"]: r for r in ev.table2["rows"]}
    assert ev.table2["modelled"] == "modelled: hand GPU, one problem at a time"
    assert [r["modelled_seconds"]["value"] for r in ev.table2["rows"]] == pytest.approx([base, barrier])
    assert rows[ev.table2["rows"][1]["method"]]["modelled_seconds_by_bucket"][bucket]["value"] == pytest.approx(barrier)


def test_released_fixture_prints_modelled_seconds_on_the_h200(tmp_path: Path, tok_dir: Path,
                                                            capsys: pytest.CaptureFixture) -> None:
    long_plan = TRAJECTORY.replace("Multiplication first.", "Multiplication first. " * 400)
    logs = released(tmp_path / "logs", {"1": (TRAJECTORY, BASELINE), "2": (long_plan, BASELINE * 200)})
    out = tmp_path / "out"
    assert cli.main(["evaluate", str(logs), "--out", str(out), "--bootstrap", "200", "--no-plots", "--workers", "1",
                     "--planner-tokenizer", str(tok_dir), "--gold", str(tmp_path / "gold.csv")]) == 0
    said = capsys.readouterr().out
    assert "seconds per problem (modelled: NVIDIA H200, one problem at a time):" in said
    assert " (barrier): " in said and " (sequential): " in said and " barrier / " in said and " stream / " in said
    table = json.loads((out / "table2.json").read_text())
    assert table["modelled"] == "modelled: NVIDIA H200, one problem at a time"
    base, sprint = table["rows"]
    assert base["modelled_seconds"]["n"] == sprint["modelled_seconds"]["n"] == 2
    assert base["seconds_per_problem"] is None and sprint["seconds_per_problem"] is None  # never timed
    # a 7B model decodes ~150 tokens a second alone: seconds are tokens / 150 or so, and the long one lands in a bucket
    metrics = json.loads((out / "metrics.json").read_text())
    seq = {r["id"]: r["sequential"] for r in metrics["baselines"][0]["problems"]}
    secs = {r["id"]: r["modelled_seconds"] for r in metrics["baselines"][0]["problems"]}
    for pid in seq:
        assert 0.0066 * seq[pid] < secs[pid] < 0.0075 * seq[pid] + 0.1
    assert sum(v is not None for v in sprint["modelled_seconds_by_bucket"].values()) == 2
    report = (out / "report.md").read_text()
    assert "## Modelled seconds" in report and "modelled: NVIDIA H200, one problem at a time" in report


def test_no_latency_model_means_no_modelled_seconds(tmp_path: Path, tok_dir: Path) -> None:
    logs = released(tmp_path / "logs", {"1": (TRAJECTORY, BASELINE)})
    ev = evaluate(logs, gold=GOLD, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", latency="none", **FAST)
    assert ev.metrics["modelled"] is None and ev.table2["modelled"] is None
    assert all(r["modelled_seconds"] is None for r in ev.table2["rows"])
    assert "## Modelled seconds" not in (tmp_path / "out" / "report.md").read_text()
    assert cli.main(["evaluate", str(logs), "--out", str(tmp_path / "bad"), "--latency", str(tmp_path / "nope.json"),
                     "--planner-tokenizer", str(tok_dir), "--no-plots", "--gold", str(tmp_path / "gold.csv")]) == 2
