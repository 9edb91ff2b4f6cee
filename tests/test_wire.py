"""sprint.timing.wire: vLLM's cut of a generation (stop strings, max_tokens, token counts) and the JSON it sends.

The rule both stand-in servers share, checked against the scripted server and the replay server
as well: the response text ends before the stop string, and completion_tokens counts every token
generated up to and including the one that completed the stop string (as vLLM reports usage).
"""

from __future__ import annotations

import http.client
import json

import pytest
from tests.fake_server import ScriptedServer

from sprint.timing import wire
from sprint.timing.wire import Generation, Splitter, generate

WORDS = Splitter()


def test_stop_string_tokens_are_counted_but_not_shown():
    gen = generate("a b\n</Plan_1> after", {"stop": ["</Plan_1>"], "max_tokens": 50}, "completions", WORDS)
    assert (gen.text, gen.finish_reason, gen.stop_reason) == ("a b\n", "stop", "</Plan_1>")
    # tokens: "a", " b", "\n</Plan_1>": the last one completed the stop string and is counted
    assert gen.tokens == 3 and gen.pieces == ["a", " b", "\n"]
    assert "".join(gen.pieces) == gen.text


def test_stop_string_glued_to_a_word_counts_that_word_once():
    gen = generate("one two</s> three", {"stop": "</s>"}, "chat", WORDS)
    assert (gen.text, gen.tokens, gen.stop_reason) == ("one two", 2, "</s>")


def test_include_stop_str_in_output_shows_it_with_the_same_count():
    request = {"stop": ["END"], "max_tokens": 50, "include_stop_str_in_output": True}
    gen = generate("x y END z", request, "completions", WORDS)
    assert (gen.text, gen.tokens, gen.finish_reason) == ("x y END", 3, "stop")


def test_earliest_stop_string_wins_and_no_stop_means_eos():
    gen = generate("p q STOP r END", {"stop": ["END", "STOP"], "max_tokens": 50}, "completions", WORDS)
    assert (gen.text, gen.stop_reason, gen.tokens) == ("p q ", "STOP", 3)
    # vLLM checks after each token: the stop string completed first wins, even if another began earlier
    inner = generate("go xabc yz", {"stop": ["abc", "b"], "max_tokens": 50}, "completions", WORDS)
    assert (inner.text, inner.stop_reason) == ("go xa", "b")
    tie = generate("go abc", {"stop": ["bc", "abc"], "max_tokens": 50}, "completions", WORDS)
    assert (tie.text, tie.stop_reason) == ("go a", "bc")  # both end together: the one listed first
    plain = generate("p q r", {"max_tokens": 50}, "completions", WORDS)
    assert (plain.text, plain.finish_reason, plain.stop_reason, plain.tokens) == ("p q r", "stop", None, 3)


def test_budget_ending_before_the_stop_string_is_length_with_max_tokens_counted():
    request = {"stop": ["</Plan_1>"], "max_tokens": 2}
    gen = generate("a b\n</Plan_1> after", request, "completions", WORDS)
    assert (gen.text, gen.finish_reason, gen.stop_reason, gen.tokens) == ("a b", "length", None, 2)


def test_last_allowed_token_completing_the_stop_string_is_a_stop():
    gen = generate("a b\n</Plan_1> after", {"stop": ["</Plan_1>"], "max_tokens": 3}, "completions", WORDS)
    assert (gen.text, gen.finish_reason, gen.stop_reason, gen.tokens) == ("a b\n", "stop", "</Plan_1>", 3)


def test_completions_default_to_16_tokens_chat_to_no_limit():
    text = " ".join(f"w{i}" for i in range(40))
    assert generate(text, {}, "completions", WORDS).tokens == wire.COMPLETIONS_DEFAULT_MAX_TOKENS == 16
    assert generate(text, {}, "chat", WORDS).tokens == 40


def test_stop_error_and_error_body():
    assert wire.stop_error({"stop": ["a", "b", "c", "d"]}) is None
    assert wire.stop_error({"stop": list("abcde")}) == "at most 4 stop sequences are supported, got 5"
    body = wire.error_body(429, "slow down")["error"]
    assert (body["type"], body["code"], body["message"]) == ("RateLimitError", 429, "slow down")


def test_wire_bodies_and_stream_events():
    gen = Generation("hi there", "stop", "END", ["hi", " there", ""])
    usage = wire.usage(4, gen.tokens)
    assert usage == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    chat = wire.Wire.for_request("chat", "9", {"model": "m", "stream": True}, 123)
    assert (chat.ident, chat.object) == ("chatcmpl-9", "chat.completion.chunk")
    assert chat.opening()[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    apart = chat.closing(gen, usage, separate_usage=True)
    assert apart[-1] == b"[DONE]" and apart[1]["choices"] == [] and apart[1]["usage"] == usage
    assert apart[0]["choices"][0]["finish_reason"] == "stop" and apart[0]["choices"][0]["stop_reason"] == "END"
    riding = chat.closing(gen, usage, separate_usage=False)
    assert len(riding) == 2 and riding[0]["usage"] == usage
    assert "usage" not in chat.closing(gen, None, separate_usage=True)[0]
    text = wire.Wire.for_request("completions", "1", {"model": "m"}, 5)
    body = text.body(gen, usage)
    assert (body["object"], body["choices"][0]["text"], body["usage"]) == ("text_completion", "hi there", usage)
    assert "usage" not in text.body(gen, None) and text.opening() == []
    event = wire.sse([{"a": 1}, b"[DONE]"])
    payload = b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    assert event == b"1e\r\n" + payload + b"\r\n" and len(payload) == 0x1E and wire.sse([]) == b""


@pytest.mark.parametrize("stream", [False, True])
def test_scripted_server_reports_the_same_count(stream: bool, scripted_server: ScriptedServer):
    srv = scripted_server(lambda req, ep: "a b\n</Plan_1> after")
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    body = {"model": "test-model", "prompt": "x", "max_tokens": 50, "stop": ["</Plan_1>"], "stream": stream,
            "stream_options": {"include_usage": True}}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    raw = conn.getresponse().read().decode()
    conn.close()
    if stream:
        events = [json.loads(e[len("data: "):]) for e in raw.split("\n\n") if e.startswith("data: {")]
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
        usage = events[-1]["usage"]
    else:
        reply = json.loads(raw)
        text, usage = reply["choices"][0]["text"], reply["usage"]
    assert text == "a b\n" and usage["completion_tokens"] == 3
