"""The scripted server itself (spoken to with plain http.client) and the shared FaultPlan."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter

import pytest
from tests.fake_server import FakeServer, Reply, scripted

from sprint.timing import faults
from sprint.core.errors import UserError
from sprint.timing.faults import FaultPlan
from sprint.timing.wire import Splitter


def post(srv: FakeServer, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def sse_events(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().split("\n\n") if line.startswith("data: ")]


def completion(srv: FakeServer, **body) -> tuple[int, dict]:
    status, _, raw = post(srv, "/v1/completions", {"model": "test-model", "prompt": "a b c", **body})
    return status, json.loads(raw)


def test_word_pieces_join_back_and_count_words():
    text = "  the quick\n brown  fox  "
    pieces = Splitter().pieces(text)  # the server's tokens: whitespace-separated words
    assert "".join(pieces) == text
    assert len(pieces) == 4 == Splitter().count(text)


def test_models_lists_configured_names(scripted_server):
    srv = scripted_server(models=["m1", "m2"])
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", "/v1/models")
    body = json.loads(conn.getresponse().read())
    conn.close()
    assert [m["id"] for m in body["data"]] == ["m1", "m2"]
    assert srv.requests == [("models", {})]


def test_completion_usage_and_recorded_request(scripted_server):
    srv = scripted_server(lambda req, ep: "four five six")
    status, body = completion(srv, max_tokens=10)
    assert status == 200
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == ("four five six", "stop", None)
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    assert srv.requests == [("completions", {"model": "test-model", "prompt": "a b c", "max_tokens": 10})]


def test_stop_cuts_at_earliest_stop_string_and_names_it(scripted_server):
    srv = scripted_server(lambda req, ep: "step one END step two STOP three")
    _, body = completion(srv, max_tokens=50, stop=["STOP", "END"])
    choice = body["choices"][0]
    assert choice["text"] == "step one "
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "END")
    # as vLLM: the text stops before "END", the count includes the token that completed it
    assert body["usage"]["completion_tokens"] == 3


def test_max_tokens_truncates_and_defaults_to_16_on_completions(scripted_server):
    text = " ".join(f"w{i}" for i in range(40))
    srv = scripted_server(lambda req, ep: text)
    _, limited = completion(srv, max_tokens=5)
    _, default = completion(srv)
    assert limited["choices"][0]["text"] == "w0 w1 w2 w3 w4"
    assert limited["choices"][0]["finish_reason"] == "length"
    assert limited["usage"]["completion_tokens"] == 5
    assert default["usage"]["completion_tokens"] == 16


def test_more_than_four_stop_strings_is_http_400(scripted_server):
    srv = scripted_server()
    status, body = completion(srv, max_tokens=5, stop=["a", "b", "c", "d", "e"])
    assert status == 400
    assert "stop" in body["error"]["message"]


def test_unknown_model_is_404(scripted_server):
    srv = scripted_server()
    status, body = completion(srv, model="other", max_tokens=5)
    assert status == 404
    assert "other" in body["error"]["message"]


def test_chat_endpoint_counts_message_words(scripted_server):
    srv = scripted_server(lambda req, ep: f"endpoint {ep}")
    status, _, raw = post(
        srv,
        "/v1/chat/completions",
        {"model": "test-model", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 9},
    )
    body = json.loads(raw)
    assert status == 200
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "endpoint chat"}
    assert body["usage"]["prompt_tokens"] == 3


def test_streaming_sends_chunks_finish_usage_and_done(scripted_server):
    srv = scripted_server(lambda req, ep: "alpha beta gamma delta")
    status, headers, raw = post(
        srv,
        "/v1/completions",
        {"model": "test-model", "prompt": "x", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}},
    )
    events = sse_events(raw)
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == "alpha beta gamma"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_dropped_stream_has_no_finish_and_no_done(scripted_server):
    srv = scripted_server(scripted(Reply(text="one two three four five six", drop_stream_after=8)))
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    body = {"model": "test-model", "prompt": "x", "max_tokens": 50, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    with pytest.raises(http.client.IncompleteRead) as info:
        resp.read()
    conn.close()
    events = sse_events(info.value.partial)
    assert "[DONE]" not in events
    assert all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events)
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events) == "one two three"


def test_reset_closes_without_a_response(scripted_server):
    srv = scripted_server(scripted(Reply(reset=True), "fine"))
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        completion(srv, max_tokens=5)
    status, body = completion(srv, max_tokens=5)
    assert status == 200 and body["choices"][0]["text"] == "fine"


def test_scripted_status_headers_and_handler_errors(scripted_server):
    def broken(req, ep):
        raise RuntimeError("boom")

    srv = scripted_server(scripted(Reply(status=429, headers={"Retry-After": "7"}, error="slow down")))
    status, headers, raw = post(srv, "/v1/completions", {"model": "test-model", "prompt": "x", "max_tokens": 1})
    assert status == 429 and headers["Retry-After"] == "7"
    assert json.loads(raw)["error"]["message"] == "slow down"
    srv = scripted_server(broken)
    status, _ = completion(srv, max_tokens=5)
    assert status == 500 and isinstance(srv.errors[0], RuntimeError)


def test_api_key_is_enforced_when_set(scripted_server):
    srv = scripted_server(api_key="sk-right")
    wrong, _, _ = post(srv, "/v1/completions", {"model": "test-model", "prompt": "x", "max_tokens": 1}, {"Authorization": "Bearer sk-wrong"})
    right, _, _ = post(srv, "/v1/completions", {"model": "test-model", "prompt": "x", "max_tokens": 1}, {"Authorization": "Bearer sk-right"})
    assert (wrong, right) == (401, 200)


def test_max_in_flight_is_recorded():
    with FakeServer(scripted(Reply(text="ok", delay=0.3))) as srv:
        threads = [threading.Thread(target=completion, args=(srv,), kwargs={"max_tokens": 2}) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert srv.max_in_flight == 3 and srv.in_flight == 0


# --- FaultPlan ------------------------------------------------------------------------------


def test_fault_plan_is_deterministic_per_seed_and_counter():
    plan = FaultPlan(rate_5xx=0.2, rate_reset=0.1, rate_empty=0.1, seed=7)
    first = [plan.decide(i) for i in range(500)]
    assert first == [FaultPlan(rate_5xx=0.2, rate_reset=0.1, rate_empty=0.1, seed=7).decide(i) for i in range(500)]
    assert first != [FaultPlan(rate_5xx=0.2, rate_reset=0.1, rate_empty=0.1, seed=8).decide(i) for i in range(500)]
    assert plan.garbage(3) == plan.garbage(3) and plan.garbage(3) != plan.garbage(4)


def test_fault_plan_frequencies_follow_rates():
    plan = FaultPlan(rate_5xx=0.1, rate_429=0.05, rate_timeout=0.05, rate_garbage=0.2, seed=1)
    counts = Counter(plan.decide(i) for i in range(20000))
    assert counts[faults.SERVER_ERROR] / 20000 == pytest.approx(0.1, abs=0.01)
    assert counts[faults.RATE_LIMIT] / 20000 == pytest.approx(0.05, abs=0.01)
    assert counts[faults.TIMEOUT] / 20000 == pytest.approx(0.05, abs=0.01)
    assert counts[faults.GARBAGE] / 20000 == pytest.approx(0.2, abs=0.01)
    assert counts[None] / 20000 == pytest.approx(0.6, abs=0.015)
    assert not FaultPlan().active and plan.active
    assert FaultPlan(rate_reset=1.0).decide(12345) == faults.RESET


def test_fault_plan_validation_and_spec_parsing():
    with pytest.raises(ValueError):
        FaultPlan(rate_5xx=0.7, rate_429=0.7)
    with pytest.raises(ValueError):
        FaultPlan(rate_empty=-0.1)
    plan = FaultPlan.from_spec("5xx=0.1, 429=0.05,retry_after=0.2,seed=3,rate_garbage=0.01")
    assert plan == FaultPlan(rate_5xx=0.1, rate_429=0.05, retry_after=0.2, seed=3, rate_garbage=0.01)
    for bad in ("nonsense=1", "5xx", "5xx=abc", "5xx=0.9,429=0.9"):
        with pytest.raises(UserError):
            FaultPlan.from_spec(bad)


def test_server_applies_fault_plan_in_request_order(scripted_server):
    plan = FaultPlan(rate_5xx=0.3, rate_429=0.2, rate_empty=0.1, rate_garbage=0.1, retry_after=0.25, seed=5)
    srv = scripted_server(lambda req, ep: "clean answer", faults=plan)
    results = [completion(srv, max_tokens=10) for _ in range(40)]
    expected = [plan.decide(i) for i in range(40)]
    assert srv.faults_seen == expected
    for fault, (status, body) in zip(expected, results):
        if fault == faults.SERVER_ERROR:
            assert status == 500
        elif fault == faults.RATE_LIMIT:
            assert status == 429
        elif fault == faults.EMPTY:
            assert (body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == ("", "length")
            assert body["usage"]["completion_tokens"] == 0
        elif fault == faults.GARBAGE:
            assert status == 200 and body["choices"][0]["text"] not in ("", "clean answer")
        else:
            assert status == 200 and body["choices"][0]["text"] == "clean answer"
    assert {faults.SERVER_ERROR, faults.RATE_LIMIT, faults.EMPTY, faults.GARBAGE, None} <= set(expected)
