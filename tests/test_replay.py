"""The replay server: recorded answers to the orchestrator's exact requests, timing, faults."""

from __future__ import annotations

import dataclasses

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from sprint.cli import build_parser, main
from sprint.core.errors import UserError
from sprint.core.resources import prompt_file
from sprint.timing.faults import FaultPlan
from sprint.latency.model import H100, H200, LatencyModel
from sprint.llm.client import LLMClient, LLMConfig, Sampling
from sprint.timing.replay import ReplayRequestError, load_library, read_request, resolve
from sprint.core.options import config_from
from sprint.timing.replay_server import ReplayConfig, replay_server
from sprint.format.trajectory import Execution, Phase, Trajectory, parse, render_prompt, render_question
from sprint.timing.wire import Splitter

REPO_ROOT = Path(__file__).resolve().parents[1]
AGENT = prompt_file("agent").read_text(encoding="utf-8").strip()
FAST = LatencyModel.simple(ttft_base_s=0.0, ttft_per_prompt_token_s=0.0, s_per_token=0.0, batch_slowdown=0.0)
MODEL = "sprint-replay"


def sums() -> Trajectory:
    plan1 = (
        "We need the sum, so compute the two parts separately.\n"
        + render_prompt("1.1", "Compute 2 + 3 and show the steps.")
        + "\nAlso the other part.\n"
        + render_prompt("1.2", "Compute 10 - 4 carefully.")
        + "\nThen add the results."
    )
    phase1 = Phase(
        1,
        plan1,
        [Execution("1.1", "2 + 3 = 5, because counting on from 2 gives 3, 4, 5."), Execution("1.2", "10 - 4 = 6.")],
    )
    phase2 = Phase(2, "Based on execution_1.1, execution_1.2:\nThe total is 5 + 6 = 11, nothing left to run.", [])
    return Trajectory("What is (2 + 3) + (10 - 4)?", [phase1, phase2], "So the answer is $\\boxed{11}$.")


def unfinished() -> Trajectory:
    plan = "Multiply. " + render_prompt("1.1", "Compute 7 times 6.")
    return Trajectory("Compute 7 * 6.", [Phase(1, plan, [Execution("1.1", "7 * 6 = 42.")])], None)


@pytest.fixture(scope="module")
def traj_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trajectories")
    (out / "planner_trajectory_sums.txt").write_text(sums().render() + "\n", encoding="utf-8")
    (out / "nested").mkdir()
    (out / "nested" / "planner_trajectory_mul.txt").write_text(unfinished().render(), encoding="utf-8")
    baseline = (
        render_question(sums().question) + "\n\n<think>\nAdd them up: 5 and 6 make 11.\n</think>\n\n$\\boxed{11}$"
    )
    (out / "base_model_trajectory_sums.txt").write_text(baseline, encoding="utf-8")
    (out / "notes.txt").write_text("not a trajectory at all", encoding="utf-8")
    return out


# --- the requests an orchestrator sends (raw mode) ---------------------------------------------


def prefix(traj: Trajectory) -> str:
    return AGENT + "\n\n" + render_question(traj.question) + "\n\n<think>\n"


def past(traj: Trajectory, p: int) -> str:
    return "".join(ph.render() + "\n\n" for ph in traj.phases[: p - 1])


def planner_prompt(traj: Trajectory, p: int) -> str:
    return prefix(traj) + past(traj, p) + f"<Plan_{p}>\n"


def executor_prompt(traj: Trajectory, p: int, name: str, stream: bool = False) -> str:
    phase = traj.phases[p - 1]
    if stream:  # the executor sees the plan up to its own prompt
        end = next(pr.end for pr in phase.prompts if pr.name == name)
        plan = f"<Plan_{p}>\n" + phase.plan[:end]
    else:
        plan = phase.render_plan()
    return prefix(traj) + past(traj, p) + plan + f"\n\n<Execution_{p}>\n<execution_{name}>\n"


