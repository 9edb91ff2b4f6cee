"""One writer per folder, a clean `--overwrite`, and an evaluation report that is always one set.

- Two identical runs into one folder, the second started once the first holds the lock: one refuses at once naming the other's
  pid, the other does everything once; nothing is asked twice, no id is recorded twice.
- A lock left by a killed run (kill -9) is taken over with a notice, and the rerun completes.
- `--overwrite` leaves nothing of the previous run (records, trajectories, evaluation, cache).
- `evaluate` killed at random points never leaves a mixed report; a failure while writing keeps
  the previous report whole.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tests.fake_server import Reply, ScriptedServer
from tests.test_components import by_question, good_answer, load_traces, write_jsonl
from tests.test_reliability import problems_file, solver
from tests.helpers import tokenizer_dir
from tests.test_resume_all import cli_env, complete_lines, leftover_tmp, sprint_run

from sprint.evaluation import report
from sprint.cli import main as cli_main
from sprint.core.errors import EXIT_OK, EXIT_USER, UserError
from sprint.core.records import LOCK_NAME, FolderLock, FolderSet, RunDir

MODEL = "test-model"
REPO = Path(__file__).resolve().parents[1]


def launch(argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "sprint", *argv], cwd=REPO, env=cli_env(), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def slow(handler, delay: float):
    return lambda body, endpoint: Reply(text=handler(body, endpoint), delay=delay)


def gated(handler, gate: threading.Event):
    """Every completion waits until the test opens `gate`: the run that asks holds its lock until then,
    however slowly the machine starts the other one."""
    def reply(body, endpoint):
        if endpoint != "models":
            gate.wait(timeout=120)
        return handler(body, endpoint)
    return reply


def wait_for_lock(out: Path, pid: int, timeout: float = 60) -> None:
    """Until a lock file under `out` names process `pid` (it took the lock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(str(pid) in f.read_text(errors="replace") for f in out.rglob(LOCK_NAME) if f.is_file()):
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} took no lock under {out} in {timeout} s")


# ---------------------------------------------------------------------------------------------
# the lock itself


def test_a_second_writer_is_refused_naming_the_first(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "out", "stage", {"model": "m"})
    info = json.loads((tmp_path / "out" / LOCK_NAME).read_text())
    assert info["pid"] == os.getpid() and info["host"] and info["started"]
    with pytest.raises(UserError, match=f"being written by another run \\(pid {os.getpid()} on "):
        RunDir(tmp_path / "out", "stage", {"model": "m"})
    run.append({"id": "a", "status": "ok"})
    run.close()
    assert not (tmp_path / "out" / LOCK_NAME).exists()
    with RunDir(tmp_path / "out", "stage", {"model": "m"}) as again:
        assert sorted(again.done) == ["a"]


