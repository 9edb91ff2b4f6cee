"""File-system errors end a run with one line naming the path and what to do, never a traceback;
no temporary file is left behind and what was finished stays.

Read-only folders and full disks are real where the machine allows it: a small tmpfs mounted by
the test (root, or a user namespace). Elsewhere the error is simulated in-process (EROFS / ENOSPC
raised by the system calls the writers use). Being root, `chmod` cannot make a folder read-only.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.fake_server import ScriptedServer
from tests.test_components import by_question, good_answer, load_traces, write_jsonl
from tests.test_reliability import problems_file, solver
from tests.helpers import tokenizer_dir
from tests.test_resume_all import sprint_run

from sprint.core import files as files_module
from sprint.cli import main as cli_main
from sprint.core.errors import EXIT_OK, EXIT_USER, UserError
from sprint.core.records import RunDir
from sprint.core.files import atomic_write

MODEL = "test-model"
REPO = Path(__file__).resolve().parents[1]


def mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True).returncode == 0


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path | None]:
    """A tmpfs of `size` at `path` (None when this machine does not let the test mount one)."""
    path.mkdir(parents=True, exist_ok=True)
    if not mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)):
        yield None
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, options: str) -> None:
    assert mount("-o", f"remount,{options}", str(path)), f"cannot remount {path} {options}"


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.endswith(".tmp") or ".tmp-" in p.name)


def one_line_error(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ") or "Traceback" in line]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def complete(path: Path) -> list[dict]:
    data = path.read_bytes() if path.exists() else b""
    assert not data or data.endswith(b"\n"), "a partial record line was left"
    return [json.loads(line) for line in data.splitlines()]


# ---------------------------------------------------------------------------------------------
# read-only


def simulate_read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """EROFS for every write-mode open and mkdir under `folder` (what a read-only mount answers)."""
    real_open, real_mkdir = os.open, os.mkdir

    def ro_open(path, flags, *args, **kw):
        if str(path).startswith(str(folder)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kw)

    def ro_mkdir(path, *args, **kw):
        if str(path).startswith(str(folder)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_mkdir(path, *args, **kw)

    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "mkdir", ro_mkdir)


def stage_command(stage: str, tmp_path: Path, out: Path, url: str) -> list[str]:
    if stage == "components":
        rows = load_traces()
        return ["components", "-i", str(write_jsonl(tmp_path / "t.jsonl", rows)), "-o", str(out), "--model", MODEL,
                "--server-url", url, "--no-progress"]
    if stage == "pack":
        example = json.loads((REPO / "tests" / "data" / "packing_example.json").read_text())
        return ["pack", "-i", str(write_jsonl(tmp_path / "p.jsonl", [example])), "-o", str(out)]
    if stage == "evaluate":
        if not (tmp_path / "run").exists():
            sprint_run(tmp_path / "run", 4)
        return ["evaluate", str(tmp_path / "run"), "--planner-tokenizer", str(tokenizer_dir()), "--out", str(out),
                "--no-plots", "--bootstrap", "0"]
    return ["orchestrate", "--planner-model", MODEL, "--planner-url", url, "--data", problems_file(tmp_path, 3),
            "--out-dir", str(out), "--prompt-mode", "raw", "--no-progress"]


def handler_for(stage: str):
    return by_question(load_traces(), good_answer) if stage == "components" else solver


@pytest.mark.parametrize("stage", ["components", "pack", "evaluate", "orchestrate"])
def test_a_read_only_output_folder_is_one_line(tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str],
                                               scripted_server: ScriptedServer) -> None:
    disk = tmp_path / "disk"
    srv = scripted_server(handler_for(stage))
    with tmpfs(disk, "1m") as mounted:
        out = disk / "out"
        command = stage_command(stage, tmp_path, out, srv.base_url)
        if mounted is not None:
            out.mkdir()  # an existing folder on a read-only disk
            remount(disk, "ro")
        else:
            out.mkdir()
            simulate_read_only(monkeypatch, disk)
        capsys.readouterr()
        assert cli_main(command) == EXIT_USER
        err = one_line_error(capsys.readouterr().err)
        assert "Read-only file system" in err and str(out) in err and "writable disk" in err
        monkeypatch.undo()
        assert leftovers(disk) == [] and sorted(os.listdir(out)) == []


def test_resuming_a_run_on_a_disk_turned_read_only(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   scripted_server: ScriptedServer) -> None:
    disk = tmp_path / "disk"
    srv = scripted_server(handler_for("components"))
    with tmpfs(disk, "4m") as mounted:
        if mounted is None:
            pytest.skip("cannot mount a tmpfs here (the read-only case is simulated in the test above)")
        out = disk / "out"
        command = stage_command("components", tmp_path, out, srv.base_url)
        assert cli_main(command) == EXIT_OK
        before = (out / "records.jsonl").read_bytes()
        remount(disk, "ro")
        capsys.readouterr()
        assert cli_main([*command, "--overwrite"]) == EXIT_USER
        err = one_line_error(capsys.readouterr().err)
        assert "Read-only file system" in err
        assert (out / "records.jsonl").read_bytes() == before and leftovers(disk) == []


# ---------------------------------------------------------------------------------------------
# a full disk


@pytest.mark.parametrize("stage", ["components", "orchestrate"])
def test_a_full_disk_is_one_line_keeps_finished_records_and_the_rerun_completes(
    tmp_path: Path, stage: str, capsys: pytest.CaptureFixture[str], scripted_server: ScriptedServer
) -> None:
    disk = tmp_path / "disk"
    with tmpfs(disk, "48k") as mounted:
        if mounted is None:
            pytest.skip("cannot mount a tmpfs here (see the simulated ENOSPC tests below)")
        out = disk / "out"
        if stage == "components":
            rows = [{**t, "id": f"{t['id']}-{i}", "question": f"{t['question']} (copy {i})"}
                    for i in range(8) for t in load_traces()]
            handler = by_question(rows, good_answer)
            n = len(rows)
        else:
            handler, n = solver, 30
        srv = scripted_server(handler)
        if stage == "components":
            command = ["components", "-i", str(write_jsonl(tmp_path / "t.jsonl", rows)), "-o", str(out), "--model",
                       MODEL, "--server-url", srv.base_url, "--no-progress", "--num-workers", "2"]
        else:
            command = ["orchestrate", "--planner-model", MODEL, "--planner-url", srv.base_url, "--data",
                       problems_file(tmp_path, n), "--out-dir", str(out), "--prompt-mode", "raw", "--no-progress"]
        assert cli_main(command) == EXIT_USER
        err = one_line_error(capsys.readouterr().err)
        assert "No space left on device" in err and str(out) in err and "re-run the same command" in err
        assert leftovers(disk) == []
        kept = complete(out / "records.jsonl")
        assert len(kept) < n and len({r["id"] for r in kept}) == len(kept)
        remount(disk, "size=16m")  # space freed: the same command finishes the job
        assert cli_main(command) == EXIT_OK
        done = complete(out / "records.jsonl")
        assert sorted(r["id"] for r in done) == sorted({r["id"] for r in done}) and len(done) == n
        assert all(r["status"] == "ok" for r in done) and leftovers(disk) == []
        print(f"{stage}: {len(kept)} of {n} records written before the disk filled up")


def test_evaluate_on_a_full_disk_keeps_the_previous_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    disk = tmp_path / "disk"
    with tmpfs(disk, "256k") as mounted:
        if mounted is None:
            pytest.skip("cannot mount a tmpfs here")
        out = disk / "report"
        command = stage_command("evaluate", tmp_path, out, "")
        assert cli_main(command) == EXIT_OK
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)  # fill the disk
        with contextlib.suppress(OSError):
            while os.write(fd, b"x" * 4096):
                pass
        os.close(fd)
        capsys.readouterr()
        assert cli_main(command) == EXIT_USER
        assert "No space left on device" in one_line_error(capsys.readouterr().err)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
        assert sorted(p.name for p in disk.iterdir()) == ["filler", "report"]


# ---------------------------------------------------------------------------------------------
# simulated: the writers' own handling, on any machine


def test_a_short_write_is_cut_back_to_the_last_complete_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = RunDir(tmp_path / "out", "stage", {"model": "m"})
    run.append({"id": "a", "status": "ok"})
    real_write = os.write

    def half_write(fd: int, data: bytes) -> int:  # what write(2) does when the disk fills mid-line
        return real_write(fd, data[: len(data) // 2])

    monkeypatch.setattr(os, "write", half_write)
    with pytest.raises(UserError, match=r"cannot write .*records\.jsonl: No space left on device; the disk is full"):
        run.append({"id": "b", "status": "ok", "text": "x" * 1000})
    monkeypatch.undo()
    assert complete(tmp_path / "out" / "records.jsonl") == [{"id": "a", "status": "ok"}]
    run.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_atomic_write_errors_are_one_line_and_leave_no_temp_file(tmp_path: Path, code: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old")

    def failing_replace(src, dst):
        raise OSError(code, os.strerror(code), str(dst))

    monkeypatch.setattr(files_module.os, "replace", failing_replace)
    with pytest.raises(UserError) as info:
        atomic_write(target, "new")
    monkeypatch.undo()
    message = str(info.value)
    assert str(target) in message and os.strerror(code) in message and "\n" not in message
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_a_disk_error_outside_the_writers_is_one_line_in_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI's last guard: an ENOSPC raised anywhere (here: packing's summary) is one line, exit 2."""
    from sprint.curation import packing

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out" / "summary.json"))

    monkeypatch.setattr(packing, "format_summary", full)
    assert cli_main(stage_command("pack", tmp_path, tmp_path / "out", "")) == EXIT_USER
    err = one_line_error(capsys.readouterr().err)
    assert "No space left on device" in err and "summary.json" in err