def client(srv, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=retries, timeout=10)


def complete(c: openai.OpenAI, prompt: str, stop: list[str], **kw):
    return c.completions.create(model=MODEL, prompt=prompt, stop=stop, max_tokens=kw.pop("max_tokens", 1000), **kw)


def collect(stream) -> tuple[str, list[str], list, object]:
    text, pieces, finishes, usage = "", [], [], None
    for chunk in stream:
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.text:
                pieces.append(choice.text)
                text += choice.text
            if choice.finish_reason:
                finishes.append((choice.finish_reason, getattr(choice, "stop_reason", None)))
    return text, pieces, finishes, usage


def words(text: str) -> int:
    return len(text.split())


# --- loading and reading requests ------------------------------------------------------------


def test_library_reads_folders_and_run_folders(traj_dir: Path, tmp_path: Path):
    lib = load_library([traj_dir])
    assert len(lib.trajectories) == 2 and len(lib.baselines) == 1
    assert any("notes" in s for s in lib.skipped)
    assert lib.names[" ".join(sums().question.split())] == "planner_trajectory_sums"

    run = tmp_path / "run"
    run.mkdir()
    rows = [
        {"id": "a", "status": "ok", "trajectory": sums().render()},
        {"id": "b", "status": "error", "error": "timeout", "trajectory": None},
        {"id": "c", "status": "ok", "question": unfinished().question, "trajectory": unfinished().render_body()},
    ]
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    lib = load_library([run, traj_dir])  # the same questions twice: first one wins
    assert len(lib.trajectories) == 2 and lib.duplicates == 2
    assert lib.names[" ".join(unfinished().question.split())] == "run/c"


def test_library_refuses_folders_without_trajectories(tmp_path: Path):
    (tmp_path / "x.txt").write_text("hello", encoding="utf-8")
    with pytest.raises(UserError, match="no recorded trajectories"):
        load_library([tmp_path])
    with pytest.raises(UserError, match="does not exist"):
        load_library([tmp_path / "missing"])


def test_read_request_roles():
    t = sums()
    view = read_request(planner_prompt(t, 2))
    assert (view.role, view.phase, view.opened, view.question) == ("planner", 2, True, t.question)
    assert len(view.past.phases) == 1
    view = read_request(executor_prompt(t, 1, "1.2", stream=True))
    assert (view.role, view.phase, view.prompt) == ("executor", 1, "1.2")
    view = read_request(prefix(t) + past(t, 3).rstrip())  # ends at </Execution_2>: the model writes <Plan_3>
    assert (view.role, view.phase, view.opened, view.separator) == ("planner", 3, False, "\n\n")
    view = read_request(prefix(t))  # ends with "<think>\n"
    assert (view.role, view.phase, view.separator) == ("planner", 1, "")
    view = read_request(prefix(t) + past(t, 3) + "<Final_answer>\n")
    assert (view.role, view.prompt) == ("planner", "final")  # the planner's forced final answer
    chat = (
        "<｜begin▁of▁sentence｜><｜User｜>"
        + AGENT
        + "\n\n"
        + render_question(t.question)
        + "\n\n<｜Assistant｜><think>\n<Plan_1>\n"
    )
    assert read_request(chat).phase == 1
    with pytest.raises(ReplayRequestError, match="ends inside a block") as err:
        read_request(planner_prompt(t, 1) + "We need the sum")
    assert err.value.status == 400
    with pytest.raises(ReplayRequestError, match="no <Question>"):
        read_request("<Plan_1>\n")


def test_resolve_continuations(traj_dir: Path):
    lib = load_library([traj_dir])
    t = sums()
    own_tag = resolve(lib, prefix(t) + past(t, 2).rstrip())
    assert own_tag.continuation.startswith(f"\n\n<Plan_2>\n{t.phases[1].plan}\n</Plan_2>")
    beyond = resolve(lib, planner_prompt(t, 3))  # the recording ends with an answer after phase 2
    assert (beyond.role, beyond.prompt) == ("planner", "final") and beyond.continuation.startswith("<Final_answer>\nSo the answer")
    base = resolve(lib, render_question(t.question) + "\n<think>\n", baseline=True)
    assert base.role == "baseline" and base.continuation.startswith("Add them up")


