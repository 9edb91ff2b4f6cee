"""sprint.llm.client over real HTTP: the real openai client against the scripted server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from tests.fake_server import Reply, dead_url, scripted

from sprint.core.errors import UserError
from sprint.timing.faults import FaultPlan
from sprint.llm.client import Completion, LLMClient, LLMConfig, Sampling, cache_key
from sprint.llm.failures import LLMError

MODEL = "test-model"
PLANTED_KEY = "sk-planted-3f9c1d7e-DO-NOT-LEAK"


def config(url: str, **overrides) -> LLMConfig:
    """Test settings: short timeouts and backoff so fault tests take fractions of a second."""
    values = dict(base_url=url, model=MODEL, timeout=0.5, backoff=0.01, max_retries=3, api_key_env="SPRINT_TEST_KEY")
    values.update(overrides)
    return LLMConfig(**values)


def run_complete(cfg: LLMConfig, prompt: str = "What is 2+2?", sampling: Sampling | None = None, **kw) -> tuple[Completion, LLMClient]:
    async def go() -> tuple[Completion, LLMClient]:
        async with LLMClient(cfg) as client:
            return await client.complete(prompt, sampling or Sampling(max_tokens=64), **kw), client

    return asyncio.run(go())


def run_error(cfg: LLMConfig, **kw) -> tuple[LLMError, LLMClient]:
    client = LLMClient(cfg)

    async def go() -> None:
        async with client:
            await client.complete("q", Sampling(max_tokens=8), **kw)

    with pytest.raises(LLMError) as info:
        asyncio.run(go())
    return info.value, client


def run_check(cfg: LLMConfig) -> list[str]:
    async def go() -> list[str]:
        async with LLMClient(cfg) as client:
            return await client.check()

    return asyncio.run(go())


def cache_files(cache_dir: Path) -> list[Path]:
    return sorted(p for p in cache_dir.rglob("*") if p.is_file())


# --- round trips --------------------------------------------------------------------------


def test_completion_round_trip_sends_exact_body_and_reads_usage(scripted_server):
    srv = scripted_server(lambda req, ep: "The answer is 4. STOP and more")
    done, client = run_complete(
        config(srv.base_url),
        "What is 2+2?",
        Sampling(max_tokens=20, temperature=0.6, top_p=0.95, stop=("STOP",), seed=11, extra=(("skip_special_tokens", False),)),
    )
    assert done.text == "The answer is 4. "
    assert (done.finish_reason, done.stop_reason) == ("stop", "STOP")
    assert (done.prompt_tokens, done.completion_tokens) == (3, 5)  # vLLM counts the stop string's token
    assert (done.cached, done.attempts) == (False, 1)
    assert done.start <= done.end
    endpoint, body = srv.requests[0]
    assert endpoint == "completions"
    assert body == {
        "model": MODEL,
        "prompt": "What is 2+2?",
        "max_tokens": 20,
        "temperature": 0.6,
        "top_p": 0.95,
        "stop": ["STOP"],
        "seed": 11,
        "skip_special_tokens": False,
    }
    assert client.usage.as_dict() == {
        "calls": 1, "cache_hits": 0, "retries": 0, "failures": 0, "prompt_tokens": 3, "completion_tokens": 5, "errors": {}
    }


def test_chat_round_trip_and_length_finish(scripted_server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "count to ten"}]

    async def go():
        async with LLMClient(config(srv.base_url)) as client:
            return await client.chat(messages, Sampling(max_tokens=3)), client

    srv = scripted_server(lambda req, ep: "one two three four five")
    done, client = asyncio.run(go())
    assert srv.requests == [("chat", {"model": MODEL, "messages": messages, "max_tokens": 3, "temperature": 0.0, "top_p": 1.0})]
    assert (done.text, done.finish_reason, done.stop_reason) == ("one two three", "length", None)
    assert (done.prompt_tokens, done.completion_tokens) == (5, 3)
    assert client.usage.completion_tokens == 3


def test_more_than_four_stop_strings_rejected_before_any_request(scripted_server):
    srv = scripted_server()
    with pytest.raises(ValueError, match="at most 4"):
        run_complete(config(srv.base_url), sampling=Sampling(max_tokens=5, stop=("a", "b", "c", "d", "e")))
    assert srv.requests == []
    assert Sampling(max_tokens=5, stop=["a", "b", "c", "d"]).stop == ("a", "b", "c", "d")


def test_sampling_validation():
    with pytest.raises(ValueError):
        Sampling(max_tokens=0)
    with pytest.raises(ValueError):
        Sampling(max_tokens=5, stop=("",))
    with pytest.raises(ValueError):
        Sampling(max_tokens=5, extra=(("prompt", "sneaky"),))


# --- retries and classification -----------------------------------------------------------


def test_server_error_then_success_counts_a_retry(scripted_server):
    srv = scripted_server(scripted(Reply(status=500), "recovered"))
    done, client = run_complete(config(srv.base_url))
    assert (done.text, done.attempts) == ("recovered", 2)
    assert len(srv.requests) == 2
    assert client.usage.retries == 1 and client.usage.failures == 0
    assert client.usage.errors == {"server_error": 1}


def test_rate_limit_honours_retry_after(scripted_server):
    srv = scripted_server(scripted(Reply(status=429, headers={"Retry-After": "0.3"}), "ok"))
    done, client = run_complete(config(srv.base_url, backoff=0.001))
    assert (done.text, done.attempts) == ("ok", 2)
    waited = srv.arrivals[1] - srv.arrivals[0]
    assert waited >= 0.28, f"retried after {waited:.3f}s despite Retry-After: 0.3"
    assert client.usage.errors == {"rate_limit": 1}


def test_timeout_then_success(scripted_server):
    srv = scripted_server(scripted(Reply(text="late", delay=2.0), "on time"))
    done, client = run_complete(config(srv.base_url, timeout=0.3))
    assert (done.text, done.attempts) == ("on time", 2)
    assert client.usage.errors == {"timeout": 1}


def test_persistent_server_error_fails_after_all_attempts(tmp_path, scripted_server):
    srv = scripted_server(scripted(Reply(status=503, error="overloaded")))
    err, client = run_error(config(srv.base_url, max_retries=3, cache_dir=tmp_path))
    assert err.kind == "server_error" and err.status == 503 and err.attempts == 4
    assert len(srv.requests) == 4
    assert srv.base_url in str(err) and "4 attempts" in str(err)
    assert (client.usage.retries, client.usage.failures, client.usage.calls) == (3, 1, 1)
    assert cache_files(tmp_path) == []  # failures are never cached


@pytest.mark.parametrize(
    ("status", "kind"), [(400, "bad_request"), (401, "auth"), (403, "auth"), (404, "not_found"), (422, "bad_request")]
)
def test_client_errors_are_not_retried(status, kind, scripted_server):
    srv = scripted_server(scripted(Reply(status=status, error="no"), "never reached"))
    err, client = run_error(config(srv.base_url))
    assert (err.kind, err.status, err.attempts) == (kind, status, 1)
    assert len(srv.requests) == 1
    assert client.usage.retries == 0


def test_unknown_model_is_not_found_without_retry(scripted_server):
    srv = scripted_server()
    err, _ = run_error(config(srv.base_url, model="no-such-model"))
    assert err.kind == "not_found" and len(srv.requests) == 1


def test_request_timeout_408_is_retried(scripted_server):
    srv = scripted_server(scripted(Reply(status=408), "ok"))
    done, client = run_complete(config(srv.base_url))
    assert done.attempts == 2 and client.usage.errors == {"timeout": 1}


def test_connection_reset_is_retried(scripted_server):
    srv = scripted_server(scripted(Reply(reset=True), Reply(truncate_body=True, text="half"), "whole"))
    done, client = run_complete(config(srv.base_url))
    assert (done.text, done.attempts) == ("whole", 3)
    assert client.usage.errors == {"connection": 2}


def test_empty_completion_is_retried(scripted_server):
    empty_choices = {"id": "x", "object": "text_completion", "created": 0, "model": MODEL, "choices": []}
    srv = scripted_server(scripted(Reply(empty=True), Reply(body=empty_choices), "finally"))
    done, client = run_complete(config(srv.base_url))
    assert (done.text, done.attempts) == ("finally", 3)
    assert client.usage.errors == {"empty": 2}


def test_legitimately_empty_stop_is_not_retried(scripted_server):
    srv = scripted_server(lambda req, ep: "</Plan> never seen")
    done, _ = run_complete(config(srv.base_url), sampling=Sampling(max_tokens=9, stop=("</Plan>",)))
    assert (done.text, done.finish_reason, done.stop_reason, done.attempts) == ("", "stop", "</Plan>", 1)


def test_persistent_empty_fails_with_kind_empty(scripted_server):
    srv = scripted_server(scripted(Reply(empty=True)))
    err, _ = run_error(config(srv.base_url, max_retries=1))
    assert (err.kind, err.attempts) == ("empty", 2)


def test_non_json_body_is_a_retried_server_error(scripted_server):
    srv = scripted_server(scripted(Reply(body="<html>proxy error</html>"), "fine"))
    done, client = run_complete(config(srv.base_url))
    assert done.attempts == 2 and client.usage.errors == {"server_error": 1}


def test_random_faults_all_recover_and_retries_match_faults(scripted_server):
    plan = FaultPlan(rate_5xx=0.15, rate_429=0.05, retry_after=0.01, rate_reset=0.1, rate_truncated=0.1, rate_empty=0.1, seed=3)

    async def go():
        async with LLMClient(config(srv.base_url, max_retries=8, max_concurrency=1)) as client:
            outs = await asyncio.gather(*(client.complete(f"q{i}", Sampling(max_tokens=8)) for i in range(20)))
            return outs, client

    srv = scripted_server(lambda req, ep: f"answer to {req['prompt']}", faults=plan)
    outs, client = asyncio.run(go())
    assert [o.text for o in outs] == [f"answer to q{i}" for i in range(20)]
    faulted = sum(f is not None for f in srv.faults_seen)
    assert faulted >= 5  # the plan really injected faults
    assert client.usage.retries == faulted == sum(o.attempts - 1 for o in outs)
    assert client.usage.failures == 0


# --- cache --------------------------------------------------------------------------------


def test_cache_hit_makes_no_request(tmp_path, scripted_server):
    cfg = config("unused", cache_dir=tmp_path)
    srv = scripted_server(lambda req, ep: "cached words")
    cfg.base_url = srv.base_url

    async def go():
        async with LLMClient(cfg) as client:
            first = await client.complete("p", Sampling(max_tokens=8))
            second = await client.complete("p", Sampling(max_tokens=8))
            return first, second, client

    first, second, client = asyncio.run(go())
    assert len(srv.requests) == 1
    assert (first.cached, second.cached, second.attempts) == (False, True, 0)
    assert (second.text, second.finish_reason, second.completion_tokens) == (first.text, first.finish_reason, first.completion_tokens)
    assert (client.usage.calls, client.usage.cache_hits, client.usage.completion_tokens) == (2, 1, 2)
    key = cache_key("completions", MODEL, "p", Sampling(max_tokens=8))
    files = cache_files(tmp_path)
    assert files == [tmp_path / key[:2] / f"{key}.json"]  # one entry, no temp files left
    assert json.loads(files[0].read_text())["text"] == "cached words"


def test_different_sampling_or_kind_or_model_is_a_miss(tmp_path, scripted_server):
    srv = scripted_server(lambda req, ep: "x y")
    cfg = config(srv.base_url, cache_dir=tmp_path)

    async def go():
        async with LLMClient(cfg) as client:
            await client.complete("p", Sampling(max_tokens=8))
            await client.complete("p", Sampling(max_tokens=8, temperature=0.7))
            await client.complete("p", Sampling(max_tokens=9))
            await client.complete("p", Sampling(max_tokens=8, seed=1))
            await client.chat([{"role": "user", "content": "p"}], Sampling(max_tokens=8))
            return client

    client = asyncio.run(go())
    assert len(srv.requests) == 5 and client.usage.cache_hits == 0
    assert len(cache_files(tmp_path)) == 5
    base = Sampling(max_tokens=8)
    assert cache_key("completions", MODEL, "p", base) != cache_key("completions", "other", "p", base)
    # equal settings written differently share a key
    assert cache_key("chat", MODEL, "p", Sampling(max_tokens=8, temperature=0, stop=["a"])) == cache_key(
        "chat", MODEL, "p", Sampling(max_tokens=8, temperature=0.0, stop=("a",))
    )


def test_cache_hit_works_with_server_stopped(tmp_path, scripted_server):
    srv = scripted_server(lambda req, ep: "remembered")
    run_complete(config(srv.base_url, cache_dir=tmp_path))
    # replay against a URL where nothing listens: the cache answers, no network needed
    seen: list[str] = []
    done, client = run_complete(config(dead_url(), cache_dir=tmp_path, max_retries=0), on_text=seen.append)
    assert (done.text, done.cached) == ("remembered", True)
    assert seen == ["remembered"]
    with pytest.raises(LLMError) as info:  # a miss really would need the (dead) server
        run_complete(config(dead_url(), cache_dir=tmp_path, max_retries=0), prompt="another")
    assert info.value.kind == "connection"


def test_api_key_is_sent_but_never_stored_or_reported(tmp_path, monkeypatch, scripted_server):
    monkeypatch.setenv("SPRINT_TEST_KEY", PLANTED_KEY)
    srv = scripted_server(lambda req, ep: "secret-free text", api_key=PLANTED_KEY)
    done, _ = run_complete(config(srv.base_url, cache_dir=tmp_path))
    ok = run_check(config(srv.base_url))
    assert done.text == "secret-free text" and ok == [MODEL]
    assert srv.headers[0]["authorization"] == f"Bearer {PLANTED_KEY}"
    files = cache_files(tmp_path)
    assert files and all(PLANTED_KEY.encode() not in p.read_bytes() for p in files)
    assert PLANTED_KEY not in repr(LLMClient(config(srv.base_url)))

    monkeypatch.setenv("SPRINT_TEST_KEY", "sk-wrong-key")
    srv = scripted_server(api_key=PLANTED_KEY)
    err, _ = run_error(config(srv.base_url))
    with pytest.raises(UserError) as info:
        run_check(config(srv.base_url))
    assert err.kind == "auth" and "sk-wrong-key" not in str(err)
    assert "SPRINT_TEST_KEY" in str(info.value) and "sk-wrong-key" not in str(info.value)


def test_unreadable_cache_entry_is_a_miss(tmp_path, scripted_server):
    key = cache_key("completions", MODEL, "What is 2+2?", Sampling(max_tokens=64))
    (tmp_path / key[:2]).mkdir()
    (tmp_path / key[:2] / f"{key}.json").write_text("{truncated")
    srv = scripted_server(lambda req, ep: "fresh")
    done, _ = run_complete(config(srv.base_url, cache_dir=tmp_path))
    assert (done.text, done.cached, len(srv.requests)) == ("fresh", False, 1)
    assert json.loads((tmp_path / key[:2] / f"{key}.json").read_text())["text"] == "fresh"


# --- streaming ----------------------------------------------------------------------------


def test_streaming_reports_growing_prefixes(scripted_server):
    text = "Plan: split the problem into three parts and solve each"
    seen: list[str] = []
    srv = scripted_server(lambda req, ep: text)
    done, client = run_complete(config(srv.base_url), on_text=seen.append)
    assert done.text == text and seen[-1] == text
    assert len(seen) == len(text.split())
    assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(seen, seen[1:]))
    assert (done.finish_reason, done.completion_tokens, done.prompt_tokens) == ("stop", 10, 3)
    body = srv.requests[0][1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_chat_streaming_with_stop(scripted_server):
    seen: list[str] = []

    async def go():
        async with LLMClient(config(srv.base_url)) as client:
            return await client.chat([{"role": "user", "content": "hi"}], Sampling(max_tokens=50, stop=("<End>",)), on_text=seen.append)

    srv = scripted_server(lambda req, ep: "alpha beta<End> gamma")
    done = asyncio.run(go())
    assert (done.text, done.finish_reason, done.stop_reason) == ("alpha beta", "stop", "<End>")
    assert seen == ["alpha", "alpha beta"]


def test_stream_without_usage_counts_zero_tokens(scripted_server):
    srv = scripted_server(scripted(Reply(text="a b c", usage=False)))
    done, client = run_complete(config(srv.base_url), on_text=lambda t: None)
    assert (done.text, done.completion_tokens, done.prompt_tokens) == ("a b c", 0, 0)
    assert client.usage.completion_tokens == 0


def test_dropped_stream_is_retried_from_scratch(scripted_server):
    text = "first second third fourth fifth"
    seen: list[str] = []
    srv = scripted_server(scripted(Reply(text=text, drop_stream_after=12), text), chunk_delay=0.001)
    done, client = run_complete(config(srv.base_url), on_text=seen.append)
    assert (done.text, done.attempts) == (text, 2)
    assert seen[:2] == ["first", "first second"]  # the dropped attempt
    restart = seen.index("first", 1)  # the retry starts again from the beginning
    assert restart == 2 and seen[-1] == text
    assert client.usage.errors == {"connection": 1}


# --- concurrency and lifecycle ------------------------------------------------------------


def test_concurrency_bound_is_respected(scripted_server):
    async def go():
        async with LLMClient(config(srv.base_url, max_concurrency=2, timeout=5)) as client:
            return await asyncio.gather(*(client.complete(f"p{i}", Sampling(max_tokens=4)) for i in range(6)))

    srv = scripted_server(scripted(Reply(text="slow", delay=0.15)))
    outs = asyncio.run(go())
    assert len(srv.requests) == 6 and [o.text for o in outs] == ["slow"] * 6
    assert srv.max_in_flight == 2
    # the start/end stamps show the overlap too: never more than 2 calls open at once
    events = sorted([(o.start, 1) for o in outs] + [(o.end, -1) for o in outs], key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    assert peak == 2


def test_client_built_outside_a_loop_survives_two_event_loops(scripted_server):
    async def once(client: LLMClient, prompt: str) -> str:
        async with client:  # closes the HTTP client at the end of this loop; the next loop opens one
            return (await client.complete(prompt, Sampling(max_tokens=4))).text

    srv = scripted_server(lambda req, ep: "again")
    client = LLMClient(config(srv.base_url))
    assert [asyncio.run(once(client, p)) for p in ("p1", "p2")] == ["again", "again"]
    assert client.usage.calls == 2 and len(srv.requests) == 2


# --- check() ------------------------------------------------------------------------------


def test_check_lists_served_models(scripted_server):
    srv = scripted_server(models=["a", MODEL])
    assert run_check(config(srv.base_url)) == ["a", MODEL]


def test_check_dead_port_names_the_url():
    url = dead_url()
    with pytest.raises(UserError) as info:
        run_check(config(url))
    assert url in str(info.value) and "no server answers" in str(info.value)


def test_check_wrong_model_lists_served_ones(scripted_server):
    srv = scripted_server(models=["model-a", "model-b"])
    with pytest.raises(UserError) as info:
        run_check(config(srv.base_url, model="model-c"))
    message = str(info.value)
    assert "model-c" in message and "model-a" in message and "model-b" in message


# --- against a real vLLM server (tiny random model: gibberish, but real tokens) -----------


@pytest.mark.vllm
def test_real_vllm_streamed_and_plain_agree_with_usage(vllm_server):
    cfg = config(vllm_server.base_url, model=vllm_server.served_model_name, timeout=120)
    sampling = Sampling(max_tokens=24, temperature=0.0, seed=0)
    seen: list[str] = []

    async def go():
        async with LLMClient(cfg) as client:
            served = await client.check()
            plain = await client.complete("The answer to 2 + 3 is", sampling)
            streamed = await client.complete("The answer to 2 + 3 is", sampling, on_text=seen.append)
            chat = await client.chat([{"role": "user", "content": "Say hi."}], sampling)
            return served, plain, streamed, chat

    served, plain, streamed, chat = asyncio.run(go())
    assert vllm_server.served_model_name in served
    assert streamed.text == plain.text and seen and seen[-1] == plain.text
    for done in (plain, streamed, chat):
        assert done.prompt_tokens > 0 and 0 < done.completion_tokens <= 24
        assert done.finish_reason in ("stop", "length")


@pytest.mark.vllm
def test_real_vllm_reports_the_matching_stop_string(vllm_server):
    cfg = config(vllm_server.base_url, model=vllm_server.served_model_name, timeout=120)

    async def go():
        async with LLMClient(cfg) as client:
            free = await client.complete("Once upon a time", Sampling(max_tokens=32, seed=0))
            if not free.text.strip():
                pytest.skip("the tiny model wrote nothing to pick a stop string from")
            # stop on a piece of what the model writes anyway: greedy decoding repeats it and cuts there
            stop = free.text[len(free.text) // 2 :][:3]
            cut = await client.complete("Once upon a time", Sampling(max_tokens=32, seed=0, stop=(stop,)))
            return free, stop, cut

    free, stop, cut = asyncio.run(go())
    assert stop and stop in free.text
    assert (cut.finish_reason, cut.stop_reason) == ("stop", stop)
    assert cut.text == free.text[: free.text.index(stop)]
