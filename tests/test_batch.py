"""Batch mode of the curation stages: the OpenAI Batch API (scripted files/batches endpoints),
the JSONL for vLLM's `run_batch` and its results, resume, partial failures, the cache."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.fake_server import FakeServer, Reply, ScriptedServer
from tests.helpers import EAGER
from tests.test_components import (MODEL, STRICT, by_question, case_handler, case_rows, good_answer, load_traces,
                                   records_of, write_jsonl)
from tests.test_dag import stage1_dir  # noqa: F401 - a fixture

from sprint.core.errors import UserError
from sprint.curation.batch import collect, requests_text
from sprint.curation.components import COMPONENTS_STAGE, separate_components
from sprint.curation.stage import ItemBody
from sprint.curation.stage_config import sampling_for
from sprint.curation.templates import load_prompt
from sprint.llm.client import LLMClient, LLMConfig


def traces(n: int = 8) -> list[dict]:
    base = load_traces()
    rows = []
    for i in range(n):
        row = dict(base[i % len(base)])
        row["id"], row["question"] = f"{row['id']}-{i}", f"{row['question']} (copy {i})"
        rows.append(row)
    return rows


def run(inp: Path, out: Path, url: str, cache: Path, **kw: Any):
    settings = dict(model=MODEL, server_url=url, num_workers=4, timeout=5.0, max_retries=1, progress=False,
                    cache_dir=str(cache), batch_poll=0.02)
    settings.update(kw)
    return separate_components(str(inp), out, **settings)


def online_requests(srv: FakeServer) -> int:
    """Completion requests that came over HTTP (the batch worker records its lines without headers)."""
    return sum(1 for (endpoint, _), headers in zip(srv.requests, srv.headers) if endpoint != "models" and headers)


def test_batch_submits_polls_retries_failures_and_writes_the_online_records(tmp_path: Path, capsys,
                                                                            scripted_server: ScriptedServer) -> None:
    rows = traces(8)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    flaky = rows[3]["question"].strip()
    seen: dict[str, int] = {}

    def answer(row: dict) -> Any:
        q = row["question"].strip()
        seen[q] = seen.get(q, 0) + 1
        if q == flaky and seen[q] == 1:
            return Reply(status=500, error="overloaded")  # a failed line in the first batch
        return good_answer(row)

    srv = scripted_server(by_question(rows, answer))
    srv.batches.line_delay = 0.01
    outcome = run(inp, tmp_path / "batch", srv.base_url, tmp_path / "cache", batch=True)
    assert srv.batches.created == 2  # the failed request went into a second batch
    assert online_requests(srv) == 0  # every answer came through the batches
    uploads = [call for call in srv.batch_calls if call == ("POST", "/v1/files")]
    assert len(uploads) == 2
    err = capsys.readouterr().err
    assert "in_progress" in err and "completed" in err and "7/8 done, 1 failed" in err
    assert any("round 1: 7 answered, 1 failed" in n for n in outcome.notes)
    got = records_of(tmp_path / "batch")
    assert len(got) == 8 and all(r["status"] == "ok" for r in got.values())
    requests_file = json.loads((tmp_path / "batch" / "batch" / "requests-1.jsonl").read_text().splitlines()[0])
    assert requests_file["url"] == "/v1/chat/completions" and requests_file["body"]["model"] == MODEL
    assert not (tmp_path / "batch" / "batch" / "state.json").exists()

    # the same stage online gives the same records (the answers are the same)
    srv = scripted_server(by_question(rows, good_answer))
    run(inp, tmp_path / "online", srv.base_url, tmp_path / "cache2")
    online = records_of(tmp_path / "online")
    for item_id, rec in got.items():
        assert rec["components"] == online[item_id]["components"]
        assert rec["components_answer"] == online[item_id]["components_answer"]

    # the cache is filled: a fresh run (another folder) costs nothing, online
    srv = scripted_server(by_question(rows, good_answer))
    run(inp, tmp_path / "again", srv.base_url, tmp_path / "cache")
    assert online_requests(srv) == 0 and srv.batches.created == 0


def test_a_rerun_resumes_the_submitted_batch_instead_of_paying_twice(tmp_path: Path,
                                                                     scripted_server: ScriptedServer) -> None:
    rows = traces(5)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out, cache = tmp_path / "out", tmp_path / "cache"
    srv = scripted_server(by_question(rows, good_answer))
    # a first run submitted its batch and was killed while polling: its state.json names the batch
    llm = LLMConfig(base_url=srv.base_url, model=MODEL, cache_dir=cache)

    async def submit_only() -> str:
        async with LLMClient(llm) as client:
            from sprint.core.data import load_items

            items = load_items(str(inp))
            body = ItemBody(COMPONENTS_STAGE, _template(), sampling_for(2048, 0.0))
            requests, _ = await collect(body, items, client)
            text = requests_text(MODEL, requests)
            api = client.api()
            f = await api.files.create(file=("requests-1.jsonl", text.encode()), purpose="batch")
            b = await api.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
            import hashlib

            (out / "batch").mkdir(parents=True)
            (out / "batch" / "state.json").write_text(json.dumps(
                {"batch_id": b.id, "input_file_id": f.id, "requests_hash": hashlib.sha256(text.encode()).hexdigest()[:16]}))
            return b.id

    batch_id = asyncio.run(submit_only())
    assert srv.batches.created == 1
    outcome = run(inp, out, srv.base_url, cache, batch=True, max_tokens=2048)
    assert srv.batches.created == 1  # resumed, not submitted again
    assert online_requests(srv) == 0
    assert outcome.counts == {"ok": 5}
    assert batch_id


def _template() -> str:
    return load_prompt(COMPONENTS_STAGE.prompt_name, None)


def _answer_lines(requests_file: Path, rows: list[dict], fail: set[str]) -> str:
    """What an offline batch runner writes for `requests_file` (the scripted answers; `fail`: error lines)."""
    by_q = {r["question"].strip(): r for r in rows}
    out = []
    for n, line in enumerate(json.loads(x) for x in requests_file.read_text().splitlines()):
        content = line["body"]["messages"][-1]["content"]
        question = content.split("<Question>\n", 1)[1].split("\n</Question>", 1)[0]
        if line["custom_id"] in fail:
            out.append({"id": f"r{n}", "custom_id": line["custom_id"], "response": None,
                        "error": {"code": "server_error", "message": "engine crashed"}})
            continue
        text = good_answer(by_q[question.strip()])
        body = {"id": f"c{n}", "object": "chat.completion", "model": MODEL,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": len(text.split()), "total_tokens": 0}}
        out.append({"id": f"r{n}", "custom_id": line["custom_id"], "response": {"status_code": 200, "body": body},
                    "error": None})
    return "".join(json.dumps(x) + "\n" for x in out)


def test_file_only_then_results_with_a_partial_failure(tmp_path: Path) -> None:
    rows = traces(6)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out, cache, dead = tmp_path / "out", tmp_path / "cache", "http://127.0.0.1:9/v1"  # no server needed
    outcome = run(inp, out, dead, cache, batch_file_only=True)
    first = out / "batch" / "requests-1.jsonl"
    lines = [json.loads(x) for x in first.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == [r["id"] for r in rows]
    assert outcome.processed == 0 and not (out / "records.jsonl").exists()

    results = tmp_path / "results-1.jsonl"
    results.write_text(_answer_lines(first, rows, fail={rows[2]["id"]}))
    outcome = run(inp, out, dead, cache, batch_results=str(results))
    assert outcome.counts == {"ok": 5}
    assert any("1 requests without one" in n for n in outcome.notes)
    second = out / "batch" / "requests-2.jsonl"
    assert [json.loads(x)["custom_id"] for x in second.read_text().splitlines()] == [rows[2]["id"]]

    results2 = tmp_path / "results-2.jsonl"
    results2.write_text(_answer_lines(second, rows, fail=set()))
    outcome = run(inp, out, dead, cache, batch_results=str(results2))
    assert outcome.counts == {"ok": 6} and outcome.skipped == 5
    recs = records_of(out)
    assert recs[rows[2]["id"]]["components_usage"]["prompt_tokens"] == 100  # the batch's usage is recorded


@pytest.mark.parametrize("flags,message", [
    (dict(batch=True, batch_file_only=True), "exclude each other"),
    (dict(batch=True, use_cache=False), "drop --no-cache"),
    (dict(batch_results="/nonexistent/out.jsonl"), "no such file"),
])
def test_contradictory_batch_options_are_user_errors(tmp_path: Path, flags: dict, message: str) -> None:
    inp = write_jsonl(tmp_path / "in.jsonl", traces(1))
    with pytest.raises(UserError, match=message):
        run(inp, tmp_path / "out", "http://127.0.0.1:9/v1", tmp_path / "cache", **flags)
    assert not (tmp_path / "out").exists()


@pytest.mark.vllm
def test_vllm_run_batch_output_is_ingested(tmp_path: Path, vllm_python: Path, tiny_model_dir: Path) -> None:
    """The JSONL of --batch-file-only, run for real through vLLM CPU's offline `run_batch`, then ingested."""
    rows = traces(3)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out, cache, dead = tmp_path / "out", tmp_path / "cache", "http://127.0.0.1:9/v1"  # no server at all
    model = str(tiny_model_dir)
    run(inp, out, dead, cache, model=model, batch_file_only=True, max_tokens=32)
    requests_file = out / "batch" / "requests-1.jsonl"
    results = tmp_path / "vllm-out.jsonl"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([str(vllm_python), "-m", "vllm.entrypoints.openai.run_batch", "-i", str(requests_file),
                           "-o", str(results), "--model", model, "--max-model-len", "4096", *EAGER],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    produced = {json.loads(x)["custom_id"]: json.loads(x) for x in results.read_text().splitlines()}
    assert set(produced) == {r["id"] for r in rows}
    outcome = run(inp, out, dead, cache, model=model, batch_results=str(results), max_tokens=32)
    recs = records_of(out)
    assert set(recs) == {r["id"] for r in rows} and outcome.processed == 3
    for item_id, rec in recs.items():  # gibberish from a random model: ingested as written, judged by the stage
        body = produced[item_id]["response"]["body"]
        assert rec["components_answer"] == body["choices"][0]["message"]["content"]
        assert rec["status"] in ("ok", "unparseable", "invalid", "truncated")


def test_script_variables_tpm_rpm_batch(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    """TPM/RPM/BATCH in run_component_separation.sh reach the stage; an empty variable passes no flag."""
    rows = traces(3)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    script = Path(__file__).resolve().parents[1] / "run_component_separation.sh"
    python = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
    srv = scripted_server(by_question(rows, good_answer))
    base = {**os.environ, "DATA": str(inp), "SERVER_URL": srv.base_url, "MODEL": MODEL, "PYTHON": str(python)}
    done = subprocess.run(["bash", str(script), "--no-progress", "--batch-poll", "0.02"], capture_output=True,
                          text=True, env={**base, "OUT_DIR": str(tmp_path / "a"), "BATCH": "true", "TPM": ""})
    assert done.returncode == 0, done.stderr
    assert srv.batches.created == 1 and online_requests(srv) == 0
    done = subprocess.run(["bash", str(script), "--no-progress"], capture_output=True, text=True,
                          env={**base, "OUT_DIR": str(tmp_path / "b"), "BATCH": "", "TPM": "600000", "RPM": "6000"})
    assert done.returncode == 0, done.stderr
    assert srv.batches.created == 1 and online_requests(srv) == 3
    usage = json.loads((tmp_path / "b" / "manifest.json").read_text())["usage"]["this_run"]
    assert usage["rate_limiter"]["tpm"] == 600000 and usage["rate_limiter"]["rpm"] == 6000


def test_stage2_in_batch_mode_writes_the_online_records(tmp_path: Path, stage1_dir: tuple[Path, list[dict]],
                                                        scripted_server: ScriptedServer) -> None:
    from tests.test_dag import run_stage2

    components_dir, rows = stage1_dir
    handler = by_question(rows, lambda row: row["scripted_dag"])
    srv = scripted_server(handler)
    run_stage2(components_dir, tmp_path / "batch", srv.base_url, batch=True, batch_poll=0.02,
               cache_dir=str(tmp_path / "c1"), timeout=5.0)
    assert srv.batches.created == 1 and online_requests(srv) == 0
    run_stage2(components_dir, tmp_path / "online", srv.base_url, cache_dir=str(tmp_path / "c2"), timeout=5.0)
    batch, online = records_of(tmp_path / "batch"), records_of(tmp_path / "online")
    assert set(batch) == set(online) and len(batch) > 5
    for item_id, rec in batch.items():
        assert (rec["status"], rec.get("dag")) == (online[item_id]["status"], online[item_id].get("dag"))


def test_batch_runs_are_priced_at_half_the_online_price(tmp_path: Path, capsys,
                                                       scripted_server: ScriptedServer) -> None:
    rows = traces(4)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    manifests = {}
    for mode in ("online", "batch"):
        srv = scripted_server(by_question(rows, good_answer), models=["gpt-4o"])
        run(inp, tmp_path / mode, srv.base_url, tmp_path / f"cache-{mode}", model="gpt-4o", batch=mode == "batch")
        manifests[mode] = json.loads((tmp_path / mode / "manifest.json").read_text())["usage"]
        err = capsys.readouterr().err
        assert ("at gpt-4o Batch API prices (half the online price)" in err) == (mode == "batch"), err
    online, batch = manifests["online"], manifests["batch"]
    assert batch["prompt_tokens"] == online["prompt_tokens"] > 0  # the same answers, the same tokens
    assert (online["priced_as"], batch["priced_as"]) == ("online", "batch")
    assert batch["estimated_cost_usd"] == pytest.approx(online["estimated_cost_usd"] / 2, abs=1e-4)


# --- one run body: online and batch write the same records and manifest -----------------------------

# The scripted cases of test_components whose answers do not depend on how they are fetched (no
# delays, retries or finish reasons, which the batch worker does not script): kept, kept with
# warnings, rejected, unreadable, and an item refused before any call.
SAME_CASES = ("case-missing-fields", "case-overlap", "case-past-end", "case-lines-not-found", "case-prose",
              "case-no-json", "case-gap", "case-blank", "case-no-thought")


def same_case_rows() -> tuple[list[dict], dict]:
    rows, replies = case_rows()
    return [r for r in rows if not r["id"].startswith("case-") or r["id"] in SAME_CASES], replies


def answer_offline(requests_file: Path, base_url: str) -> str:
    """What an offline batch runner (vLLM's `run_batch`) writes for `requests_file`: each line answered by
    the scripted server's chat endpoint, so the answers and their usage are the online ones."""
    out = []
    for line in (json.loads(x) for x in requests_file.read_text().splitlines()):
        request = urllib.request.Request(f"{base_url}/chat/completions", data=json.dumps(line["body"]).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
        out.append({"id": f"r-{line['custom_id']}", "custom_id": line["custom_id"],
                    "response": {"status_code": 200, "body": body}, "error": None})
    return "".join(json.dumps(x) + "\n" for x in out)


def run_batch_route(route: str, inp: Path, out: Path, srv: FakeServer, cache: Path, **kw: Any):
    """Stage 1 in batch mode: `submit` (the Batch API) or `file` (--batch-file-only, then --batch-results)."""
    if route == "submit":
        return run(inp, out, srv.base_url, cache, batch=True, **kw)
    run(inp, out, srv.base_url, cache, batch_file_only=True, **kw)
    results = out.parent / f"{out.name}-results.jsonl"
    results.write_text(answer_offline(out / "batch" / "requests-1.jsonl", srv.base_url))
    return run(inp, out, srv.base_url, cache, batch_results=str(results), **kw)


def comparable_manifest(out: Path) -> dict:
    """The manifest less what differs between two runs of the same work: when, where, and how answers came."""
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("started", "updated"):
        manifest.pop(key)
    for key in ("batch", "cache_dir", "server_url"):
        manifest["config"].pop(key)
    manifest["usage"].pop("this_run")  # calls, cache hits: batch mode reads its answers from the cache
    return manifest


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("route", ["submit", "file"])
def test_online_and_batch_runs_write_the_same_records_and_manifest(tmp_path: Path, route: str, strict: bool,
                                                                   scripted_server: ScriptedServer) -> None:
    rows, replies = same_case_rows()
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    srv = scripted_server(case_handler(rows, replies))
    online = run(inp, tmp_path / "online", srv.base_url, tmp_path / "c-online", strict=strict)
    batch = run_batch_route(route, inp, tmp_path / "batch", srv, tmp_path / "c-batch", strict=strict)
    assert not srv.errors
    assert records_of(tmp_path / "batch") == records_of(tmp_path / "online")
    assert comparable_manifest(tmp_path / "batch") == comparable_manifest(tmp_path / "online")
    assert batch.counts == online.counts and batch.total == online.total == len(rows)
    manifest = comparable_manifest(tmp_path / "batch")
    assert manifest["config"]["strict"] is strict and "warnings" in manifest
    assert bool(manifest["warnings"]) is not strict or manifest["warnings"] == {"uncovered_lines": 1}
    assert [n for n in batch.notes if "kept with warnings" in n] == [n for n in online.notes if "kept with warnings" in n]


@pytest.mark.parametrize("route", ["submit", "file"])
def test_batch_strict_rejects_what_online_strict_rejects(tmp_path: Path, route: str,
                                                         scripted_server: ScriptedServer) -> None:
    """`--batch --strict` judges the answers as `--strict` does (it once judged them leniently while its
    manifest said strict), and an online --strict re-run resumes the folder with nothing to redo."""
    rows, replies = same_case_rows()
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "batch"
    srv = scripted_server(case_handler(rows, replies))
    outcome = run_batch_route(route, inp, out, srv, tmp_path / "cache", strict=True)
    records = records_of(out)
    for item_id, (status, message) in STRICT.items():
        assert records[item_id]["status"] == status and message in records[item_id]["error"], records[item_id]
        assert records[item_id]["components"] == []
    assert outcome.counts["invalid"] == len(STRICT) + 1  # + case-past-end, which is never renderable
    assert json.loads((out / "manifest.json").read_text())["config"]["strict"] is True
    again = run(inp, out, srv.base_url, tmp_path / "cache", strict=True)  # online, same folder
    assert again.processed == 0 and records_of(out) == records