# --- the server, spoken to with the openai client ---------------------------------------------


def test_planner_executor_and_final_requests(traj_dir: Path):
    t = sums()
    with replay_server([traj_dir], FAST, tokenizer="words") as srv:
        c = client(srv)
        r = complete(c, planner_prompt(t, 1), ["</Plan_1>", "</Final_answer>"])
        choice = r.choices[0]
        assert choice.text.strip() == t.phases[0].plan
        assert (choice.finish_reason, choice.stop_reason) == ("stop", "</Plan_1>")
        # usage: whitespace words of the prompt, and of the plan plus the generated stop string
        assert r.usage.prompt_tokens == words(planner_prompt(t, 1))
        assert r.usage.completion_tokens == words(t.phases[0].plan) + 1
        assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

        for name, barrier in (("1.1", True), ("1.2", False)):
            r = complete(c, executor_prompt(t, 1, name, stream=not barrier), [f"</execution_{name}>"])
            assert r.choices[0].text.strip() == t.phases[0].execution(name).text

        r = complete(c, planner_prompt(t, 3), ["</Plan_3>", "</Final_answer>"])
        assert r.choices[0].text == "<Final_answer>\nSo the answer is $\\boxed{11}$.\n"
        assert r.choices[0].stop_reason == "</Final_answer>"
        r = complete(c, prefix(t) + past(t, 3) + "<Final_answer>\n", ["</Final_answer>"])
        assert r.choices[0].text.strip() == t.final_answer

        r = complete(c, prefix(t) + past(t, 2).rstrip(), ["</Plan_2>"])  # the model opens the plan itself
        assert r.choices[0].text == f"\n\n<Plan_2>\n{t.phases[1].plan}\n"

        r = complete(c, planner_prompt(t, 1), ["</Plan_1>"], max_tokens=5)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5
        assert r.choices[0].text.split() == t.phases[0].plan.split()[:5]
        stats = srv.stats()
    assert stats.answered == {"planner": 3, "executor": 2, "final": 2}
    assert not stats.errors


def test_streaming_concatenates_to_the_same_text(traj_dir: Path):
    t = sums()
    prompt = planner_prompt(t, 1)
    with replay_server([traj_dir], FAST, tokenizer="words") as srv:
        c = client(srv)
        whole = complete(c, prompt, ["</Plan_1>"])
        stream = complete(c, prompt, ["</Plan_1>"], stream=True, stream_options={"include_usage": True})
        text, pieces, finishes, usage = collect(stream)
        plain, _, _, plain_usage = collect(complete(c, prompt, ["</Plan_1>"], stream=True))
    assert text == whole.choices[0].text == plain
    # one chunk per token with visible text: the plan's words, then the newline before the stop string
    assert all(len(p.split()) <= 1 for p in pieces)
    assert words(t.phases[0].plan) <= len(pieces) <= usage.completion_tokens
    assert finishes == [("stop", "</Plan_1>")]
    assert usage.completion_tokens == whole.usage.completion_tokens and usage.prompt_tokens == whole.usage.prompt_tokens
    assert plain_usage is not None  # usage comes even when the client did not ask for it


