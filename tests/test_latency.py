"""The latency model and the one-GPU timeline of a problem, checked against hand computations."""

from __future__ import annotations

import random

import pytest

from sprint.latency.model import H100, H200, LatencyModel
from sprint.latency.simulate import critical_path, critical_path_timeline, sequential_timeline
from sprint.format.trajectory import Execution, Phase, Trajectory, parse, render_prompt


def words(text: str) -> int:
    return len(text.split())


# a = 1 s, b = 0.1 s per prompt word, c = 1 s per generated word, no batching effect, no prefix cache effect
# (a prefill of n new words after c cached ones costs 1 + 0.1 n whatever c: the earlier model's form).
UNIT = LatencyModel.simple(ttft_base_s=1.0, ttft_per_prompt_token_s=0.1, s_per_token=1.0, batch_slowdown=0.0)
# A step costs 1 s + 0.01 s per context word of every sequence decoding; a prefill at least 0.5 s, 0.1 s per new word.
KV = LatencyModel(step_base_s=1.0, step_per_seq_s=0.0, step_per_context_s=0.01, prefill_base_s=0.0,
                  prefill_floor_s=0.5, prefill_per_token_s=0.1, prefill_per_pair_s=0.0, gpu="hand")


def tiny() -> Trajectory:
    """Two phases (two prompts, then none) and a final answer; every tag is one word."""
    plan1 = f"a b {render_prompt('1.1', 'c d')} e {render_prompt('1.2', 'f')} g h"  # 12 words; prompts end at 6 and 10
    phase1 = Phase(1, plan1, [Execution("1.1", "x x x"), Execution("1.2", "y y y y y y y y")])
    phase2 = Phase(2, "i j k", [])
    return Trajectory("q1 q2", [phase1, phase2], "the answer is \\boxed{4}")


def small() -> Trajectory:
    """One phase of two prompts (plan: 7 words, the prompts end at words 4 and 7), executions of 2 and 4 words."""
    plan = f"a {render_prompt('1.1', 'c')} {render_prompt('1.2', 'd')}"
    return Trajectory("q", [Phase(1, plan, [Execution("1.1", "x x"), Execution("1.2", "y y y y")])], "\\boxed{4}")


def test_model_defaults_and_formulas():
    m = LatencyModel()
    assert m == H200 and m.gpu == "NVIDIA H200"
    assert 0.005 <= m.s_per_token <= 0.03  # a 7B model decodes tens of tokens per second per stream
    # 16 sequences at 16k context: the KV reads add most of a step (the H200 table: 12.05 ms vs 7.21 ms alone)
    assert m.step(16, 16 * 16384) * 1000 == pytest.approx(12.05, rel=0.05)
    assert m.step(1, 16384) * 1000 == pytest.approx(7.21, rel=0.05)
    assert H100.step(1, 0) > H200.step(1, 0) and H100.step_per_context_s > H200.step_per_context_s
    assert m.prefill(8192) * 1000 == pytest.approx(224.4, rel=0.05)  # the table's fresh 8k prefill
    assert m.prefill(3, 8000) == pytest.approx(m.prefill_floor_s)  # a few new tokens on a cached prefix: one step
    m = LatencyModel.simple(ttft_base_s=0.5, ttft_per_prompt_token_s=0.01, s_per_token=0.2, batch_slowdown=0.5)
    assert m.prefill(100) == pytest.approx(1.5)
    assert m.step(1) == pytest.approx(0.2) and m.step(3) == pytest.approx(0.4) and m.step(0) == pytest.approx(0.2)
    assert m.sequential_time(10, 100) == pytest.approx(1.5 + 10 * 0.2)
    # prefill: floor, per new token, per (new, context) pair; the decode of one sequence with its context growing
    m = LatencyModel(step_base_s=1.0, step_per_seq_s=0.5, step_per_context_s=0.01, prefill_base_s=0.2,
                     prefill_floor_s=0.3, prefill_per_token_s=0.1, prefill_per_pair_s=0.001)
    assert m.prefill(2) == pytest.approx(0.2 + 0.3)  # 0.2 + 0.002 under the floor
    assert m.prefill(10, 100) == pytest.approx(0.2 + 1.0 + 0.001 * 10 * 105)
    assert m.step(2, 300) == pytest.approx(1 + 1 + 3)
    assert m.decode_alone(3, 10) == pytest.approx(3 * 1.5 + 0.01 * (10 + 11 + 12))
    assert m.sequential_time(3, 10, cached_tokens=8) == pytest.approx(m.prefill(2, 8) + m.decode_alone(3, 10))
    with pytest.raises(ValueError):
        LatencyModel(step_base_s=-1)
    with pytest.raises(ValueError):
        LatencyModel(capacity=0)


