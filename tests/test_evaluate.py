"""The evaluation stage end to end: hand-counted tokens, failures, the authors' log layout, the report."""

from __future__ import annotations

import csv
import hashlib
import json
import threading
from pathlib import Path

import pytest
from tests.fake_server import ScriptedServer
from tests.helpers import write_run
from tokenizers import Tokenizer, models, pre_tokenizers

from sprint import cli
from sprint.core.errors import UserError
from sprint.evaluation.evaluate import evaluate
from sprint.evaluation.metrics import mcnemar_exact
from sprint.evaluation.report import load_metrics, render_markdown
from sprint.evaluation.runs import _input_files, load_run, run_fingerprint
from sprint.format.tokencount import batch_counts, splits_at_lines
from sprint.format.trajectory import load_tokenizer, token_counter

FAST = {"resamples": 100, "workers": 1, "plots": False}

# A SPRINT trajectory written by hand. Stripped of tags, the pieces the paper's rule counts are:
PLAN1_PREFIX1 = "First I compute the product, then I add.\n\n Compute 3 * 4. "
PLAN1 = PLAN1_PREFIX1 + "\n\nSeparately I check the order of operations.\n\n State which operation comes first. "
EXEC1 = (
    "3 * 4 means three groups of four: 4 + 4 + 4. Adding them one at a time gives 4, then 8, then 12, "
    "so the product is 12. Checking with the times table, 3 * 4 = 12 as well, which confirms it."
)
EXEC2 = "Multiplication first."
PLAN2 = "Based on execution_1.1, execution_1.2:\nAdding 2 to 12 gives 14."
FINAL = "The answer is $\\boxed{14}$."

TRAJECTORY = f"""<Question>
What is 2 + 3 * 4?
</Question>

<Plan_1>
First I compute the product, then I add.

<prompt_1.1> Compute 3 * 4. </prompt_1.1>

Separately I check the order of operations.

<prompt_1.2> State which operation comes first. </prompt_1.2>
</Plan_1>

<Execution_1>
<execution_1.1>
{EXEC1}
</execution_1.1>

<execution_1.2>
{EXEC2}
</execution_1.2>
</Execution_1>

<Plan_2>
{PLAN2}
</Plan_2>

<Execution_2>
No prompt to execute.
</Execution_2>

<Final_answer>
{FINAL}
</Final_answer>"""

BASELINE = "Okay, 3 * 4 is 12 and 2 + 12 is 14.\n\nSo the answer is \\boxed{14}."


@pytest.fixture(scope="module")
def n_tokens(tok_dir: Path):
    """An independent counter: the `tokenizers` library straight from the file."""
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    assert tok.encode("Hello world", add_special_tokens=False).ids == [9707, 1879]  # README's anchor
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def sprint_record(pid: str, text: str | None, gold: str = "14", **extra) -> dict:
    rec = {"id": pid, "question": "q", "gold": gold, "predicted": None, "status": "ok", "forced_final": False,
           "calls": []}
    if text is not None:
        rec["trajectory"] = text
    rec.update(extra)
    return rec


def baseline_record(pid: str, text: str, gold: str = "14", **extra) -> dict:
    rec = {"id": pid, "question": "q", "gold": gold, "predicted": None, "status": "ok", "generation": text,
           "completion_tokens": 999, "calls": []}
    rec.update(extra)
    return rec


# --------------------------------------------------------------------------- token accounting


