"""The latency model and the critical-path calculator, checked against hand computations."""

from __future__ import annotations

import random

import pytest

from sprint.timing.latency import LatencyModel, critical_path, critical_path_timeline
from sprint.format.trajectory import Execution, Phase, Trajectory, parse, render_prompt


def words(text: str) -> int:
    return len(text.split())


# a = 1 s, b = 0.1 s per prompt word, c = 1 s per generated word, no batching effect.
UNIT = LatencyModel(ttft_base_s=1.0, ttft_per_prompt_token_s=0.1, s_per_token=1.0, batch_slowdown=0.0)


def tiny() -> Trajectory:
    """Two phases (two prompts, then none) and a final answer; every tag is one word."""
    plan1 = f"a b {render_prompt('1.1', 'c d')} e {render_prompt('1.2', 'f')} g h"  # 12 words; prompts end at 6 and 10
    phase1 = Phase(1, plan1, [Execution("1.1", "x x x"), Execution("1.2", "y y y y y y y y")])
    phase2 = Phase(2, "i j k", [])
    return Trajectory("q1 q2", [phase1, phase2], "the answer is \\boxed{4}")


def test_model_defaults_and_formulas():
    m = LatencyModel()
    assert 0.005 <= m.s_per_token <= 0.03  # a 7B model on one H100 decodes tens of tokens per second per stream
    assert m.step(64) > m.step(1) and m.step(64) < 2.5 * m.step(1)
    m = LatencyModel(ttft_base_s=0.5, ttft_per_prompt_token_s=0.01, s_per_token=0.2, batch_slowdown=0.5)
    assert m.prefill(100) == pytest.approx(1.5)
    assert m.step(1) == pytest.approx(0.2) and m.step(3) == pytest.approx(0.4) and m.step(0) == pytest.approx(0.2)
    assert m.sequential_time(10, 100) == pytest.approx(1.5 + 10 * 0.2)
    with pytest.raises(ValueError):
        LatencyModel(s_per_token=-1)
    with pytest.raises(ValueError):
        LatencyModel(capacity=0)


def test_tiny_trajectory_barrier_by_hand():
    # context before phase 1: "<Question> q1 q2 </Question>" + "<think>" = 5 words
    # phase 1 planner: prompt 5 + "<Plan_1>" = 6 -> prefill 1.6; writes 12 plan words + "</Plan_1>" -> ends 1.6 + 13 = 14.6
    # executors see the whole plan: prompt 6 + 13 + "<Execution_1> <execution_1.k>" = 21 -> prefill 3.1
    #   1.1 writes 3 + 1 closing tag -> 14.6 + 3.1 + 4 = 21.7 ; 1.2 writes 8 + 1 -> 14.6 + 3.1 + 9 = 26.7
    # phase 1 rendered = 31 words -> context 36; phase 2 planner: prompt 37 -> 4.7 + (3 + 1) = 8.7 -> 35.4
    # phase 2 rendered = 11 words -> context 47; final: prompt 48 -> 5.8 + (4 + 1) = 10.8 -> 46.2
    timing = critical_path_timeline(tiny(), UNIT, words, "barrier")
    assert timing.phase_ends == pytest.approx([26.7, 35.4])
    assert timing.total == pytest.approx(46.2)
    starts = {(c.kind, c.label): (c.start, c.end, c.prompt_tokens, c.completion_tokens) for c in timing.calls}
    assert starts[("executor", "1.1")] == pytest.approx((14.6, 21.7, 21, 4))
    assert starts[("final", "final")] == pytest.approx((35.4, 46.2, 48, 5))


def test_tiny_trajectory_stream_by_hand():
    # 1.1 starts when the planner has written 6 words: 1.6 + 6 = 7.6; it sees 6 + 6 + 2 = 14 words -> 2.4; ends 7.6 + 2.4 + 4 = 14.0
    # 1.2 starts at 1.6 + 10 = 11.6; sees 6 + 10 + 2 = 18 -> 2.8; ends 11.6 + 2.8 + 9 = 23.4
    # phase 1 ends at max(plan end 14.6, 14.0, 23.4) = 23.4; phases 2 and the answer as in barrier (+8.7 +10.8)
    timing = critical_path_timeline(tiny(), UNIT, words, "stream")
    assert timing.phase_ends == pytest.approx([23.4, 32.1])
    assert timing.total == pytest.approx(42.9)
    assert critical_path(tiny(), UNIT, words, "stream") == pytest.approx(42.9)


def test_overhead_and_untagged_counts():
    # overhead adds 10 prompt words to each of the 4 calls on the path (planner 1, executor 1.2, planner 2, final)
    base = critical_path(tiny(), UNIT, words, "barrier")
    assert critical_path(tiny(), UNIT, words, "barrier", prompt_overhead_tokens=10) == pytest.approx(
        base + 4 * 10 * 0.1
    )
    # without closing tags: 4 fewer words generated on the path (</Plan_1>, </execution_1.2>, </Plan_2>, </Final_answer>)
    # and the executors' prompts still hold "</Plan_1>" (it is in the rendered plan they see)
    assert critical_path(tiny(), UNIT, words, "barrier", stop_tags=False) == pytest.approx(base - 4)


def test_prompts_at_the_end_make_both_schedules_equal():
    # One prompt per phase, at the very end of its plan: streaming cannot start it any earlier.
    phases = [
        Phase(1, "think about it " + render_prompt("1.1", "do the sum"), [Execution("1.1", "the sum is 4")]),
        Phase(2, "now check " + render_prompt("2.1", "check it"), [Execution("2.1", "it checks out fine")]),
    ]
    traj = Trajectory("what is 2+2", phases, "\\boxed{4}")
    no_prompt_cost = LatencyModel(0.5, 0.0, 0.1, 0.0)
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
