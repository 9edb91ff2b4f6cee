"""What produced a stage folder and what it cost: `manifest.json` (config, versions, commit, prompt hashes, counts, usage priced at list prices)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from sprint import __version__
from sprint.core.files import atomic_write

# Settings that may change between a run and its resumption without changing what a record means.
VOLATILE_KEYS = frozenset(
    {"range", "num_workers", "max_problem_workers", "timed_problems", "max_execution_workers", "timeout", "overwrite",
     "retry_failed", "progress", "cache_dir", "out_dir", "server_url", "planner_server_url",
     "executor_server_url", "max_retries", "max_connection_failures", "affinity_header", "priority",
     "batch"}  # batch: the same records as online; it only changes the price
)


# USD per 1M tokens (input, output), for the cost estimate of paid APIs. Local servers cost 0.
PRICES = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-2024-08-06": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
}


BATCH_DISCOUNT = 0.5  # the OpenAI Batch API bills half the online price (--batch)


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


def write_manifest(
    folder: str | Path,
    stage: str,
    config: dict[str, Any],
    *,
    started: float,
    counts: dict[str, int],
    identity: dict[str, Any] | None = None,
    inputs: dict[str, Any] | None = None,
    prompts: dict[str, str] | None = None,
    usage: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write FOLDER/manifest.json atomically, in the one shape every stage uses; returns it.

    What produced the folder (config, versions, commit, prompt hashes), what it holds (counts) and
    what it cost (usage, with a price estimate for known paid models). `identity` is the part of the
    config a resumed run must match (default: the whole config); `prompts` and `usage` appear only
    for stages that have them.
    """
    identity = config if identity is None else identity
    manifest: dict[str, Any] = {
        "stage": stage,
        "sprint_version": __version__,
        "git_commit": git_commit(),
        "packages": package_versions(),
        "config": config,
    }
    if identity is not config:
        manifest["identity"] = identity
    manifest["config_hash"] = _hash(identity)
    manifest["inputs"] = inputs or {}
    if prompts is not None:
        manifest["prompt_hashes"] = {k: text_hash(v) for k, v in prompts.items()}
    manifest["counts"] = counts
    if usage is not None:
        usage = dict(usage)
        model = config.get("model") or config.get("planner_model")
        if model and usage:
            price_usage(usage, str(model), bool(config.get("batch")))
        manifest["usage"] = usage
    manifest["started"] = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started))
    manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    manifest.update(extra or {})
    atomic_write(Path(folder) / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False, default=str))
    return manifest


def estimate_cost(model: str, prompt_tokens: int, completion_tokens: int, batch: bool = False) -> float | None:
    """USD at the model's list prices (None for a model without one); `batch`: at Batch API prices."""
    price = PRICES.get(model)
    if price is None:
        return None
    online = (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6
    return round(online * BATCH_DISCOUNT if batch else online, 4)


def price_usage(usage: dict[str, Any], model: str, batch: bool) -> None:
    """Add `estimated_cost_usd` and `priced_as` to a usage dict, for a model with list prices.
    This run's mode prices the whole folder: records answered online and by batch look alike."""
    cost = estimate_cost(model, usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0), batch)
    if cost is not None:
        usage["estimated_cost_usd"] = cost
        usage["priced_as"] = "batch" if batch else "online"