def test_kv_model_barrier_by_hand():
    # context before phase 1: "<Question> q </Question>" + "<think>" = 4 words, nothing cached
    # planner: prompt 4 + "<Plan_1>" = 5, prefill max(0.5, 0.5) = 0.5; writes 7 + "</Plan_1>" = 8 words alone, step j
    #   at context 5 + j: 8 + 0.01 (5 + ... + 12) = 8.68 -> ends 9.18
    # executors: prompt 5 + 8 + "<Execution_1> <execution_1.k>" = 15, 13 cached, 2 new: prefill 0.5 -> decode from 9.68
    #   together (contexts 15 + 15): 3 steps 1.30 + 1.32 + 1.34 -> 1.1 (2 + closing tag) ends 13.64;
    #   1.2 alone at context 18: 1.18 + 1.19 -> ends 16.01
    # final: the phase rendered is 21 words -> prompt 4 + 21 + "<Final_answer>" = 26, 13 cached (the plan's prompt and the
    #   plan), 13 new: prefill 1.3; 2 words at context 26: 1.26 + 1.27 -> 16.01 + 1.3 + 2.53 = 19.84
    timing = critical_path_timeline(small(), KV, words, "barrier")
    assert timing.phase_ends == pytest.approx([16.01])
    assert timing.total == pytest.approx(19.84)
    calls = {c.label: c for c in timing.calls}
    assert (calls["1"].start, calls["1"].end, calls["1"].completion_tokens) == pytest.approx((0.0, 9.18, 8))
    assert (calls["1.1"].start, calls["1.1"].end, calls["1.1"].prompt_tokens, calls["1.1"].cached_tokens) == \
        pytest.approx((9.18, 13.64, 15, 13))
    assert calls["1.1"].first_token == pytest.approx(9.68 + 1.30)
    assert calls["final"].cached_tokens == 13 and calls["final"].end == pytest.approx(19.84)


def test_kv_model_stream_by_hand():
    # planner ready at 0.5, alone: 4 words (1.05 + 1.06 + 1.07 + 1.08) -> 4.76, it has written </prompt_1.1>:
    #   1.1's prompt 5 + 4 + 2 = 11, 9 cached -> ready 5.26; the planner's 5th word (1.09) ends at 5.85, then 1.1 joins
    # together (contexts 10 + 11, growing by 2 a step): 1.21 + 1.23 -> 8.29, the planner has written </prompt_1.2>:
    #   1.2's prompt 5 + 7 + 2 = 14, 12 cached -> ready 8.79
    # one more step together (contexts 12 + 13): 1.25 -> 9.54, both the plan (8 words) and 1.1 (3 words) end
    # 1.2 alone at context 14, 5 words: 1.14 + ... + 1.18 = 5.80 -> 15.34; the final answer as in barrier: + 3.83
    timing = critical_path_timeline(small(), KV, words, "stream")
    assert timing.phase_ends == pytest.approx([15.34])
    assert timing.total == pytest.approx(19.17)
    calls = {c.label: c for c in timing.calls}
    assert (calls["1.1"].start, calls["1.1"].end) == pytest.approx((4.76, 9.54))
    assert (calls["1.2"].start, calls["1.2"].end) == pytest.approx((8.29, 15.34))
    assert calls["1"].end == pytest.approx(9.54)


def test_sequential_timeline_by_hand():
    # prompt 4 words, none cached: prefill max(0.5, 0.4) = 0.5; 3 words at context 4: 1.04 + 1.05 + 1.06
    timing = sequential_timeline(KV, 3, 4)
    assert timing.total == pytest.approx(0.5 + 3.15)
    assert timing.calls[0].first_token == pytest.approx(0.5 + 1.04)
    assert sequential_timeline(KV, 3, 4, cached_tokens=3).total == pytest.approx(0.5 + 3.15)  # 1 new word: the floor


def test_overhead_in_the_prefix_cache_costs_only_its_kv_reads():
    base = critical_path(small(), KV, words, "barrier")
    # 10 words of agent prompt, cached: every call's context is 10 words longer (one step: +0.1 s per sequence)
    cached = critical_path(small(), KV, words, "barrier", prompt_overhead_tokens=10, overhead_cached=True)
    fresh = critical_path(small(), KV, words, "barrier", prompt_overhead_tokens=10)
    assert base < cached < fresh
    # 8 plan steps alone, 3 steps of two executors, 2 of one, 2 final steps: 8 + 6 + 2 + 2 = 18 sequence-steps
    assert cached - base == pytest.approx(18 * 0.1)
    # not cached: the first prefill computes 15 words instead of 5 (0.5 -> 1.5)
    assert fresh - cached == pytest.approx(1.0)


