"""The bad-input corpus (tests/bad_inputs/): every user mistake gets one clear line and an exit code.

Two kinds of case:
- fatal: the whole command cannot run (a missing file, a wrong model name, an unreachable
  server, a file that is not rows, ...). It must exit with code 2 and print exactly one line
  starting with `error:` that says what is wrong (the expected words) and what to do, and no
  traceback. Every case runs in-process through `sprint.cli.main`; a subset also runs as a real
  `python -m sprint` subprocess (in parallel) to prove the exit code and stderr for real.
- per-row: one bad row among good ones (an empty or huge trace, odd ids, a DAG that is a list,
  a trajectory with unbalanced tags). The run goes on (exit 0), the bad row gets a record with a
  readable error, the good rows are processed, and ids never escape the output folder.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer, dead_url
from tests.helpers import shared_data_dir, tokenizer_dir

from sprint.cli import main as cli_main

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "bad_inputs"
MODEL = "test-model"
CONTEXT_CHARS = 200_000  # the fake server's "context window": longer prompts get HTTP 400, as vLLM answers


@dataclass(frozen=True)
class Case:
    """A command that must fail with exit code 2 and one `error:` line holding `words`.

    In `argv`, {corpus} is tests/bad_inputs, {tmp} a scratch folder, {url} a working fake
    server (model test-model), {dead} a URL where nothing listens.
    """

    name: str
    argv: tuple[str, ...]
    words: tuple[str, ...]
    subprocess: bool = False  # also run it as a real `python -m sprint` process
    in_process: bool = True  # False: only as a subprocess (the hub's offline flag is read at import time)


def llm(url: str = "{url}") -> tuple[str, ...]:
    return ("--model", MODEL, "--server-url", url, "--no-progress")


def comp(inp: str, *extra: str, url: str = "{url}", model: str = MODEL) -> tuple[str, ...]:
    return ("components", "-i", inp, "-o", "{tmp}/out", "--model", model, "--server-url", url, "--no-progress", *extra)


def orch(*extra: str, url: str = "{url}", model: str = MODEL, mode: str = "raw") -> tuple[str, ...]:
    return ("orchestrate", "--planner-model", model, "--planner-url", url, "--data", "{tmp}/problems.jsonl",
            "--out-dir", "{tmp}/run", "--prompt-mode", mode, "--no-progress", *extra)


CASES = [
    # the input data
    Case("missing columns", comp("{corpus}/missing_columns.jsonl"), ("no thought column", "columns: answer, question"), True),
    Case("empty file", comp("{corpus}/empty.jsonl"), ("has no rows",)),
    Case("empty traces", comp("{corpus}/empty_traces.jsonl"), ("thought is empty in all 2 selected rows",)),
    Case("non-UTF-8 bytes", comp("{corpus}/not_utf8.jsonl"), ("line 2 is not valid UTF-8", "re-encode"), True),
    Case("a line that is not JSON", comp("{corpus}/not_json.jsonl"), ("line 2 is not valid JSON", "fix or remove")),
    Case("a half-written last line", comp("{corpus}/half_line.jsonl"), ("line 2 is not valid JSON",)),
    Case("a row that is a list", comp("{corpus}/row_is_list.jsonl"), ("line 1 is a JSON list", "object per line")),
    Case("a DAG file that is a list", ("pack", "-i", "{corpus}/dag_is_list.json", "-o", "{tmp}/packed"),
         ("JSON list whose item 0 is a list", "one object per row"), True),
    Case("a JSON file that is a string", comp("{corpus}/json_not_rows.json"), ("holds a JSON str, not rows",)),
    Case("an unsupported file type", comp("{corpus}/unsupported.csv"), ("unsupported file type '.csv'", ".jsonl")),
    Case("a nonexistent path", comp("{tmp}/no_such_file.jsonl"), ("does not exist", "check the path")),
    Case("a nonexistent .csv path", comp("no_such_folder/data.csv"), ("does not exist",)),
    Case("a nonexistent hub id", comp("no-such-org/no-such-dataset"), ("cannot load dataset", "no-such-org/no-such-dataset",
                                                                        "SPRINT_LOCAL_DATA"), subprocess=True, in_process=False),
    Case("range out of bounds", comp("{corpus}/mixed_traces.jsonl", "--range", "100:200"),
         ("range '100:200' selects no rows", "which has 5", "0:5"), True),
    Case("range backwards", comp("{corpus}/mixed_traces.jsonl", "--range", "4:1"), ("selects no rows",)),
    Case("range not a range", comp("{corpus}/mixed_traces.jsonl", "--range", "first-ten"), ("bad range", "START:END")),
    Case("dag input without components", ("dag", "-i", "{corpus}/no_components.jsonl", "-o", "{tmp}/d", *llm()),
         ("has no components", "sprint components")),
    Case("dag input whose records all failed", ("dag", "-i", "{corpus}/failed_stage", "-o", "{tmp}/d", *llm()),
         ("none with status ok", "unparseable")),
    Case("an empty folder", ("dag", "-i", "{tmp}/empty_folder", "-o", "{tmp}/d", *llm()),
         ("folder without records.jsonl or data files",)),
    Case("countdown data without numbers", orch("--task", "countdown"), ("no 'nums'/'target' columns",)),
    Case("gpqa data without options", orch("--task", "gpqa"), ("lacks column(s)", "Correct Answer")),
    # the server and the model
    Case("an unreachable server", comp("{corpus}/mixed_traces.jsonl", url="{dead}"), ("no server answers at",), True),
    Case("a server URL that is not a URL", comp("{corpus}/mixed_traces.jsonl", url="localhost:8000"), ("not an http(s) URL",)),
    Case("a wrong model name", comp("{corpus}/mixed_traces.jsonl", model="gpt-5"),
         ("model 'gpt-5' is not served", "served models: test-model"), True),
    Case("orchestrate: a wrong model name", orch(model="wrong-model"), ("'wrong-model' is not served",)),
    Case("orchestrate: an unreachable server", orch(url="{dead}"), ("no server answers at",)),
    Case("baseline: an unreachable server", ("baseline", "--model", MODEL, "--server-url", "{dead}", "--data",
                                             "{tmp}/problems.jsonl", "--out-dir", "{tmp}/b", "--prompt-mode", "raw"),
         ("no server answers at",)),
    Case("a chat template from a nonexistent tokenizer", orch("--tokenizer", "{tmp}/no_tok", mode="chat"),
         ("cannot load the tokenizer", "--prompt-mode raw"), True),
    # options and output folders
    Case("output folder is a file", ("components", "-i", "{corpus}/mixed_traces.jsonl", "-o", "{tmp}/a_file", *llm()),
         ("is an existing file", "--out-dir"), True),
    Case("output folder with an unreadable manifest", ("components", "-i", "{corpus}/mixed_traces.jsonl", "-o",
                                                       "{tmp}/corrupt_run", *llm()), ("manifest.json is unreadable", "--overwrite")),
    Case("a missing prompt template", comp("{corpus}/mixed_traces.jsonl", "--prompt", "{tmp}/no_prompt.txt"),
         ("prompt template", "not found")),
    Case("a prompt template without placeholders", comp("{corpus}/mixed_traces.jsonl", "--prompt",
                                                        "{corpus}/prompt_without_placeholders.txt"),
         ("lacks the placeholder(s) {question}, {lines}",)),
    Case("zero max tokens", comp("{corpus}/mixed_traces.jsonl", "--max-tokens", "0"), ("--max-tokens must be a positive integer",)),
    Case("negative temperature", comp("{corpus}/mixed_traces.jsonl", "--temperature", "-1"), ("--temperature must be >= 0",)),
    Case("zero workers", comp("{corpus}/mixed_traces.jsonl", "--num-workers", "0"), ("--num-workers must be at least 1",)),
    Case("a negative timeout", comp("{corpus}/mixed_traces.jsonl", "--timeout", "-1"), ("--timeout must be a positive",)),
    Case("negative retries", comp("{corpus}/mixed_traces.jsonl", "--max-retries", "-1"), ("--max-retries must be 0 or more",)),
    Case("a test fraction above 1", ("pack", "-i", "{corpus}/dag_field_is_list.jsonl", "-o", "{tmp}/p", "--test-frac", "1.5"),
         ("test fraction 1.5", "[0, 1)")),
    Case("a missing required option", ("components", "-i", "{corpus}/mixed_traces.jsonl"),
         ("required: --out-dir", "--help"), True),
    Case("a number that is not a number", comp("{corpus}/mixed_traces.jsonl", "--max-tokens", "many"),
         ("invalid int value: 'many'",)),
    Case("an unknown command", ("componets", "-i", "x"), ("invalid choice: 'componets'",)),
    # evaluation
    Case("evaluate: a nonexistent run", ("evaluate", "{tmp}/no_run"), ("does not exist", "run folder")),
    Case("evaluate: an empty folder", ("evaluate", "{tmp}/empty_folder"), ("neither records.jsonl nor trajectory",)),
    Case("evaluate: a nonexistent gold file", ("evaluate", "{corpus}/unbalanced_trajectory", "--gold", "{tmp}/gold.csv",
                                               "--out", "{tmp}/ev"), ("does not exist",)),
    Case("evaluate: a gold file without answers", ("evaluate", "{corpus}/unbalanced_trajectory", "--gold",
                                                    "{corpus}/gold_without_answer.csv", "--out", "{tmp}/ev"),
         ("no answer column", "columns: id, solution")),
    Case("evaluate: a nonexistent tokenizer", ("evaluate", "{corpus}/unbalanced_trajectory", "--gold", "{corpus}/gold.csv",
                                               "--planner-tokenizer", "{tmp}/no_tok", "--out", "{tmp}/ev"),
         ("cannot load tokenizer",)),
]


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory):
    """Scratch folder and servers shared by the cases (each case writes under its own {tmp})."""
    with FakeServer(lambda body, endpoint: "[]") as srv:
        yield {"url": srv.base_url, "dead": dead_url(), "corpus": str(CORPUS), "root": tmp_path_factory.mktemp("bad")}


def scratch(root: Path, name: str) -> Path:
    """A fresh folder for one case, with the files some cases need."""
    tmp = root / name.replace(" ", "_").replace(":", "").replace("'", "")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "a_file").write_text("I am a file, not a folder\n")
    (tmp / "empty_folder").mkdir(exist_ok=True)
    (tmp / "corrupt_run").mkdir(exist_ok=True)
    (tmp / "corrupt_run" / "manifest.json").write_text('{"stage": "compo')
    (tmp / "corrupt_run" / "records.jsonl").write_text('{"id": "x", "status": "ok"}\n')  # records to protect
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(2)]
    (tmp / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp


def argv_of(case: Case, ctx: dict, tmp: Path) -> list[str]:
    values = {**ctx, "tmp": str(tmp)}
    return [a.format(**values) for a in case.argv]


def problems_with(case: Case, rc: int, err: str) -> list[str]:
    """What is wrong with a run's outcome, as readable sentences (empty: the case passes)."""
    problems = []
    if rc != 2:
        problems.append(f"exit code {rc}, expected 2")
    if "Traceback" in err:
        problems.append("a traceback on stderr")
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    if len(errors) != 1:
        problems.append(f"{len(errors)} lines start with 'error:', expected exactly one")
    else:
        missing = [w for w in case.words if w not in errors[0]]
        if missing:
            problems.append(f"the error line lacks {missing}")
    return problems


