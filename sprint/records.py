"""Stage output folders: `records.jsonl` (append-only, line-atomic, resumable) + `manifest.json`.

A stage can be killed at any moment: each record is one `write` of one complete line on an
O_APPEND descriptor, a half-written tail is cut off on reopen, and finished ids are skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

from sprint import __version__
from sprint.errors import UserError

# Settings that may change between a run and its resumption without changing what a record means.
VOLATILE_KEYS = frozenset(
    {"range", "num_workers", "max_problem_workers", "max_execution_workers", "timeout", "overwrite",
     "retry_failed", "progress", "cache_dir", "out_dir", "server_url", "planner_server_url",
     "executor_server_url", "max_retries"}
)

# USD per 1M tokens (input, output), for the cost estimate of paid APIs. Local servers cost 0.
PRICES = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-2024-08-06": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
}

PACKAGES = ("openai", "datasets", "transformers", "tokenizers", "math-verify")


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"sprint": __version__}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def estimate_cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    price = PRICES.get(model)
    if price is None:
        return None
    return round((prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6, 4)


@dataclass
class RunDir:
    """One stage's output folder. Open it, skip `done`, `append` records, `finish` the manifest."""

    path: Path
    stage: str
    config: dict[str, Any]
    overwrite: bool = False
    retry_failed: bool = True
    done: dict[str, dict] = field(default_factory=dict, init=False)
    started: float = field(default_factory=time.time, init=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.records_path = self.path / "records.jsonl"
        self.manifest_path = self.path / "manifest.json"
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise UserError(f"output folder {self.path} is an existing file (or lies under one); pass another --out-dir") from None
        except OSError as exc:
            raise UserError(f"cannot create output folder {self.path} ({exc.strerror}); pass another --out-dir") from None
        self._guard()
        self._repair_tail()
        self._load_done()
        if not self.manifest_path.exists():
            self.write_manifest()  # so the --overwrite guard protects even a run killed early

    @property
    def identity(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if k not in VOLATILE_KEYS}

    def _guard(self) -> None:
        """Refuse to mix outputs of a different configuration into an existing folder."""
        if not self.manifest_path.exists():
            return
        try:
            old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            old = None
        if not isinstance(old, dict):
            if self.overwrite:
                for p in (self.records_path, self.manifest_path):
                    p.unlink(missing_ok=True)
                return
            raise UserError(
                f"{self.manifest_path} is unreadable, so it is unknown what made {self.path}; "
                "use another output folder or pass --overwrite"
            )
        old_identity = old.get("identity", {})
        if old.get("stage") == self.stage and old_identity == json.loads(json.dumps(self.identity, default=str)):
            return
        if self.overwrite:
            for p in (self.records_path, self.manifest_path):
                p.unlink(missing_ok=True)
            return
        if old.get("stage") != self.stage:
            what = f"a {old.get('stage')!r} run"
        else:
            keys = sorted(k for k in set(old_identity) | set(self.identity) if old_identity.get(k) != json.loads(json.dumps(self.identity.get(k), default=str)))
            what = "a run with a different configuration (differs in: " + ", ".join(keys) + ")"
        raise UserError(f"{self.path} already holds {what}; use another output folder or pass --overwrite")

    def _repair_tail(self) -> None:
        """Cut a half-written last line left by a kill, so appends start on a line boundary."""
        if not self.records_path.exists():
            return
        with open(self.records_path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)

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
                tmp = self.records_path.with_suffix(".jsonl.tmp")
                tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
                os.replace(tmp, self.records_path)
        self.done = {str(r["id"]): r for r in keep if "id" in r}

    def is_done(self, item_id: str) -> bool:
        return item_id in self.done

    def append(self, record: dict[str, Any]) -> None:
        """Write one record as one complete line in a single system call."""
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        fd = os.open(self.records_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
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
        """(Re)write manifest.json atomically: config, versions, prompt hashes, counts, usage, cost."""
        usage = dict(usage or {})
        model = self.config.get("model") or self.config.get("planner_model")
        if model and usage:
            cost = estimate_cost(str(model), usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0))
            if cost is not None:
                usage["estimated_cost_usd"] = cost
        manifest = {
            "stage": self.stage,
            "sprint_version": __version__,
            "git_commit": git_commit(),
            "packages": package_versions(),
            "config": self.config,
            "identity": self.identity,
            "config_hash": _hash(self.identity),
            "inputs": inputs or {},
            "prompt_hashes": {k: text_hash(v) for k, v in (prompts or {}).items()},
            "counts": self.counts(),
            "usage": usage,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(self.started)),
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
            **(extra or {}),
        }
        tmp = self.manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False, default=str))
        os.replace(tmp, self.manifest_path)
        return manifest


def write_jsonl(path: Path, rows: Iterable[dict]) -> int:
    """Write a whole JSONL file atomically (for derived files such as train.jsonl)."""
    tmp = Path(str(path) + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
