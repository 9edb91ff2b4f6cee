"""Writing files safely: one temp-file + rename writer, and disk errors (full, read-only, forbidden) as one-line `UserError`s."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Iterable

from sprint.core.errors import UserError

# errno -> what to do, for the file-system errors a user can fix
_DISK_ADVICE = {
    errno.ENOSPC: "the disk is full; free some space or pass a folder on another disk, then re-run the same "
                  "command (finished records are kept)",
    errno.EDQUOT: "the disk quota is used up; free some space or pass another folder, then re-run the same command",
    errno.EROFS: "the file system is read-only; pass a folder on a writable disk",
    errno.EACCES: "permission denied; fix the folder's permissions or pass another folder",
    errno.EPERM: "operation not permitted; fix the folder's permissions or pass another folder",
}


def disk_error(exc: OSError, path: str | Path | None = None, doing: str = "write") -> UserError | None:
    """A one-line `UserError` for a permission, read-only or no-space error (None for other errors)."""
    advice = _DISK_ADVICE.get(exc.errno or 0)
    if advice is None:
        return None
    where = path if path is not None else (exc.filename or "the output folder")
    return UserError(f"cannot {doing} {where}: {exc.strerror or os.strerror(exc.errno or 0)}; {advice}")


@contextlib.contextmanager
def disk_errors(path: str | Path | None = None, doing: str = "write") -> Iterator[None]:
    """Turn the file-system errors a user can fix into one-line `UserError`s (others propagate)."""
    try:
        yield
    except OSError as exc:
        err = disk_error(exc, path, doing)
        if err is None:
            raise
        raise err from None


def atomic_write(path: str | Path, data: str | bytes, *, private_tmp: bool = False) -> None:
    """Replace `path` with `data` all at once: readers and a kill mid-write see the old file or the new one.

    The temp file sits beside the target (a rename across file systems would not be atomic). Its
    name is `NAME.tmp`, so a write killed half-way is overwritten by the next one instead of piling
    up; `private_tmp=True` takes a unique name instead, for files several processes may write at
    once (the shared response cache).
    """
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with disk_errors(path):
        if private_tmp:
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            tmp = Path(name)
        else:
            tmp = path.with_name(path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(raw)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            raise


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Write a whole JSONL file atomically (for derived files such as train.jsonl)."""
    lines = [json.dumps(row, ensure_ascii=False) + "\n" for row in rows]
    atomic_write(path, "".join(lines))
    return len(lines)
