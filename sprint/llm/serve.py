"""Start, wait for and stop a local vLLM server (the CPU build living in `.venv-vllm`).

vLLM runs in its own venv because it pins its own torch/transformers, so we never import it:
we launch `python -m vllm.entrypoints.openai.api_server` from that venv as a child process in
its own process group (vLLM forks an engine process; stopping the group stops both) and talk
to it over HTTP like any other OpenAI-compatible endpoint.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

from sprint.core.errors import UserError
from sprint.core.options import option
from sprint.core.resources import VLLM_ENV
from sprint.llm.cpu_placement import place_server

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0"}
# The child always gets these unless the caller's environment says otherwise: no hub downloads,
# and a 1 GiB KV cache, which is plenty for the tiny test model and small CPU runs.
CHILD_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
LOG_TAIL_LINES = 40


@dataclass
class ServeConfig:
    """One server's settings (`vllm_command` and `start_vllm` take the same defaults from here); the `sprint serve`
    command is `sprint.llm.fleet`, whose `FleetConfig` adds the replicas and their router."""

    model_dir: Path = option(help="local Hugging Face model folder", flags=("model_dir",), type=Path)
    served_model_name: str | None = option(None, "name clients ask for (default: the folder name)")
    host: str = option("127.0.0.1", "address to listen on (local only unless you mean otherwise)")
    port: int = option(8000, "port to listen on")
    max_model_len: int = option(8192, "longest prompt + answer in tokens (vLLM --max-model-len)")
    dtype: str = option("bfloat16", "weights dtype (vLLM --dtype)")
    python: Path | None = option(None, "Python with vLLM (default: $VLLM_PYTHON or .venv-vllm)", type=Path)
    log: Path | None = option(None, "server log file (default: a temp file)", type=Path)
    timeout: float = option(900.0, "seconds to wait for readiness")
    vllm_args: str = option("", 'extra vLLM flags as one string, e.g. "--enforce-eager"')


def default_python() -> Path:
    """The Python that has vLLM: $VLLM_PYTHON, else $VLLM_VENV/bin/python, else <checkout>/.venv-vllm
    (a wheel has no checkout: then one of the variables or --python must be given, a UserError says so)."""
    if os.environ.get("VLLM_PYTHON"):
        return Path(os.environ["VLLM_PYTHON"])
    return VLLM_ENV.require("or VLLM_PYTHON, or --python") / "bin" / "python"


def _ephemeral_floor() -> int:
    """The lowest port the OS hands out for `bind(0)` (Linux's default when unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now, for servers started by tests and scripts.

    Drawn below the OS's ephemeral range: a port the OS picked for us and we released could be
    picked again for someone else's `bind(0)` (a server's own engine, a client socket) before
    our server binds it, which once made a rollout server fail with "address already in use".
    """
    floor = _ephemeral_floor()
    candidates = list(range(20000, floor)) if floor > 21000 else []
    random.SystemRandom().shuffle(candidates)  # a port, not a result: no seed needed
    for port in candidates[:200]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # no room below: let the OS pick
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def vllm_command(
    model_dir: str | Path,
    served_name: str,
    port: int,
    *,
    python: str | Path | None = None,
    host: str = ServeConfig.host,
    max_model_len: int = ServeConfig.max_model_len,
    dtype: str = ServeConfig.dtype,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The exact vLLM command line; also shown to users who should start a server themselves."""
    return [
        str(python or default_python()),
        "-m",
        API_SERVER_MODULE,
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        dtype,
        *extra_args,
    ]


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """Last lines of a server log, the part that says why a start failed."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return f"(no log at {log_path})"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class VLLMServer:
    """A vLLM child process we started, plus where to reach it and where it logs."""

    process: subprocess.Popen[bytes]
    base_url: str
    served_name: str
    model_dir: Path
    log_path: Path
    command: list[str]
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    placement: str | None = None  # what sprint.llm.cpu_placement did once the server was ready

    def running(self) -> bool:
        return self.process.poll() is None

    def wait_ready(self, timeout: float = 600.0) -> list[str]:
        models = wait_ready(self.base_url, timeout, server=self)
        self.placement = place_server(self.process.pid, self.log_path)
        return models

    def stop(self, grace: float = 20.0) -> None:
        stop(self, grace)


def start_vllm(
    model_dir: str | Path,
    served_name: str,
    port: int,
    *,
    log_path: str | Path | None = None,
    env: dict[str, str] | None = None,
    **options: Any,
) -> VLLMServer:
    """Launch vLLM in the background and return at once; call `wait_ready` before using it.

    `options` are `vllm_command`'s keyword arguments (python, host, max_model_len, dtype, extra_args).
    """
    host = options.get("host", ServeConfig.host)
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise UserError(
            f"model directory {model_dir} has no config.json; pass a local Hugging Face model folder "
            "(the hub is offline here)"
        )
    python = options["python"] = Path(options.get("python") or default_python())
    if not python.exists():
        raise UserError(
            f"no vLLM Python at {python}; run scripts/install_vllm.sh (or set VLLM_PYTHON / VLLM_VENV)"
        )
    if _answers_tcp(host, port):
        raise UserError(f"port {port} on {host} is already in use; pick another --port or stop what listens there")
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"vllm-{port}-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    child_env = {**os.environ, **(env or {})}
    for key, value in CHILD_ENV_DEFAULTS.items():
        child_env.setdefault(key, value)
    command = vllm_command(model_dir.resolve(), served_name, port, **options)
    log_file = log_path.open("wb")
    try:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,  # own process group, so stop() reaches the engine process too
        )
    except OSError as exc:
        log_file.close()
        raise UserError(f"could not run {python}: {exc}; run scripts/install_vllm.sh") from exc
    url_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return VLLMServer(
        process=process,
        base_url=f"http://{url_host}:{port}/v1",
        served_name=served_name,
        model_dir=model_dir,
        log_path=log_path,
        command=command,
        _log_file=log_file,
    )


def list_models(base_url: str, timeout: float = 5.0) -> list[str] | None:
    """Model ids served at base_url, or None when nothing answers there at all.

    Anything that answers but is not an OpenAI-style /models endpoint is a user error (wrong URL),
    not "no server": starting a second server on that port could never work.
    """
    url = base_url.rstrip("/") + "/models"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise UserError(
            f"{url} answered HTTP {exc.code}; check the base URL (it usually ends in /v1) and the API key"
        ) from exc
    except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout):
        return None
    try:
        return [entry["id"] for entry in json.loads(body)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{url} did not return an OpenAI-style model list; check the base URL") from exc


def wait_ready(
    base_url: str, timeout: float = 600.0, *, server: VLLMServer | None = None, interval: float = 1.0
) -> list[str]:
    """Poll GET /models until the server lists its models; fail early if our child died."""
    deadline = time.monotonic() + timeout
    while True:
        if server is not None and not server.running():
            code = server.process.returncode
            raise UserError(
                f"vLLM exited with code {code} before it was ready; last lines of {server.log_path}:\n"
                + log_tail(server.log_path)
            )
        try:
            models = list_models(base_url, timeout=min(5.0, max(interval, 1.0)))
        except UserError:
            models = None  # a half-started server may answer oddly; keep polling until the deadline
        if models:
            return models
        if time.monotonic() >= deadline:
            detail = f"; last lines of {server.log_path}:\n{log_tail(server.log_path)}" if server else ""
            raise UserError(f"no server ready at {base_url} after {timeout:.0f}s{detail}")
        time.sleep(interval)


def stop(server: VLLMServer, grace: float = 20.0) -> None:
    """SIGTERM the whole process group, then SIGKILL whatever is left after `grace` seconds."""
    try:
        if server.running():
            _signal_group(server.process, signal.SIGTERM)
            try:
                server.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        # The engine process may outlive the API server; the group kill catches it either way.
        _signal_group(server.process, signal.SIGKILL)
        if server.process.poll() is None:
            server.process.wait(timeout=grace)
    finally:
        if server._log_file is not None:
            server._log_file.close()
            server._log_file = None


def _signal_group(process: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(process.pid, sig)  # pgid == pid because of start_new_session
    except (ProcessLookupError, PermissionError):
        pass


def _answers_tcp(host: str, port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1" if host in ("0.0.0.0", "") else host, port), timeout=1.0):
            return True
    except OSError:
        return False


@contextmanager
def local_vllm(
    model_dir: str | Path,
    served_name: str | None = None,
    port: int | None = None,
    *,
    timeout: float = 600.0,
    **start_kwargs: object,
) -> Iterator[str]:
    """Run vLLM for the duration of a `with` block; yields the base URL (http://127.0.0.1:PORT/v1)."""
    server = start_vllm(
        model_dir,
        served_name or Path(model_dir).name,
        port or free_port(),
        **start_kwargs,  # type: ignore[arg-type]
    )
    try:
        server.wait_ready(timeout)
        yield server.base_url
    finally:
        server.stop()


def is_local(base_url: str) -> bool:
    """Whether the URL names this machine (the only place we may start a server)."""
    return (urlparse(base_url).hostname or "") in LOCAL_HOSTS


def _port_of(base_url: str) -> int:
    parsed = urlparse(base_url)
    return parsed.port or (443 if parsed.scheme == "https" else 80)


def start_hint(base_url: str, model: str, model_path: str | Path | None = None) -> str:
    """The exact command that would serve `model` at `base_url`, for error messages."""
    port = _port_of(base_url)
    raw = vllm_command(model_path or "MODEL_DIR", model, port)
    env = " ".join(f"{k}={v}" for k, v in CHILD_ENV_DEFAULTS.items())
    return (
        f"`{env} {shlex.join(raw)}` "
        f"(or `sprint serve {shlex.quote(str(model_path or 'MODEL_DIR'))} "
        f"--served-model-name {shlex.quote(model)} --port {port}`)"
    )


@contextmanager
def ensure_server(
    base_url: str,
    model: str,
    model_path: str | Path | None = None,
    *,
    timeout: float = 600.0,
    log_path: str | Path | None = None,
    vllm_args: str = "",
) -> Iterator[str]:
    """Make sure `model` is served at base_url for the `with` block; yields base_url.

    Reuses whatever already answers there. Only when nothing answers, the URL is on this machine
    and we know the model's folder do we start vLLM ourselves (with `vllm_args`, one string of
    extra flags) and stop it afterwards.
    """
    served = list_models(base_url)
    if served is not None:
        if model not in served:
            raise UserError(
                f"{base_url} does not serve model {model!r}; it serves {', '.join(map(repr, served)) or 'nothing'}; "
                "pass one of those as the model name"
            )
        yield base_url
        return
    if not (is_local(base_url) and model_path):
        where = "start a server there first" if is_local(base_url) else "check the URL, or start a server on that host"
        raise UserError(f"nothing answers at {base_url}; {where}, e.g. {start_hint(base_url, model, model_path)}")
    if urlparse(base_url).path.rstrip("/") != "/v1":
        raise UserError(f"cannot start vLLM for {base_url}: vLLM serves under /v1, so use http://127.0.0.1:PORT/v1")
    host = urlparse(base_url).hostname or "127.0.0.1"
    server = start_vllm(model_path, model, _port_of(base_url), host=host, log_path=log_path,
                        extra_args=shlex.split(vllm_args))
    try:
        server.wait_ready(timeout)
        yield base_url
    finally:
        server.stop()

