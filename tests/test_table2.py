"""The paper-shaped Table 2: hand-made runs whose accuracy, sequential/total tokens and measured
seconds per problem are worked out by hand, checked in table2.json, report.md and the viewer's index."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sprint import cli
from sprint.evaluation.evaluate import evaluate
from sprint.evaluation.metrics import mean_with_ci
from sprint.evaluation.runs import load_runs, split_label
from sprint.evaluation.runs import RawProblem
from sprint.evaluation.table2 import TITLE, latency_seconds, problem_seconds
from sprint.format.trajectory import Execution, Phase, Trajectory, count_tokens, parse, render_prompt
from sprint.viewer.site import ViewConfig, build
from tests.helpers import write_run

T0 = 1_700_000_000.0  # records store time.time(); offsets below are exact in binary floating point
STATS = {"resamples": 200, "workers": 1, "plots": False}
BARRIER_LABEL = "SPRINT <b>barrier</b>"  # HTML in a label: every rendering must escape it


def call(role: str, start: float, end: float, *, prompt: str | None = None, cached: bool = False,
         error: str | None = None) -> dict:
    """One call as records.jsonl stores it (sprint.core.calls.CallRecord's keys)."""
    return {"role": role, "phase": 1, "prompt": prompt, "prompt_tokens": 5, "completion_tokens": 7,
            "finish_reason": "stop", "start": T0 + start, "end": T0 + end, "cached": cached, "draw": 1, "run": 1,
            "kept": error is None, "error": error}


def sprint_text(plan: str, execution: str, answer: str) -> str:
    traj = Trajectory("What is 2 + 2?", [Phase(1, plan + " " + render_prompt("1.1", "add the numbers"),
                                                [Execution("1.1", execution)])],
                      f"So the answer is \\boxed{{{answer}}}.")
    return traj.render()


# Two problems per run, gold 4. SPRINT p1 is right, p2 wrong; the baseline gets both right.
TEXTS = {
    "p1": sprint_text("I add the two numbers.", "Two plus two: 2, then 3, then 4. It is 4.", "4"),
    "p2": sprint_text("A short plan.", "Five.", "5"),
}
BASE_TEXTS = {"p1": "Two and two make four, so \\boxed{4}.",
              "p2": "Let me count carefully: one, two, three, four. The total is four. \\boxed{4}"}
# Wall-clock spans (first call's start to last call's end): p1 5.0 s, p2 3.0 s.
BARRIER_CALLS = {
    "p1": [call("planner", 0, 1.5), call("executor", 1.5, 4, prompt="1.1"), call("planner", 4, 5, prompt="final")],
    "p2": [call("planner", 0.5, 1.5), call("executor", 1.5, 3, prompt="1.1"), call("planner", 3, 3.5, prompt="final")],
}
# The baseline: p1 one call of 8 s; p2 a failed call then its retry: 10 s, the retry included.
BASE_CALLS = {"p1": [call("baseline", 0, 8)],
              "p2": [call("baseline", 0, 2, error="timeout"), call("baseline", 2, 10)]}
# A run whose p1 was answered from the response cache: only p2 (6 s) is measured.
CACHED_CALLS = {"p1": [call("planner", 0, 0.5, cached=True), call("executor", 0.5, 1, prompt="1.1")],
                "p2": [call("planner", 0, 2), call("executor", 2, 6, prompt="1.1")]}


def sprint_run(folder: Path, schedule: str, calls: dict[str, list[dict]] | None) -> Path:
    rows = [{"id": pid, "index": i, "question": "What is 2 + 2?", "gold": "4", "trajectory": text, "status": "ok",
             "forced_final": False, "calls": (calls or {}).get(pid, []), "start": T0}
            for i, (pid, text) in enumerate(TEXTS.items())]
    return write_run(folder, rows, config={"task": "math", "schedule": schedule})


def baseline_run(folder: Path) -> Path:
    rows = [{"id": pid, "index": i, "question": "What is 2 + 2?", "gold": "4", "generation": text, "status": "ok",
             "calls": BASE_CALLS[pid], "start": T0} for i, (pid, text) in enumerate(BASE_TEXTS.items())]
    return write_run(folder, rows, stage="baseline", config={"task": "math"})


@pytest.fixture(scope="module")
def n_tokens(tok_dir: Path):
    """An independent counter: the `tokenizers` library straight from the file."""
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    return {"barrier": sprint_run(tmp_path / "barrier", "barrier", BARRIER_CALLS),
            "stream": sprint_run(tmp_path / "stream", "stream", None),  # no call times recorded
            "grpo": sprint_run(tmp_path / "grpo", "stream", CACHED_CALLS),
            "base": baseline_run(tmp_path / "base")}


def measure(value: float, lo: float, hi: float, n: int) -> dict:
    return {"value": pytest.approx(value), "ci": [pytest.approx(lo), pytest.approx(hi)], "n": n}


# --------------------------------------------------------------------------- pieces


def test_mean_with_ci_by_hand() -> None:
    # Two values: a resample's mean is 1, 2 or 3 with chances 1/4, 1/2, 1/4, so the 95% interval is [1, 3].
    assert mean_with_ci([1.0, 3.0], resamples=400, seed=0) == {"value": 2.0, "ci": [1.0, 3.0], "n": 2}
    assert mean_with_ci([7.0], resamples=50) == {"value": 7.0, "ci": [7.0, 7.0], "n": 1}
    assert mean_with_ci([2.0, 4.0], resamples=0) == {"value": 3.0, "ci": None, "n": 2}
    assert mean_with_ci([]) is None  # nothing measured: missing, not 0


def test_problem_seconds_spans_first_start_to_last_end() -> None:
    assert problem_seconds(BARRIER_CALLS["p1"]) == 5.0
    assert problem_seconds(BASE_CALLS["p2"]) == 10.0  # a failed call and its retry both took time
    assert problem_seconds([]) is None
    assert problem_seconds([{"role": "planner", "start": "soon", "end": None}]) is None
    assert problem_seconds(CACHED_CALLS["p1"]) is None  # a cache read is not the model's time
    assert problem_seconds(CACHED_CALLS["p2"]) == 6.0


def test_seconds_read_the_problems_that_ran_alone() -> None:
    """A timed subset one at a time (a: 0-2 s, b: 2-5 s), then three in flight together (c, d, e):
    only a and b are latency. All in flight together, or all alone: every problem counts."""
    def problem(pid: str, start: float, end: float) -> RawProblem:
        return RawProblem(id=pid, text="x", calls=[call("baseline", start, end)])

    timed = [problem("a", 0, 2), problem("b", 2, 5)]
    crowd = [problem("c", 5, 9), problem("d", 5.5, 7), problem("e", 8, 12)]
    assert latency_seconds(crowd[::-1] + timed) == [2.0, 3.0]
    assert sorted(latency_seconds(crowd)) == [1.5, 4.0, 4.0]
    assert latency_seconds(timed) == [2.0, 3.0]
    assert latency_seconds([problem("f", 0, 1), RawProblem(id="g", text="y")]) == [1.0]  # no times: left out


def test_folder_equals_label_names_a_run(tmp_path: Path) -> None:
    base = baseline_run(tmp_path / "base")
    odd = baseline_run(tmp_path / "odd=name")  # an existing path is never split
    assert split_label(f"{base}=RFT") == (base, "RFT")
    assert split_label(str(odd)) == (odd, None)
    assert split_label(f"{base}=") == (Path(f"{base}="), None)
    _, bases = load_runs([], [Path(f"{base}=RFT"), odd])
    assert [b.label for b in bases] == ["RFT", "odd=name"]


# --------------------------------------------------------------------------- evaluate: table2.json and report.md


def test_table2_numbers_by_hand(runs: dict[str, Path], tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    ev = evaluate([f"{runs['barrier']}={BARRIER_LABEL}", runs["stream"], f"{runs['grpo']}=GRPO"],
                  baseline=f"{runs['base']}=RFT", planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **STATS)
    table = json.loads((tmp_path / "out" / "table2.json").read_text())
    assert table == ev.table2 == json.loads((tmp_path / "out" / "metrics.json").read_text())["table2"]
    assert ev.files["table2"] == tmp_path / "out" / "table2.json"
    rows = {r["method"]: r for r in table["rows"]}
    assert [r["method"] for r in table["rows"]] == ["RFT", BARRIER_LABEL, "stream", "GRPO"]  # baseline first

    seq = {pid: count_tokens(parse(t, strict=True), n_tokens) for pid, t in TEXTS.items()}
    s1, s2 = sorted([seq["p1"].sequential, seq["p2"].sequential])
    t1, t2 = sorted([seq["p1"].total, seq["p2"].total])
    b1, b2 = sorted(n_tokens(t) for t in BASE_TEXTS.values())
    assert s1 < s2 and t1 < t2 and b1 < b2  # two distinct lengths: the interval is [shorter, longer]

    rft = rows["RFT"]
    assert (rft["mode"], rft["problems"], rft["path"]) == ("baseline", 2, str(runs["base"]))
    assert rft["accuracy"] == measure(1.0, 1.0, 1.0, 2)
    assert rft["sequential_tokens"] == rft["total_tokens"] == measure((b1 + b2) / 2, b1, b2, 2)
    assert rft["seconds_per_problem"] == measure(9.0, 8.0, 10.0, 2)

    barrier = rows[BARRIER_LABEL]
    assert (barrier["mode"], barrier["schedule"]) == ("sprint", "barrier")
    assert barrier["accuracy"] == measure(0.5, 0.0, 1.0, 2)
    assert barrier["sequential_tokens"] == measure((s1 + s2) / 2, s1, s2, 2)
    assert barrier["total_tokens"] == measure((t1 + t2) / 2, t1, t2, 2)
    assert barrier["seconds_per_problem"] == measure(4.0, 3.0, 5.0, 2)

    stream = rows["stream"]  # the same texts, no call times: tokens as barrier, seconds missing
    assert stream["schedule"] == "stream" and stream["sequential_tokens"] == barrier["sequential_tokens"]
    assert stream["seconds_per_problem"] is None
    assert rows["GRPO"]["seconds_per_problem"] == measure(6.0, 6.0, 6.0, 1)  # p1 came from the cache
    assert set(table["definitions"]) >= {"accuracy", "sequential_tokens", "total_tokens", "seconds_per_problem",
                                         "ci"}
    assert "200 resamples" in table["definitions"]["ci"]

    report = (tmp_path / "out" / "report.md").read_text()
    assert report.index(f"## {TITLE}") < report.index("## Summary")
    lines = report.splitlines()
    assert "| Method | Problems | Accuracy [95% CI] | Sequential tokens [95% CI] | Total tokens [95% CI] | " \
           "Seconds per problem [95% CI] | Seconds per problem (modelled: NVIDIA H200, one problem at a time) " \
           "[95% CI] |" in lines
    assert table["modelled"] == "modelled: NVIDIA H200, one problem at a time"

    def measured(start: str) -> str:  # a row without its last cell (the modelled seconds: tests/test_modelled_seconds.py)
        return next(line for line in lines if line.startswith(start)).rsplit(" | ", 1)[0] + " |"

    b = f"{(b1 + b2) / 2:,.0f} [{b1:,.0f}–{b2:,.0f}]"
    assert measured("| RFT |") == f"| RFT | 2 | 100.0% [100.0–100.0%] | {b} | {b} | 9.00 [8.00–10.00] |"
    assert measured("| SPRINT &lt;") == (
        f"| SPRINT &lt;b&gt;barrier&lt;/b&gt; | 2 | 50.0% [0.0–100.0%] | {(s1 + s2) / 2:,.0f} [{s1:,.0f}–{s2:,.0f}] "
        f"| {(t1 + t2) / 2:,.0f} [{t1:,.0f}–{t2:,.0f}] | 4.00 [3.00–5.00] |")
    assert measured("| stream |").endswith("| – |")  # not measured
    assert measured("| GRPO |").endswith("| 6.00 [6.00–6.00] (1/2) |")
    # every row has modelled seconds: the texts are there whether or not the run was timed
    assert all(r["modelled_seconds"]["n"] == 2 for r in table["rows"])
    assert "<b>barrier</b>" not in report


def test_cli_labels_and_no_call_times(runs: dict[str, Path], tmp_path: Path, tok_dir: Path,
                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cli"
    code = cli.main(["evaluate", str(runs["stream"]), "--baseline", f"{runs['base']}=RFT", "--out", str(out),
                     "--bootstrap", "0", "--no-plots", "--planner-tokenizer", str(tok_dir)])
    assert code == 0 and f"table2: {out / 'table2.json'}" in capsys.readouterr().out
    table = json.loads((out / "table2.json").read_text())
    assert [r["method"] for r in table["rows"]] == ["RFT", "stream"]
    assert table["rows"][1]["seconds_per_problem"] is None  # null in the JSON, never a made-up number
    assert table["rows"][0]["seconds_per_problem"] == {"value": 9.0, "ci": None, "n": 2}  # --bootstrap 0: no CI
    assert "| RFT | 2 | 100.0% |" in (out / "report.md").read_text()
    assert table["rows"][1]["modelled_seconds"]["value"] > 0  # modelled though never timed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["baseline"] == [f"{runs['base']}=RFT"]  # as given; fingerprinted from the folder
    again = cli.main(["evaluate", str(runs["stream"]), "--out", str(out), "--bootstrap", "0", "--no-plots",
                      "--planner-tokenizer", str(tok_dir)])
    assert again == 0  # table2.json is part of a report folder: evaluating into it again is allowed


# --------------------------------------------------------------------------- the viewer's index


def test_viewer_index_shows_the_table_escaped(runs: dict[str, Path], tmp_path: Path, tok_dir: Path) -> None:
    result = build(ViewConfig(runs=[f"{runs['barrier']}={BARRIER_LABEL}", str(runs["stream"])],
                              baseline=[f"{runs['base']}=RFT"], planner_tokenizer=str(tok_dir),
                              out=str(tmp_path / "site"), bootstrap=200, plots=False))
    index = result.index.read_text()
    section = re.search(r'<section class="table2">.*?</section>', index, re.DOTALL)
    assert section and index.index('<section class="table2">') < index.index('<section class="headline">')
    rows = [re.findall(r"<td>(.*?)</td>", tr) for tr in re.findall(r"<tr>(<td>.*?)</tr>", section.group(0))]
    assert [r[0] for r in rows] == ["RFT", "SPRINT &lt;b&gt;barrier&lt;/b&gt;", "stream"]
    assert rows[0][2] == "100.0% [100.0–100.0%]" and rows[0][5] == "9.00 [8.00–10.00]"
    assert rows[1][2] == "50.0% [0.0–100.0%]" and rows[1][5] == "4.00 [3.00–5.00]"
    assert rows[2][5] == "–"
    assert "<b>barrier</b>" not in index
    report = (tmp_path / "site" / "evaluation" / "report.md").read_text()
    for row in rows:  # the same cells as report.md (one table, rendered twice)
        assert "| " + " | ".join(row) + " |" in report