def test_a_stale_lock_file_is_taken_over_with_a_notice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "out").mkdir()
    stale = {"pid": 999999, "host": "elsewhere", "started": "2026-01-01T00:00:00", "command": "sprint components"}
    (tmp_path / "out" / LOCK_NAME).write_text(json.dumps(stale))
    with RunDir(tmp_path / "out", "stage", {"model": "m"}):
        err = capsys.readouterr().err
        assert "taking over the lock" in err and "pid 999999 on elsewhere" in err and "no longer running" in err
        assert json.loads((tmp_path / "out" / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_lock_held_by_another_process_is_respected(tmp_path: Path) -> None:
    """The lock is the kernel's (`flock`), so it holds across processes and dies with its holder."""
    folder = tmp_path / "out"
    folder.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from sprint.core.records import FolderLock; "
         f"lock = FolderLock({str(folder / LOCK_NAME)!r}); lock.acquire(); print('locked', flush=True); time.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(UserError, match=f"pid {holder.pid} "):
            FolderLock(folder / LOCK_NAME).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = FolderLock(folder / LOCK_NAME)
    lock.acquire()  # the kernel released the dead holder's lock
    lock.release()


# ---------------------------------------------------------------------------------------------
# two runs at once, end to end


@pytest.mark.parametrize("stage", ["components", "orchestrate"])
def test_two_concurrent_runs_one_refuses_and_nothing_is_duplicated(tmp_path: Path, stage: str,
                                                                   scripted_server: ScriptedServer) -> None:
    out = tmp_path / "out"
    if stage == "components":
        rows = load_traces()
        handler = by_question(rows, good_answer)
        n = len(rows)
        argv = ["components", "-i", str(write_jsonl(tmp_path / "t.jsonl", rows)), "-o", str(out), "--model", MODEL,
                "--num-workers", "1"]
        url_flag = "--server-url"
    else:
        n = 6
        handler = solver
        argv = ["orchestrate", "--planner-model", MODEL, "--data", problems_file(tmp_path, n), "--out-dir", str(out),
                "--prompt-mode", "raw", "--max-problem-workers", "2"]
        url_flag = "--planner-url"
    gate = threading.Event()
    srv = scripted_server(gated(slow(handler, 0.2), gate))
    argv = [*argv, url_flag, srv.base_url, "--no-progress"]
    first = launch(argv, tmp_path / "first.log")
    try:
        wait_for_lock(out, first.pid)
        second = launch(argv, tmp_path / "second.log")
        assert second.wait(timeout=60) == EXIT_USER
    finally:
        gate.set()
    assert first.wait(timeout=120) == EXIT_OK, (tmp_path / "first.log").read_text()
    asked = [b for e, b in srv.requests if e != "models"]
    err = (tmp_path / "second.log").read_text().strip().splitlines()[-1]
    assert err.startswith("error: ") and f"being written by another run (pid {first.pid} on " in err
    records = complete_lines(out / "records.jsonl")
    ids = [r["id"] for r in records]
    assert len(ids) == len(set(ids)) == n
    bodies = [json.dumps(b, sort_keys=True) for b in asked]
    assert len(bodies) == len(set(bodies)), "a call was paid twice"
    assert not (out / LOCK_NAME).exists()


def test_a_run_killed_with_its_lock_is_resumed_with_a_notice(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows = [{**t, "id": f"{t['id']}-{i}", "question": f"{t['question']} (copy {i})"} for i in range(3) for t in load_traces()]
    out = tmp_path / "out"
    srv = scripted_server(slow(by_question(rows, good_answer), 0.2))
    argv = ["components", "-i", str(write_jsonl(tmp_path / "t.jsonl", rows)), "-o", str(out), "--model", MODEL,
            "--server-url", srv.base_url, "--num-workers", "1", "--no-progress"]
    proc = launch(argv, tmp_path / "killed.log")
    deadline = time.monotonic() + 60
    while len(complete_lines(out / "records.jsonl")) < 2:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == proc.pid  # left behind by kill -9
    again = subprocess.run([sys.executable, "-m", "sprint", *argv], cwd=REPO, env=cli_env(), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == EXIT_OK, again.stderr
    assert f"taking over the lock of {out} left by a run that is no longer running (pid {proc.pid} " in again.stderr
    ids = [r["id"] for r in complete_lines(out / "records.jsonl")]
    assert sorted(ids) == sorted(r["id"] for r in rows)
    assert not (out / LOCK_NAME).exists() and not leftover_tmp(out)


# ---------------------------------------------------------------------------------------------
# --overwrite starts clean


def test_overwrite_leaves_nothing_of_the_previous_run(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    out = tmp_path / "o"
    data = problems_file(tmp_path, 6)
    srv = scripted_server(solver)
    cmd = ["orchestrate", "--planner-model", MODEL, "--planner-url", srv.base_url, "--data", data, "--out-dir",
           str(out), "--prompt-mode", "raw", "--no-progress"]
    assert cli_main(cmd) == EXIT_OK
    assert len(list((out / "trajectories").glob("*.txt"))) == 6
    (out / "evaluation").mkdir()
    (out / "evaluation" / "report.md").write_text("the old run's report")
    (out / "notes.txt").write_text("the user's own file")  # not an output of ours: kept
    assert cli_main([*cmd, "--range", "0:2", "--planner-temp", "0.5", "--overwrite"]) == EXIT_OK
    assert sorted(p.name for p in (out / "trajectories").iterdir()) == ["test_sums_0.txt", "test_sums_1.txt"]
    assert len((out / "records.jsonl").read_text().splitlines()) == 2
    assert not (out / "evaluation").exists()
    assert (out / "notes.txt").read_text() == "the user's own file"
    assert json.loads((out / "manifest.json").read_text())["config"]["planner_temperature"] == 0.5
    assert not [p for p in out.iterdir() if p.name.startswith(".sprint-trash")]


def test_overwrite_with_the_same_configuration_starts_afresh_too(tmp_path: Path,
                                                                 scripted_server: ScriptedServer) -> None:
    rows = load_traces()
    traces = str(write_jsonl(tmp_path / "t.jsonl", rows))
    out = tmp_path / "c"
    srv = scripted_server(by_question(rows, good_answer))
    cmd = ["components", "-i", traces, "-o", str(out), "--model", MODEL, "--server-url", srv.base_url, "--no-progress"]
    assert cli_main(cmd) == EXIT_OK
    asked = len(srv.requests)
    assert cli_main([*cmd, "--overwrite"]) == EXIT_OK
    assert len(srv.requests) - asked == len(rows) + 1  # every item asked again (the cache went too), + GET /models
    assert len((out / "records.jsonl").read_text().splitlines()) == len(rows)


# ---------------------------------------------------------------------------------------------
# evaluate writes one set


def report_identity(out: Path) -> tuple[str, str, str]:
    """Which run each file of a report belongs to: metrics.json, manifest.json, report.md."""
    metrics = json.loads((out / "metrics.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    text = (out / "report.md").read_text()
    in_report = [label for label in ("alpha", "beta") if label in text]
    assert len(in_report) == 1, "report.md names neither or both runs"
    return Path(metrics["runs"][0]["path"]).name, Path(manifest["config"]["runs"][0]).name, in_report[0]


def test_a_killed_evaluate_never_leaves_a_mixed_report(tmp_path: Path) -> None:
    tok = str(tokenizer_dir())
    sprint_run(tmp_path / "alpha", 40, seed=1)
    sprint_run(tmp_path / "beta", 60, seed=2)
    out = tmp_path / "report"
    flags = ["--planner-tokenizer", tok, "--out", str(out), "--bootstrap", "200"]
    assert cli_main(["evaluate", str(tmp_path / "alpha"), *flags]) == EXIT_OK
    assert report_identity(out) == ("alpha", "alpha", "alpha")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "sprint", "evaluate", str(tmp_path / "beta"), *flags], cwd=REPO,
                          env=cli_env(), capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - started
    assert done.returncode == EXIT_OK, done.stderr
    rng = random.Random(7)
    seen = set()
    for attempt in range(8):
        run = ("alpha", "beta")[attempt % 2]
        proc = launch(["evaluate", str(tmp_path / run), *flags], tmp_path / f"kill{attempt}.log")
        time.sleep(rng.uniform(0.6, 1.1) * wall)  # mostly late: the write comes last
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished first
            pass
        proc.wait()
        ident = report_identity(out)
        assert len(set(ident)) == 1, f"mixed report after a kill: {ident}"
        seen.add(ident[0])
        assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    # the leftovers of killed writers are cleared by the next evaluation
    assert cli_main(["evaluate", str(tmp_path / "alpha"), *flags]) == EXIT_OK
    assert report_identity(out) == ("alpha", "alpha", "alpha")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".report")) == []
    print(f"evaluate takes {wall:.1f}s; reports seen after kills: {sorted(seen)}")


def test_a_failure_while_writing_keeps_the_previous_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = str(tokenizer_dir())
    sprint_run(tmp_path / "alpha", 5, seed=1)
    sprint_run(tmp_path / "beta", 7, seed=2)
    out = tmp_path / "report"
    flags = ["--planner-tokenizer", tok, "--out", str(out), "--no-plots", "--bootstrap", "0"]
    assert cli_main(["evaluate", str(tmp_path / "alpha"), *flags]) == EXIT_OK
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = report.atomic_write

    def fail_on_report(path, data, **kw):
        if Path(path).name == "report.md":
            raise RuntimeError("killed between metrics.json and report.md")
        return real(path, data, **kw)

    monkeypatch.setattr(report, "atomic_write", fail_on_report)
    with pytest.raises(RuntimeError):
        cli_main(["evaluate", str(tmp_path / "beta"), *flags])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".report")] == []


def test_two_evaluations_into_one_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tok = str(tokenizer_dir())
    sprint_run(tmp_path / "alpha", 5, seed=1)
    out = tmp_path / "report"
    busy = FolderSet(out)
    busy.open()
    try:
        assert cli_main(["evaluate", str(tmp_path / "alpha"), "--planner-tokenizer", tok, "--out", str(out)]) == EXIT_USER
    finally:
        busy.close()
    err = capsys.readouterr().err
    assert f"{out} is being written by another run (pid {os.getpid()} " in err
    assert not out.exists()
