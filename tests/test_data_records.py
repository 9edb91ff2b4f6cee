"""Dataset input (sources, layouts, ranges, ids) and resumable run folders."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from tests.helpers import shared_data_dir, shared_path

from sprint.core.data import load_items, parse_range, safe_id
from sprint.core.errors import UserError
from sprint.core.records import RunDir


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "spec, n, expected",
    [(None, 5, [0, 1, 2, 3, 4]), ("1:3", 5, [1, 2]), (":2", 5, [0, 1]), ("3:", 5, [3, 4]), ("-2:", 5, [3, 4]), ("0:100", 3, [0, 1, 2])],
)
def test_parse_range(spec, n, expected):
    assert list(parse_range(spec, n)) == expected


def test_bad_range_is_a_user_error():
    with pytest.raises(UserError, match="START:END"):
        parse_range("1-3", 5)


@pytest.mark.parametrize(
    "raw, safe",
    [("test/precalculus/807.json", "test_precalculus_807"), ("../etc/passwd", "_etc_passwd"), ("a b", "a_b"), (7, "7")],
)
def test_safe_id(raw, safe):
    assert safe_id(raw) == safe


def test_math500_via_local_mapping(monkeypatch):
    shared_path("math500/test.jsonl")  # skip without it: load_items would fall back to the Hugging Face hub
    monkeypatch.setenv("SPRINT_LOCAL_DATA", str(shared_data_dir()))
    items = load_items("HuggingFaceH4/MATH-500", split="test", range_spec="0:2")
    assert items[0].id == "test_precalculus_807"
    assert items[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert "polar coordinates" in items[0].question


def test_openthoughts_layout_and_plain_thought(tmp_path):
    rows = [
        {"conversations": [{"from": "user", "value": "Q1?"}, {"from": "assistant", "value": "<|begin_of_thought|>\n\nthink hard\n\n<|end_of_thought|>\n\n<|begin_of_solution|>x<|end_of_solution|>"}], "id": "a"},
    ]
    items = load_items(str(write_jsonl(tmp_path / "ot.jsonl", rows)), require=("question", "thought"))
    assert items[0].question == "Q1?" and items[0].thought == "think hard"
    plain = load_items(str(write_jsonl(tmp_path / "p.jsonl", [{"problem": "Q", "thought": "T", "ProblemIdx": 3}])))
    assert plain[0].id == "3" and plain[0].thought == "T"


def test_parquet_and_stage_folder(tmp_path):
    datasets.Dataset.from_list([{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]).to_parquet(str(tmp_path / "d.parquet"))
    items = load_items(str(tmp_path / "d.parquet"))
    assert [i.id for i in items] == ["0", "1"] and items[1].answer == "2"
    stage = tmp_path / "stage"
    stage.mkdir()
    write_jsonl(stage / "records.jsonl", [{"id": "x", "question": "q", "status": "ok"}, {"id": "y", "question": "q", "status": "invalid"}])
    assert [i.id for i in load_items(str(stage))] == ["x"]


@pytest.mark.parametrize(
    "content, message",
    [(b'{"question": "a"}\n\xff\xfe\n', "not valid UTF-8"), (b'{"question": "a"}\nnot json\n', "not valid JSON"), (b"[1, 2]\n", "expected an object")],
)
def test_broken_files_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message):
        load_items(str(path))


def test_missing_column_and_missing_path(tmp_path):
    with pytest.raises(UserError, match="no thought column"):
        load_items(str(write_jsonl(tmp_path / "x.jsonl", [{"question": "q"}])), require=("question", "thought"))
    with pytest.raises(UserError, match="does not exist"):
        load_items(str(tmp_path / "nope.jsonl"))


def test_duplicate_ids_are_disambiguated(tmp_path):
    items = load_items(str(write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "id": "k"}, {"question": "b", "id": "k"}])))
    assert [i.id for i in items] == ["k", "k_1"]


def test_run_dir_resume_repairs_tail_and_retries_transient(tmp_path):
    run = RunDir(tmp_path, "stage", {"model": "m"})
    run.append({"id": "a", "status": "ok"})
    run.append({"id": "b", "status": "timeout", "retryable": True})
    run.append({"id": "c", "status": "invalid", "retryable": False})
    with open(tmp_path / "records.jsonl", "ab") as f:
        f.write(b'{"id": "d", "sta')  # killed mid-write
    run.close()  # one writer per folder: release the lock before reopening
    again = RunDir(tmp_path, "stage", {"model": "m", "num_workers": 9})
    assert sorted(again.done) == ["a", "c"]
    lines = (tmp_path / "records.jsonl").read_bytes().splitlines(keepends=True)
    assert [json.loads(line)["id"] for line in lines] == ["a", "c"] and all(line.endswith(b"\n") for line in lines)
    again.append({"id": "b", "status": "ok"})
    loaded = datasets.load_dataset("json", data_files=str(tmp_path / "records.jsonl"), split="train")
    assert sorted(loaded["id"]) == ["a", "b", "c"]


@pytest.mark.parametrize("tail", [b"", b'{"id": "z", "sta', b"x" * 200_000, b"y" * 65_536])
@pytest.mark.parametrize("before", [b"", b'{"id": "a"}\n', b'{"id": "a"}\n' + b'{"id": "b", "pad": "' + b"p" * 70_000 + b'"}\n'])
def test_the_tail_repair_cuts_exactly_the_unfinished_line(tmp_path, before, tail):
    """Read backwards in blocks: tails and lines longer than a block, and a file with no newline at all."""
    (tmp_path / "records.jsonl").write_bytes(before + tail)
    RunDir(tmp_path, "stage", {"model": "m"}, load_done=False).close()
    assert (tmp_path / "records.jsonl").read_bytes() == before


def test_run_dir_guard_and_overwrite(tmp_path):
    RunDir(tmp_path, "stage", {"model": "m", "max_phases": 12}).append({"id": "a", "status": "ok"})
    with pytest.raises(UserError, match="differs in: max_phases"):
        RunDir(tmp_path, "stage", {"model": "m", "max_phases": 4})
    with pytest.raises(UserError, match="'stage' run"):
        RunDir(tmp_path, "other", {"model": "m", "max_phases": 12})
    fresh = RunDir(tmp_path, "stage", {"model": "m", "max_phases": 4}, overwrite=True)
    assert fresh.done == {}


def test_manifest_contents(tmp_path, monkeypatch):
    run = RunDir(tmp_path, "stage", {"model": "gpt-4o", "server_url": "https://api.openai.com/v1"})
    run.append({"id": "a", "status": "ok"})
    m = run.write_manifest(prompts={"p": "text"}, usage={"prompt_tokens": 1_000_000, "completion_tokens": 100_000})
    assert m["counts"] == {"ok": 1} and m["usage"]["estimated_cost_usd"] == 3.5
    assert m["packages"]["sprint"] and len(m["prompt_hashes"]["p"]) == 16
    assert json.loads((tmp_path / "manifest.json").read_text())["config"]["model"] == "gpt-4o"
