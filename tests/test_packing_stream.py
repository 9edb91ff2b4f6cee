"""Packing streams its input and writes as it goes: the outputs equal what the whole-input path gives."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from tests.test_packing import read_jsonl, synthetic_rows

from sprint.core.data import iter_records, load_items
from sprint.core.errors import UserError
from sprint.curation.packing import PackConfig, PackInput, pack, split_ids


def _rows(n: int) -> list[dict]:
    rows = synthetic_rows(n)
    rows[7]["id"] = rows[3]["id"]  # a duplicate id: renamed as load_items renames it
    return rows


def test_streamed_outputs_equal_the_whole_input_path(tmp_path: Path) -> None:
    rows = _rows(60)
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "in.json").write_text(json.dumps(rows))  # a .json file is loaded whole
    assert PackInput.open(PackConfig(data=str(jsonl), out_dir="x")).loaded is None
    assert PackInput.open(PackConfig(data=str(tmp_path / "in.json"), out_dir="x")).loaded is not None

    pack(str(jsonl), tmp_path / "streamed", seed=11, range_spec="2:50")
    pack(str(tmp_path / "in.json"), tmp_path / "whole", seed=11, range_spec="2:50")
    for name in ("records.jsonl", "train.jsonl", "test.jsonl"):
        assert (tmp_path / "streamed" / name).read_text() == (tmp_path / "whole" / name).read_text(), name
    records = read_jsonl(tmp_path / "streamed" / "records.jsonl")
    items = load_items(str(jsonl), range_spec="2:50")
    assert [r["id"] for r in records] == [it.id for it in items]  # same ids, same order, duplicate renamed
    assert all(list(r)[-1] == "split" for r in records)
    kept = [r["id"] for r in records if r["status"] == "ok"]
    train, test = split_ids(kept, 0.1, 11)  # the seeded split of the kept ids, unchanged
    assert {r["id"] for r in records if r["split"] == "test"} == test
    assert {r["id"] for r in records if r["split"] == "train"} == train
    assert [r["id"] for r in read_jsonl(tmp_path / "streamed" / "train.jsonl")] == [i for i in kept if i in train]
    assert not list((tmp_path / "streamed").glob("*.tmp"))  # working files gone


def test_packing_again_into_its_folder_rewrites_it_without_reading_the_old_records(tmp_path: Path, monkeypatch) -> None:
    from sprint.core.records import RunDir

    rows = _rows(40)
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack(str(jsonl), tmp_path / "out", seed=5)
    first = {name: (tmp_path / "out" / name).read_text() for name in ("records.jsonl", "train.jsonl", "test.jsonl")}

    def refuse(self: RunDir) -> None:
        raise AssertionError("pack read the folder's old records")

    monkeypatch.setattr(RunDir, "_load_done", refuse)
    pack(str(jsonl), tmp_path / "out", seed=5)  # the same settings: the same folder, rewritten whole
    for name, text in first.items():
        assert (tmp_path / "out" / name).read_text() == text, name
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert sum(manifest["counts"].values()) == len(read_jsonl(tmp_path / "out" / "records.jsonl")) == 40


def test_stream_input_errors_leave_no_outputs(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "components": [], "dag": {}}) + "\n" for i in range(3)))
    with pytest.raises(UserError, match="no question column"):
        pack(str(src), tmp_path / "out")
    assert not (tmp_path / "out" / "records.jsonl").exists() and not list(tmp_path.glob("out/*.tmp"))
    with pytest.raises(UserError, match="selects no rows"):
        pack(str(src), tmp_path / "out2", range_spec="10:20")


def test_a_stage_folder_is_packed_in_input_order_whatever_order_its_records_came_back_in(tmp_path: Path) -> None:
    """Stages 1-2 append a record when its item finishes, so with concurrent workers their records.jsonl
    follows the order answers came back; pack (streamed or whole) and the next stage read it in input order."""
    rows = [{**r, "index": i} for i, r in enumerate(synthetic_rows(40))]
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    for name, order in (("in_order", rows), ("shuffled", shuffled)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in order))
        pack(str(tmp_path / name), tmp_path / f"{name}-packed", seed=5)
        pack(str(tmp_path / name), tmp_path / f"{name}-whole", seed=5, range_spec="-40:")  # the whole-input path
    for name in ("records.jsonl", "train.jsonl", "test.jsonl"):
        first = (tmp_path / "in_order-packed" / name).read_bytes()
        assert (tmp_path / "shuffled-packed" / name).read_bytes() == first, name
        assert (tmp_path / "shuffled-whole" / name).read_bytes() == first, name
    assert [it.index for it in load_items(str(tmp_path / "shuffled"))] == list(range(40))
    assert [it.row["index"] for it in load_items(str(tmp_path / "shuffled"))] == list(range(40))
    assert [r["index"] for r in iter_records(tmp_path / "shuffled" / "records.jsonl")] == list(range(40))
