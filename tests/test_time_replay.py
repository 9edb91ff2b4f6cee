"""time-replay's call plan against what the orchestrator really sent (scripted server), its timing of
barrier and stream releases, the summary figures, and the latency fit on synthetic timings."""

from __future__ import annotations

import dataclasses

import asyncio
import heapq
import json
import random
import re
from collections import Counter as Multiset
from pathlib import Path

import pytest

from sprint import cli
from sprint.inference.baseline import BaselineConfig, baseline
from sprint.latency.model import LatencyModel, load_latency_model
from sprint.core.calls import CallRecord
from sprint.timing.latency_fit import decode_concurrency, fit_latency, summarize_timing, timing_table
from sprint.timing.replay_server import ReplayConfig
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.timing.time_replay import (
    Engine,
    PlannedCall,
    ProblemPlan,
    Step,
    TimeReplayConfig,
    load_recorded,
    plans_for,
    replay_problem,
)
from sprint.format.trajectory import load_tokenizer
from tests.fake_server import FakeServer, Reply, ScriptedServer

AGENT = "Solve it in phases."
PLAN_1 = "Split it.\n<prompt_1.1> Add 2 and 3. </prompt_1.1>\nThen check.\n<prompt_1.2> Count up. </prompt_1.2>\nDone."
PLAN_2 = "Based on execution_1.1:\nOne more look.\n<prompt_2.1> Verify the sum once more please. </prompt_2.1>"
EXECUTOR_RE = re.compile(r"<execution_(\d+\.\d+)>\n$")


def words(text: str) -> int:
    """The fake server's token count: whitespace-separated words."""
    return len(text.split())


