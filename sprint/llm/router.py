"""vllm-router in front of several vLLM servers: start it, ask it which workers it has, and read
the workers' own prefix-cache counters.

Why the stock router rather than our client-side ring (`sprint.llm.replicas`): it is one URL for
every client (planner, executors, time replay, other tools), it fails over with health checks,
retries and a circuit breaker, and its `consistent_hash` policy keys on the `X-Session-Id` header
that every sprint request already carries (the problem id), so all calls of a problem reach one
replica and find their shared prefix in its cache.

What the router does not say: which worker answered a request (no response header names it; its
log does, at INFO, which is not an interface). So a run through a router records, per worker, how
many requests it served and its prefix-cache queries/hits, read from each worker's Prometheus
`/metrics` before and after the run (`RouterWatch`); every call keeps its own `cached_tokens`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from sprint.core.errors import UserError

# vllm-router 0.1.17's --policy choices (kv_aware needs KV events from the engines; not used here)
POLICIES = ("consistent_hash", "cache_aware", "round_robin", "power_of_two", "random", "sticky_least_loaded",
            "kv_aware")
DEFAULT_POLICY = "consistent_hash"
# Faster failure detection than the router's defaults (60 s between health checks): a dead replica
# is out within seconds; the circuit breaker and the retries cover the requests in between.
DEFAULT_ROUTER_ARGS = ("--health-check-interval-secs", "5", "--health-failure-threshold", "2")
# Engine counters kept per worker (summed over their label sets), and the names they get here.
COUNTERS = {
    "vllm:request_success_total": "requests",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
}
_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[+-]?Inf)\s*$")


def router_executable() -> Path:
    """The vllm-router launcher: $VLLM_ROUTER, else beside this Python (the pipeline venv), else on PATH."""
    if os.environ.get("VLLM_ROUTER"):
        return Path(os.environ["VLLM_ROUTER"])
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return beside
    found = shutil.which("vllm-router")
    if found:
        return Path(found)
    raise UserError("vllm-router is not installed; `pip install vllm-router` into this environment "
                    "(or set VLLM_ROUTER), or pass --router none for a plain list of replica URLs")


def server_root(base_url: str) -> str:
    """http://host:port/v1 -> http://host:port (vllm-router takes workers without the /v1)."""
    parsed = urlparse(base_url)
    return f"{parsed.scheme}://{parsed.netloc}"


def router_command(worker_urls: Sequence[str], port: int, *, host: str = "127.0.0.1",
                   policy: str = DEFAULT_POLICY, prometheus_port: int | None = None,
                   extra_args: Sequence[str] = ()) -> list[str]:
    """The exact vllm-router command line (shown in logs, so a user can start it by hand)."""
    if policy not in POLICIES:
        raise UserError(f"unknown router policy {policy!r}; choose one of {', '.join(POLICIES)}")
    command = [str(router_executable()), "--host", host, "--port", str(port),
               "--worker-urls", *(server_root(u) for u in worker_urls), "--policy", policy,
               *DEFAULT_ROUTER_ARGS]
    if prometheus_port is not None:  # the router's default (29000) would clash between two routers
        command += ["--prometheus-port", str(prometheus_port)]
    return command + list(extra_args)


@dataclass
class RouterProcess:
    """A vllm-router child process we started (own process group), and where to reach it."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    command: list[str]
    metrics_url: str | None = None
    _log_file: IO[bytes] | None = field(default=None, repr=False)

    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM its group, SIGKILL what is left after `grace` seconds; close the log."""
        try:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.process.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    self.process.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None


