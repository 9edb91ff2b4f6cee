"""`sprint serve --replicas N`: the real vllm-router in front of stand-in servers (tests/stand_in_vllm.py),
so the process handling is checked in seconds: one URL printed, the router knows every replica,
everything stops on Ctrl-C and when one process dies (exit 4), and nothing is left behind.

The same command with real vLLM servers and a real run is tests/test_router_vllm.py (marked vllm).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sprint.core.errors import UserError
from sprint.llm.fleet import FleetConfig, ReplicaSet, gpu_ids
from sprint.llm.router import RouterWatch, parse_counters, router_command, server_root
from tests.serve_helpers import ServeProcess, ports_free_after, router_available, SPRINT

HERE = Path(__file__).resolve().parent

needs_router = pytest.mark.skipif(not router_available(), reason="vllm-router is not installed (pip install vllm-router)")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status == 200
    except OSError:
        time.sleep(0.2)
        return False


def _wrapper(tmp_path: Path) -> Path:
    """A "Python with vLLM" that runs the stand-in server instead."""
    wrapper = tmp_path / "python-stand-in"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {HERE / 'stand_in_vllm.py'} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def _model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def start_serve(tmp_path: Path, *extra: str) -> ServeProcess:
    """`sprint serve` with 2 stand-in replicas and the real router."""
    serve = ServeProcess.start(_model(tmp_path), 2, "--python", str(_wrapper(tmp_path)), "--log",
                               str(tmp_path / "serve.log"), *extra, ready_timeout=60)
    assert serve.url.endswith("/v1") and set(serve.pids) == {"replica 1", "replica 2", "router"}, serve.pids
    return serve


@needs_router
def test_serve_replicas_one_url_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    serve = start_serve(tmp_path)
    try:
        with urllib.request.urlopen(serve.url + "/models", timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == "model"
        with urllib.request.urlopen(server_root(serve.url) + "/list_workers", timeout=10) as response:
            assert len(json.load(response)["urls"]) == 2
        assert len(RouterWatch.start([serve.url]).before[serve.url]) == 2
    finally:
        assert serve.stop(signal.SIGINT) == 0
    assert serve.leftovers() == []


@needs_router
def test_serve_replicas_stops_everything_when_one_dies(tmp_path: Path) -> None:
    serve = start_serve(tmp_path)
    try:
        serve.kill_replica(2)
        assert serve.process.wait(60) == 4  # a server stopped: the set went down with it
        assert "replica 2" in serve.process.stderr.read()
    finally:
        serve.stop()
    assert serve.leftovers() == []


@needs_router
def test_keep_serving_survives_a_replica_until_sigterm(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, "--keep-serving")
    try:
        serve.kill_replica(1)
        time.sleep(2)  # the watch polls every second; it must not stop the set
        assert serve.process.poll() is None
        # GET /models may still go to the dead replica (500) until the router's health check (every 5 s,
        # 2 failures) takes it out; then the survivor answers
        assert any(_answers(serve.url + "/models") for _ in range(150))
    finally:
        assert serve.stop(signal.SIGTERM) == 0
    assert serve.leftovers() == []


def test_router_none_prints_the_replica_list(tmp_path: Path) -> None:
    port = ports_free_after(2)
    proc = subprocess.Popen([str(SPRINT), "serve", str(_model(tmp_path)), "--replicas", "2", "--router", "none",
                             "--port", str(port), "--python", str(_wrapper(tmp_path)), "--timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        url = proc.stdout.readline().strip()
        assert url == f"http://127.0.0.1:{port}/v1,http://127.0.0.1:{port + 1}/v1", proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_router_command_and_gpu_assignment() -> None:
    if not router_available():
        pytest.skip("vllm-router is not installed")
    command = router_command(["http://127.0.0.1:8001/v1", "http://127.0.0.1:8002/v1"], 8000, policy="round_robin",
                             prometheus_port=9100)
    assert command[command.index("--worker-urls") + 1:command.index("--worker-urls") + 3] == \
        ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]
    assert command[command.index("--policy") + 1] == "round_robin"
    assert gpu_ids(2, "3,5") == ["3", "5"]
    with pytest.raises(UserError, match="one id per replica"):
        gpu_ids(2, "0")
    with pytest.raises(UserError, match="--replicas"):
        FleetConfig(model_dir=Path("m"), replicas=0)


def test_parse_counters_sums_label_sets() -> None:
    text = ('# HELP x\nvllm:request_success_total{finished_reason="length"} 3.0\n'
            'vllm:request_success_total{finished_reason="stop"} 2.0\nvllm:prefix_cache_hits_total{engine="0"} 64.0\n'
            'vllm:prefix_cache_queries_total{engine="0"} 128.0\nother 1\n')
    assert parse_counters(text) == {"requests": 5.0, "prefix_cache_hits": 64.0, "prefix_cache_queries": 128.0}
    assert ReplicaSet([]).url == ""