def test_sequential_and_total_tokens_by_hand(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    p1, plan1, e1, e2, plan2, final = map(n_tokens, (PLAN1_PREFIX1, PLAN1, EXEC1, EXEC2, PLAN2, FINAL))
    # The data is built so that the first prompt's branch is the critical path of phase 1:
    assert p1 + e1 > plan1 + e2 > plan1
    expected_seq = (p1 + e1) + plan2 + final
    expected_total = n_tokens(TRAJECTORY.split("</Question>\n\n", 1)[1])  # the text after the question, tags included
    assert expected_total > plan1 + e1 + e2 + plan2 + final  # the tags cost tokens

    run = write_run(tmp_path / "sprint", [sprint_record("p1", TRAJECTORY)])
    base = write_run(tmp_path / "base", [baseline_record("p1", BASELINE)])
    ev = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **FAST)

    row = ev.metrics["runs"][0]["problems"][0]
    assert (row["sequential"], row["total"]) == (expected_seq, expected_total)
    assert row["planner"] == plan1 + plan2 + final and row["executor"] == e1 + e2
    assert (row["phases"], row["prompts"], row["prompts_per_phase"]) == (2, 2, [2, 0])
    assert row["correct"] and row["answered"] and row["predicted"] == "14"
    brow = ev.metrics["baselines"][0]["problems"][0]
    assert brow["sequential"] == brow["total"] == n_tokens(BASELINE)  # counted from text
    assert brow["reported_tokens"] == 999  # the server's number is kept beside it
    comp = ev.metrics["comparisons"][0]
    assert comp["overall"]["reduction"] == pytest.approx(1 - expected_seq / n_tokens(BASELINE))
    assert row["bucket"] == "<2000" and row["baseline_tokens"] == n_tokens(BASELINE)


def test_batch_counts_equal_the_plain_counter(shared_data: Path, tok_dir: Path) -> None:
    rows = [json.loads(line) for line in open(shared_data / "math500" / "test.jsonl", encoding="utf-8")]
    tricky = [
        "a\n\n  indented after a break", "line\n's contraction", "x\n<think>\ny</think>\n", "end with newline\n",
        "\r\nwindows\r\nlines\r\n", "unicode\né accent\n中文\nok", "tabs\n\tand\n\n\nmany\n \nbreaks",
        "$x$\n$$y$$\n\\[z\\]\n-1\n(2)\n", "\n\nleading", "", "one",
    ]
    texts = [r["solution"] for r in rows] + [r["problem"] for r in rows] + tricky
    texts += ["\n".join(r["solution"] for r in rows[i:i + 7]) for i in range(0, 200, 7)]
    counted = batch_counts(str(tok_dir), texts)
    plain = token_counter(str(tok_dir))
    assert [counted[t] for t in texts] == [plain(t) for t in texts]


def test_batch_counts_on_adversarial_strings(tok_dir: Path) -> None:
    """Line cuts next to whitespace oddities, combining marks, contractions and special tokens."""
    import random

    alphabet = list("\n\n\n  \t\r abcXYZ019'$\\{}()[]<>/|.,;:!?-+=*_^~`\"#%&@") + [
        "\u0301", "é", "中", "😀", "\u00a0", "\u2028", "\x1c", "\x85", "'s", "'ll", "<think>", "</think>",
        "<|im_end|>", "\u3000", "\u200b"]
    rng = random.Random(7)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(3000)]
    counted = batch_counts(str(tok_dir), texts)
    plain = token_counter(str(tok_dir))
    assert [counted[t] for t in texts] == [plain(t) for t in texts]


def test_line_splitting_only_for_known_tokenizers(tok_dir: Path) -> None:
    assert splits_at_lines(json.loads(load_tokenizer(str(tok_dir)).to_str()))
    other = Tokenizer(models.BPE())
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    assert not splits_at_lines(json.loads(other.to_str()))


# --------------------------------------------------------------------------- failures, stored fields