def test_chat_endpoint_and_baseline_model(traj_dir: Path):
    t = sums()
    with replay_server([traj_dir], FAST, tokenizer="words") as srv:
        c = client(srv)
        assert {m.id for m in c.models.list().data} == {MODEL, "sprint-replay-baseline"}
        messages = [
            {"role": "user", "content": AGENT + "\n\n" + render_question(t.question) + "\n\n"},
            {"role": "assistant", "content": "<think>\n" + t.phases[0].render() + "\n\n<Plan_2>\n"},
        ]
        r = c.chat.completions.create(model=MODEL, messages=messages, stop=["</Plan_2>"], max_tokens=200)
        assert r.choices[0].message.content.strip() == t.phases[1].plan
        assert r.usage.completion_tokens > 0
        base = c.completions.create(
            model="sprint-replay-baseline", prompt=render_question(t.question) + "\n\n<think>\n", max_tokens=200
        )
        assert base.choices[0].text.startswith("Add them up") and "\\boxed{11}" in base.choices[0].text


def test_unknown_requests_get_clear_4xx(traj_dir: Path):
    t, u = sums(), unfinished()
    with replay_server([traj_dir], FAST, tokenizer="words") as srv:
        c = client(srv)
        cases = [
            (
                planner_prompt(Trajectory("What is 1 + 1?"), 1),
                openai.NotFoundError,
                "no recorded trajectory for the question 'What is 1 \\+ 1\\?'",
            ),
            (
                executor_prompt(t, 1, "1.2").replace("execution_1.2>", "execution_1.7>"),
                openai.NotFoundError,
                "no execution_1.7",
            ),
            (
                prefix(t) + "<Plan_5>\nx\n</Plan_5>\n\n<Execution_5>\n<execution_5.1>\n",
                openai.NotFoundError,
                "has no phase 5",
            ),
            (planner_prompt(u, 2), openai.NotFoundError, "no final answer"),
            (planner_prompt(t, 1) + "We need", openai.BadRequestError, "ends inside a block"),
            ("just some text", openai.BadRequestError, "no <Question>"),
        ]
        for prompt, error, message in cases:
            with pytest.raises(error, match=message) as exc:
                complete(c, prompt, ["</Plan_1>"])
            assert 400 <= exc.value.status_code < 500
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            c.completions.create(model="gpt-4", prompt=planner_prompt(t, 1), max_tokens=5)
        with pytest.raises(openai.BadRequestError, match="at most 4 stop"):
            complete(c, planner_prompt(t, 1), ["a", "b", "c", "d", "e"])
        assert sum(srv.stats().errors.values()) == len(cases) + 2


# --- timing -------------------------------------------------------------------------------------


def test_timing_follows_the_latency_model(traj_dir: Path):
    t = sums()
    model = LatencyModel.simple(ttft_base_s=0.05, ttft_per_prompt_token_s=0.0005, s_per_token=0.006, batch_slowdown=0.0)
    prompt = planner_prompt(t, 1)
    with replay_server([traj_dir], model, tokenizer="words") as srv:
        c = client(srv)
        complete(c, prompt, ["</Plan_1>"], max_tokens=1)  # warm the connection pool
        started = time.monotonic()
        r = complete(c, prompt, ["</Plan_1>"])
        elapsed = time.monotonic() - started
        expected = model.sequential_time(r.usage.completion_tokens, r.usage.prompt_tokens)
        assert expected > 0.25
        # never faster than the model; slower only by HTTP and scheduling (generous for loaded CI machines)
        assert expected - 0.005 <= elapsed <= expected + 0.5

        started = time.monotonic()
        arrivals = []
        for chunk in complete(c, prompt, ["</Plan_1>"], stream=True):
            if chunk.choices and chunk.choices[0].text:
                arrivals.append(time.monotonic() - started)
        first = model.prefill(r.usage.prompt_tokens) + model.step(1)
        assert first - 0.005 <= arrivals[0] <= first + 0.5
        # the tokens arrive at the decode pace, not all at once (deadlines are kept, so delays do not add up)
        assert arrivals[-1] - arrivals[0] >= (len(arrivals) - 1) * model.s_per_token - 0.005
        pace = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
        assert pace <= 2.5 * model.s_per_token  # upper bounds are generous: a loaded machine only adds delay


