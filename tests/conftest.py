"""Shared pytest fixtures: the shared data folder, the R1 tokenizer, the scripted server, the tiny random
model, one real vLLM server.

Expensive fixtures are session-scoped so a test run builds the model and starts vLLM at most once.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from sprint.llm.serve import default_python, free_port, local_vllm
from tests.fake_server import FakeServer, Handler, ScriptedServer
from tests.helpers import EAGER, REPO_ROOT, SHARED_MISSING, TOKENIZER, shared_data_dir, shared_missing, tokenizer_dir
from tests.serve_helpers import ServeProcess, router_available

# `SPRINT_LOCAL_DATA=../shared/data make test` (README): subprocesses that run in a test's own folder
# inherit the variable, so it is made absolute once, here, before any of them starts
if os.environ.get("SPRINT_LOCAL_DATA"):
    os.environ["SPRINT_LOCAL_DATA"] = str(shared_data_dir())

TINY_MODEL_TOKENIZER = TOKENIZER
TINY_MODEL_NAME = "tiny-qwen2"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data folder (../shared/data or SPRINT_LOCAL_DATA); a fresh clone without it skips."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(shared_missing(path))
    return path


@pytest.fixture(scope="session")
def tok_dir() -> Path:
    """The shared R1-distill tokenizer folder (skips without it): the one every token count is checked with."""
    return tokenizer_dir()


@pytest.fixture
def scripted_server() -> Iterator[ScriptedServer]:
    """Start scripted OpenAI-compatible servers (`scripted_server(handler, **FakeServer options)`) that
    live until the test ends and are stopped even when it fails, without a `with` block per server."""
    servers: list[FakeServer] = []

    def start(handler: Handler | None = None, **options: Any) -> FakeServer:
        server = FakeServer(handler, **options).start()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        server.stop()


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line counting the skips for a missing ../shared, so a green run of a fresh clone is not
    mistaken for the full suite."""
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if SHARED_MISSING in _skip_reason(r)]
    found = "found" if shared_data_dir().is_dir() else "missing; set SPRINT_LOCAL_DATA"
    terminalreporter.write_line(f"shared data: {len(skipped)} skipped for missing shared data "
                                f"({shared_data_dir()}: {found})")


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The Python of .venv-vllm (or $VLLM_PYTHON / $VLLM_VENV); skips tests when it is absent."""
    python = default_python()
    if not python.exists():
        pytest.skip(f"vLLM venv missing ({python}); run scripts/install_vllm.sh")
    return python


def _torch_python() -> Path | None:
    """A Python with torch + transformers, needed only to write the tiny model's weights."""
    for python in (default_python(), REPO_ROOT / ".venv-swift" / "bin" / "python"):
        if python.exists():
            return python
    return None


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, shared_data: Path) -> Path:
    """A tiny random-weight Qwen2 (gibberish, but real weights + the real R1-distill tokenizer)."""
    python = _torch_python()
    if python is None:
        pytest.skip("no venv with torch to build the tiny model; run scripts/install_vllm.sh")
    tokenizer = shared_data / TINY_MODEL_TOKENIZER
    if not tokenizer.is_dir():
        pytest.skip(shared_missing(tokenizer))
    out = tmp_path_factory.mktemp("models") / TINY_MODEL_NAME
    result = subprocess.run(
        [str(python), str(REPO_ROOT / "scripts" / "make_tiny_model.py"), str(out), "--tokenizer", str(tokenizer)],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    if result.returncode != 0:
        pytest.fail(f"make_tiny_model.py failed with code {result.returncode}:\n{result.stderr[-3000:]}")
    return out


class VLLMFixture(NamedTuple):
    base_url: str
    served_model_name: str
    model_dir: Path


@pytest.fixture(scope="session")
def vllm_server(vllm_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMFixture]:
    """One real vLLM CPU server for the whole session, serving the tiny model."""
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    started = time.monotonic()
    with local_vllm(
        tiny_model_dir, TINY_MODEL_NAME, free_port(), python=vllm_python, log_path=log_path, timeout=600,
        # time-replay's tests read prefix-cache hits (usage.prompt_tokens_details.cached_tokens)
        extra_args=("--enable-prefix-caching", "--enable-prompt-tokens-details", *EAGER),
    ) as base_url:
        print(f"\nvLLM ready at {base_url} in {time.monotonic() - started:.1f}s (log: {log_path})")
        yield VLLMFixture(base_url, TINY_MODEL_NAME, tiny_model_dir)


@pytest.fixture(scope="session")
def router_replicas(vllm_python: Path, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`sprint serve --replicas 2 --keep-serving`: two real vLLM CPU servers (tiny model) behind the real
    vllm-router, started once per session; stopped with Ctrl-C at the end, leaving nothing behind."""
    if not router_available():
        pytest.skip("vllm-router is not installed (pip install vllm-router)")
    log = tmp_path_factory.mktemp("router") / "serve.log"
    serve = ServeProcess.start(tiny_model_dir, 2, "--served-model-name", TINY_MODEL_NAME, "--python", str(vllm_python),
                               "--log", str(log), "--max-model-len", "4096", "--keep-serving",
                               f"--vllm-args={' '.join(EAGER)}", ready_timeout=900)  # `=`: a value that starts with `--`
    try:
        yield serve
    finally:
        code = serve.stop()
        left = serve.leftovers()
        assert code == 0 and not left, f"sprint serve exit {code}, processes left: {left} (logs beside {log})"
