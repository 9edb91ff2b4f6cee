"""Running `sprint serve --replicas N` as a child process in tests: the URL it prints, the pids it names,
and the check that nothing it started is left alive after it ends."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sprint.core.errors import UserError
from sprint.llm.fleet import replica_ports
from sprint.llm.router import router_executable
from sprint.llm.serve import free_port

SPRINT = Path(sys.executable).parent / "sprint"
_CHILD_LINE = re.compile(r"(replica \d+|vllm-router)[^:]*: (\S+) \(.*pid (\d+)")


def router_available() -> bool:
    try:
        router_executable()
    except UserError:
        return False
    return True


def alive_in_groups(pgids: list[int]) -> list[int]:
    """Processes (not zombies) still alive in these process groups."""
    alive = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) in pgids and fields[0] != "Z":
            alive.append(int(proc.name))
    return alive


def ports_free_after(count: int) -> int:
    """A free port with `count` free ports after it (the router's and the replicas' ports)."""
    for _ in range(50):
        port = free_port()
        try:
            replica_ports(port, count, True, "127.0.0.1")
            return port
        except UserError:
            continue
    raise RuntimeError("no run of free ports")


@dataclass
class ServeProcess:
    """`sprint serve` running: its process, the one URL it printed, the children's pids by name."""

    process: subprocess.Popen[str]
    url: str
    pids: dict[str, int]  # "replica 1", "replica 2", ..., "router" -> pid (= its process group)
    urls: dict[str, str]  # the same names -> base URL

    @classmethod
    def start(cls, model_dir: Path, replicas: int, *args: str, ready_timeout: float = 900.0) -> ServeProcess:
        port = ports_free_after(replicas)
        process = subprocess.Popen([str(SPRINT), "serve", str(model_dir), "--replicas", str(replicas),
                                    "--port", str(port), "--timeout", str(ready_timeout), *args],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        url = process.stdout.readline().strip()  # the first stdout line, printed once everything is ready
        if not url:
            process.wait(60)
            raise RuntimeError(f"sprint serve printed no URL (exit {process.returncode}):\n{process.stderr.read()}")
        pids: dict[str, int] = {}
        urls: dict[str, str] = {}
        while "router" not in pids:  # stderr names each child before the URL is printed
            line = process.stderr.readline()
            if not line:
                break
            match = _CHILD_LINE.match(line)
            if match:
                name = "router" if match.group(1) == "vllm-router" else match.group(1)
                urls[name], pids[name] = match.group(2), int(match.group(3))
        return cls(process, url, pids, urls)

    def kill_replica(self, number: int) -> None:
        """SIGKILL a replica's whole process group (its API server and engine), as a crash would."""
        os.killpg(self.pids[f"replica {number}"], signal.SIGKILL)

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120.0) -> int:
        """Signal `sprint serve` as Ctrl-C would and return its exit code (SIGKILL its group past the timeout)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        return self.process.returncode

    def leftovers(self, grace: float = 10.0) -> list[int]:
        """Processes of the children's groups still alive (after up to `grace` s for exits in progress)."""
        deadline = time.monotonic() + grace
        while True:
            alive = alive_in_groups(list(self.pids.values()))
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.2)
