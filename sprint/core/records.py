"""Stage output folders: `records.jsonl` (append-only, line-atomic, resumable) + `manifest.json`.

A stage can be killed at any moment: each record is one `write` of one complete line on an
O_APPEND descriptor, a half-written tail is cut off on reopen, and finished ids are skipped.
One run writes a folder at a time (an `fcntl` lock, `FolderLock`); the manifest appears with the
first record, so a run refused before any work leaves nothing that blocks the corrected command;
`--overwrite` clears the previous run's outputs first; a full, read-only or forbidden disk is one
`UserError` naming the path, with no temporary file left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sprint.core.errors import UserError
from sprint.core.files import atomic_write, disk_errors
from sprint.core.manifest import VOLATILE_KEYS, write_manifest


LOCK_NAME = ".sprint.lock"  # the lock file inside a stage folder (pid, host, start time, command)
TRASH_PREFIX = ".sprint-trash-"  # where --overwrite moves the old outputs before deleting them
# What a stage run leaves in its folder; `--overwrite` clears exactly these (never other files a user
# keeps there). The response cache goes too, unless it lives elsewhere (--cache-dir).
OUTPUT_NAMES = ("manifest.json", "records.jsonl", "trajectories", "evaluation", "summary.json", "train.jsonl",
                "test.jsonl", "llm_cache", "batch",  # "batch": batch-mode request/result files (sprint.curation.batch)
                "sequential_train.jsonl", "sequential_test.jsonl")  # `pack --sequential`


def _release_lock(fd: int, path: Path, inode: tuple[int, int]) -> None:
    """Remove the lock file (if it is still ours) and close it; closing releases the lock."""
    try:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) == inode:
            os.unlink(path)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.close(fd)


class FolderLock:
    """One writer per folder: an exclusive `fcntl.flock` on a lock file that names its holder.

    A second run is refused at once with the holder's pid, host, start time and command. The
    kernel drops the lock when its process dies (kill -9 included), so a lock file whose lock
    nobody holds is stale: it is taken over, with a notice. The file is removed on release; after
    locking, the file is checked to be the one at the path (a release may have removed it meanwhile).
    """

    def __init__(self, path: str | Path, folder: str | Path | None = None) -> None:
        self.path = Path(path)
        self.folder = Path(folder) if folder is not None else self.path.parent
        self._fd: int | None = None
        self._finalizer: weakref.finalize | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, argv: list[str] | None = None) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "command": " ".join(["sprint", *(sys.argv[1:] if argv is None else argv)])}
        while True:
            with disk_errors(self.folder, "write to"):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read_fd(fd))
                os.close(fd)
                raise UserError(
                    f"{self.folder} is being written by another run ({holder}); wait for it to end or stop it, "
                    "or use another output folder"
                ) from None
            except OSError as exc:  # a file system without locks (some network mounts): go on unguarded
                print(f"warning: cannot lock {self.path} ({exc.strerror}); make sure no other run writes "
                      f"{self.folder}", file=sys.stderr)
            st = os.fstat(fd)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                os.close(fd)  # released and removed while we waited: lock the new file
                continue
            break
        old = _read_fd(fd)
        if old:
            print(f"note: taking over the lock of {self.folder} left by a run that is no longer running "
                  f"({_describe(old)})", file=sys.stderr)
        try:
            with disk_errors(self.path):
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        except UserError:
            _release_lock(fd, self.path, (st.st_dev, st.st_ino))
            raise
        self._fd = fd
        self._finalizer = weakref.finalize(self, _release_lock, fd, self.path, (st.st_dev, st.st_ino))

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs _release_lock once
        self._fd, self._finalizer = None, None


def _read_fd(fd: int) -> dict[str, Any] | None:
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return {"pid": "?"}
    return info if isinstance(info, dict) or info is None else {"pid": "?"}


def _describe(info: dict[str, Any] | None) -> str:
    if not info:
        return "holder unknown"
    text = f"pid {info.get('pid', '?')} on {info.get('host', '?')}"
    if info.get("started"):
        text += f", started {info['started']}"
    if info.get("command"):
        text += f": {info['command']}"
    return text


@dataclass
class RunDir:
    """One stage's output folder. Open it, skip `done`, `append` records, `finish` the manifest, `close` it.

    Opening takes the folder's lock (held until `close`, or until the process ends); a folder made by
    this run and left empty is removed again on `close`, so a refused start leaves nothing behind.
    """

    path: Path
    stage: str
    config: dict[str, Any]
    overwrite: bool = False
    retry_failed: bool = True
    load_done: bool = True  # False for a stage that rewrites every record (pack): resuming reads nothing
    done: dict[str, dict] = field(default_factory=dict, init=False)
    started: float = field(default_factory=time.time, init=False)
    # inputs/prompts the manifest written with the first record carries (the stage knows them up front)
    manifest_fields: dict[str, Any] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.records_path = self.path / "records.jsonl"
        self.manifest_path = self.path / "manifest.json"
        self._created = not self.path.exists()
        try:
            with disk_errors(self.path, "create the output folder"):
                self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise UserError(f"output folder {self.path} is an existing file (or lies under one); pass another --out-dir") from None
        except NotADirectoryError:
            raise UserError(f"output folder {self.path} lies under a file; pass another --out-dir") from None
        except OSError as exc:
            raise UserError(f"cannot create output folder {self.path} ({exc.strerror}); pass another --out-dir") from None
        self.lock = FolderLock(self.path / LOCK_NAME, self.path)
        self.lock.acquire()
        try:
            self._remove_trash()
            self._guard()
            self._repair_tail()
            if self.load_done:
                self._load_done()
        except BaseException:
            self.close()
            raise
        self._manifest_due = not self.manifest_path.exists()

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock; remove the folder again if this run made it and wrote nothing into it."""
        self.lock.release()
        if self._created:
            with contextlib.suppress(OSError):
                self.path.rmdir()  # only when empty

    @property
    def identity(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in VOLATILE_KEYS}

    def _has_records(self) -> bool:
        try:
            with open(self.records_path, "rb") as f:
                return any(line.strip() for line in f)
        except FileNotFoundError:
            return False

    def _guard(self) -> None:
        """Refuse to mix outputs of a different configuration into an existing folder.

        `--overwrite` clears the old outputs; so does a manifest without records (a run that stopped
        before its first item: nothing to protect, and its leftovers must not be mixed in).
        """
        if self.overwrite:
            self.clear()
            return
        if not self.manifest_path.exists():
            return
        if not self._has_records():
            self.clear(cache=False)  # answers already paid for stay usable
            return
        try:
            old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict):
            raise UserError(
                f"{self.manifest_path} is unreadable, so it is unknown what made {self.path}; "
                "use another output folder or pass --overwrite"
            )
        old_identity = old.get("identity", {})
        if old.get("stage") == self.stage and old_identity == json.loads(json.dumps(self.identity, default=str)):
            return
        if old.get("stage") != self.stage:
            what = f"a {old.get('stage')!r} run"
        else:
            keys = sorted(k for k in set(old_identity) | set(self.identity) if old_identity.get(k) != json.loads(json.dumps(self.identity.get(k), default=str)))
            what = "a run with a different configuration (differs in: " + ", ".join(keys) + ")"
        raise UserError(f"{self.path} already holds {what}; use another output folder or pass --overwrite")

    def clear(self, *, cache: bool = True) -> None:
        """Remove the previous run's outputs (`OUTPUT_NAMES` and temp files; the cache when `cache`), nothing else.

        They are first renamed into one trash folder (the manifest last), then deleted, so a kill
        half-way leaves either the old run's identity or no old output, never a half-cleared mix.
        """
        names = [n for n in OUTPUT_NAMES[1:] if cache or n != "llm_cache"]
        present = [self.path / name for name in names if (self.path / name).exists()]
        present += sorted(self.path.glob("*.tmp"))
        if self.manifest_path.exists():
            present.append(self.manifest_path)
        if not present:
            return
        trash = self.path / f"{TRASH_PREFIX}{os.getpid()}-{time.time_ns()}"
        with disk_errors(self.path, "clear the previous outputs of"):
            trash.mkdir()
            for p in present:
                os.replace(p, trash / p.name)
            shutil.rmtree(trash)

    def _remove_trash(self) -> None:
        """Finish deleting what a killed `--overwrite` had moved aside."""
        for old in self.path.glob(TRASH_PREFIX + "*"):
            shutil.rmtree(old, ignore_errors=True)

    def _repair_tail(self) -> None:
        """Cut a half-written last line left by a kill, so appends start on a line boundary.

        Reads backwards from the end, a block at a time: a folder of 60k traces holds GBs of records.
        """
        if not self.records_path.exists():
            return
        with disk_errors(self.records_path, "repair"), open(self.records_path, "rb+") as f:
            end = f.seek(0, os.SEEK_END)
            if end == 0:
                return
            f.seek(end - 1)
            if f.read(1) == b"\n":
                return
            pos = end
            while pos > 0:
                start = max(0, pos - (1 << 16))
                f.seek(start)
                newline = f.read(pos - start).rfind(b"\n")
                if newline >= 0:
                    f.truncate(start + newline + 1)
                    return
                pos = start
            f.truncate(0)

    def _load_done(self) -> None:
        if not self.records_path.exists():
            return
        records = []
        with open(self.records_path, "rb") as f:
            for raw in f:
                try:
                    record = json.loads(raw)
                except ValueError:  # not JSON, or not UTF-8: not a record of ours
                    continue
                if isinstance(record, dict):
                    records.append(record)
        keep = records
        if self.retry_failed:
            # transient failures (server down, timeouts) are redone; their old lines are dropped by an
            # atomic rewrite so the folder never holds two records for one id
            keep = [r for r in records if not r.get("retryable")]
            if len(keep) != len(records):
                atomic_write(self.records_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
        self.done = {str(r["id"]): r for r in keep if "id" in r}

    def is_done(self, item_id: str) -> bool:
        return item_id in self.done

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one complete line in a single system call (the manifest first, if due).

        On a full disk a short write is cut back off, so the file still ends on a line boundary.
        """
        if self._manifest_due:
            self._write_manifest()
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        with disk_errors(self.records_path):
            fd = os.open(self.records_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                try:
                    written = os.write(fd, line)
                    if written != len(line):
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.records_path))
                except OSError:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                    raise
            finally:
                os.close(fd)
        self.done[str(record["id"])] = record

    def records(self) -> list[dict]:
        return list(self.done.values())

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.done.values():
            out[r.get("status", "ok")] = out.get(r.get("status", "ok"), 0) + 1
        return out

    def write_manifest(
        self,
        *,
        inputs: dict[str, Any] | None = None,
        prompts: dict[str, str] | None = None,
        usage: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict:
        """(Re)write manifest.json (see `write_manifest`): config, versions, prompt hashes, counts, usage, cost.

        Arguments left out come from `manifest_fields`. A run with no record yet writes none: a folder
        holding only a manifest would look like a run to resume.
        """
        if not self.done and not self._has_records():
            return {}
        return self._write_manifest(inputs=inputs, prompts=prompts, usage=usage, extra=extra)

    def _write_manifest(self, **given: Any) -> dict:
        given = {k: given.get(k) for k in ("inputs", "prompts", "usage", "extra")}
        fields_ = {k: v if v is not None else self.manifest_fields.get(k) for k, v in given.items()}
        manifest = write_manifest(
            self.path, self.stage, self.config, started=self.started, counts=self.counts(),
            identity=self.identity, inputs=fields_["inputs"], prompts=fields_["prompts"] or {},
            usage=fields_["usage"] or {}, extra=fields_["extra"],
        )
        self._manifest_due = False
        return manifest


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux `renameat2(RENAME_EXCHANGE)`); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


class FolderSet:
    """Write a folder's files as one set (an evaluation report): a reader sees the old set or the new one.

    `open` takes a lock beside the folder (`.NAME.lock`: one writer) and returns an empty temporary
    folder beside it; `commit` swaps the temporary folder into place (atomically where the kernel
    can, else two renames: then for an instant there is no folder, never a mixed one); `close`
    removes what a failed or killed write left and releases the lock.
    """

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        parent, name = self.target.parent, self.target.name
        self.tmp = parent / f".{name}.tmp-{os.getpid()}"
        self._old = parent / f".{name}.old-{os.getpid()}"
        self.lock = FolderLock(parent / f".{name}.lock", self.target)

    def open(self) -> Path:
        parent, name = self.target.parent, self.target.name
        with disk_errors(parent, "create the folder"):
            parent.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        try:
            for left in [*parent.glob(f".{name}.tmp-*"), *parent.glob(f".{name}.old-*")]:  # a killed writer's
                shutil.rmtree(left, ignore_errors=True)
            with disk_errors(self.target, "write"):
                self.tmp.mkdir()
        except BaseException:
            self.lock.release()
            raise
        return self.tmp

    def commit(self) -> None:
        with disk_errors(self.target, "write"):
            if not self.target.exists():
                os.replace(self.tmp, self.target)
                return
            if _exchange(self.tmp, self.target):
                shutil.rmtree(self.tmp, ignore_errors=True)  # now the old set
                return
            os.replace(self.target, self._old)
            os.replace(self.tmp, self.target)
            shutil.rmtree(self._old, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.lock.release()

    def __enter__(self) -> Path:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()


