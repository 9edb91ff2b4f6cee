"""sprint.llm.serve against a real vLLM CPU server (marked vllm), plus fast checks of its error paths."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import openai
import pytest

from sprint.core.errors import UserError
from sprint.llm.cpu_placement import ENGINE, WORKER, session_processes
from sprint.llm.serve import API_SERVER_MODULE, ensure_server, free_port, list_models, start_vllm


def _client(base_url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=120)


async def _complete(base_url: str, model: str, **params: object) -> openai.types.Completion:
    async with _client(base_url) as client:
        return await client.completions.create(model=model, prompt="The answer to 2 + 3 is", **params)


# ---- real server -------------------------------------------------------------------------------


def _server_session(port: int) -> dict[int, str]:
    """The processes of the vLLM server listening on `port` (its API server leads their session)."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and API_SERVER_MODULE.encode() in argv and str(port).encode() in argv:
            return session_processes(os.getsid(int(entry.name)))
    return {}


@pytest.mark.vllm
def test_a_cpu_server_runs_its_engine_beside_its_worker_and_its_api_server_apart(vllm_server) -> None:
    """sprint.llm.cpu_placement: the engine core shares the worker's cores, the API server has the others
    (apart, a decode step of 3 sequences costs about one; together, about three)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to place apart")
    processes = _server_session(urlparse(vllm_server.base_url).port)
    workers = [p for p, c in processes.items() if c.startswith(WORKER)]
    engines = [p for p, c in processes.items() if c.startswith(ENGINE)]
    others = [p for p in processes if p not in workers and p not in engines]
    assert workers and engines and others, processes
    worker_cores = set().union(*(os.sched_getaffinity(p) for p in workers))
    for pid in engines:
        assert os.sched_getaffinity(pid) <= worker_cores
    for pid in others:
        assert not os.sched_getaffinity(pid) & worker_cores, (pid, processes[pid])


@pytest.mark.vllm
def test_completion_reports_usage_within_max_tokens(vllm_server) -> None:
    result = asyncio.run(_complete(vllm_server.base_url, vllm_server.served_model_name, max_tokens=20, temperature=0))
    assert result.usage is not None
    assert 0 < result.usage.completion_tokens <= 20
    assert result.usage.prompt_tokens > 0
    assert len(result.choices) == 1 and isinstance(result.choices[0].text, str)


@pytest.mark.vllm
def test_five_stop_strings_are_rejected_with_http_400(vllm_server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        asyncio.run(
            _complete(vllm_server.base_url, vllm_server.served_model_name, max_tokens=8, stop=["a", "b", "c", "d", "e"])
        )
    assert caught.value.status_code == 400


@pytest.mark.vllm
def test_four_stop_strings_are_accepted(vllm_server) -> None:
    result = asyncio.run(
        _complete(vllm_server.base_url, vllm_server.served_model_name, max_tokens=8, stop=["</a>", "</b>", "</c>", "</d>"])
    )
    assert result.choices[0].finish_reason in ("stop", "length")
    assert result.usage is not None and result.usage.completion_tokens <= 8


@pytest.mark.vllm
def test_served_model_name_is_listed_and_reused(vllm_server) -> None:
    async def model_ids() -> list[str]:
        async with _client(vllm_server.base_url) as client:
            return [model.id async for model in client.models.list()]

    assert vllm_server.served_model_name in asyncio.run(model_ids())
    assert list_models(vllm_server.base_url) == [vllm_server.served_model_name]
    # A running server is reused as is, even when a model path is given.
    with ensure_server(vllm_server.base_url, vllm_server.served_model_name, vllm_server.model_dir) as url:
        assert url == vllm_server.base_url
    with pytest.raises(UserError, match=repr(vllm_server.served_model_name)):
        with ensure_server(vllm_server.base_url, "no-such-model"):
            pass


# ---- fast error paths (no vLLM needed) ---------------------------------------------------------


def test_ensure_server_explains_how_to_start_one_when_nothing_listens() -> None:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(UserError) as caught:
        with ensure_server(base_url, "tiny"):
            pass
    message = str(caught.value)
    assert f"nothing answers at {base_url}" in message
    assert API_SERVER_MODULE in message
    assert "--served-model-name tiny" in message
    assert f"--port {port}" in message
    assert "sprint serve" in message


class _ModelsHandler(BaseHTTPRequestHandler):
    """Answers GET /v1/models like an OpenAI-compatible server serving one model."""

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        if self.path != "/v1/models":
            self.send_error(404)
            return
        body = json.dumps({"object": "list", "data": [{"id": "other-model", "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def models_stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ModelsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_ensure_server_lists_served_models_when_the_name_is_wrong(models_stub: str, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="serves 'other-model'"):
        with ensure_server(models_stub + "/v1", "tiny", model_path=tmp_path):
            pass
    with ensure_server(models_stub + "/v1", "other-model") as url:
        assert url == models_stub + "/v1"


def test_wrong_base_url_path_is_a_user_error(models_stub: str) -> None:
    with pytest.raises(UserError, match="HTTP 404"):
        list_models(models_stub + "/v2")


def test_start_vllm_rejects_a_folder_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no config.json"):
        start_vllm(tmp_path, "tiny", free_port())
