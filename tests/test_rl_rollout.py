"""One SPRINT rollout through the orchestration loop with an in-process engine (no ms-swift needed).

The ms-swift scheduler around it is tested in test_rl_scheduler.py (RL venv); this checks the
piece it wraps: the loop's calls through `EngineClient`, what is kept for training, the facts.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from sprint.core.errors import UserError
from sprint.llm.client import Sampling
from sprint.format.prompt_format import EXECUTOR_STOPS, FINAL_STOPS, PLANNER_STOPS
from sprint.rl.rollout import Generation, RolloutConfig, problem_from_row, run_rollout, without_stop


def words(text: str) -> int:
    return len(text.split())


class Engine:
    """Answers like a SPRINT model would; executors take 50 ms so overlap can be seen."""

    def __init__(self, plan: str, answer: str) -> None:
        self.plan, self.answer = plan, answer
        self.calls: list[tuple[list[dict], Sampling]] = []
        self.in_flight = self.max_in_flight = 0

    async def __call__(self, messages: list[dict], sampling: Sampling) -> Generation:
        self.calls.append((messages, sampling))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            assistant = messages[-1]["content"]
            if sampling.stop == EXECUTOR_STOPS:
                await asyncio.sleep(0.05)
                name = assistant.rsplit("<execution_", 1)[1].split(">", 1)[0]
                text = f"result of {name}"
            elif sampling.stop == FINAL_STOPS:
                text = self.answer
            else:
                text = self.plan if "<Plan_1>" not in assistant else f"<Final_answer>\n{self.answer}\n"
            return Generation(text=text, token_ids=list(range(words(text))), finish_reason="stop", prompt_tokens=7)
        finally:
            self.in_flight -= 1


ROW = {"question": "What is 2+3+4+5?", "task": "math", "problem_id": "p1", "gold": json.dumps("14"),
       "reference_tokens": 40}
PLAN = "<Plan_1>\nSplit.\n<prompt_1.1> Add 2 and 3. </prompt_1.1>\n<prompt_1.2> Add 4 and 5. </prompt_1.2>\n"


def test_rollout_runs_the_loop_and_keeps_every_call_for_training():
    engine = Engine(PLAN, "\\boxed{14}")
    cfg = RolloutConfig.from_env({"SPRINT_RL_PLANNER_MAX_TOKENS": "50", "SPRINT_RL_EXECUTOR_MAX_TOKENS": "30"})
    rollout = asyncio.run(run_rollout(ROW, cfg, engine, words, temperature=0.8, top_p=0.95))
    stops = [s.stop for _, s in engine.calls]
    assert stops == [PLANNER_STOPS, EXECUTOR_STOPS, EXECUTOR_STOPS, PLANNER_STOPS]
    assert [s.max_tokens for _, s in engine.calls] == [50, 30, 30, 50]
    assert all(s.seed is None and s.temperature == 0.8 and s.top_p == 0.95 for _, s in engine.calls)
    assert engine.max_in_flight == 2  # the phase's two executors at once
    assert [(s.role, s.phase, s.prompt) for s in rollout.samples] == [
        ("planner", 1, None), ("executor", 1, "1.1"), ("executor", 1, "1.2"), ("planner", 2, None)]
    assert rollout.samples[0].prefix == "<think>\n" and rollout.samples[0].messages[-1]["content"] == "<think>\n"
    assert {s.prefix[-16:] for s in rollout.samples[1:3]} == {"<execution_1.1>\n", "<execution_1.2>\n"}
    infos = rollout.infos
    assert infos["status"] == "ok" and infos["num_prompts"] == 2 and infos["executed_prompts"] == 2
    assert infos["num_turns"] == 4 and (infos["planner_calls"], infos["executor_calls"]) == (2, 2)
    assert infos["generated_tokens"] == sum(words(s.generation.text) for s in rollout.samples)
    # plan "Split. Add 2 and 3. Add 4 and 5." 9 words; prompt 1.2 ends the plan: 9 + "result of 1.2" 3 = 12;
    # final "\boxed{14}" 1 -> 13
    assert infos["sequential_tokens"] == 13
    assert rollout.record["correct"] is True  # orchestration's own grading agrees


def test_phase_limit_forces_the_answer_and_env_config_is_checked():
    engine = Engine("<Plan_1>\nThinking without prompts.\n", "\\boxed{14}")
    cfg = RolloutConfig.from_env({"SPRINT_RL_MAX_PHASES": "5"}, max_phases=2)  # swift's --max_turns wins
    rollout = asyncio.run(run_rollout(ROW, cfg, engine, words, temperature=1.0, top_p=1.0))
    # phase 1 plans (no prompt), phase 2 = the limit: the final answer is pre-filled and forced
    assert [s.stop for _, s in engine.calls] == [PLANNER_STOPS, FINAL_STOPS]
    assert engine.calls[1][0][-1]["content"].endswith("<Final_answer>\n")
    assert rollout.infos["forced_final"] is True and rollout.samples[-1].prompt == "final"
    with pytest.raises(UserError, match="SPRINT_RL_PLANNER_MAX_TOKENS must be an integer"):
        RolloutConfig.from_env({"SPRINT_RL_PLANNER_MAX_TOKENS": "lots"})
    with pytest.raises(UserError, match="SPRINT_RL_MAX_PHASES must be at least 1"):
        RolloutConfig.from_env({"SPRINT_RL_MAX_PHASES": "0"})
    with pytest.raises(UserError, match="lacks gold"):
        problem_from_row({"question": "q", "task": "math"})


def test_a_failing_engine_ends_the_trajectory_with_an_error_not_an_exception():
    async def broken(messages: list[dict], sampling: Sampling) -> Generation:
        raise RuntimeError("engine died")

    rollout = asyncio.run(run_rollout(ROW, RolloutConfig(), broken, words, temperature=1.0, top_p=1.0))
    assert rollout.samples == [] and rollout.infos["status"] == "error"
    assert "engine died" in rollout.infos["error"]


def test_stream_schedule_gives_executors_the_stream_layout():
    engine = Engine(PLAN, "\\boxed{14}")
    rollout = asyncio.run(run_rollout(ROW, RolloutConfig.from_env({"SPRINT_RL_SCHEDULE": "stream"}), engine, words,
                                      temperature=1.0, top_p=1.0))
    heads = sorted(m[-1]["content"] for m, s in engine.calls if s.stop == EXECUTOR_STOPS)
    # each executor sees the plan up to its own prompt, closed (the rest is still being written)
    assert heads[0].endswith("<prompt_1.1> Add 2 and 3. </prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\n")
    assert "prompt_1.2" not in heads[0] and "prompt_1.2" in heads[1]
    assert rollout.infos["executed_prompts"] == 2 and rollout.record["correct"] is True
    with pytest.raises(UserError):
        RolloutConfig.from_env({"SPRINT_RL_SCHEDULE": "sometimes"})


def test_an_engine_text_is_cut_where_vllm_cuts_it():
    """ms-swift decodes every sampled token, so a call that stopped on `</Plan_` inside the one tag token
    `</Plan_1>` (the mini tokenizer's) comes back with the whole tag; the loop must get vLLM's text, or
    it writes the closing tags twice (which cost the mini model nearly all its rollouts' accuracy)."""
    stops = ("</Plan_", "<Execution_", "</Final_answer>", "</think>")
    assert without_stop("try 2 and 1 first . </prompt_1.3>\n</Plan_1>", "stop", stops) == \
        "try 2 and 1 first . </prompt_1.3>\n"
    assert without_stop("Yes , ( 1 + 2 ) + 1 = 4 .\n</execution_1.1>", "stop", ("</execution_1.1>",)) == \
        "Yes , ( 1 + 2 ) + 1 = 4 .\n"
    assert without_stop("a </think> b </Plan_2>", "stop", stops) == "a "  # the first stop, as vLLM stops there
    assert without_stop("cut at the limit </Plan_", "length", stops) == "cut at the limit </Plan_"  # no stop: as is
    assert without_stop("no stop string", "stop", stops) == "no stop string"  # stopped on EOS
