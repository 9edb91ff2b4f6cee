"""The --tpm/--rpm limiter: pacing, corrections from usage, 429s; against a server enforcing a TPM limit."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from tests.fake_server import ScriptedServer
from tests.test_batch import traces
from tests.test_components import MODEL, by_question, good_answer, write_jsonl

from sprint.curation.components import separate_components
from sprint.core.errors import UserError
from sprint.llm.client import LLMClient, LLMConfig, Sampling
from sprint.llm.ratelimit import RateLimiter


def test_requests_are_paced_to_the_token_budget() -> None:
    async def go() -> float:
        lim = RateLimiter(tpm=600_000, burst_s=0.5)  # 10,000 tokens per second
        t0 = time.monotonic()
        for _ in range(10):  # 10 x 1,000 tokens: one second of budget, half of it as burst
            charge = await lim.acquire("x" * 3, 999)  # 3 chars / 3 per token + 999 = 1,000 tokens
            lim.settle(charge, None, None)  # no usage reported: the estimate stands
        return time.monotonic() - t0

    elapsed = asyncio.run(go())
    assert 0.35 <= elapsed <= 2.0


def test_usage_corrects_the_charge_and_teaches_the_ratio() -> None:
    async def go() -> tuple[float, float]:
        lim = RateLimiter(tpm=60_000, burst_s=0.0)  # 1,000 tokens per second
        charge = await lim.acquire("word " * 200, 1000)  # 1,000 chars: ~333 + 1,000 tokens estimated
        assert charge.tokens == pytest.approx(1000 / 3 + 1000)
        lim.settle(charge, 200, 50)  # the API says: 200 prompt tokens (5 chars each), 50 generated
        t0 = time.monotonic()
        await lim.acquire("hi", 1)
        return time.monotonic() - t0, lim.chars_per_token

    waited, ratio = asyncio.run(go())
    assert ratio == pytest.approx(5.0)
    assert 0.15 <= waited <= 1.0  # 250 tokens used (0.25 s), not 1,333 (1.33 s)


def test_a_429_pauses_everyone_and_halves_concurrency() -> None:
    async def go() -> tuple[float, RateLimiter]:
        lim = RateLimiter(tpm=6_000_000, max_concurrency=8)
        charge = await lim.acquire("x", 10)
        lim.refused(charge, 0.3)
        t0 = time.monotonic()
        await lim.acquire("x", 10)
        return time.monotonic() - t0, lim

    waited, lim = asyncio.run(go())
    assert waited >= 0.25 and lim.concurrency == 4 and lim.rate_limited == 1 and lim.pace < 1


def test_bad_budgets_are_user_errors() -> None:
    with pytest.raises(UserError, match="--tpm must be a positive"):
        LLMConfig(base_url="http://x/v1", model="m", tpm=0)


def test_within_a_budget_429s_do_not_use_up_retries(scripted_server: ScriptedServer) -> None:
    srv = scripted_server(lambda r, e: "four words of answer", tpm=6_000, tpm_window_s=1.0)  # 100 tokens/s
    cfg = LLMConfig(base_url=srv.base_url, model="test-model", max_retries=0, tpm=60_000, max_concurrency=8)

    async def go() -> list:
        async with LLMClient(cfg) as client:
            return await asyncio.gather(*(client.complete(f"question {i} " * 10, Sampling(max_tokens=20))
                                          for i in range(12)))

    done = asyncio.run(go())  # the client overstates the budget 10x: the server's 429s must correct it
    assert len(done) == 12 and srv.budget.refused > 0


def test_stage1_within_a_tpm_limit_loses_nothing_and_uses_the_budget(tmp_path: Path,
                                                                     scripted_server: ScriptedServer) -> None:
    rows = traces(40)
    inp = write_jsonl(tmp_path / "in.jsonl", rows)
    srv = scripted_server(by_question(rows, good_answer), tpm=240_000, tpm_window_s=1.0)
    outcome = separate_components(str(inp), tmp_path / "out", model=MODEL, server_url=srv.base_url,
                                  num_workers=16, max_tokens=512, tpm=240_000, progress=False, max_retries=1)
    used = srv.budget.used_fraction()
    records = [json.loads(x) for x in (tmp_path / "out" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 40 and all(r["status"] == "ok" for r in records)
    assert used >= 0.75  # the benchmark (200 traces) shows >= 90 %; a short run pays its start-up
    assert outcome.usage["this_run"]["rate_limiter"]["tpm"] == 240_000