def test_tiny_trajectory_barrier_by_hand():
    # UNIT: a prefill costs 1 + 0.1 per new word; the planner's prompt, plan and tags stay in the cache
    # context before phase 1: "<Question> q1 q2 </Question>" + "<think>" = 5 words
    # phase 1 planner: prompt 5 + "<Plan_1>" = 6 new -> prefill 1.6; writes 12 plan words + "</Plan_1>" -> ends 14.6
    # executors see the whole plan: prompt 6 + 13 + "<Execution_1> <execution_1.k>" = 21, 2 new -> prefill 1.2
    #   1.1 writes 3 + 1 closing tag -> 14.6 + 1.2 + 4 = 19.8 ; 1.2 writes 8 + 1 -> 14.6 + 1.2 + 9 = 24.8
    # phase 1 rendered = 31 words -> context 36; phase 2 planner: prompt 37, 19 cached, 18 new -> 2.8 + (3 + 1) -> 31.6
    # phase 2 rendered = 11 words -> context 47; final: prompt 48, 41 cached, 7 new -> 1.7 + (4 + 1) -> 38.3
    timing = critical_path_timeline(tiny(), UNIT, words, "barrier")
    assert timing.phase_ends == pytest.approx([24.8, 31.6])
    assert timing.total == pytest.approx(38.3)
    starts = {(c.kind, c.label): (c.start, c.end, c.prompt_tokens, c.completion_tokens) for c in timing.calls}
    assert starts[("executor", "1.1")] == pytest.approx((14.6, 19.8, 21, 4))
    assert starts[("final", "final")] == pytest.approx((31.6, 38.3, 48, 5))


def test_tiny_trajectory_stream_by_hand():
    # the planner's steps end at 2.6, 3.6, ..., 14.6; 1.1 starts when it has written 6 words (7.6), prefills 2 new
    #   words (1.2) and joins the step that starts at 9.6: 4 words -> 13.6
    # 1.2 starts at 11.6 (10 words), ready at 12.8, joins at 13.6: 9 words -> 22.6
    # phase 1 ends at max(plan end 14.6, 13.6, 22.6) = 22.6; phase 2 and the answer as in barrier (+6.8 +6.7)
    timing = critical_path_timeline(tiny(), UNIT, words, "stream")
    assert timing.phase_ends == pytest.approx([22.6, 29.4])
    assert timing.total == pytest.approx(36.1)
    assert critical_path(tiny(), UNIT, words, "stream") == pytest.approx(36.1)


def test_overhead_and_untagged_counts():
    # overhead not cached: 10 more new prompt words for the first call only (the others find them in the cache)
    base = critical_path(tiny(), UNIT, words, "barrier")
    assert critical_path(tiny(), UNIT, words, "barrier", prompt_overhead_tokens=10) == pytest.approx(base + 10 * 0.1)
    # without closing tags: 4 fewer words generated on the path (</Plan_1>, </execution_1.2>, </Plan_2>, </Final_answer>);
    # the executors' prompts still hold "</Plan_1>" but no longer find it cached (+0.1), nor do the next planner's
    # "</Plan_1>" and the answer's "</Plan_2>" (+0.1 each)
    assert critical_path(tiny(), UNIT, words, "barrier", stop_tags=False) == pytest.approx(base - 4 + 0.3)


def test_prompts_at_the_end_make_both_schedules_equal():
    # One prompt per phase, at the very end of its plan: streaming cannot start it any earlier.
    phases = [
        Phase(1, "think about it " + render_prompt("1.1", "do the sum"), [Execution("1.1", "the sum is 4")]),
        Phase(2, "now check " + render_prompt("2.1", "check it"), [Execution("2.1", "it checks out fine")]),
    ]
    traj = Trajectory("what is 2+2", phases, "\\boxed{4}")
    no_prompt_cost = LatencyModel.simple(0.5, 0.0, 0.1, 0.0)
    barrier = critical_path(traj, no_prompt_cost, words, "barrier", stop_tags=False)
    stream = critical_path(traj, no_prompt_cost, words, "stream", stop_tags=False)
    assert stream == pytest.approx(barrier)
    # with the closing tag generated, barrier waits for "</Plan_p>": one word per phase
    assert critical_path(traj, no_prompt_cost, words, "barrier") - critical_path(
        traj, no_prompt_cost, words, "stream"
    ) == pytest.approx(2 * 0.1)


def random_trajectory(rng: random.Random) -> Trajectory:
    phases = []
    for p in range(1, rng.randint(1, 6) + 1):
        parts, execs = [], []
        for k in range(1, rng.randint(0, 5) + 1):
            parts.append(" ".join("w" for _ in range(rng.randint(0, 30))))
            parts.append(render_prompt(f"{p}.{k}", "do " * rng.randint(1, 10)))
            execs.append(Execution(f"{p}.{k}", "r " * rng.randint(1, 200)))
        parts.append("tail " * rng.randint(0, 20))
        phases.append(Phase(p, " ".join(parts).strip() or "plan", execs))
    return parse(Trajectory("a question", phases, "\\boxed{1}").render())


def test_stream_never_slower_than_barrier():
    rng = random.Random(7)
    model = LatencyModel()
    for _ in range(30):
        traj = random_trajectory(rng)
        barrier = critical_path(traj, model, words, "barrier")
        stream = critical_path(traj, model, words, "stream")
        assert 0 < stream <= barrier + 1e-12
        # never faster than the planner alone writing all plans and the answer
        planner_only = sum(model.prefill(0) + words(ph.plan) * model.s_per_token for ph in traj.phases)
        assert stream > planner_only


def test_bad_schedule_is_refused():
    with pytest.raises(ValueError, match="schedule"):
        critical_path(tiny(), UNIT, words, "eager")