def test_failed_and_missing_trajectories_count_as_no_answer(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    wrong = TRAJECTORY.replace("\\boxed{14}", "\\boxed{15}")
    records = [
        sprint_record("ok", TRAJECTORY, forced_final=True),
        # stored predicted/correct are not trusted: the text says 15
        sprint_record("stored_lies", wrong, predicted="14", correct=True),
        # a failed call with a partial text that happens to hold the right box: not an answer
        sprint_record("failed", TRAJECTORY, status="server_error", error="HTTP 500"),
        # no text in the record and no file: missing
        sprint_record("missing", None, status="timeout"),
        # no text in the record but trajectories/<id>.txt exists: read from there
        sprint_record("from_file", None),
        # a truncated generation without a final answer
        sprint_record("cut", TRAJECTORY.split("<Plan_2>")[0] + "<Plan_2>\nAdding 2 to"),
    ]
    half_line = json.dumps(sprint_record("half", TRAJECTORY))[:40]  # a killed write, no newline
    run = write_run(tmp_path / "run", records, files={"from_file": TRAJECTORY}, tail=half_line)
    ev = evaluate(run, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **FAST)

    rows = {r["id"]: r for r in ev.metrics["runs"][0]["problems"]}
    assert set(rows) == {"ok", "stored_lies", "failed", "missing", "from_file", "cut"}
    assert rows["ok"]["correct"] and rows["from_file"]["correct"]
    assert rows["stored_lies"]["answered"] and not rows["stored_lies"]["correct"]
    assert rows["stored_lies"]["predicted"] == "15"
    assert not rows["failed"]["answered"] and not rows["failed"]["correct"]
    assert rows["failed"]["sequential"] == rows["ok"]["sequential"]  # its tokens still count
    assert rows["missing"]["sequential"] is None and not rows["missing"]["answered"]
    assert not rows["cut"]["answered"] and rows["cut"]["malformed"]
    assert rows["cut"]["sequential"] == n_tokens(PLAN1_PREFIX1) + n_tokens(EXEC1)  # phase 1 only
    s = ev.metrics["runs"][0]["summary"]
    assert (s["problems"], s["correct"], s["answered"], s["no_answer"]) == (6, 2, 3, 3)
    assert s["accuracy"] == pytest.approx(2 / 6) and s["accuracy_answered"] == pytest.approx(2 / 3)
    assert (s["failed"], s["missing_text"], s["forced_final"], s["malformed"]) == (2, 1, 1, 1)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| | SPRINT |\n" in report and "## Reduction by baseline length" not in report
    assert "| Accuracy (no final answer counts as wrong) [95% CI] | 33.3% [" in report
    assert "| Accuracy over answered problems only (authors' variant) | 66.7% |" in report
    assert "| Failed calls (status not ok) | 2 |" in report and "| Forced final answers (phase limit reached) | 1 |" in report


def test_unknown_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", [sprint_record("a", TRAJECTORY)])
    with pytest.raises(UserError, match="tokenizer"):
        evaluate(run, planner_tokenizer=str(tmp_path / "no-such-tokenizer"), write=False, **FAST)


def test_missing_gold_is_a_clear_error(tmp_path: Path, tok_dir: Path) -> None:
    run = write_run(tmp_path / "run", [sprint_record("a", TRAJECTORY, gold=None)])
    with pytest.raises(UserError, match="no gold answer"):
        evaluate(run, planner_tokenizer=str(tok_dir), write=False, **FAST)


def test_a_folder_holding_both_modes_pairs_itself(tmp_path: Path, tok_dir: Path) -> None:
    records = [sprint_record("a", TRAJECTORY, mode="sprint"), baseline_record("a", BASELINE, mode="baseline")]
    run = write_run(tmp_path / "both", records)
    assert [r.mode for r in load_run(run)] == ["sprint", "baseline"]
    ev = evaluate(run, planner_tokenizer=str(tok_dir), write=False, **FAST)
    assert len(ev.runs) == 1 and len(ev.baselines) == 1 and ev.metrics["comparisons"][0]["paired"] == 1


def test_baseline_text_from_the_trajectory_file(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    # orchestration stores a baseline's file as question block + pre-filled <think> + generation + newline
    stored = "<Question>\nWhat is 2 + 3 * 4?\n</Question>\n\n<think>\n" + BASELINE + "\n"
    rec = baseline_record("b", BASELINE)
    del rec["generation"]
    run = write_run(tmp_path / "base", [rec], files={"b": stored}, stage="baseline")
    ev = evaluate(run, planner_tokenizer=str(tok_dir), write=False, **FAST)
    row = ev.metrics["baselines"][0]["problems"][0]
    assert row["sequential"] == n_tokens(BASELINE) and row["correct"]


def test_rows_follow_dataset_order(tmp_path: Path, tok_dir: Path) -> None:
    records = [sprint_record(pid, TRAJECTORY, index=i) for pid, i in (("c", 2), ("a", 0), ("b", 1))]
    ev = evaluate(write_run(tmp_path / "run", records), planner_tokenizer=str(tok_dir), write=False, **FAST)
    assert [r["id"] for r in ev.metrics["runs"][0]["problems"]] == ["a", "b", "c"]


# --------------------------------------------------------------------------- pairing statistics


def test_mcnemar_and_buckets_from_run_folders(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    # baseline lengths: two short, two medium, two long; SPRINT wrong on three the baseline gets right
    lengths = {"s1": 300, "s2": 500, "m1": 3000, "m2": 3500, "l1": 9000, "l2": 9500}
    sprint_wrong = {"s1", "m1", "l1"}
    sprint_recs, base_recs = [], []
    for pid, n in lengths.items():
        text = TRAJECTORY if pid not in sprint_wrong else TRAJECTORY.replace("\\boxed{14}", "\\boxed{13}")
        sprint_recs.append(sprint_record(pid, text))
        base_recs.append(baseline_record(pid, " one" * n + " So \\boxed{14}."))
    run = write_run(tmp_path / "sprint", sprint_recs)
    base = write_run(tmp_path / "base", base_recs)
    ev = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **FAST)

    comp = ev.metrics["comparisons"][0]
    assert comp["mcnemar"]["baseline_only"] == 3 and comp["mcnemar"]["sprint_only"] == 0
    assert comp["mcnemar"]["p_value"] == pytest.approx(2 / 2**3) == mcnemar_exact(0, 3)
    by = {b["bucket"]: b for b in comp["buckets"]}
    assert {k: v["problems"] for k, v in by.items()} == {"<2000": 2, "2000-4000": 2, "4000-8000": 0, ">8000": 2}
    seq = ev.metrics["runs"][0]["problems"][0]["sequential"]
    long_mean = (n_tokens(" one" * 9000 + " So \\boxed{14}.") + n_tokens(" one" * 9500 + " So \\boxed{14}.")) / 2
    assert by[">8000"]["reduction"] == pytest.approx(1 - seq / long_mean)
    assert by[">8000"]["sprint_accuracy"] == 0.5 and by[">8000"]["baseline_accuracy"] == 1.0


def test_several_seeds_give_mean_and_spread(tmp_path: Path, tok_dir: Path) -> None:
    wrong = TRAJECTORY.replace("\\boxed{14}", "\\boxed{1}")
    seed0 = write_run(tmp_path / "seed0" / "sprint", [sprint_record("a", TRAJECTORY), sprint_record("b", TRAJECTORY)])
    seed1 = write_run(tmp_path / "seed1" / "sprint", [sprint_record("a", TRAJECTORY), sprint_record("b", wrong)])
    base = write_run(tmp_path / "base", [baseline_record("a", BASELINE), baseline_record("b", BASELINE)])
    ev = evaluate([seed0, seed1], baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **FAST)
    assert [r["label"] for r in ev.metrics["runs"]] == ["seed0/sprint", "seed1/sprint"]
    acc = ev.metrics["aggregate"]["sprint"]["accuracy"]
    assert acc["values"] == [1.0, 0.5] and acc["mean"] == pytest.approx(0.75)
    assert acc["std"] == pytest.approx(0.3535533906)
    assert len(ev.metrics["comparisons"]) == 2
    report = (tmp_path / "out" / "report.md").read_text()
    assert "| Runs (seeds) | 2 | 1 |" in report
    assert "75.0% ± 35.4 pp" in report


# --------------------------------------------------------------------------- the authors' layout


def test_authors_layout_rescored_with_a_gold_csv(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    right = TRAJECTORY.replace("\\boxed{14}", "\\boxed{(3,\\frac{\\pi}{2})}")
    (logs / "planner_trajectory_test_precalculus_807.txt").write_text(right)
    (logs / "planner_trajectory_test_algebra_1.txt").write_text(TRAJECTORY)  # gold is not 14
    (logs / "base_model_trajectory_test_precalculus_807.txt").write_text("... so \\boxed{(3, \\pi/2)}")
    (logs / "base_model_trajectory_test_algebra_1.txt").write_text(BASELINE)
    gold = tmp_path / "gold.csv"
    with open(gold, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "answer"])
        w.writerow(["test/precalculus/807.json", "\\left( 3, \\frac{\\pi}{2} \\right)"])  # mapped by safe_id
        w.writerow(["test_algebra_1", "7"])

    ev = evaluate(logs, gold=gold, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", **FAST)
    assert [r.mode for r in ev.runs] == ["sprint"] and [r.mode for r in ev.baselines] == ["baseline"]
    rows = {r["id"]: r for r in ev.metrics["runs"][0]["problems"]}
    assert rows["test_precalculus_807"]["correct"] and not rows["test_algebra_1"]["correct"]
    base = {r["id"]: r for r in ev.metrics["baselines"][0]["problems"]}
    assert base["test_precalculus_807"]["correct"] and not base["test_algebra_1"]["correct"]
    assert base["test_algebra_1"]["sequential"] == n_tokens(BASELINE)
    assert ev.metrics["comparisons"][0]["paired"] == 2


def test_authors_layout_with_the_math500_file_as_gold(tmp_path: Path, tok_dir: Path, shared_data: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "planner_trajectory_test_precalculus_807.txt").write_text(
        TRAJECTORY.replace("\\boxed{14}", "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}"))
    ev = evaluate(logs, gold=shared_data / "math500" / "test.jsonl", planner_tokenizer=str(tok_dir), write=False, **FAST)
    assert ev.metrics["runs"][0]["summary"]["correct"] == 1


def test_plain_id_files_are_classified_by_content(tmp_path: Path, tok_dir: Path) -> None:
    logs = tmp_path / "plain"
    logs.mkdir()
    (logs / "a.txt").write_text(TRAJECTORY)
    (logs / "b.txt").write_text(BASELINE)
    runs = load_run(logs)
    assert {r.mode: [p.id for p in r.problems] for r in runs} == {"sprint": ["a"], "baseline": ["b"]}


# --------------------------------------------------------------------------- report, CLI, threads


def test_report_files_table_and_figures(tmp_path: Path, tok_dir: Path, n_tokens) -> None:
    wrong = TRAJECTORY.replace("\\boxed{14}", "\\boxed{2}")
    run = write_run(tmp_path / "sprint", [sprint_record("a", TRAJECTORY), sprint_record("b", wrong),
                                           sprint_record("c", None, status="timeout")])
    base = write_run(tmp_path / "base", [baseline_record(p, BASELINE) for p in "abc"])
    out = tmp_path / "out"
    ev = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=out, resamples=200, workers=1)

    for name in ("metrics", "report", "accuracy_vs_tokens", "reduction_by_bucket", "phases_histogram",
                 "prompts_per_phase", "tokens_scatter"):
        assert ev.files[name].is_file(), name
        if ev.files[name].suffix == ".png":
            assert ev.files[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = load_metrics(out)
    row = metrics["runs"][0]["problems"][0]
    assert {"id", "correct", "answered", "sequential", "total", "phases", "prompts", "bucket"} <= set(row)

    report = (out / "report.md").read_text()
    assert report == render_markdown(metrics, {k: v.name for k, v in ev.files.items() if v.suffix == ".png"})
    counted = [r for r in ev.metrics["runs"][0]["problems"] if r["sequential"] is not None]
    assert len(counted) == 2  # "c" has no text
    seq = sum(r["sequential"] for r in counted) / 2
    total = sum(r["total"] for r in counted) / 2
    decoded = sum(r["sequential_decoded"] for r in counted) / 2
    base_n = n_tokens(BASELINE)
    acc_row = next(line for line in report.splitlines() if line.startswith("| Accuracy (no final answer"))
    assert "| 33.3% [" in acc_row and acc_row.endswith("| 100.0% [100.0, 100.0] |")
    assert "| Accuracy over answered problems only (authors' variant) | 50.0% | 100.0% |" in report
    assert "| Problems without a final answer | 1 | 0 |" in report
    assert "| Missing trajectories (no text) | 1 | 0 |" in report
    assert f"| Mean sequential tokens | {seq:,.0f} | {base_n:,} |" in report
    assert f"| Mean total tokens | {total:,.0f} | {base_n:,} |" in report
    reduction = 100 * (1 - seq / base_n)
    assert f"| Sequential-token reduction vs baseline [95% CI] | {reduction:.1f}% [" in report
    # all three pair up in the <2000 bucket (two with text on both sides); baseline alone right on b, c
    assert f"| <2000 | 3 | {base_n:,} | {seq:,.0f} | {decoded:,.0f} | {reduction:.1f}% [" in report
    assert f"exact McNemar p = {mcnemar_exact(0, 2):.3f}" in report
    assert "![Sequential-token reduction by baseline length bucket](reduction_by_bucket.png)" in report


def test_cli_evaluate(tmp_path: Path, tok_dir: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "sprint", [sprint_record("a", TRAJECTORY)])
    base = write_run(tmp_path / "base", [baseline_record("a", BASELINE)])
    out = tmp_path / "out"
    code = cli.main(["evaluate", str(run), "--baseline", str(base), "--out", str(out), "--bootstrap", "50",
                     "--workers", "1", "--no-plots", "--planner-tokenizer", str(tok_dir)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "SPRINT sprint: accuracy 100.0%" in printed and "McNemar p = 1" in printed
    assert (out / "report.md").is_file() and not list(out.glob("*.png"))
    assert cli.main(["evaluate", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_default_tokenizer_resolves_to_the_local_copy(tmp_path: Path, shared_data: Path, monkeypatch, n_tokens) -> None:
    monkeypatch.setenv("SPRINT_LOCAL_DATA", str(shared_data))
    run = write_run(tmp_path / "base", [baseline_record("a", BASELINE)])
    ev = evaluate(run, write=False, **FAST)
    assert ev.metrics["baselines"][0]["problems"][0]["sequential"] == n_tokens(BASELINE)


def test_same_numbers_off_the_main_thread(tmp_path: Path, tok_dir: Path) -> None:
    # "\frac{1}{2}" vs "0.5" needs Math-Verify (sympy), whose timeouts use SIGALRM
    half = TRAJECTORY.replace("\\boxed{14}", "\\boxed{\\frac{1}{2}}")
    run = write_run(tmp_path / "run", [sprint_record("a", half, gold="0.5"), sprint_record("b", TRAJECTORY, gold="15")])
    main = evaluate(run, planner_tokenizer=str(tok_dir), write=False, **FAST).metrics
    box: dict = {}
    t = threading.Thread(target=lambda: box.update(
        m=evaluate(run, planner_tokenizer=str(tok_dir), write=False, **FAST).metrics))
    t.start()
    t.join(120)
    got = box["m"]
    assert [r["correct"] for r in got["runs"][0]["problems"]] == [True, False]
    assert got["runs"][0]["problems"] == main["runs"][0]["problems"]


def test_reads_the_folders_orchestration_writes(tmp_path: Path, tok_dir: Path, scripted_server: ScriptedServer) -> None:
    """The real producer: `orchestrate` and `baseline` against the scripted server, then evaluate."""
    import re

    from sprint.inference.baseline import BaselineConfig, baseline
    from sprint.inference.orchestration import OrchestrationConfig, orchestrate

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is 2+{i}?", "answer": str(2 + i),
                                        "unique_id": f"test/demo/{i}.json"}) + "\n" for i in range(3)))
    agent = tmp_path / "agent.txt"
    agent.write_text("Solve it in phases.\n")

    def planner_and_executor(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        m = re.search(r"<execution_(\d+\.\d+)>\n$", prompt)
        if m:
            return f"Adding gives the sum.\n</execution_{m.group(1)}>"
        if "<Plan_1>" not in prompt:
            return "<Plan_1>\nAdd them.\n<prompt_1.1> Compute the sum. </prompt_1.1>\n</Plan_1>"
        q = int(re.search(r"What is 2\+(\d)", prompt).group(1))
        return f"<Final_answer>\nThe answer is \\boxed{{{2 + q}}}.\n</Final_answer>"

    srv = scripted_server(planner_and_executor)
    orchestrate(OrchestrationConfig(
        planner_model="test-model", planner_server_url=srv.base_url, out_dir=str(tmp_path / "run"), data=str(data),
        prompt_mode="raw", agent_prompt=str(agent), planner_max_tokens=200, max_tokens=100, max_retries=0,
        timeout=20.0), progress=False)
    generation = "Let me add.\n</think>\nThe answer is \\boxed{4}."
    srv = scripted_server(lambda body, endpoint: generation)
    baseline(BaselineConfig(model="test-model", server_url=srv.base_url, out_dir=str(tmp_path / "base"),
                            data=str(data), prompt_mode="raw", agent_prompt=str(agent), max_tokens=300,
                            max_retries=0), progress=False)

    ev = evaluate(tmp_path / "run", baseline=tmp_path / "base", planner_tokenizer=str(tok_dir), write=False, **FAST)
    plain = token_counter(str(tok_dir))
    sprint_rows = ev.metrics["runs"][0]["problems"]
    assert [r["id"] for r in sprint_rows] == ["test_demo_0", "test_demo_1", "test_demo_2"]
    assert all(r["correct"] and r["phases"] == 1 and r["prompts"] == 1 for r in sprint_rows)
    # one phase: plan up to the prompt's end + its execution, plus the final answer line
    plan, execution, final = "Add them.\n Compute the sum. ", "Adding gives the sum.", "The answer is \\boxed{2}."
    assert sprint_rows[0]["executor"] == plain(execution)
    assert sprint_rows[0]["planner"] == plain(plan) + plain(final)
    assert sprint_rows[0]["sequential"] == plain(plan) + plain(execution) + plain(final)
    # total: the generated text after the question, tags included
    body = ("<Plan_1>\nAdd them.\n<prompt_1.1> Compute the sum. </prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n"
            "<execution_1.1>\nAdding gives the sum.\n</execution_1.1>\n</Execution_1>\n\n"
            "<Final_answer>\nThe answer is \\boxed{2}.\n</Final_answer>")
    assert sprint_rows[0]["total"] == plain(body)
    base_rows = ev.metrics["baselines"][0]["problems"]
    assert [r["correct"] for r in base_rows] == [False, False, True]  # it always says 4
    assert all(r["sequential"] == plain(generation) for r in base_rows)


def test_countdown_task_from_the_manifest(tmp_path: Path, tok_dir: Path) -> None:
    gold = {"nums": [3, 5, 7], "target": 22}
    right = TRAJECTORY.replace("\\boxed{14}", "\\boxed{3 \\times 5 + 7}")
    reused = TRAJECTORY.replace("\\boxed{14}", "\\boxed{3 \\times 7 + 1}")  # 1 is not given
    run = write_run(tmp_path / "cd", [sprint_record("0", right, gold=gold), sprint_record("1", reused, gold=gold)])
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config"]["task"] = "countdown"
    (run / "manifest.json").write_text(json.dumps(manifest))
    ev = evaluate(run, planner_tokenizer=str(tok_dir), write=False, **FAST)
    assert ev.metrics["task"] == "countdown"
    assert [r["correct"] for r in ev.metrics["runs"][0]["problems"]] == [True, False]


# --------------------------------------------------------------------------- manifest, warnings


def test_fingerprint_of_the_bytes_loaded_equals_the_files_on_disk(tmp_path: Path) -> None:
    """`load_run` hashes what it parses as it reads it (each file read once); the fingerprint is the
    one a fresh read of the files gives, in every layout, and the texts are what `read_text` gives."""
    run = write_run(tmp_path / "run", [sprint_record("a", TRAJECTORY), sprint_record("b", None, status="timeout")])
    (run / "trajectories").mkdir()
    (run / "trajectories" / "a.txt").write_text(TRAJECTORY + "\n")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "planner_trajectory_1.txt").write_bytes(TRAJECTORY.replace("\n", "\r\n").encode())  # Windows lines
    (logs / "base_model_trajectory_1.txt").write_bytes(b"old Mac\rlines \\boxed{14}")
    nested = tmp_path / "nested"
    (nested / "trajectories").mkdir(parents=True)
    (nested / "trajectories" / "7.txt").write_text(TRAJECTORY)
    for arg in (run, run / "records.jsonl", logs, nested):
        loaded = load_run(arg)
        root, files = _input_files(Path(arg))
        digest = hashlib.sha256(b"".join(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0"
                                         for f in files)).hexdigest()[:16]  # the manifest's format, from disk
        fresh = {"path": str(arg), "files": len(files), "fingerprint": digest}
        assert run_fingerprint(arg, loaded) == run_fingerprint(arg) == fresh and files, arg
        assert all(r.files is loaded[0].files for r in loaded)  # one folder's runs share one read
    texts = {r.mode: r.problems[0].text for r in load_run(logs)}
    assert texts["sprint"] == (logs / "planner_trajectory_1.txt").read_text(encoding="utf-8") == TRAJECTORY
    assert texts["baseline"] == "old Mac\nlines \\boxed{14}"


def test_manifest_records_config_versions_and_what_was_read(tmp_path: Path, tok_dir: Path) -> None:
    run = write_run(tmp_path / "sprint", [sprint_record("a", TRAJECTORY), sprint_record("b", None, status="timeout")])
    base = write_run(tmp_path / "base", [baseline_record(p, BASELINE) for p in "ab"])
    ev = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", seed=3, **FAST)
    manifest = json.loads(ev.files["manifest"].read_text())
    assert ev.files["manifest"] == tmp_path / "out" / "manifest.json"
    assert manifest["stage"] == "evaluate" and manifest["task"] == "math"
    assert manifest["packages"]["sprint"] == manifest["sprint_version"] and "math-verify" in manifest["packages"]
    assert manifest["git_commit"] is None or len(manifest["git_commit"]) == 40
    config = manifest["config"]
    assert config["runs"] == [str(run)] and config["baseline"] == [str(base)] and config["seed"] == 3
    assert config["planner_tokenizer"] == config["executor_tokenizer"] == str(tok_dir)
    inputs = manifest["inputs"]
    assert [i["path"] for i in inputs["runs"]] == [str(run)] and inputs["runs"][0]["files"] == 1
    assert manifest["counts"] == {"runs": 1, "baselines": 1, "problems": 4, "no_text": 1, "malformed": 0}

    # the fingerprint follows the bytes read: same folder, same print; one record changed, another
    again = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out2", seed=3, **FAST)
    second = json.loads(again.files["manifest"].read_text())
    assert second["inputs"] == inputs and second["config_hash"] == manifest["config_hash"]  # out_dir is not a setting
    write_run(run, [sprint_record("a", TRAJECTORY.replace("\\boxed{14}", "\\boxed{15}")),
                    sprint_record("b", None, status="timeout")])
    changed = evaluate(run, baseline=base, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out3", seed=4, **FAST)
    third = json.loads(changed.files["manifest"].read_text())
    assert third["inputs"]["runs"][0]["fingerprint"] != inputs["runs"][0]["fingerprint"]
    assert third["inputs"]["baselines"] == inputs["baselines"]
    assert third["config_hash"] != manifest["config_hash"]  # the seed changes the numbers


def test_malformed_trajectories_are_named_on_stderr_and_capped(tmp_path: Path, tok_dir: Path, capsys) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    unclosed = TRAJECTORY.replace("</Plan_2>\n", "")
    for i in range(7):
        (logs / f"planner_trajectory_{i}.txt").write_text(unclosed if i != 3 else TRAJECTORY)
    gold = tmp_path / "gold.csv"
    gold.write_text("id,answer\n" + "".join(f"{i},14\n" for i in range(7)))
    code = cli.main(["evaluate", str(logs), "--gold", str(gold), "--out", str(tmp_path / "out"), "--bootstrap", "0",
                     "--workers", "1", "--no-plots", "--planner-tokenizer", str(tok_dir)])
    assert code == 0
    said = capsys.readouterr()
    warnings = [line for line in said.err.splitlines() if line.startswith("warning: ")]
    named = [f"planner_trajectory_{i}.txt" for i in (0, 1, 2, 4, 5)]  # the first five malformed ones
    assert len(warnings) == 6 and "planner_trajectory_3" not in said.err
    for line, name in zip(warnings, named):
        assert name in line and "<Plan_2>" in line and "never closed" in line
    assert "and 1 more" in warnings[-1] and "warning" not in said.out
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["runs"][0]["summary"]["malformed"] == 6
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["malformed"] == 6 and manifest["warnings"] == [w[len("warning: "):] for w in warnings]


def test_report_into_a_run_folder_is_refused(tmp_path: Path, tok_dir: Path) -> None:
    run = write_run(tmp_path / "sprint", [sprint_record("a", TRAJECTORY)])
    before = (run / "manifest.json").read_text()
    with pytest.raises(UserError, match="'orchestrate'.*another --out"):
        evaluate(run, planner_tokenizer=str(tok_dir), out_dir=run, **FAST)
    assert (run / "manifest.json").read_text() == before and not (run / "metrics.json").exists()
    ev = evaluate(run, planner_tokenizer=str(tok_dir), **FAST)  # the default folder, twice: its own manifest
    ev = evaluate(run, planner_tokenizer=str(tok_dir), **FAST)
    assert ev.out_dir == run / "evaluation" and (run / "evaluation" / "manifest.json").is_file()