def _data(tmp_path: Path, n: int) -> str:
    path = tmp_path / "data.jsonl"
    rows = [{"problem": f"What is 2+{i}?", "answer": str(2 + i), "unique_id": f"p{i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class Script:
    """A planner writing two phases (2 prompts, then 1) and an answer; the first plan of phase 2 of
    problem 0 rambles past the token limit once (so it is redrawn); executors answer by name."""

    def __init__(self) -> None:
        self.rambled = False

    def __call__(self, body: dict, endpoint: str) -> str | Reply:
        prompt = body["prompt"]
        m = EXECUTOR_RE.search(prompt)
        if m:
            name = m.group(1)
            return f"result of {name} is " + "five " * (3 + int(name[-1])) + f"\n</execution_{name}>"
        if prompt.endswith("<Final_answer>\n"):
            return "So it is \\boxed{5}.\n</Final_answer>"
        if "<Plan_2>" in prompt:
            return "<Final_answer>\nSo it is \\boxed{5}.\n</Final_answer>"
        if "<Plan_1>" in prompt:
            if "2+0" in prompt and not self.rambled:
                self.rambled = True
                return "<Plan_2>\n" + "on and on " * 40
            return f"<Plan_2>\n{PLAN_2}\n</Plan_2>\n\n<Execution_2>"
        return f"<Plan_1>\n{PLAN_1}\n</Plan_1>\n\n<Execution_1>"


def _orchestrate(tmp_path: Path, srv: FakeServer, schedule: str, n: int = 2, **extra: object) -> Path:
    (tmp_path / "agent.txt").write_text(AGENT + "\n")
    settings: dict = dict(
        planner_model="test-model", planner_server_url=srv.base_url, out_dir=str(tmp_path / f"run-{schedule}"),
        data=_data(tmp_path, n), prompt_mode="raw", agent_prompt=str(tmp_path / "agent.txt"),
        planner_max_tokens=60, max_tokens=60, max_retries=0, timeout=20.0, schedule=schedule, planner_temperature=0.6,
    )
    cfg = OrchestrationConfig(**{**settings, **extra})
    orchestrate(cfg, progress=False)
    return Path(cfg.out_dir)


def _plans(run: Path, schedule: str) -> list[ProblemPlan]:
    cfg = TimeReplayConfig(run=str(run), server_url="http://unused/v1", model="m")
    return plans_for(load_recorded(str(run), "sprint", cfg), schedule, words, None)


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]


# ---- the call plan ----------------------------------------------------------------------------


@pytest.mark.parametrize("schedule,mode", [("barrier", "raw"), ("stream", "raw"), ("barrier", "chat")])
def test_call_plan_is_exactly_what_the_orchestrator_sent(tmp_path: Path, shared_data: Path, schedule: str, mode: str,
                                                         scripted_server: ScriptedServer) -> None:
    chat = {"prompt_mode": "chat", "tokenizer": str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b")}
    srv = scripted_server(Script())
    run = _orchestrate(tmp_path, srv, schedule, **(chat if mode == "chat" else {}))
    assert srv.errors == []
    sent = [body["prompt"] for _, body in srv.completion_requests]
    if mode == "chat":  # the user turn went through the model's chat template
        assert all(p.startswith("<｜User｜>") for p in sent)
    plans = _plans(run, schedule)
    assert [p.lengths for p in plans] == ["recorded", "recorded"]
    # the same contexts, as many times each (the redrawn plan of phase 2 was sent twice)
    assert Multiset(c.context for p in plans for c in p.calls) == Multiset(sent)
    roles = {p.id: [(c.call.role, c.call.phase, c.call.prompt, c.call.draw) for c in p.calls] for p in plans}
    assert roles["p0"] == [("planner", 1, None, 1), ("executor", 1, "1.1", 1), ("executor", 1, "1.2", 1),
                           ("planner", 2, None, 1), ("planner", 2, None, 2), ("executor", 2, "2.1", 1),
                           ("planner", 3, None, 1)]
    assert len(roles["p1"]) == 6  # no redraw
    # forced lengths: the engine's own counts, call by call
    for plan, record in zip(sorted(plans, key=lambda p: p.id), sorted(_records(run), key=lambda r: r["id"])):
        recorded = sorted((c["role"], c["phase"], c["prompt"] or "", c["draw"], c["completion_tokens"])
                          for c in record["calls"])
        planned = sorted((c.call.role, c.call.phase, c.call.prompt or "", c.call.draw, c.tokens) for c in plan.calls)
        assert planned == recorded
    redrawn = next(c for c in plans[0].calls if c.call.phase == 2 and c.call.draw == 1)
    assert redrawn.tokens == 60  # cut at the planner's token limit, as recorded


def test_stream_release_points_are_where_each_prompt_closed(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    srv = scripted_server(Script())
    run = _orchestrate(tmp_path, srv, "stream", n=1)
    [plan] = _plans(run, "stream")
    by_name = {c.call.prompt: c for c in plan.calls if c.call.role == "executor"}
    # "<Plan_1>", "Split", "it.", "<prompt_1.1>", "Add", "2", "and", "3.", "</prompt_1.1>": 9 words
    assert by_name["1.1"].release == 9
    assert by_name["1.2"].release == 9 + 6  # "Then check. <prompt_1.2> Count up. </prompt_1.2>"
    assert by_name["2.1"].release == words("<Plan_2>\n" + PLAN_2)
    # stream contexts stop at the executor's own prompt, closed; barrier ones hold the whole plan
    assert by_name["1.1"].context.endswith("<Plan_1>\nSplit it.\n<prompt_1.1> Add 2 and 3. </prompt_1.1>"
                                           "\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n")
    [barrier] = _plans(run, "barrier")
    assert all(c.release is None for c in barrier.calls)
    assert next(c for c in barrier.calls if c.call.prompt == "1.1").context.endswith(
        "Done.\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n")


def test_forced_final_answer_is_its_own_call(tmp_path: Path, scripted_server: ScriptedServer) -> None:
    srv = scripted_server(Script())
    run = _orchestrate(tmp_path, srv, "barrier", n=1, max_phases=2)
    [plan] = _plans(run, "barrier")
    final = plan.calls[-1]
    assert (final.call.role, final.call.phase, final.call.prompt) == ("planner", 2, "final")  # the forced answer
    assert final.context.endswith("</Execution_1>\n\n<Final_answer>\n")
    assert final.context in [body["prompt"] for _, body in srv.completion_requests]


def test_authors_layout_counts_lengths_from_the_text(tmp_path: Path) -> None:
    text = ("<Question>\nWhat is 1+1?\n</Question>\n\n<Plan_1>\nGo.\n<prompt_1.1> Add one and one. </prompt_1.1>\n</Plan_1>"
            "\n\n<Execution_1>\n<execution_1.1>\nIt is two.\n</execution_1.1>\n</Execution_1>\n\n"
            "<Final_answer>\nSo \\boxed{2}.\n</Final_answer>")
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "planner_trajectory_7.txt").write_text(text)
    (tmp_path / "agent.txt").write_text(AGENT)
    cfg = TimeReplayConfig(run=str(logs), server_url="http://unused/v1", model="m", agent_prompt=str(tmp_path / "agent.txt"))
    [plan] = plans_for(load_recorded(str(logs), "sprint", cfg), "stream", words, None)
    assert plan.lengths == "counted"
    head = AGENT + "\n\n<Question>\nWhat is 1+1?\n</Question>\n\n<think>\n"
    planner, executor, answer = plan.calls
    assert planner.context == head and planner.tokens == words("<Plan_1>\nGo.\n<prompt_1.1> Add one and one. </prompt_1.1>\n</Plan_1>")
    assert executor.context == head + "<Plan_1>\nGo.\n<prompt_1.1> Add one and one. </prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n"
    assert executor.tokens == words("It is two.\n</execution_1.1>") and executor.release == 8  # <Plan_1> Go. <prompt_1.1> Add one and one. </prompt_1.1>
    assert answer.call.role == "planner" and answer.call.phase == 2 and answer.tokens == words("<Final_answer>\nSo \\boxed{2}.\n</Final_answer>")


# ---- replaying on a server --------------------------------------------------------------------


def _forced(body: dict, endpoint: str) -> Reply:
    """A server that writes exactly max_tokens words, as vLLM does with min_tokens = max_tokens."""
    return Reply(text=" ".join(["tok"] * int(body["max_tokens"])))


def _engine(srv: FakeServer, shared_data: Path) -> Engine:
    tok = load_tokenizer(str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"))
    return Engine(srv.base_url, "test-model", tok, 20.0, 0.6, 0.95)


def _planned(role: str, phase: int, prompt: str | None, context: str, tokens: int,
             release: int | None = None) -> PlannedCall:
    return PlannedCall(CallRecord(role, phase, prompt, completion_tokens=tokens), context, release)


def _one_phase(release: tuple[int | None, int | None]) -> ProblemPlan:
    planner = _planned("planner", 1, None, "plan context", 30)
    executors = [_planned("executor", 1, "1.1", "context 1", 5, release[0]),
                 _planned("executor", 1, "1.2", "context 2", 5, release[1])]
    return ProblemPlan("x", "t", [Step([planner], executors), Step([_planned("planner", 2, None, "final ctx", 4)])],
                       "recorded")


@pytest.mark.parametrize("release", [(None, None), (5, 20)])
def test_executors_start_at_their_release_point(shared_data: Path, release: tuple,
                                                scripted_server: ScriptedServer) -> None:
    srv = scripted_server(_forced, chunk_delay=0.02)
    async def go() -> list:
        engine = _engine(srv, shared_data)
        try:
            return await replay_problem(engine, _one_phase(release), "salt")
        finally:
            await engine.aclose()

    measured = asyncio.run(go())
    calls = [m.call for m in measured]
    planner, ex1, ex2, final = calls[0], *sorted(calls[1:3], key=lambda c: c.prompt or ""), calls[3]
    assert [c.completion_tokens for c in calls] == [30, 5, 5, 4] == [m.planned.tokens for m in measured]
    assert final.start >= max(ex1.end, ex2.end)  # the next phase waits for every executor
    bodies = [b for _, b in srv.completion_requests]
    assert all(b["min_tokens"] == b["max_tokens"] and b["ignore_eos"] is True and b["cache_salt"] == "salt" for b in bodies)
    assert all(isinstance(b["prompt"], list) and all(isinstance(i, int) for i in b["prompt"]) for b in bodies)
    if release == (None, None):  # barrier: both after the plan is complete
        assert ex1.start >= planner.end and ex2.start >= planner.end
    else:  # stream: after 5 and 20 of the planner's 30 tokens (20 ms apart), before it ends
        assert planner.first_token < ex1.start < ex2.start < planner.end
        assert ex2.start - ex1.start > 0.15


# ---- summary and latency fit ------------------------------------------------------------------


def _call(start: float, end: float, ttft: float, prompt: int = 100, cached: int | None = 50, n: int = 10) -> dict:
    return {"start": start, "end": end, "first_token": start + ttft, "ttft": ttft, "prompt_tokens": prompt,
            "cached_tokens": cached, "completion_tokens": n, "forced_tokens": n, "error": None}


def test_summary_pairs_problems_and_buckets_by_baseline_length() -> None:
    def problems(seconds: dict[str, float], tokens: dict[str, int]) -> list[dict]:
        return [{"id": i, "seconds": s, "output_tokens": tokens[i], "calls": [_call(0, s, 0.1 * s)]} for i, s in seconds.items()]

    tokens = {"a": 1000, "b": 3000, "c": 9000}
    timing = {"methods": {
        "barrier": {"problems": problems({"a": 1.0, "b": 2.0, "c": 3.0}, tokens)},
        "stream": {"problems": problems({"a": 1.0, "b": 1.0, "c": 2.0}, tokens)},
        "baseline": {"problems": problems({"a": 2.0, "b": 4.0, "c": 6.0, "z": 9.0}, {**tokens, "z": 5})},
    }}
    s = summarize_timing(timing, resamples=200)
    assert s["calls"] == 10 and s["forced_ok"] == 10  # every method's calls
    assert s["methods"]["barrier"]["cache_hit_ratio"] == pytest.approx(0.5)
    assert s["methods"]["barrier"]["ttft_share"] == pytest.approx(0.1)
    vs = s["vs_baseline"]["barrier"]
    assert vs["problems"] == 3 and vs["speedup"] == pytest.approx(12 / 6) and vs["saved_seconds"] == pytest.approx(2.0)
    assert set(vs["buckets"]) == {"<2000", "2000-4000", ">8000"}
    assert vs["buckets"][">8000"]["speedup"] == pytest.approx(2.0)
    lo, hi = vs["speedup_ci"]
    assert lo <= 2.0 <= hi
    assert s["stream_vs_barrier"]["speedup"] == pytest.approx(6 / 4)


def simulate(model: LatencyModel, arrivals: list[tuple[float, int, int]]) -> list[CallRecord]:
    """An engine that behaves as the latency model says, per-call clocks as in the replay server:
    prefill from arrival, then one token per step, each step `model.step(sequences decoding now,
    their contexts summed)`, a sequence's context being its prompt + the tokens it has made."""
    events = [(t + model.prefill(p), 0, i) for i, (t, p, n) in enumerate(arrivals)]
    heapq.heapify(events)
    decoding, contexts, left, first, end = 0, 0, {}, {}, {}
    while events:
        t, kind, i = heapq.heappop(events)
        if kind == 0:
            decoding += 1
            contexts += arrivals[i][1]
            left[i] = arrivals[i][2]
        else:
            left[i] -= 1
            contexts += 1
            first.setdefault(i, t)
        if left[i] == 0:
            decoding -= 1
            contexts -= arrivals[i][1] + arrivals[i][2]
            end[i] = t
            continue
        heapq.heappush(events, (t + model.step(decoding, contexts), 1, i))
    return [CallRecord("executor", 1, prompt_tokens=arrivals[i][1], completion_tokens=arrivals[i][2], start=arrivals[i][0],
                       end=end[i], first_token=first[i]) for i in range(len(arrivals))]


TERMS = ("step_base_s", "step_per_seq_s", "prefill_base_s", "prefill_per_token_s")


@pytest.mark.parametrize("truth", [
    LatencyModel.simple(0.06, 4e-5, 0.0073, 0.008),  # H100-like, no KV term
    LatencyModel.simple(0.02, 3e-4, 0.004, 0.05),  # a CPU-like engine: slow prefill, strong batch effect
    dataclasses.replace(LatencyModel.simple(0.03, 5e-5, 0.006, 0.01), step_per_context_s=4e-7),  # KV reads matter
])
def test_fit_recovers_known_parameters_within_5_percent(truth: LatencyModel) -> None:
    rng = random.Random(3)
    t, arrivals = 0.0, []
    for _ in range(250):
        t += rng.expovariate(1 / 0.25)
        arrivals.append((t, rng.randint(20, 3000), rng.randint(2, 300)))
    fit = fit_latency([simulate(truth, arrivals)])
    if truth.step_per_context_s == 0:
        for name in TERMS:
            assert getattr(fit.model, name) == pytest.approx(getattr(truth, name), rel=0.05), name
        assert fit.model.step_per_context_s < 1e-8  # 1 % of a 1 ms step at 1,000 tokens of context
    else:  # the per-sequence and the context terms go together (more sequences, more context): the steps must agree (time-averaged loads: within 2.5 %)
        assert fit.model.step_per_context_s == pytest.approx(truth.step_per_context_s, rel=0.1)
        for k, contexts in ((1, 100), (1, 3000), (4, 6000), (8, 12000)):
            assert fit.model.step(k, contexts) == pytest.approx(truth.step(k, contexts), rel=0.025), (k, contexts)
        assert fit.model.prefill(1000) == pytest.approx(truth.prefill(1000), rel=0.05)
    assert fit.duration_mape < 0.02 and fit.concurrency_range[1] > 3 and not fit.note


def test_fit_without_overlap_says_the_per_sequence_term_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    truth = LatencyModel.simple(0.05, 1e-4, 0.01, 0.0)
    arrivals = [(10.0 * i, 100 * i + 10, 20 + i) for i in range(6)]
    fit = fit_latency([simulate(truth, arrivals)])
    assert fit.model.s_per_token == pytest.approx(0.01, rel=1e-6) and fit.model.step_per_seq_s == 0.0
    assert "not identified" in fit.note
    assert decode_concurrency(simulate(truth, arrivals)) == pytest.approx([1.0] * 6)
    path = tmp_path / "latency.json"
    path.write_text(json.dumps(fit.as_dict()))
    assert load_latency_model(path) == fit.model
    # the replay server simulates the fitted hardware (its --capacity still applies)
    served = ReplayConfig(latency_from=str(path), capacity=3).latency
    assert served is not None and served.s_per_token == fit.model.s_per_token and served.capacity == 3
    assert cli.main(["replay-server", str(tmp_path), "--latency-from", str(tmp_path / "missing.json")]) == 2
    assert "cannot read the latency model" in capsys.readouterr().err


def test_a_latency_file_of_the_earlier_form_still_loads(tmp_path: Path) -> None:
    """fit-latency's files before the KV term: the same prefills and steps as they gave."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"latency_model": {"ttft_base_s": 0.03, "ttft_per_prompt_token_s": 1e-4,
                                                  "s_per_token": 0.008, "batch_slowdown": 0.02, "capacity": None}}))
    model = load_latency_model(path)
    assert model.prefill(100) == pytest.approx(0.03 + 0.01)
    assert model.step(1, 5000) == pytest.approx(0.008) and model.step(4, 5000) == pytest.approx(0.008 * 1.06)


def test_fit_latency_command_writes_the_model(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    truth = LatencyModel.simple(0.03, 1e-4, 0.008, 0.02)
    rng = random.Random(1)
    arrivals = [(0.05 * i, rng.randint(10, 500), rng.randint(5, 50)) for i in range(40)]
    calls = [{"start": c.start, "first_token": c.first_token, "end": c.end, "prompt_tokens": c.prompt_tokens,
              "completion_tokens": c.completion_tokens, "error": None} for c in simulate(truth, arrivals)]
    (tmp_path / "timing.json").write_text(json.dumps({"methods": {"barrier": {"problems": [], "run_calls": calls}}}))
    assert cli.main(["fit-latency", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step_base_s" in out and "fit error" in out
    assert load_latency_model(tmp_path / "latency.json").s_per_token == pytest.approx(0.008, rel=0.05)
    assert cli.main(["fit-latency", str(tmp_path / "nowhere")]) == 2


def test_bad_options_are_user_errors(tmp_path: Path) -> None:
    assert cli.main(["time-replay", str(tmp_path), "--server", "http://127.0.0.1:9/v1", "--model", "m",
                     "--concurrency", "0"]) == 2
    assert cli.main(["time-replay", str(tmp_path / "missing"), "--server", "http://127.0.0.1:9/v1", "--model", "m"]) == 2


# ---- the real vLLM CPU server -----------------------------------------------------------------


@pytest.mark.vllm
def test_real_vllm_honours_forced_lengths_and_reports_cache_hits(tmp_path: Path, vllm_server, shared_data: Path,
                                                                 capsys: pytest.CaptureFixture,
                                                                 scripted_server: ScriptedServer) -> None:
    from sprint.timing.time_replay import time_replay

    srv = scripted_server(Script())
    run = _orchestrate(tmp_path, srv, "barrier", n=3)
    (tmp_path / "agent.txt").write_text(AGENT + "\n")
    bcfg = BaselineConfig(model="test-model", server_url=srv.base_url, out_dir=str(tmp_path / "base"),
                          data=_data(tmp_path, 3), prompt_mode="raw", agent_prompt=str(tmp_path / "agent.txt"),
                          max_tokens=300, max_retries=0)
    baseline(bcfg, progress=False)
    tokenizer = str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b")
    cfg = TimeReplayConfig(run=str(run), server_url=vllm_server.base_url, model=vllm_server.served_model_name,
                           baseline=str(tmp_path / "base"), out_dir=str(tmp_path / "timing"), tokenizer=tokenizer,
                           warmup=1, resamples=200)
    timing = time_replay(cfg)
    s = timing["summary"]
    table = timing_table(timing)
    print("\n" + table)  # the measured SPRINT-vs-sequential table (pytest -s shows it)
    assert f"forced lengths honoured {s['calls']}/{s['calls']} calls" in table
    assert s["calls"] == s["forced_ok"] == 2 * 19 + 3  # two schedules x (7 + 6 + 6 calls) + 3 baseline calls
    for method in ("barrier", "stream", "baseline"):
        assert s["methods"][method]["problems"] == 3 and s["methods"][method]["failed_calls"] == 0
        assert s["methods"][method]["cached_tokens"] is not None
    # executors share their planner's prompt: the engine reports those blocks as cached
    assert s["methods"]["barrier"]["cache_hit_ratio"] > 0.2
    assert s["vs_baseline"]["barrier"]["speedup"] is not None
    saved = json.loads((tmp_path / "timing" / "timing.json").read_text())
    first = saved["methods"]["barrier"]["problems"][0]["calls"][0]
    assert first["prompt_tokens"] > 0 and first["completion_tokens"] == first["forced_tokens"]
    assert "## Seconds on a real engine" in (tmp_path / "timing" / "report.md").read_text()


# ---- the command end to end (scripted server), the viewer, the GPU script ---------------------


def _recorded_runs(tmp_path: Path, n: int = 2) -> tuple[Path, Path]:
    with FakeServer(Script()) as srv:
        run = _orchestrate(tmp_path, srv, "barrier", n=n)
        bcfg = BaselineConfig(model="test-model", server_url=srv.base_url, out_dir=str(tmp_path / "base"),
                              data=_data(tmp_path, n), prompt_mode="raw", agent_prompt=str(tmp_path / "agent.txt"),
                              max_tokens=300, max_retries=0)
        baseline(bcfg, progress=False)
    return run, tmp_path / "base"


def test_command_writes_timing_and_report(tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture,
                                          scripted_server: ScriptedServer) -> None:
    from sprint.viewer.timeline import from_calls

    run, base = _recorded_runs(tmp_path)
    out = tmp_path / "timing"
    srv = scripted_server(_forced)
    code = cli.main(["time-replay", str(run), "--server", srv.base_url, "--model", "test-model", "--baseline", str(base),
                     "--tokenizer", str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"),
                     "--out", str(out), "--warmup", "1", "--resamples", "100"])
    printed = capsys.readouterr().out
    assert code == 0
    assert "forced lengths honoured 28/28 calls" in printed  # 2 schedules x (7 + 6) SPRINT calls + 2 baseline
    assert re.search(r"speedup of stream over the baseline: [\d.]+x", printed)
    timing = json.loads((out / "timing.json").read_text())
    assert set(timing["methods"]) == {"barrier", "stream", "baseline"}
    problem = timing["methods"]["stream"]["problems"][0]
    bars = from_calls(problem["calls"], "measured", origin=0.0).bars
    assert [b.call.prompt for b in bars if b.role == "executor"][:2] == ["1.1", "1.2"]
    assert max(b.end for b in bars) == pytest.approx(problem["seconds"], abs=0.05)
    assert "| baseline |" in (out / "report.md").read_text()
    assert cli.main(["time-replay", str(run), "--server", "http://127.0.0.1:9/v1", "--model", "m",
                     "--tokenizer", str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"), "--out", str(out)]) == 2
    assert "cannot reach" in capsys.readouterr().err


def test_gpu_script_dry_run_builds_the_7b_shape_and_prints_its_commands(tmp_path: Path, shared_data: Path) -> None:
    import os
    import subprocess

    from sprint.llm.serve import default_python

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "DRY_RUN": "1", "SPRINT_LOCAL_DATA": str(shared_data), "MODEL_DIR": str(tmp_path / "shape"),
           "OUT_DIR": str(tmp_path / "out"), "TOKENIZER": str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"),
           "RUN": "outputs/sprint", "BASELINE": "outputs/baseline"}
    done = subprocess.run(["bash", str(root / "scripts" / "time_on_gpus.sh")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((tmp_path / "shape" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"], config["vocab_size"]) == (
        3584, 28, 4, 152064)
    assert (tmp_path / "shape" / "tokenizer.json").is_file()
    assert "7.616B parameters" in done.stdout
    if default_python().exists():  # transformers' Qwen2 on the meta device: no memory allocated
        assert "7,615,616,512 parameters on the meta device" in done.stdout
    serve = next(line for line in done.stdout.splitlines() if "vllm.entrypoints.openai.api_server" in line)
    for flag in ("--load-format dummy", "--enable-prefix-caching", "--enable-prompt-tokens-details", "--dtype bfloat16"):
        assert flag in serve
    replay = next(line for line in done.stdout.splitlines() if " time-replay " in line)
    assert "outputs/sprint" in replay and "--baseline outputs/baseline" in replay and "--schedule both" in replay
    assert " fit-latency " in done.stdout
    assert not (tmp_path / "out" / "vllm.log").exists()  # a dry run starts nothing


def test_run_script_times_then_fits(tmp_path: Path, shared_data: Path, scripted_server: ScriptedServer) -> None:
    import os
    import subprocess
    import sys

    run, base = _recorded_runs(tmp_path, n=1)
    root = Path(__file__).resolve().parents[1]
    srv = scripted_server(_forced)
    env = {**os.environ, "PYTHON": sys.executable, "RUN": str(run), "BASELINE": str(base), "SERVER_URL": srv.base_url,
           "MODEL": "test-model", "TOKENIZER": str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b"),
           "SCHEDULE": "stream", "OUT_DIR": str(tmp_path / "out")}
    done = subprocess.run(["bash", str(root / "run_time_replay.sh"), "--warmup", "0"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "forced lengths honoured 8/8 calls" in done.stdout  # 7 stream calls (a redrawn plan) + 1 baseline call
    assert "step_base_s" in done.stdout and (tmp_path / "out" / "latency.json").is_file()
    bodies = [b for _, b in srv.completion_requests]
    assert all(b["model"] == "test-model" for b in bodies) and len(bodies) == 8
