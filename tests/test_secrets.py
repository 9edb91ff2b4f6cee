"""API keys come from the environment only and are never written anywhere.

A key is planted in OPENAI_API_KEY; the stages run against a fake server that requires it (so
the key is really sent), then against servers that reject it with 401 and even echo it back in
their error bodies, as some proxies do. Afterwards every file of the output folders, the
response caches, and everything the processes printed or logged is searched for the key.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tests.fake_server import Reply, ScriptedServer
from tests.helpers import shared_data_dir
from tests.test_components import by_question, good_answer, load_traces, write_jsonl

from sprint.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
MODEL = "test-model"
KEY = "sk-proj-PLANTED7f3a9c2e41d84b6f0c1d2e3f4a5b6c7d"
WRONG_KEY = "sk-proj-OTHER00000000000000000000000000000000"
# Pieces a partial leak would show (a masked key keeps its head and tail; a cut message its middle).
FRAGMENTS = (KEY, KEY[8:24], KEY[-16:], "PLANTED7f3a9c2e")


def run(argv: list[str], log: Path, key: str = KEY, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPENAI_API_KEY": key, "SPRINT_LOCAL_DATA": str(shared_data_dir()), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", **(extra_env or {})}
    result = subprocess.run([sys.executable, "-m", "sprint", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=180)
    log.write_text(f"$ {' '.join(argv)}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}\n", encoding="utf-8")
    return result


def leaks(root: Path) -> list[str]:
    """Every file under `root` holding the key or a telling piece of it."""
    found = []
    for path in root.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits = [f for f in FRAGMENTS if f.encode() in data]
            if hits:
                found.append(f"{path.relative_to(root)}: {hits}")
    return found


def test_no_command_takes_a_key_on_the_command_line() -> None:
    """A key given as an option ends up in shell history, `ps` and the manifest's config."""
    parser = build_parser(every_command=True)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    offending = []
    for name, command in sub.choices.items():
        for action in command._actions:
            names = " ".join(action.option_strings).lower() + " " + str(action.dest).lower()
            if any(word in names for word in ("api-key", "api_key", "apikey", "secret", "password", "bearer", "credential")):
                offending.append(f"{name} {action.option_strings}")
    assert not offending, offending


def problems(tmp_path: Path) -> Path:
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "unique_id": f"test/sums/{i}.json"} for i in range(3)]
    return write_jsonl(tmp_path / "problems.jsonl", rows)


def answer_everything(rows: list[dict]):
    """One handler for every stage: components, DAGs, planner/executor calls, baseline generations."""
    components = by_question(rows, good_answer)
    dags = by_question(rows, lambda row: row["scripted_dag"])

    def handler(body: dict, endpoint: str) -> str:
        if endpoint == "chat":
            content = body["messages"][-1]["content"]
            return (components if "<Line 1>" in content else dags)(body, endpoint)
        prompt = body["prompt"]
        if "<Plan_1>" in prompt or prompt.endswith("<Final_answer>\n"):
            return "<Final_answer>\nSo \\boxed{2}.\n</Final_answer>"
        return "<Plan_1>\nJust add.\n</Plan_1>"  # no prompts: the next planner call answers

    return handler


def workspace(tmp_path: Path) -> tuple[list[dict], Path, Path, Path, Path]:
    """Traces (rows and file), problems, and empty output and log folders."""
    rows = load_traces()
    traces = write_jsonl(tmp_path / "traces.jsonl", rows)
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    logs.mkdir()
    return rows, traces, problems(tmp_path), out, logs


