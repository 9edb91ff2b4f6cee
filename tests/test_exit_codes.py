"""Exit codes by outcome, for every stage and through the shell scripts (README "Exit codes").

0: every item ended ok (or was dropped by a filter); 3: the run finished but some items failed
(the count and the command to retry are printed); 2: a user error (nothing run, one line);
4: a server stopped answering (tests/test_reliability.py). A failed start leaves nothing that
blocks the corrected command: no `--overwrite` needed after a typo.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from tests.fake_server import Reply, ScriptedServer
from tests.test_components import good_answer, load_traces, question_in, write_jsonl
from tests.test_reliability import problems_file, solver
from tests.helpers import tokenizer_dir
from tests.test_resume_all import cli_env, sprint_run

from sprint.cli import main as cli_main
from sprint.core.errors import EXIT_ITEMS_FAILED, EXIT_OK, EXIT_USER

MODEL = "test-model"
REPO = Path(__file__).resolve().parents[1]


def one_line_error(err: str) -> str:
    """The one `error: ...` line of stderr (other lines are progress notes, e.g. the cost estimate)."""
    errors = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def curation_answer(rows: list[dict], *, bad: set[str] = frozenset(), down: set[str] = frozenset()):
    """Components/DAG answers: good, except garbage for questions in `bad` and HTTP 500 for those in `down`."""
    index = {r["question"].strip(): r for r in rows}

    def handler(body: dict, endpoint: str) -> str | Reply:
        question = question_in(body)
        if question in down:
            return Reply(status=500, error="overloaded")
        if question in bad:
            return "I cannot do that."
        row = index[question]
        return good_answer(row) if "<Line 1>" in body["messages"][-1]["content"] else row["scripted_dag"]

    return handler


def llm_flags(url: str, model: str = MODEL) -> list[str]:
    return ["--model", model, "--server-url", url, "--no-progress", "--max-retries", "0", "--timeout", "5"]


# ---------------------------------------------------------------------------------------------
# components and dag


def test_components_rc_by_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  scripted_server: ScriptedServer) -> None:
    rows = load_traces()
    traces = str(write_jsonl(tmp_path / "traces.jsonl", rows))
    first, second = rows[0]["question"].strip(), rows[1]["question"].strip()
    srv = scripted_server(curation_answer(rows))
    assert cli_main(["components", "-i", traces, "-o", str(tmp_path / "ok"), *llm_flags(srv.base_url)]) == EXIT_OK
    capsys.readouterr()
    srv = scripted_server(curation_answer(rows, bad={first}, down={second}))
    cmd = ["components", "-i", traces, "-o", str(tmp_path / "some"), *llm_flags(srv.base_url)]
    assert cli_main(cmd) == EXIT_ITEMS_FAILED
    err = capsys.readouterr().err
    assert "2 items failed" in err and "llm_server_error: 1" in err and "unparseable: 1" in err
    assert "1 of them failed transiently; retry them with: sprint components -i" in err
    assert "1 failed for good" in err
    srv = scripted_server(curation_answer(rows, bad={first}))  # the server is back: the retry redoes one item
    cmd = ["components", "-i", traces, "-o", str(tmp_path / "some"), *llm_flags(srv.base_url)]
    assert cli_main(cmd) == EXIT_ITEMS_FAILED  # the unparseable answer stays
    assert [endpoint for endpoint, _ in srv.requests].count("chat") == 1
    records = [json.loads(x) for x in (tmp_path / "some" / "records.jsonl").read_text().splitlines()]
    assert len(records) == len(rows) and sum(r["status"] != "ok" for r in records) == 1
    capsys.readouterr()
    assert cli_main(["components", "-i", traces, "-o", str(tmp_path / "bad"), "--num-workers", "0"]) == EXIT_USER
    one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "bad").exists()


def test_dag_rc_by_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str], scripted_server: ScriptedServer) -> None:
    rows = load_traces()
    traces = str(write_jsonl(tmp_path / "traces.jsonl", rows))
    srv = scripted_server(curation_answer(rows))
    assert cli_main(["components", "-i", traces, "-o", str(tmp_path / "c"), *llm_flags(srv.base_url)]) == EXIT_OK
    assert cli_main(["dag", "-i", str(tmp_path / "c"), "-o", str(tmp_path / "d"), *llm_flags(srv.base_url)]) == EXIT_OK
    srv = scripted_server(curation_answer(rows, bad={rows[0]["question"].strip()}))
    cmd = ["dag", "-i", str(tmp_path / "c"), "-o", str(tmp_path / "d2"), *llm_flags(srv.base_url)]
    assert cli_main(cmd) == EXIT_ITEMS_FAILED
    assert "1 item failed (unparseable: 1)" in capsys.readouterr().err
    assert cli_main(["dag", "-i", str(tmp_path / "nope"), "-o", str(tmp_path / "d3")]) == EXIT_USER
    one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("stage", ["components", "orchestrate", "baseline"])
def test_a_typo_in_the_model_then_the_corrected_command_runs_without_overwrite(
    tmp_path: Path, stage: str, capsys: pytest.CaptureFixture[str], scripted_server: ScriptedServer
) -> None:
    out = tmp_path / "out"
    if stage == "components":
        rows = load_traces()
        handler = curation_answer(rows)

        def command(model: str, url: str) -> list[str]:
            return ["components", "-i", str(write_jsonl(tmp_path / "t.jsonl", rows)), "-o", str(out), *llm_flags(url, model)]
    else:
        data = problems_file(tmp_path, 3)
        handler = solver

        def command(model: str, url: str) -> list[str]:
            flag, url_flag = ("--planner-model", "--planner-url") if stage == "orchestrate" else ("--model", "--server-url")
            extra = [] if stage == "orchestrate" else ["--max-tokens", "50"]
            return [stage, flag, model, url_flag, url, "--data", data, "--out-dir", str(out), "--prompt-mode", "raw",
                    "--no-progress", *extra]

    srv = scripted_server(handler)
    assert cli_main(command("test-modle", srv.base_url)) == EXIT_USER
    err = one_line_error(capsys.readouterr().err)
    assert "test-modle" in err and "not served" in err
    assert not out.exists() or not any(out.iterdir())  # nothing that blocks the corrected command
    assert cli_main(command(MODEL, srv.base_url)) == EXIT_OK
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"].get("model", manifest["config"].get("planner_model")) == MODEL


def test_a_folder_holding_only_a_manifest_is_no_conflict(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    """What older versions left after a failed start (a manifest, no record) does not block a new run."""
    rows = load_traces()
    traces = str(write_jsonl(tmp_path / "traces.jsonl", rows))
    out = tmp_path / "c"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({"stage": "components", "identity": {"model": "test-modle"}}))
    srv = scripted_server(curation_answer(rows))
    assert cli_main(["components", "-i", traces, "-o", str(out), *llm_flags(srv.base_url)]) == EXIT_OK
    assert json.loads((out / "manifest.json").read_text())["config"]["model"] == MODEL


# ---------------------------------------------------------------------------------------------
# pack


def pack_input(tmp_path: Path, broken: bool) -> str:
    example = json.loads((REPO / "tests" / "data" / "packing_example.json").read_text())
    rows = [example]
    if broken:
        rows.append({**example, "id": "broken", "dag": "{not json"})
    (tmp_path / "in").mkdir(exist_ok=True)
    return str(write_jsonl(tmp_path / "in" / ("broken.jsonl" if broken else "ok.jsonl"), rows))


def test_pack_rc_by_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = pack_input(tmp_path, broken=False)
    keep = ["--parallelization-threshold", "0"]  # the worked example has few executions per phase
    assert cli_main(["pack", "-i", good, "-o", str(tmp_path / "p"), *keep]) == EXIT_OK
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["kept"] == 1
    # dropped by a filter on purpose: still 0
    assert cli_main(["pack", "-i", good, "-o", str(tmp_path / "f"), "--parallelization-threshold", "99"]) == EXIT_OK
    assert json.loads((tmp_path / "f" / "summary.json").read_text())["kept"] == 0
    capsys.readouterr()
    assert cli_main(["pack", "-i", pack_input(tmp_path, broken=True), "-o", str(tmp_path / "b"), *keep]) == EXIT_ITEMS_FAILED
    err = capsys.readouterr().err
    assert "1 trace failed (invalid_dag: 1)" in err
    assert len((tmp_path / "b" / "train.jsonl").read_text().splitlines()) + len(
        (tmp_path / "b" / "test.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize("bad", [["--max-phases", "0"], ["--test-frac", "1.5"]])
def test_pack_user_error_leaves_nothing_and_the_corrected_command_runs(
    tmp_path: Path, bad: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    good = pack_input(tmp_path, broken=False)
    out = tmp_path / "p"
    assert cli_main(["pack", "-i", good, "-o", str(out), *bad]) == EXIT_USER
    one_line_error(capsys.readouterr().err)
    assert not out.exists()
    assert cli_main(["pack", "-i", good, "-o", str(out)]) == EXIT_OK


# ---------------------------------------------------------------------------------------------
# orchestrate and baseline


def failing_solver(fail: set[int]):
    """`solver`, but HTTP 500 for the problems numbered in `fail`."""

    def handler(body: dict, endpoint: str) -> str | Reply:
        prompt = body["prompt"]
        if any(f"What is {i} + {i}?" in prompt for i in fail):
            return Reply(status=500, error="overloaded")
        return solver(body, endpoint)

    return handler


@pytest.mark.parametrize("stage", ["orchestrate", "baseline"])
def test_inference_rc_by_outcome(tmp_path: Path, stage: str, capsys: pytest.CaptureFixture[str],
                                 scripted_server: ScriptedServer) -> None:
    data = problems_file(tmp_path, 4)

    def command(url: str, out: str) -> list[str]:
        model = ["--planner-model", MODEL, "--planner-url", url] if stage == "orchestrate" else \
            ["--model", MODEL, "--server-url", url, "--max-tokens", "50"]
        return [stage, *model, "--data", data, "--out-dir", str(tmp_path / out), "--prompt-mode", "raw",
                "--no-progress", "--max-retries", "0", "--problem-retries", "0"]

    srv = scripted_server(solver)
    assert cli_main(command(srv.base_url, "ok")) == EXIT_OK
    capsys.readouterr()
    srv = scripted_server(failing_solver({1, 2}))
    assert cli_main(command(srv.base_url, "some")) == EXIT_ITEMS_FAILED
    captured = capsys.readouterr()
    assert "(2 errors)" in captured.out
    assert "2 problems failed (server_error: 2)" in captured.err and f"retry them with: sprint {stage} " in captured.err
    srv = scripted_server(solver)  # the retry command finishes the run
    assert cli_main(command(srv.base_url, "some")) == EXIT_OK
    records = [json.loads(x) for x in (tmp_path / "some" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and all(r["status"] == "ok" for r in records)
    capsys.readouterr()
    assert cli_main([*command("http://127.0.0.1:9/v1", "bad"), "--max-problem-workers", "0"]) == EXIT_USER
    one_line_error(capsys.readouterr().err)


# ---------------------------------------------------------------------------------------------
# evaluate


def test_evaluate_rc_by_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = str(tokenizer_dir())
    sprint_run(tmp_path / "run", 6)
    flags = ["--planner-tokenizer", tok, "--no-plots", "--bootstrap", "0"]
    assert cli_main(["evaluate", str(tmp_path / "run"), *flags]) == EXIT_OK
    # a run with two failed problems: the report is written, and the code says it is not the final word
    records = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    for r in records[:2]:
        r.update(status="error", trajectory=None, error="server error 500")
    (tmp_path / "run" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    capsys.readouterr()
    assert cli_main(["evaluate", str(tmp_path / "run"), *flags]) == EXIT_ITEMS_FAILED
    captured = capsys.readouterr()
    assert "2 problems failed (error: 2)" in captured.err and (tmp_path / "run" / "evaluation" / "report.md").is_file()
    assert cli_main(["evaluate", str(tmp_path / "run"), "--planner-tokenizer", str(tmp_path / "no-tokenizer")]) == EXIT_USER
    one_line_error(capsys.readouterr().err)
    # a folder of the user's other files is never replaced by a report
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    assert cli_main(["evaluate", str(tmp_path / "run"), *flags, "--out", str(tmp_path / "mine")]) == EXIT_USER
    assert "notes.txt" in one_line_error(capsys.readouterr().err)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


# ---------------------------------------------------------------------------------------------
# through the shell scripts (they `exec` the CLI, so its code is theirs)


def run_script(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / script)], cwd=REPO, env={**cli_env(), **env}, capture_output=True,
                          text=True, timeout=300)


def test_shell_scripts_pass_the_exit_code_through(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows = load_traces()
    traces = str(write_jsonl(tmp_path / "traces.jsonl", rows))
    for script in ("run_component_separation.sh", "run_dag_creation.sh", "run_finetuning_data_preparation.sh",
                   "run_agent_orchestration.sh", "run_baseline_evaluation.sh"):
        assert "\nexec " in (REPO / script).read_text(), f"{script} must exec the CLI so its exit code passes through"
    srv = scripted_server(curation_answer(rows, bad={rows[0]["question"].strip()}))
    env = {"DATA": traces, "OUT_DIR": str(tmp_path / "c"), "MODEL": MODEL, "SERVER_URL": srv.base_url,
           "NUM_WORKERS": "2"}
    assert run_script("run_component_separation.sh", env).returncode == EXIT_ITEMS_FAILED
    srv = scripted_server(curation_answer(rows))
    env = {"DATA": traces, "OUT_DIR": str(tmp_path / "c2"), "MODEL": MODEL, "SERVER_URL": srv.base_url}
    assert run_script("run_component_separation.sh", env).returncode == EXIT_OK
    proc = run_script("run_finetuning_data_preparation.sh",
                      {"DATA": pack_input(tmp_path, broken=False), "OUT_DIR": str(tmp_path / "p"), "MAX_PHASES": "0"})
    assert proc.returncode == EXIT_USER and one_line_error(proc.stderr)
    proc = run_script("run_finetuning_data_preparation.sh",
                      {"DATA": pack_input(tmp_path, broken=True), "OUT_DIR": str(tmp_path / "p")})
    assert proc.returncode == EXIT_ITEMS_FAILED, proc.stderr
    data = problems_file(tmp_path, 3)
    srv = scripted_server(failing_solver({0}))
    env = {"PLANNER_MODEL": MODEL, "PLANNER_SERVER_URL": srv.base_url, "TEST_DATA": data, "PROMPT_MODE": "raw",
           "OUT_DIR": str(tmp_path / "o")}
    proc = run_script("run_agent_orchestration.sh", env)
    assert proc.returncode == EXIT_ITEMS_FAILED, proc.stderr[-2000:]
    env = {"MODEL": MODEL, "SERVER_URL": srv.base_url, "TEST_DATA": data, "PROMPT_MODE": "raw", "MAX_TOKENS": "50",
           "OUT_DIR": str(tmp_path / "b")}
    proc = run_script("run_baseline_evaluation.sh", env)
    assert proc.returncode == EXIT_ITEMS_FAILED, proc.stderr[-2000:]
    srv = scripted_server(solver)
    env = {"PLANNER_MODEL": MODEL, "PLANNER_SERVER_URL": srv.base_url, "TEST_DATA": data, "PROMPT_MODE": "raw",
           "OUT_DIR": str(tmp_path / "o")}
    assert run_script("run_agent_orchestration.sh", env).returncode == EXIT_OK
    env["PLANNER_MODEL"] = "test-modle"
    env["OUT_DIR"] = str(tmp_path / "o2")
    proc = run_script("run_agent_orchestration.sh", env)
    assert proc.returncode == EXIT_USER and "not served" in one_line_error(proc.stderr.splitlines()[-1])


def test_no_server_answering(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             scripted_server: ScriptedServer) -> None:
    """With the start check: exit 2 and nothing left behind. Without it (--no-check): the breaker ends the
    run in seconds with exit 4 instead of trying every item in full (before: exit 0, `llm_connection: 8`)."""
    import time

    from sprint.core.errors import EXIT_SERVER_STOPPED
    from sprint.llm.serve import free_port

    rows = load_traces() * 2
    rows = [{**r, "id": f"{r['id']}-{i}", "question": f"{r['question']} ({i})"} for i, r in enumerate(rows)]
    traces = str(write_jsonl(tmp_path / "traces.jsonl", rows))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    out = tmp_path / "c"
    cmd = ["components", "-i", traces, "-o", str(out), "--model", MODEL, "--server-url", dead, "--no-progress"]
    assert cli_main(cmd) == EXIT_USER
    assert "no server answers" in one_line_error(capsys.readouterr().err) and not out.exists()
    started = time.monotonic()
    assert cli_main([*cmd, "--no-check"]) == EXIT_SERVER_STOPPED
    took = time.monotonic() - started
    err = one_line_error(capsys.readouterr().err)
    assert err == (f"error: server at {dead} stopped answering after 10 connection failures in a row, "
                   f"{len(rows)} items not done; rerun the same command to continue")
    assert took < 10, took
    records = [json.loads(x) for x in (out / "records.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "llm_connection" and r["retryable"] for r in records)
    srv = scripted_server(curation_answer(rows))  # the server is up: the same folder completes
    assert cli_main([a if a != dead else srv.base_url for a in cmd]) == EXIT_OK
    assert len((out / "records.jsonl").read_text().splitlines()) == len(rows)
