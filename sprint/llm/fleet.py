"""`sprint serve`: one vLLM server, or N replicas behind vllm-router, kept up until Ctrl-C.

Why a fleet command: SPRINT is fast only when every call of a problem lands where its prefix is
cached. `sprint serve MODEL --replicas N` starts N vLLM servers (one per GPU, or N CPU servers),
with prefix caching and per-request cached-token counts on, puts vllm-router in front with the
`consistent_hash` policy (it keys on the `X-Session-Id` header every sprint request carries) and
prints the one URL to give PLANNER_SERVER_URL. `--router none` prints the replicas as a
comma-separated list instead, for the client-side ring (`sprint.llm.replicas`).

No orphans: every child runs in its own process group and is stopped on Ctrl-C, on SIGTERM, and
when any of them dies (a set that silently lost a replica would serve at half speed; the router
fails over a run's calls meanwhile). `--keep-serving` keeps the set up while one replica is left.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from sprint.core.errors import ServerStopped, UserError
from sprint.core.options import add_options, check_range, config_from, option
from sprint.llm.router import (
    DEFAULT_POLICY,
    POLICIES,
    RouterProcess,
    start_router,
    wait_router_ready,
)
from sprint.llm.serve import (
    ServeConfig,
    VLLMServer,
    _answers_tcp,
    free_port,
    log_tail,
    start_vllm,
)

ROUTERS = ("vllm-router", "none")
# What a replica needs so that prefix reuse is both possible and visible in every response.
PREFIX_FLAGS = ("--enable-prefix-caching", "--enable-prompt-tokens-details")


@dataclass
class FleetConfig(ServeConfig):
    """`sprint serve` settings: the single-server ones plus the replicas and their router."""

    replicas: int = option(1, "vLLM servers to start (one per GPU, or CPU servers); more than one get a router "
                           "in front", var="REPLICAS")
    router: str = option("vllm-router", "what fronts the replicas: vllm-router, or none (print their URLs "
                         "comma-separated, for the client-side ring)", choices=ROUTERS, var="ROUTER")
    router_policy: str = option(DEFAULT_POLICY, "vllm-router --policy (consistent_hash keeps a problem on one "
                                "replica by its X-Session-Id header)", choices=POLICIES, var="ROUTER_POLICY")
    router_args: str = option("", 'extra vllm-router flags as one string, e.g. "--retry-max-retries 5"')
    gpus: str | None = option(None, "GPU ids, one per replica, e.g. 0,1 (default: 0..N-1 when nvidia-smi lists "
                              "that many GPUs, else CPU servers)")
    keep_serving: bool = option(False, "keep serving while one replica is left (the router fails over); by "
                                "default the whole set stops when any of its processes dies")

    def __post_init__(self) -> None:
        check_range(type(self), "replicas", self.replicas, low=1)


def gpu_ids(replicas: int, gpus: str | None) -> list[str | None]:
    """CUDA_VISIBLE_DEVICES per replica: the given ids, else 0..N-1 when the machine has the GPUs,
    else None (CPU servers). Too few GPUs for the replicas is a user error, not silent sharing."""
    if gpus:
        ids = [g.strip() for g in gpus.split(",") if g.strip()]
        if len(ids) != replicas:
            raise UserError(f"--gpus names {len(ids)} GPU(s) for {replicas} replica(s); give one id per replica")
        return list(ids)
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        count = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    except (OSError, subprocess.SubprocessError):
        count = 0
    if count == 0:
        return [None] * replicas
    if count < replicas:
        raise UserError(f"{replicas} replicas need {replicas} GPUs; nvidia-smi lists {count}; "
                        "pass fewer --replicas or --gpus with the ids to use")
    return [str(i) for i in range(replicas)]


@dataclass
class ReplicaSet:
    """The replicas and the router we started, as one thing to wait for, watch and stop."""

    servers: list[VLLMServer]
    router: RouterProcess | None = None
    gpus: list[str | None] = field(default_factory=list)
    router_log: Path | None = None  # where the router will log, beside the replicas' logs

    @property
    def url(self) -> str:
        """What clients are given: the router's URL, else the replicas' URLs comma-separated."""
        return self.router.base_url if self.router else ",".join(s.base_url for s in self.servers)

    def pids(self) -> list[int]:
        """Process-group ids of every child (what `stop` signals; tests check none is left)."""
        return [s.process.pid for s in self.servers] + ([self.router.process.pid] if self.router else [])

    def wait_ready(self, timeout: float) -> None:
        """Wait for every replica at once; the first that fails (it died, or the deadline) stops the wait."""
        with ThreadPoolExecutor(max_workers=len(self.servers)) as pool:
            for future in [pool.submit(s.wait_ready, timeout) for s in self.servers]:
                future.result()

    def dead(self) -> list[str]:
        """What has exited, as readable lines (with each replica's last log lines)."""
        lines = [f"replica {i + 1} ({s.base_url}) exited with code {s.process.returncode}; last lines of "
                 f"{s.log_path}:\n{log_tail(s.log_path, 10)}" for i, s in enumerate(self.servers) if not s.running()]
        if self.router is not None and not self.router.running():
            lines.append(f"vllm-router exited with code {self.router.process.returncode}; see {self.router.log_path}")
        return lines

    def watch(self, keep_serving: bool = False, interval: float = 1.0) -> str:
        """Block until the set can no longer serve as started; returns why. Without `keep_serving`
        any death ends it; with it, only the router's or the last replica's."""
        while True:
            dead = self.dead()
            router_gone = self.router is not None and not self.router.running()
            replicas_gone = all(not s.running() for s in self.servers)
            if dead and (not keep_serving or router_gone or replicas_gone):
                return "\n".join(dead)
            time.sleep(interval)

    def stop(self, grace: float = 20.0) -> None:
        """The router first (no new requests), then every replica; each group gets SIGTERM, then SIGKILL."""
        if self.router is not None:
            self.router.stop()
        for server in self.servers:  # SIGTERM all first, so they shut down in parallel
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(server.process.pid, signal.SIGTERM)
        for server in self.servers:
            server.stop(grace)


def _log_paths(log: Path | None, replicas: int) -> tuple[list[Path], Path]:
    """One log per replica and one for the router: beside --log (its stem + -replicaN / -router), else a temp folder."""
    if log is None:
        folder = Path(tempfile.mkdtemp(prefix="sprint-serve-"))
        return [folder / f"replica{i + 1}.log" for i in range(replicas)], folder / "router.log"
    if replicas == 1:
        return [log], log.with_name(f"{log.stem}-router{log.suffix or '.log'}")
    suffix = log.suffix or ".log"
    return [log.with_name(f"{log.stem}-replica{i + 1}{suffix}") for i in range(replicas)], \
        log.with_name(f"{log.stem}-router{suffix}")


def replica_ports(port: int, replicas: int, router: bool, host: str) -> list[int]:
    """The router on `port`, replicas on the ports after it (the replicas from `port` without a router);
    each must be free, so a clash is reported before anything starts."""
    ports = [port + i + (1 if router else 0) for i in range(replicas)]
    for p in ([port] if router else []) + ports:
        if _answers_tcp(host, p):
            raise UserError(f"port {p} on {host} is already in use; pick another --port (the replicas use the "
                            f"ports after the router's) or stop what listens there")
    return ports


def start_replica_set(cfg: FleetConfig, python: Path | None = None) -> ReplicaSet:
    """Start the replicas (and nothing else yet); `serve_replicas` waits for them and adds the router."""
    name = cfg.served_model_name or cfg.model_dir.resolve().name
    use_router = cfg.router != "none" and cfg.replicas > 1
    ports = replica_ports(cfg.port, cfg.replicas, use_router, cfg.host)
    gpus = gpu_ids(cfg.replicas, cfg.gpus)
    logs, router_log = _log_paths(cfg.log, cfg.replicas)
    extra = shlex.split(cfg.vllm_args)
    extra += [f for f in PREFIX_FLAGS if f not in extra]
    servers: list[VLLMServer] = []
    try:
        for port, gpu, log in zip(ports, gpus, logs):
            env = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else None
            servers.append(start_vllm(cfg.model_dir, name, port, python=python or cfg.python, host=cfg.host,
                                      max_model_len=cfg.max_model_len, dtype=cfg.dtype, log_path=log, env=env,
                                      extra_args=extra))
    except BaseException:
        ReplicaSet(servers).stop()
        raise
    return ReplicaSet(servers, gpus=gpus, router_log=router_log)


def add_router(fleet: ReplicaSet, cfg: FleetConfig) -> None:
    """Put vllm-router in front of the (ready) replicas and wait until it answers."""
    router_log = fleet.router_log or _log_paths(cfg.log, cfg.replicas)[1]
    fleet.router = start_router([s.base_url for s in fleet.servers], cfg.port, router_log, host=cfg.host,
                                policy=cfg.router_policy, prometheus_port=free_port(),
                                extra_args=shlex.split(cfg.router_args))
    wait_router_ready(fleet.router, timeout=min(cfg.timeout, 120.0))


@contextlib.contextmanager
def serve_replicas(cfg: FleetConfig) -> Iterator[ReplicaSet]:
    """The whole set, ready, for a `with` block; everything is stopped when it ends, however it ends."""
    fleet = start_replica_set(cfg)
    try:
        fleet.wait_ready(cfg.timeout)
        if cfg.router != "none" and cfg.replicas > 1:
            add_router(fleet, cfg)
        yield fleet
    finally:
        fleet.stop()


@contextlib.contextmanager
def ensure_replicas(base_url: str, model: str, model_path: str | Path, replicas: int,
                    policy: str = DEFAULT_POLICY, *, timeout: float = 900.0, vllm_args: str = "") -> Iterator[str]:
    """For the run scripts: start `replicas` servers and a router on a local URL's port for the
    `with` block (the caller checked that nothing answers there); yields the router's URL."""
    parsed = urlparse(base_url)
    if parsed.path.rstrip("/") != "/v1":
        raise UserError(f"cannot start replicas for {base_url}: the router serves under /v1, so use "
                        "http://127.0.0.1:PORT/v1")
    cfg = FleetConfig(model_dir=Path(model_path), served_model_name=model, host=parsed.hostname or "127.0.0.1",
                      port=parsed.port or 80, replicas=replicas, router_policy=policy, timeout=timeout,
                      vllm_args=vllm_args)
    with serve_replicas(cfg) as fleet:
        yield fleet.url


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Start vLLM (from .venv-vllm) for a local model folder and keep it running until Ctrl-C; "
                          "with --replicas N, N servers behind vllm-router (one URL, a problem's calls on one "
                          "replica).")
    add_options(parser, FleetConfig)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(FleetConfig, args)
    # Make `kill` behave like Ctrl-C so the `with` below always stops every child; and take Ctrl-C
    # back where a shell started us in the background with SIGINT ignored.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        what = "vLLM" if cfg.replicas == 1 else f"{cfg.replicas} vLLM replicas"
        _say(f"starting {what} for {cfg.model_dir}")
        with serve_replicas(cfg) as fleet:
            for i, server in enumerate(fleet.servers):
                gpu = f"GPU {fleet.gpus[i]}" if fleet.gpus and fleet.gpus[i] is not None else "CPU"
                _say(f"replica {i + 1}: {server.base_url} ({gpu}, pid {server.process.pid}, log {server.log_path})")
                if server.placement:
                    _say(f"replica {i + 1}: {server.placement}")
            if fleet.router is not None:
                _say(f"vllm-router ({cfg.router_policy}): {fleet.router.base_url} (pid {fleet.router.process.pid}, "
                     f"log {fleet.router.log_path})")
            print(fleet.url, flush=True)
            _say(f"give PLANNER_SERVER_URL={fleet.url}; Ctrl-C stops everything")
            reason = fleet.watch(cfg.keep_serving)
            raise ServerStopped(f"{reason}\nstopped every other process of the set")
    except KeyboardInterrupt:
        _say("stopped every server")
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)

