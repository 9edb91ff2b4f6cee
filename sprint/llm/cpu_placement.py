"""Which cores a CPU vLLM server's processes run on.

vLLM-CPU binds its model worker's OpenMP threads to some cores and keeps the others for the front
end (`VLLM_CPU_OMP_THREADS_BIND=auto`; on 2 cores: the worker on core 0, core 1 reserved), but it
leaves the API server and the engine-core process free to run anywhere. When those two share a
core, each decode step waits for the API server's per-request work, so a step of k sequences costs
about k times a step of one. Measured on the 2-core machine with the mini model (100 tokens per
sequence, ms per step): one sequence 1.9-2.3; three sequences 5.5-6.5 with the two on one core,
2.5-2.6 with the engine core beside its worker and the API server on the reserved core. Unpinned,
Linux puts them together part of the time, and parallel executors lose their advantage at random.

`place_server` pins them apart once the server is ready: the engine core on the worker's cores,
the API server (and any other process of the server) on the remaining ones. It does nothing on a
GPU server, or when the worker is not bound to a strict subset of the cores (set
`VLLM_CPU_OMP_THREADS_BIND` to change vLLM's own binding), or where Linux affinity is unavailable.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
WORKER = "VLLM::Worker"
ENGINE = "VLLM::EngineCor"  # comm names are cut at 15 characters


def session_processes(session: int) -> dict[int, str]:
    """pid -> command name of every process in the Linux session `session` (vLLM runs in its own, `setsid`)."""
    found: dict[int, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, session, ...
        if int(fields[3]) == session:
            found[int(entry.name)] = comm
    return found


def _pin(pid: int, cores: set[int]) -> None:
    """Every thread of `pid` onto `cores` (a process's threads keep their own affinity)."""
    for task in (PROC / str(pid) / "task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile


def place_server(pid: int, log_path: Path) -> str | None:
    """Pin a ready CPU server (its API server started with `pid` as a session leader) as above;
    returns what was done, for the log, or None when nothing was."""
    if not hasattr(os, "sched_setaffinity") or not PROC.is_dir():
        return None
    try:
        if "device_config=cpu" not in log_path.read_text(errors="replace"):
            return None
        processes = session_processes(pid)
        workers = [p for p, comm in processes.items() if comm.startswith(WORKER)]
        engines = [p for p, comm in processes.items() if comm.startswith(ENGINE)]
        allowed = os.sched_getaffinity(pid)
        worker_cores = set().union(*(os.sched_getaffinity(p) for p in workers)) if workers else set()
        front = allowed - worker_cores
        if not worker_cores or not front:
            return None
        for p in processes:
            if p not in workers:  # the worker's threads keep vLLM's own per-thread binding
                _pin(p, worker_cores if p in engines else front)
    except OSError:
        return None
    return (f"cpu placement: engine core and worker on cores {sorted(worker_cores)}, "
            f"API server on {sorted(front)}")
