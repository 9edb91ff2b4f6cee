"""Crash-and-resume for every stage: SIGKILL the real CLI at a seeded random point, run the same
command again, and compare with an uninterrupted run.

What must hold for each stage (components, dag, pack, orchestrate, baseline, evaluate):
- the folder never holds a half-written file under its final name, nor a partial record line
  that survives the restart;
- after the restart it holds exactly one complete record per item, equal (timing aside) to what
  an uninterrupted run writes;
- for the LLM stages, finished items are not asked again, and no call whose answer reached the
  on-disk cache before the kill is sent again (it is a cache hit instead).

The kill lands at a random point chosen by a seeded `random.Random`: after a random number of
finished records plus a random fraction of one answer's delay (LLM stages), or at a random
fraction of an uninterrupted run's wall time (pack, evaluate, which recompute everything).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer
from tests.helpers import shared_data_dir, tokenizer_dir
from tests.test_components import by_question, good_answer, load_traces, run_stage1, write_jsonl

from sprint.curation.components import separate_components
from sprint.curation.dag import create_dag
from sprint.llm.client import Sampling, cache_key
from sprint.inference.baseline import BaselineConfig, baseline
from sprint.inference.orchestration import OrchestrationConfig, orchestrate

REPO = Path(__file__).resolve().parents[1]
MODEL = "test-model"
DELAY = 0.25  # seconds per answer: slow enough for a kill to land half way
TIMING_KEYS = {"start", "end", "cached", "elapsed", "server"}  # differ between any two runs (server: its port)


def cli_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "SPRINT_LOCAL_DATA": str(shared_data_dir()),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }


# ---------------------------------------------------------------------------------------------
# Processes


def launch(argv: list[str], log: Path) -> subprocess.Popen:
    """`python -m sprint ARGV` in its own process group (grading workers die with it)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sprint", *argv], cwd=REPO, env=cli_env(), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the whole group: no cleanup, no manifest update, maybe a half-written line."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_cli(argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sprint", *argv], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------------------------------------
# Files


def complete_lines(path: Path) -> list[dict]:
    """The records of the complete lines (a half-written tail is left out)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def assert_clean_records(path: Path, n: int) -> dict[str, dict]:
    """Exactly `n` complete lines, each one JSON record, ids unique."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), f"{path} ends with a partial line"
    rows = [json.loads(line) for line in data.splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate records in {path}: {sorted(i for i in ids if ids.count(i) > 1)}"
    assert len(rows) == n, f"{path} holds {len(rows)} records, expected {n}"
    return {r["id"]: r for r in rows}


def assert_complete_files(folder: Path) -> None:
    """Every file under its final name is whole: .json parses, every .jsonl line parses."""
    for path in folder.rglob("*"):
        if not path.is_file() or "llm_cache" in path.parts or "cache" in path.parts:
            continue
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl" and path.name != "records.jsonl":  # records.jsonl may end in half a line
            for line in path.read_text().splitlines():
                json.loads(line)


def strip_timing(value: Any) -> Any:
    """A record without what differs between any two runs: times, cache flags, the order in
    which parallel calls finished."""
    if isinstance(value, dict):
        out = {k: strip_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
        if isinstance(out.get("calls"), list):
            out["calls"] = sorted(out["calls"], key=lambda c: json.dumps(c, sort_keys=True))
        return out
    if isinstance(value, list):
        return [strip_timing(v) for v in value]
    return value


def leftover_tmp(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*.tmp") if "llm_cache" not in p.parts and "cache" not in p.parts]


# ---------------------------------------------------------------------------------------------
# Requests and the cache


def request_key(endpoint: str, body: dict) -> str:
    """The cache key the client used for this request, rebuilt from what reached the server."""
    known = {"model", "prompt", "messages", "max_tokens", "temperature", "top_p", "stop", "seed", "stream", "stream_options"}
    extra = tuple((k, v) for k, v in body.items() if k not in known)
    sampling = Sampling(
        max_tokens=body["max_tokens"], temperature=body.get("temperature", 0.0), top_p=body.get("top_p", 1.0),
        stop=tuple(body.get("stop") or ()), seed=body.get("seed"), extra=extra,
    )
    payload = body["prompt"] if endpoint == "completions" else body["messages"]
    return cache_key(endpoint, body["model"], payload, sampling)


def cached_keys(cache: Path) -> set[str]:
    return {p.stem for p in cache.glob("*/*.json")}


def question_of(endpoint: str, body: dict) -> str:
    text = body["prompt"] if endpoint == "completions" else body["messages"][-1]["content"]
    if endpoint == "chat" and "<Question>" not in text:
        text = body["messages"][0]["content"]
    m = re.search(r"<Question>\n(.*?)\n</Question>", text, re.S)
    assert m, "a request without a <Question> block"
    return m.group(1).strip()


# ---------------------------------------------------------------------------------------------
# The LLM stages: kill after a random number of records, resume, compare


def kill_and_resume_llm_stage(
    tmp_path: Path,
    *,
    seed: int,
    argv: list[str],
    out: Path,
    cache: Path,
    handler: Callable[[dict, str], Any],
    items: dict[str, str],
    reference: Callable[[str], dict[str, dict]],
) -> None:
    """`items`: id -> question. `reference(url)` runs the stage uninterrupted and returns its records."""
    rng = random.Random(seed)
    n = len(items)
    after = rng.randint(2, n - 4)  # finished records before the kill
    extra = rng.uniform(0, DELAY)  # and a random point inside the next answer
    records = out / "records.jsonl"
    with FakeServer(lambda body, endpoint: Reply(text=handler(body, endpoint), delay=DELAY)) as srv:
        argv = [a.replace("{url}", srv.base_url) for a in argv] + ["--no-progress"]
        proc = launch(argv, tmp_path / "killed.log")
        deadline = time.monotonic() + 90
        while len(complete_lines(records)) < after:
            assert proc.poll() is None, f"the stage ended before the kill:\n{(tmp_path / 'killed.log').read_text()}"
            assert time.monotonic() < deadline, "the stage wrote too few records in 90 s"
            time.sleep(0.02)
        time.sleep(extra)
        assert proc.poll() is None, "the stage finished before the kill; raise DELAY or the item count"
        kill(proc)
        assert proc.returncode == -signal.SIGKILL

        finished = {r["id"] for r in complete_lines(records)}
        assert after <= len(finished) < n
        assert_complete_files(out)
        before = len(srv.completion_requests)
        in_cache = cached_keys(cache)
        # a request cut off by the kill reaches the server without its body: it was never answered
        first_keys = {request_key(e, b) for e, b in srv.completion_requests if "max_tokens" in b}
        assert in_cache and in_cache <= first_keys, "cache keys are not rebuilt as the client builds them"

        assert (out / ".sprint.lock").exists()  # kill -9 leaves the lock file; its lock died with the process
        again = run_cli(argv)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "Traceback" not in again.stderr
        assert f"taking over the lock of {out} left by a run that is no longer running (pid {proc.pid} " in again.stderr
        assert not (out / ".sprint.lock").exists()
        # a request the kill cut off may reach the server after `before` was taken: it has no body
        resumed = [(e, b) for e, b in srv.completion_requests[before:] if "max_tokens" in b]
        assert srv.errors == []

    # finished items are not asked again; calls answered before the kill come from the cache
    asked_again = {question_of(e, b) for e, b in resumed}
    finished_questions = {items[i] for i in finished}
    assert not asked_again & finished_questions, f"finished items asked again: {asked_again & finished_questions}"
    repeated = [b for e, b in resumed if request_key(e, b) in in_cache]
    assert not repeated, f"{len(repeated)} calls answered before the kill were sent again instead of read from the cache"
    print(f"killed after {len(finished)}/{n} records; {before} requests before the kill, {len(resumed)} after; "
          f"{len(in_cache)} answers were in the cache")

    # one complete record per item, equal to an uninterrupted run's
    got = assert_clean_records(records, n)
    assert set(got) == set(items)
    assert not leftover_tmp(out), leftover_tmp(out)
    with FakeServer(handler) as fast:
        expected = reference(fast.base_url)
    assert strip_timing(got) == strip_timing(expected)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(manifest["counts"].values()) == n


def curation_rows() -> list[dict]:
    traces = load_traces()
    return [{**t, "id": f"{t['id']}-{i}", "question": f"{t['question']} (copy {i})"} for i in range(3) for t in traces]


def records_by_id(folder: Path) -> dict[str, dict]:
    return {r["id"]: r for r in complete_lines(folder / "records.jsonl")}


@pytest.mark.slow
def test_components_resume_after_kill(tmp_path: Path) -> None:
    rows = curation_rows()
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "out"
    argv = ["components", "-i", str(inp), "-o", str(out), "--model", MODEL, "--server-url", "{url}", "--num-workers", "2"]

    def reference(url: str) -> dict[str, dict]:
        separate_components(str(inp), tmp_path / "ref", model=MODEL, server_url=url, num_workers=4, progress=False)
        return records_by_id(tmp_path / "ref")

    kill_and_resume_llm_stage(
        tmp_path, seed=1, argv=argv, out=out, cache=out / "llm_cache",
        handler=by_question(rows, good_answer), items={r["id"]: r["question"] for r in rows}, reference=reference,
    )


@pytest.mark.slow
def test_dag_resume_after_kill(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows = curation_rows()
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    stage1 = tmp_path / "components"
    srv = scripted_server(by_question(rows, good_answer))
    assert run_stage1(inp, stage1, srv.base_url).counts == {"ok": len(rows)}
    out = tmp_path / "out"
    argv = ["dag", "-i", str(stage1), "-o", str(out), "--model", MODEL, "--server-url", "{url}", "--num-workers", "2"]

    def reference(url: str) -> dict[str, dict]:
        create_dag(str(stage1), tmp_path / "ref", model=MODEL, server_url=url, num_workers=4, progress=False)
        return records_by_id(tmp_path / "ref")

    kill_and_resume_llm_stage(
        tmp_path, seed=2, argv=argv, out=out, cache=out / "llm_cache",
        handler=by_question(rows, lambda row: row["scripted_dag"]), items={r["id"]: r["question"] for r in rows},
        reference=reference,
    )


# ---- orchestration and baseline: a scripted two-phase solver ---------------------------------

N_PROBLEMS = 12


def math_rows(tmp_path: Path, n: int = N_PROBLEMS) -> tuple[Path, dict[str, str]]:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "unique_id": f"test/sums/{i}.json"} for i in range(n)]
    path = write_jsonl(tmp_path / "problems.jsonl", rows)
    return path, {f"test_sums_{i}": r["problem"] for i, r in enumerate(rows)}


def number_in(question: str) -> int:
    return int(re.search(r"What is (\d+)", question).group(1))


def solver(body: dict, endpoint: str) -> str:
    """Planner: one phase with two prompts, then the answer. Executors: their sum. Deterministic per prompt."""
    prompt = body["prompt"]
    i = number_in(question_of(endpoint, body))
    if prompt.endswith("<Final_answer>\n"):
        return f"So the sum is \\boxed{{{2 * i}}}.\n</Final_answer>"
    m = re.search(r"<execution_(\d+\.\d+)>\n$", prompt)
    if m:
        return f"Prompt {m.group(1)}: {i} + {i} = {2 * i}.\n</execution_{m.group(1)}>"
    if "<Plan_1>" not in prompt:
        return (f"<Plan_1>\nSplit the work.\n<prompt_1.1> Add {i} and {i}. </prompt_1.1>\n"
                f"<prompt_1.2> Double {i}. </prompt_1.2>\n</Plan_1>")
    return f"<Final_answer>\nBoth give {2 * i}, so \\boxed{{{2 * i}}}.\n</Final_answer>"


def sequential(body: dict, endpoint: str) -> str:
    i = number_in(question_of(endpoint, body))
    return f"Adding {i} to itself gives {2 * i}.\n</think>\n\nThe answer is $\\boxed{{{2 * i}}}$."


@pytest.mark.slow
def test_orchestrate_resume_after_kill(tmp_path: Path) -> None:
    data, items = math_rows(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [
        "orchestrate", "--planner-model", MODEL, "--planner-url", "{url}", "--data", str(data), "--out-dir", str(out),
        "--prompt-mode", "raw", "--max-problem-workers", "2", "--max-execution-workers", "4",
        "--planner-max-tokens", "200", "--max-tokens", "100", "--cache-dir", str(cache),
    ]

    def reference(url: str) -> dict[str, dict]:
        cfg = OrchestrationConfig(
            planner_model=MODEL, planner_server_url=url, out_dir=str(tmp_path / "ref"), data=str(data),
            prompt_mode="raw", planner_max_tokens=200, max_tokens=100,
        )
        orchestrate(cfg, progress=False)
        return records_by_id(tmp_path / "ref")

    kill_and_resume_llm_stage(
        tmp_path, seed=3, argv=argv, out=out, cache=cache, handler=solver, items=items, reference=reference,
    )
    files = sorted(p.name for p in (out / "trajectories").iterdir())
    assert files == sorted(f"{i}.txt" for i in items)
    for record in complete_lines(out / "records.jsonl"):
        assert (out / "trajectories" / f"{record['id']}.txt").read_text() == record["trajectory"] + "\n"
        assert record["correct"] is True


@pytest.mark.slow
def test_baseline_resume_after_kill(tmp_path: Path) -> None:
    data, items = math_rows(tmp_path)
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = [
        "baseline", "--model", MODEL, "--server-url", "{url}", "--data", str(data), "--out-dir", str(out),
        "--prompt-mode", "raw", "--max-problem-workers", "2", "--max-tokens", "200", "--cache-dir", str(cache),
    ]

    def reference(url: str) -> dict[str, dict]:
        cfg = BaselineConfig(model=MODEL, server_url=url, out_dir=str(tmp_path / "ref"), data=str(data),
                             prompt_mode="raw", max_tokens=200)
        baseline(cfg, progress=False)
        return records_by_id(tmp_path / "ref")

    kill_and_resume_llm_stage(
        tmp_path, seed=4, argv=argv, out=out, cache=cache, handler=sequential, items=items, reference=reference,
    )
    assert all(r["correct"] is True for r in complete_lines(out / "records.jsonl"))


# ---------------------------------------------------------------------------------------------
# Stages that recompute everything: kill at a random fraction of an uninterrupted run's time


def timed_run(tmp_path: Path, argv: list[str], marker: Path | None) -> tuple[float, float]:
    """Run to the end; (seconds until `marker` appeared (0 without one), total seconds)."""
    proc = launch(argv, tmp_path / "reference.log")
    t0 = time.monotonic()
    seen = 0.0 if marker is None else None
    while proc.poll() is None:
        if seen is None and marker.exists():
            seen = time.monotonic() - t0
        time.sleep(0.01)
    total = time.monotonic() - t0
    assert proc.returncode == 0, (tmp_path / "reference.log").read_text()
    assert seen is not None, f"{marker} never appeared"
    return seen, total


def kill_at_random_time(
    tmp_path: Path, argv: list[str], out: Path, marker: Path | None, timing: tuple[float, float], seed: int
) -> float:
    """Run the command and SIGKILL it at a random point of its work: after `marker` appears (the
    stage has loaded its input and opened its folder; without a marker, after `timing[0]`
    seconds), a random fraction of the time the uninterrupted run spent from there to its end.
    Returns the seconds from start to kill.

    On a busy machine a run can be faster than the timed one and end before the kill; then the
    output folder is removed and the kill retried earlier (the test needs a real interruption).
    """
    seen, total = timing
    fraction = random.Random(seed).uniform(0.05, 0.85)
    for _ in range(4):
        proc = launch(argv, tmp_path / "killed.log")
        t0 = time.monotonic()
        if marker is None:
            time.sleep(seen)
        while marker is not None and not marker.exists():
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()
            assert time.monotonic() - t0 < 60, f"{marker} never appeared"
            time.sleep(0.005)
        time.sleep(fraction * (total - seen))
        at = time.monotonic() - t0
        finished = proc.poll() is not None
        kill(proc)
        if not finished:
            return at
        shutil.rmtree(out, ignore_errors=True)
        fraction /= 2
    raise AssertionError(f"the command always ended before the kill:\n{(tmp_path / 'killed.log').read_text()}")


def stage2_rows(n: int, seed: int = 0) -> list[dict]:
    """Synthetic stage-2 records (components + DAG) that pack keeps or drops; ids with '/' and spaces."""
    rng = random.Random(seed)
    words = "so the value of x is then we get that term divides the sum and checking each case gives".split()

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k)).capitalize() + "."

    rows = []
    for i in range(n):
        components, dag, line = [], {}, 1
        for c in range(1, rng.randint(8, 14) + 1):
            plan = [line, line]
            execution = [line + 1, line + 1 + rng.choice([1, 3, 4])]
            line = execution[1] + 1
            components.append({
                "number": c, "description": text(5), "plan": plan, "prompt": text(10), "execution": execution,
                "comment": None, "plan_text": text(25), "execution_text": text(60), "comment_text": None,
            })
            dag[str(c)] = sorted(rng.sample(range(1, c), min(c - 1, rng.randint(1, 2)))) if c > 1 and rng.random() < 0.4 else []
        rows.append({
            "id": f"trace {i}/copy", "question": f"Question {i}: {text(15)}", "answer": str(i), "status": "ok",
            "solution": f"Adding up gives {i}. Hence the answer is $\\boxed{{{i}}}$.", "components": components, "dag": dag,
        })
    return rows


@pytest.mark.slow
def test_pack_rerun_after_kill_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    stage2 = tmp_path / "stage2"
    stage2.mkdir()
    write_jsonl(stage2 / "records.jsonl", stage2_rows(900))
    ref, out = tmp_path / "ref", tmp_path / "out"
    timing = timed_run(tmp_path, ["pack", "-i", str(stage2), "-o", str(ref)], ref / "manifest.json")
    at = kill_at_random_time(tmp_path, ["pack", "-i", str(stage2), "-o", str(out)], out, out / "manifest.json", timing, seed=5)
    assert_complete_files(out)  # whole files or none: the writes are atomic
    print(f"pack: uninterrupted {timing[1]:.2f}s (folder opened at {timing[0]:.2f}s), killed at {at:.2f}s; left behind: "
          f"{sorted(p.name for p in out.iterdir()) if out.exists() else 'nothing'}")

    again = run_cli(["pack", "-i", str(stage2), "-o", str(out)])
    assert again.returncode == 0, again.stderr
    for name in ("records.jsonl", "train.jsonl", "test.jsonl"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name
    summary = {k: v for k, v in json.loads((out / "summary.json").read_text()).items() if k != "seconds"}
    assert summary == {k: v for k, v in json.loads((ref / "summary.json").read_text()).items() if k != "seconds"}
    assert summary["kept"] > 0 and summary["train"] > 0
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (out, ref)]
    assert manifests[0]["counts"] == manifests[1]["counts"] and manifests[0]["identity"] == manifests[1]["identity"]
    assert not leftover_tmp(out)
    assert_clean_records(out / "records.jsonl", 900)


def sprint_run(folder: Path, n: int, seed: int = 0) -> None:
    """A finished orchestration run folder (records with trajectories), 70% correct."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        answer = 2 * i if rng.random() < 0.7 else 2 * i + 1
        body = "step " * rng.randint(10, 300)
        trajectory = (
            f"<Question>\nWhat is {i} + {i}?\n</Question>\n\n<Plan_1>\nAdd them.\n<prompt_1.1> Compute {i}+{i}. "
            f"</prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n{i}+{i} = {answer}. {body}\n</execution_1.1>\n"
            f"</Execution_1>\n\n<Final_answer>\nSo \\boxed{{{answer}}}.\n</Final_answer>"
        )
        rows.append({"id": f"p{i}", "index": i, "task": "math", "question": f"What is {i} + {i}?", "gold": str(2 * i),
                     "status": "ok", "mode": "sprint", "trajectory": trajectory})
    folder.mkdir(parents=True)
    write_jsonl(folder / "records.jsonl", rows)


def comparable_metrics(folder: Path) -> dict:
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics.pop("timing", None)
    return metrics


@pytest.mark.slow
def test_evaluate_rerun_after_kill_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    tokenizer = tokenizer_dir()
    run = tmp_path / "run"
    sprint_run(run, 300)
    argv = ["evaluate", str(run), "--planner-tokenizer", str(tokenizer), "--bootstrap", "200"]
    timing = timed_run(tmp_path, [*argv, "--out", str(tmp_path / "ref")], None)
    out = tmp_path / "out"
    at = kill_at_random_time(tmp_path, [*argv, "--out", str(out)], out, None, (timing[1] / 3, timing[1]), seed=6)
    if out.exists():
        assert_complete_files(out)
    print(f"evaluate: uninterrupted {timing[1]:.2f}s, killed at {at:.2f}s; left behind: "
          f"{sorted(p.name for p in out.iterdir()) if out.exists() else 'nothing'}")

    again = run_cli([*argv, "--out", str(out)])
    assert again.returncode == 0, again.stderr
    assert comparable_metrics(out) == comparable_metrics(tmp_path / "ref")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in (tmp_path / "ref").iterdir())
    assert not leftover_tmp(out)
    assert (run / "records.jsonl").read_bytes().count(b"\n") == 300  # the input is never touched


@pytest.mark.parametrize("stage", ["orchestrate", "baseline"])
def test_calls_answered_before_a_crash_are_not_paid_twice_by_default(tmp_path: Path, stage: str,
                                                                     scripted_server: ScriptedServer) -> None:
    data, _ = math_rows(tmp_path, 4)
    out = tmp_path / "out"
    srv = scripted_server(solver if stage == "orchestrate" else sequential)
    def once() -> None:
        if stage == "orchestrate":
            orchestrate(OrchestrationConfig(planner_model=MODEL, planner_server_url=srv.base_url, out_dir=str(out),
                                            data=str(data), prompt_mode="raw", planner_max_tokens=200,
                                            max_tokens=100), progress=False)
        else:
            baseline(BaselineConfig(model=MODEL, server_url=srv.base_url, out_dir=str(out), data=str(data),
                                    prompt_mode="raw", max_tokens=200), progress=False)

    once()
    asked = len(srv.completion_requests)
    # the crash: every answer came back, no record reached the disk (all problems were in flight)
    (out / "records.jsonl").write_bytes(b"")
    once()
    assert len(srv.completion_requests) == asked, "calls answered before the crash were sent again"