@pytest.mark.slow
def test_planted_key_is_used_but_never_written(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows, traces, data, out, logs = workspace(tmp_path)
    srv = scripted_server(answer_everything(rows), api_key=KEY)
    url = srv.base_url
    llm = ["--model", MODEL, "--server-url", url, "--no-progress"]

    def curation() -> list[subprocess.CompletedProcess]:
        first = run(["components", "-i", str(traces), "-o", str(out / "components"), *llm], logs / "components.log",
                    extra_env={"OPENAI_LOG": "debug"})
        second = run(["dag", "-i", str(out / "components"), "-o", str(out / "dag"), *llm], logs / "dag.log")
        return [first, second]

    def orchestration() -> list[subprocess.CompletedProcess]:
        return [run(["orchestrate", "--planner-model", MODEL, "--planner-url", url, "--data", str(data), "--out-dir",
                     str(out / "orchestrate"), "--prompt-mode", "raw", "--cache-dir", str(out / "cache"), "--no-progress"],
                    logs / "orchestrate.log", extra_env={"OPENAI_LOG": "debug"})]

    def sequential() -> list[subprocess.CompletedProcess]:
        return [run(["baseline", "--model", MODEL, "--server-url", url, "--data", str(data), "--out-dir",
                     str(out / "baseline"), "--prompt-mode", "raw", "--max-tokens", "50", "--cache-dir", str(out / "cache2"),
                     "--no-progress"], logs / "baseline.log")]

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = [r for rs in pool.map(lambda f: f(), (curation, orchestration, sequential)) for r in rs]
    sent = [h.get("authorization") for h in srv.headers]
    for result in results:
        assert result.returncode == 0, result.stderr
    # the key really went to the server, on every request, in the Authorization header only
    assert sent and all(h == f"Bearer {KEY}" for h in sent)
    assert not any(KEY in json.dumps(body) for _, body in srv.requests)
    made = {p.relative_to(out).parts[0] for p in out.rglob("*") if p.is_file()}
    assert {"components", "dag", "orchestrate", "baseline", "cache", "cache2"} <= made
    assert list((out / "components" / "llm_cache").rglob("*.json")), "no cache written: the check would be vacuous"
    assert "DEBUG openai" in (logs / "components.log").read_text()  # the client's debug logging ran, and leaked nothing
    assert not leaks(tmp_path), leaks(tmp_path)
    for stage in ("components", "dag", "orchestrate", "baseline"):
        manifest = (out / stage / "manifest.json").read_text()
        assert url in manifest and MODEL in manifest  # where and what was asked is recorded; the key is not


@pytest.mark.slow
def test_rejected_keys_are_not_repeated_in_errors(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    rows, traces, data, out, logs = workspace(tmp_path)

    # 1. the server refuses the key at GET /models: every stage stops with one clear line
    strict = scripted_server(answer_everything(rows), api_key=WRONG_KEY)
    url = strict.base_url
    llm = ["--model", MODEL, "--server-url", url, "--no-progress"]
    refused = [
        run(["components", "-i", str(traces), "-o", str(out / "c401"), *llm], logs / "c401.log"),
        run(["orchestrate", "--planner-model", MODEL, "--planner-url", url, "--data", str(data), "--out-dir",
             str(out / "o401"), "--prompt-mode", "raw", "--no-progress"], logs / "o401.log"),
    ]
    for result in refused:
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert "refused the API key (HTTP 401)" in result.stderr and "OPENAI_API_KEY" in result.stderr

    # 2. a server (or proxy) that accepts GET /models, then rejects completions and echoes the key
    def echo(status: int):
        return lambda body, endpoint: Reply(status=status, error=f"Incorrect API key provided: {KEY}. Bearer {KEY}")

    echoing = scripted_server(echo(401))
    llm = ["--model", MODEL, "--server-url", echoing.base_url, "--no-progress", "--max-retries", "0"]
    stopped = run(["components", "-i", str(traces), "-o", str(out / "c-echo"), *llm], logs / "c-echo.log")
    orchestrated = run(["orchestrate", "--planner-model", MODEL, "--planner-url", echoing.base_url, "--data", str(data),
                        "--out-dir", str(out / "o-echo"), "--prompt-mode", "raw", "--max-retries", "0", "--no-progress"],
                       logs / "o-echo.log")
    assert stopped.returncode == 2 and "authentication failure (HTTP 401)" in stopped.stderr and "***" in stopped.stderr
    assert orchestrated.returncode == 3  # finished, every problem failed (README "Exit codes")
    records = [json.loads(line) for line in (out / "o-echo" / "records.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "error" and r["error_kind"] == "auth" and "***" in r["error"] for r in records)

    # 3. a server error whose body carries the key: recorded per item, scrubbed
    failing = scripted_server(echo(500))
    llm = ["--model", MODEL, "--server-url", failing.base_url, "--no-progress", "--max-retries", "0"]
    failed = run(["components", "-i", str(traces), "-o", str(out / "c500"), *llm], logs / "c500.log")
    assert failed.returncode == 3  # finished, every item failed (README "Exit codes")
    records = [json.loads(line) for line in (out / "c500" / "records.jsonl").read_text().splitlines()]
    assert records and all(r["status"] == "llm_server_error" and "***" in r["error"] for r in records)

    assert not leaks(tmp_path), leaks(tmp_path)