IN_PROCESS = [c for c in CASES if c.in_process]


@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.name for c in IN_PROCESS])
def test_bad_input_gets_one_clear_error_line(case: Case, ctx: dict, capsys, caplog, monkeypatch) -> None:
    monkeypatch.setenv("SPRINT_LOCAL_DATA", str(shared_data_dir()))
    tmp = scratch(ctx["root"], case.name)
    argv = argv_of(case, ctx, tmp)
    caplog.set_level(logging.INFO)
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    problems = problems_with(case, rc, err)
    if logged:
        problems.append(f"logged errors/tracebacks: {[r.getMessage() for r in logged]}")
    assert not problems, f"{case.name}: {'; '.join(problems)}\n  command: {argv}\n  stderr: {err.strip()!r}"
    print(f"{case.name}: {err.strip().splitlines()[-1]}")


def cli_env() -> dict[str, str]:
    return {**os.environ, "SPRINT_LOCAL_DATA": str(shared_data_dir()), "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def run_subprocess(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sprint", *argv], cwd=REPO, env=cli_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.slow
def test_real_processes_exit_2_with_one_error_line(ctx: dict) -> None:
    """The subset marked `subprocess`, as real `python -m sprint` processes (run in parallel)."""
    chosen = [c for c in CASES if c.subprocess]
    root = ctx["root"] / "subprocess"
    jobs = [(c, argv_of(c, ctx, scratch(root, c.name))) for c in chosen]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda job: run_subprocess(job[1]), jobs))
    failures = []
    for (case, argv), result in zip(jobs, results):
        problems = problems_with(case, result.returncode, result.stderr)
        print(f"{case.name}: rc={result.returncode} {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ''}")
        if problems:
            failures.append(f"{case.name}: {'; '.join(problems)}\n    command: {argv}\n    stderr: {result.stderr.strip()[-800:]!r}")
        assert result.stdout.strip() == "" or "Traceback" not in result.stdout
    assert not failures, "\n".join(failures)
    assert len(chosen) >= 8


