"""Kill a curation stage mid-run (SIGKILL, in a real subprocess) and run it again.

What must hold: items finished before the kill are not asked again, the folder ends with exactly
one complete record per item, and those records equal an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer
from tests.test_components import by_question, good_answer, load_traces, question_in, records_of, run_stage1, write_jsonl

from sprint.core.errors import UserError
from sprint.curation.components import separate_components
from sprint.curation.dag import create_dag

REPO = Path(__file__).resolve().parents[1]
MODEL = "test-model"
DELAY = 0.3  # seconds per answer: slow enough to kill the run half way
ITEMS = 16


def many_rows() -> list[dict]:
    traces = load_traces()
    return [
        {**t, "id": f"{t['id']}-{i}", "question": f"{t['question']} (copy {i})"}
        for i in range(ITEMS // len(traces))
        for t in traces
    ]


def answer_for(stage: str):
    def reply(row: dict) -> Reply:
        return Reply(text=good_answer(row) if stage == "components" else row["scripted_dag"], delay=DELAY)

    return reply


def command(stage: str, inp: Path, out: Path, url: str) -> list[str]:
    return [
        sys.executable, "-m", "sprint", stage, "--input", str(inp), "--out-dir", str(out),
        "--model", MODEL, "--server-url", url, "--num-workers", "2", "--no-progress",
    ]


def complete_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    data = path.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def stage_input(stage: str, tmp_path: Path, rows: list[dict]) -> Path:
    traces = write_jsonl(tmp_path / "traces.jsonl", rows)
    if stage == "components":
        return traces
    folder = tmp_path / "components"
    with FakeServer(by_question(rows, good_answer)) as srv:
        outcome = run_stage1(traces, folder, srv.base_url)
    assert outcome.counts == {"ok": len(rows)}
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["components", "dag"])
def test_killed_stage_resumes_without_redoing_or_duplicating(tmp_path: Path, stage: str,
                                                             scripted_server: ScriptedServer) -> None:
    rows = many_rows()
    inp = stage_input(stage, tmp_path, rows)
    out = tmp_path / "out"
    records = out / "records.jsonl"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    srv = scripted_server(by_question(rows, answer_for(stage)))
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(command(stage, inp, out, srv.base_url), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while len(complete_lines(records)) < 4:
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.monotonic() < deadline, "the stage wrote no records in 60 s"
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no cleanup, no manifest update, maybe a half-written line
    proc.wait()
    log.close()
    assert proc.returncode == -9
    finished = {r["id"] for r in complete_lines(records)}
    assert 4 <= len(finished) < len(rows)
    asked_before = len(srv.completion_requests)
    with open(records, "ab") as f:  # the worst a kill can leave: half a record
        f.write(b'{"id": "' + sorted(finished)[0].encode() + b'", "status": "o')

    again = command(stage, inp, out, srv.base_url)
    second = subprocess.run(again, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    asked_again = [question_in(body) for _, body in srv.completion_requests[asked_before:]]

    by_id = {r["id"]: r for r in rows}
    assert not {by_id[i]["question"] for i in finished} & set(asked_again), "finished items were asked again"
    assert len(asked_again) <= len(rows) - len(finished)  # in-flight items at most once more
    assert f"{len(finished)} already done" in second.stdout

    lines = records.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) - 1 == len(rows)  # one complete line per item, no leftovers
    resumed = records_of(out)
    assert set(resumed) == set(by_id) and all(r["status"] == "ok" for r in resumed.values())

    reference = tmp_path / "reference"  # an uninterrupted run (in-process and without delays, to save time)
    run = separate_components if stage == "components" else create_dag
    srv = scripted_server(by_question(rows, lambda row: answer_for(stage)(row).text))
    run(str(inp), reference, model=MODEL, server_url=srv.base_url, num_workers=4, progress=False)
    assert resumed == records_of(reference)

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"] == {"ok": len(rows)}
    ds = datasets.load_dataset("json", data_files=str(records), split="train")
    assert sorted(ds["id"]) == sorted(by_id)


def test_a_rerun_on_changed_rows_is_refused_and_loses_nothing(tmp_path: Path, scripted_server: ScriptedServer):
    """Regenerated data under the same ids (the mini demo's traces after a format change) must not
    pass the old answers off as the new rows' own: the re-run stops before any call and says how out."""
    rows = load_traces()
    srv: FakeServer = scripted_server(by_question(rows, lambda row: Reply(text=good_answer(row))))
    inp = write_jsonl(tmp_path / "traces.jsonl", rows)
    out = tmp_path / "out"
    run_stage1(inp, out, srv.base_url)
    before = (out / "records.jsonl").read_bytes()
    assert all(len(r["input_hash"]) == 16 for r in records_of(out).values())
    run_stage1(inp, out, srv.base_url)  # the same rows: a resume, nothing asked again
    asked = len(srv.requests)
    changed = [dict(rows[0], thought=rows[0]["thought"] + "\nOne more line.")] + rows[1:]
    write_jsonl(inp, changed)
    with pytest.raises(UserError, match=r"the data changed since that run\. Pass --overwrite"):
        run_stage1(inp, out, srv.base_url)
    assert len(srv.requests) == asked and (out / "records.jsonl").read_bytes() == before
    old_hash = {json.loads(line)["id"]: json.loads(line)["input_hash"] for line in before.splitlines()}
    run_stage1(inp, out, srv.base_url, overwrite=True)
    new_hash = {i: r["input_hash"] for i, r in records_of(out).items()}
    assert [i for i in new_hash if new_hash[i] != old_hash[i]] == [rows[0]["id"]]  # only the changed row