def test_time_scale_speeds_everything_up(traj_dir: Path):
    t = sums()
    slow = LatencyModel.simple(ttft_base_s=5.0, ttft_per_prompt_token_s=0.01, s_per_token=0.5, batch_slowdown=0.0)
    with replay_server([traj_dir], slow, tokenizer="words", time_scale=0.01) as srv:
        c = client(srv)
        started = time.monotonic()
        r = complete(c, planner_prompt(t, 1), ["</Plan_1>"])
        elapsed = time.monotonic() - started
    expected = 0.01 * slow.sequential_time(r.usage.completion_tokens, r.usage.prompt_tokens)
    assert expected > 0.2  # 100x faster than the 25 s the model says
    assert expected - 0.005 <= elapsed <= expected + 0.5


async def _concurrently(srv, prompts: list[tuple[str, str]], stream: bool = False) -> list[str]:
    async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0, timeout=10) as c:

        async def one(prompt: str, stop: str) -> str:
            if not stream:
                r = await c.completions.create(model=MODEL, prompt=prompt, stop=[stop], max_tokens=1000)
                return r.choices[0].text
            text = ""
            async for chunk in await c.completions.create(
                model=MODEL, prompt=prompt, stop=[stop], max_tokens=1000, stream=True
            ):
                text += "".join(ch.text for ch in chunk.choices)
            return text

        return await asyncio.gather(*(one(p, s) for p, s in prompts))


def test_batching_slows_decoding_and_capacity_queues(traj_dir: Path):
    t = sums()
    request = (executor_prompt(t, 1, "1.1"), "</execution_1.1>")
    n = words(t.phases[0].execution("1.1").text) + 1  # with the stop string's token
    batched = LatencyModel.simple(ttft_base_s=0.0, ttft_per_prompt_token_s=0.0, s_per_token=0.02, batch_slowdown=1.0)
    with replay_server([traj_dir], batched, tokenizer="words") as srv:
        asyncio.run(_concurrently(srv, [request, request]))
        calls = srv.stats().calls
    # two sequences decode together: every step takes 2 × 20 ms (alone it would be n × 20 ms);
    # the first and last step or two may run alone, as the requests do not arrive at the same instant
    for served in calls:
        assert n * 0.04 - 0.045 <= served.call.end - served.admitted <= n * 0.04 + 0.15
    queued = LatencyModel.simple(
        ttft_base_s=0.0, ttft_per_prompt_token_s=0.0, s_per_token=0.02, batch_slowdown=0.0, capacity=1
    )
    with replay_server([traj_dir], queued, tokenizer="words") as srv:
        texts = asyncio.run(_concurrently(srv, [request, request]))
        stats = srv.stats()
    assert texts[0] == texts[1] and texts[0].strip() == t.phases[0].execution("1.1").text
    assert stats.max_running == 1
    ends = sorted(served.call.end - min(c.arrival for c in stats.calls) for served in stats.calls)
    assert n * 0.02 - 0.005 <= ends[0] <= n * 0.02 + 0.15
    assert 2 * n * 0.02 - 0.005 <= ends[1] <= 2 * n * 0.02 + 0.2  # the second waited for the first


def test_many_concurrent_streams(traj_dir: Path):
    t = sums()
    requests = [(executor_prompt(t, 1, name), f"</execution_{name}>") for name in ("1.1", "1.2")] * 40
    model = LatencyModel.simple(ttft_base_s=0.05, ttft_per_prompt_token_s=0.0, s_per_token=0.01, batch_slowdown=0.0)
    with replay_server([traj_dir], model, tokenizer="words") as srv:
        texts = asyncio.run(_concurrently(srv, requests, stream=True))
        stats = srv.stats()
    assert [x.strip() for x in texts] == [t.phases[0].execution(n).text for n in ("1.1", "1.2")] * 40
    assert stats.max_decoding >= 40