def start_router(worker_urls: Sequence[str], port: int, log_path: Path, *, host: str = "127.0.0.1",
                 policy: str = DEFAULT_POLICY, prometheus_port: int | None = None,
                 extra_args: Sequence[str] = ()) -> RouterProcess:
    """Launch vllm-router in the background; `wait_router_ready` before sending it requests."""
    command = router_command(worker_urls, port, host=host, policy=policy, prometheus_port=prometheus_port,
                             extra_args=extra_args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("wb")
    try:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    except OSError as exc:
        log_file.close()
        raise UserError(f"could not run {command[0]}: {exc}; `pip install vllm-router`") from exc
    url_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    metrics = f"http://127.0.0.1:{prometheus_port}/metrics" if prometheus_port is not None else None
    return RouterProcess(process, f"http://{url_host}:{port}/v1", log_path, command, metrics, log_file)


def _get(url: str, timeout: float) -> bytes | None:
    """The body of a GET, or None when nothing (or an error page) answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


def wait_router_ready(router: RouterProcess, timeout: float = 120.0, interval: float = 0.5) -> None:
    """Poll the router's /v1/models (it listens once its workers are healthy); fail early if it died."""
    deadline = time.monotonic() + timeout
    while True:
        if not router.running():
            raise UserError(f"vllm-router exited with code {router.process.returncode} before it was ready; "
                            f"see {router.log_path}")
        if _get(router.base_url.rstrip("/") + "/models", timeout=2.0):
            return
        if time.monotonic() >= deadline:
            raise UserError(f"vllm-router at {router.base_url} not ready after {timeout:.0f}s; see {router.log_path}")
        time.sleep(interval)


def list_workers(base_url: str, timeout: float = 3.0) -> list[str] | None:
    """The worker URLs behind a vllm-router (its GET /list_workers), or None when `base_url` is not one."""
    body = _get(server_root(base_url) + "/list_workers", timeout)
    try:
        urls = json.loads(body)["urls"] if body else None
    except (ValueError, KeyError, TypeError):
        return None
    return [str(u) for u in urls] if isinstance(urls, list) else None


def parse_counters(text: str) -> dict[str, float]:
    """Prometheus text -> the `COUNTERS` we keep, each summed over its label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC_LINE.match(line.strip())
        if match and match.group(1) in COUNTERS:
            name = COUNTERS[match.group(1)]
            out[name] = out.get(name, 0.0) + float(match.group(3))
    return out


def engine_counters(worker_url: str, timeout: float = 3.0) -> dict[str, float] | None:
    """A vLLM server's request and prefix-cache counters (GET /metrics), or None when it does not answer."""
    body = _get(server_root(worker_url) + "/metrics", timeout)
    return parse_counters(body.decode("utf-8", "replace")) if body else None


@dataclass
class RouterWatch:
    """Per-worker counters of the routers among a run's URLs, read before and after the run.

    The difference says which replicas served the run and how much of its prompts they found in
    their prefix cache, the numbers the records cannot carry through a router.
    """

    before: dict[str, dict[str, dict[str, float] | None]] = field(default_factory=dict)  # router -> worker -> counters

    @classmethod
    def start(cls, urls: Sequence[str]) -> RouterWatch:
        watch = cls()
        for url in dict.fromkeys(urls):
            workers = list_workers(url)
            if workers:
                watch.before[url] = {w: engine_counters(w) for w in workers}
        return watch

    def delta(self) -> dict[str, Any]:
        """{router: {"workers": {worker: counters after - before}}}; a worker that no longer answers
        (or did not at the start) gets `{"answers": false}`."""
        out: dict[str, Any] = {}
        for router, workers in self.before.items():
            rows: dict[str, Any] = {}
            for worker, before in workers.items():
                after = engine_counters(worker)
                if before is None or after is None:
                    rows[worker] = {"answers": False}
                    continue
                row: dict[str, Any] = {k: int(after.get(k, 0.0) - before.get(k, 0.0)) for k in COUNTERS.values()}
                queries = row["prefix_cache_queries"]
                row["hit_ratio"] = round(row["prefix_cache_hits"] / queries, 4) if queries else None
                rows[worker] = row
            out[router] = {"workers": rows}
        return out