# ---------------------------------------------------------------------------------------------
# Per-row problems: the run goes on, the bad row is recorded with a readable error


def records_of(folder: Path) -> dict[str, dict]:
    data = (folder / "records.jsonl").read_bytes()
    assert data.endswith(b"\n")
    rows = [json.loads(line) for line in data.splitlines()]
    assert len({r["id"] for r in rows}) == len(rows), "duplicate ids"
    return {r["id"]: r for r in rows}


def good_components(body: dict, endpoint: str) -> str | Reply:
    """A valid one-component answer for any trace; HTTP 400 for prompts beyond the context window."""
    content = body["messages"][-1]["content"]
    if len(content) > CONTEXT_CHARS:
        return Reply(status=400, error=f"This model's maximum context length is 32768 tokens; the prompt has {len(content)} characters")
    n = content.count("</Line ")
    return json.dumps([{"description": "All of it", "plan": f"1-{n}", "prompt": "not found", "execution": "not found"}])


@pytest.mark.slow
def test_bad_rows_do_not_stop_the_curation_run(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows = [json.loads(line) for line in (CORPUS / "mixed_traces.jsonl").read_text().splitlines()]
    huge = {"id": "huge-trace", "question": "What is 9 + 9?", "answer": "18",
            "thought": "Let me add nine and nine once more. " * 40_000}  # ~1.4 MB, far beyond the context
    rows.append(huge)
    inp = tmp_path / "traces.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    srv = scripted_server(good_components)
    result = run_subprocess(["components", "-i", str(inp), "-o", str(tmp_path / "c"), *llm(srv.base_url)])
    assert result.returncode == 3, result.stderr  # finished, with failed rows (README "Exit codes")
    assert "Traceback" not in result.stderr and "error:" not in result.stderr
    got = records_of(tmp_path / "c")
    status = {i: (r["status"], r["error"]) for i, r in got.items()}
    print(json.dumps(status, indent=1))
    assert set(got) == {"ok-1", "empty-thought", "thought-is-a-list", "thought-is-a-number", "no-question", "huge-trace"}
    assert status["ok-1"] == ("ok", None) and status["thought-is-a-number"][0] == "ok"
    for bad in ("empty-thought", "thought-is-a-list"):
        assert status[bad][0] == "no_thought" and "no reasoning trace" in status[bad][1]
    # over --max-input-tokens: set aside before any call, with the way to send it anyway
    assert status["huge-trace"][0] == "too_long" and "--allow-long" in status["huge-trace"][1]
    assert status["no-question"] == ("no_question", "the item has no question (problem) text")
    assert got["huge-trace"]["retryable"] is False
    assert "records: ok: 2" in result.stdout and "too_long: 1" in result.stdout and "no_thought: 2" in result.stdout


def test_malformed_components_are_recorded_by_the_dag_stage(tmp_path: Path, capsys, caplog,
                                                            scripted_server: ScriptedServer) -> None:
    srv = scripted_server(lambda body, endpoint: "{1: []}")
    rc = cli_main(["dag", "-i", str(CORPUS / "components_malformed.jsonl"), "-o", str(tmp_path / "d"), *llm(srv.base_url)])
    assert not srv.completion_requests
    assert rc == 3  # finished, every item failed (README "Exit codes")
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    got = records_of(tmp_path / "d")
    assert {r["status"] for r in got.values()} == {"invalid_components"}
    assert all("not a list of component objects" in r["error"] for r in got.values())


def test_odd_ids_stay_inside_the_output_folder_and_stay_distinct(tmp_path: Path,
                                                                 scripted_server: ScriptedServer) -> None:
    def answer(body: dict, endpoint: str) -> str:
        return "<Final_answer>\nIt is \\boxed{0}.\n</Final_answer>"

    workdir = tmp_path / "work"
    workdir.mkdir()
    before = set(tmp_path.rglob("*"))
    srv = scripted_server(answer)
    result = subprocess.run(
        [sys.executable, "-m", "sprint", "orchestrate", "--planner-model", MODEL, "--planner-url", srv.base_url,
         "--data", str(CORPUS / "bad_ids.jsonl"), "--out-dir", "out/run", "--prompt-mode", "raw", "--no-progress"],
        cwd=workdir, env=cli_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    run = workdir / "out" / "run"
    created = {p for p in set(tmp_path.rglob("*")) - before}
    outside = [p for p in created if run not in p.parents and p not in (run, run.parent)]
    assert not outside, f"files written outside the run folder: {outside}"
    got = records_of(run)
    assert len(got) == 9
    files = sorted(p.name for p in (run / "trajectories").iterdir())
    assert files == sorted(f"{i}.txt" for i in got)
    for i in got:
        assert "/" not in i and "\\" not in i and not i.startswith(".") and " " not in i and len(i) <= 120


def test_a_dag_that_is_a_list_drops_that_trace_only(tmp_path: Path, capsys) -> None:
    rc = cli_main(["pack", "-i", str(CORPUS / "dag_field_is_list.jsonl"), "-o", str(tmp_path / "p"), "--test-frac", "0"])
    out = capsys.readouterr().out
    assert rc == 3  # finished; a trace could not be packed (README "Exit codes")
    got = records_of(tmp_path / "p")
    assert got["dag-list"]["status"] == "dropped" and got["dag-list"]["reason"] == "invalid_dag"
    assert "dag must be a {node: [parents]} object, got list" in got["dag-list"]["error"]
    assert got["components-string"]["reason"] == "invalid_components"
    assert got["solution-number"]["reason"] == "no_boxed"
    assert "invalid_dag" in out and "dropped 3" in out


def test_a_trajectory_with_unbalanced_tags_is_scored_leniently(tmp_path: Path, capsys) -> None:
    tokenizer = tokenizer_dir()
    rc = cli_main(["evaluate", str(CORPUS / "unbalanced_trajectory"), "--gold", str(CORPUS / "gold.csv"),
                   "--planner-tokenizer", str(tokenizer), "--out", str(tmp_path / "ev"), "--no-plots", "--bootstrap", "0"])
    assert rc == 0
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    rows = {p["id"]: p for p in metrics["runs"][0]["problems"]}
    assert rows["1"]["malformed"] is True and rows["2"]["malformed"] is False
    assert rows["1"]["correct"] is True  # the answer is still read
    assert metrics["runs"][0]["summary"]["malformed"] == 1


def test_evaluate_names_the_malformed_trajectory(tmp_path: Path, capsys, caplog) -> None:
    tokenizer = tokenizer_dir()
    caplog.set_level(logging.INFO)
    assert cli_main(["evaluate", str(CORPUS / "unbalanced_trajectory"), "--gold", str(CORPUS / "gold.csv"),
                     "--planner-tokenizer", str(tokenizer), "--out", str(tmp_path / "ev"), "--no-plots",
                     "--bootstrap", "0"]) == 0
    said = capsys.readouterr()
    text = said.out + said.err + "\n".join(r.getMessage() for r in caplog.records)
    assert "planner_trajectory_1" in text or "malformed" in text.lower()
    assert "never closed" in text or "unbalanced" in text