def test_a_client_that_hangs_up_stops_its_generation(traj_dir: Path):
    t = sums()
    slow = LatencyModel.simple(ttft_base_s=0.0, ttft_per_prompt_token_s=0.0, s_per_token=0.1, batch_slowdown=0.0)
    with replay_server([traj_dir], slow, tokenizer="words") as srv:
        impatient = openai.OpenAI(base_url=srv.base_url, api_key="EMPTY", max_retries=0, timeout=0.2)
        with pytest.raises(openai.APITimeoutError):
            complete(impatient, executor_prompt(t, 1, "1.1"), ["</execution_1.1>"])  # would take 1.5 s
        deadline = time.monotonic() + 1.0
        while srv.stats().abandoned == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = srv.stats()
    assert stats.abandoned == 1 and not stats.calls


# --- faults --------------------------------------------------------------------------------------


def test_fault_plan_errors_delays_and_dropped_streams(traj_dir: Path):
    t = sums()
    prompt, stop = executor_prompt(t, 1, "1.1"), ["</execution_1.1>"]
    with replay_server([traj_dir], FAST, tokenizer="words", faults=FaultPlan(rate_5xx=1.0)) as srv:
        c = client(srv)
        with pytest.raises(openai.InternalServerError, match="injected server error"):
            complete(c, prompt, stop)
    with replay_server(
        [traj_dir], FAST, tokenizer="words", faults=FaultPlan(rate_timeout=1.0, timeout_delay=0.3)
    ) as srv:
        c = client(srv)
        started = time.monotonic()
        r = complete(c, prompt, stop)
        assert time.monotonic() - started >= 0.3
        assert r.choices[0].text.strip() == t.phases[0].execution("1.1").text
    with replay_server([traj_dir], FAST, tokenizer="words", faults=FaultPlan(rate_truncated=1.0)) as srv:
        c = client(srv)
        received: list[str] = []
        with pytest.raises(openai.APIConnectionError):  # the stream ends without its terminating chunk
            for chunk in complete(c, prompt, stop, stream=True):
                assert all(ch.finish_reason is None for ch in chunk.choices)
                received += [ch.text for ch in chunk.choices]
        assert 0 < len("".join(received)) < len(t.phases[0].execution("1.1").text)
        with pytest.raises(openai.APIConnectionError):
            complete(c, prompt, stop)  # the non-streaming body is cut half way
    with replay_server([traj_dir], FAST, tokenizer="words", faults=FaultPlan(rate_reset=1.0)) as srv:
        c = client(srv)
        with pytest.raises(openai.APIConnectionError):
            complete(c, prompt, stop)
        assert srv.stats().faults == {"reset": 1}


def test_llm_client_recovers_from_injected_faults(traj_dir: Path):
    t = sums()
    plan = FaultPlan(rate_5xx=0.25, rate_truncated=0.25, rate_reset=0.1, seed=3)
    jobs = [(executor_prompt(t, 1, n), n) for n in ("1.1", "1.2")] * 4

    async def run(base_url: str) -> list[str]:
        config = LLMConfig(base_url=base_url, model=MODEL, max_retries=12, backoff=0.005, timeout=5)
        async with LLMClient(config) as llm:
            done = await asyncio.gather(
                *(
                    llm.complete(p, Sampling(max_tokens=500, stop=(f"</execution_{n}>",)), on_text=lambda s: None)
                    for p, n in jobs
                )
            )
        return [d.text.strip() for d in done]

    with replay_server([traj_dir], FAST, tokenizer="words", faults=plan) as srv:
        texts = asyncio.run(run(srv.base_url))
        stats = srv.stats()
    assert texts == [t.phases[0].execution(n).text for _, n in jobs]
    assert sum(stats.faults.values()) > 0 and stats.requests == len(jobs) + sum(stats.faults.values())


# --- tokenizer, CLI, generator -------------------------------------------------------------------


def test_splitter_pieces_join_back():
    text = "  Let $x^2 = 4$;\n\n then  x = ±2 — done. "
    words_split = Splitter("words")
    assert "".join(words_split.pieces(text)) == text and len(words_split.pieces(text)) == words_split.count(text)


def test_tokenizer_splitter_counts_real_tokens(shared_data: Path):
    tok = Splitter(str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"))
    text = "Let $x^2 = 4$; then x = ±2 — done. <prompt_1.1> 計算 </prompt_1.1>"
    pieces = tok.pieces(text)
    assert "".join(pieces) == text
    assert len(pieces) == tok.count(text) > words(text)


def test_cli_flags_build_the_server_config(capsys: pytest.CaptureFixture):
    args = build_parser(["replay-server"]).parse_args(
        ["replay-server", "d", "--ms-per-token", "20", "--ttft-per-token", "0.1", "--capacity", "3", "--faults", "5xx=0.5,seed=2"]
    )
    config = config_from(ReplayConfig, args)
    # the default model (H200) with the parts the flags give replaced
    assert config.latency == dataclasses.replace(H200, prefill_per_token_s=0.0001, prefill_per_pair_s=0.0, prefill_floor_s=0.0,
                                                 step_base_s=0.02, step_per_seq_s=0.0, capacity=3)
    slow = config_from(ReplayConfig, build_parser(["replay-server"]).parse_args(
        ["replay-server", "d", "--latency-from", "h100", "--batch-slowdown", "0.5", "--ms-per-context-token", "0"])).latency
    assert slow is not None and slow.step(2, 1000) == pytest.approx(H100.s_per_token * 1.5) and slow.gpu == H100.gpu
    assert config.faults == FaultPlan(rate_5xx=0.5, seed=2) and config.port == 8000
    assert config_from(ReplayConfig, build_parser(["replay-server"]).parse_args(["replay-server", "d"])).faults is None
    for bad in (["--time-scale", "-1"], ["--ms-per-token", "-3"], ["--faults", "nonsense=1"]):
        assert main(["replay-server", "d", *bad]) == 2
        assert capsys.readouterr().err.startswith("error: ")


def test_cli_serves_prints_its_url_and_reports_bad_input(traj_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture):
    assert main(["replay-server", str(tmp_path / "nowhere"), "--tokenizer", "words"]) == 2
    assert "does not exist" in capsys.readouterr().err
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sprint",
            "replay-server",
            str(traj_dir),
            "--port",
            "0",
            "--tokenizer",
            "words",
            "--time-scale",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert "replay server at http://127.0.0.1:" in line and "2 trajectories" in line
        url = line.split(" at ", 1)[1].split()[0]
        r = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=5).completions.create(
            model=MODEL, prompt=planner_prompt(sums(), 1), stop=["</Plan_1>"], max_tokens=300
        )
        assert r.choices[0].text.strip() == sums().phases[0].plan
    finally:
        proc.terminate()
        proc.wait(timeout=5)


def test_generated_benchmark_trajectories_are_realistic(tmp_path: Path):
    out = tmp_path / "synthetic"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "make_trajectories.py"), str(out), "--n", "50", "--seed", "1"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    lib = load_library([out])
    assert len(lib.trajectories) == 50 and len(lib.baselines) == 50
    lengths = []
    for path in sorted(out.glob("planner_trajectory_*.txt")):
        traj = parse(path.read_text(encoding="utf-8"), strict=True)
        assert 1 <= len(traj.phases) <= 11
        assert all(0 <= len(ph.prompts) <= 8 for ph in traj.phases)
        assert all(ph.execution(pr.name) for ph in traj.phases for pr in ph.prompts)
        assert "\\boxed{" in (traj.final_answer or "")
        lengths.append(words(traj.render_body()))
    assert min(lengths) >= 100 and max(lengths) >= 2000
    assert len({len(lib.trajectories[k].phases) for k in lib.trajectories}) >= 6  # a spread of depths
    gold = (out / "gold.csv").read_text(encoding="utf-8").splitlines()
    assert gold[0] == "id,question,answer" and len(gold) == 51
