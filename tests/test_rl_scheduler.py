"""The SPRINT scheduler's `run()` in-process against the scripted server: its calls, their
concurrency, what it returns to ms-swift and the rewards that follows from it.

The scheduler runs in the RL environment (.venv-rl: ms-swift + vLLM + sprint), loaded through
ms-swift's plugin registry by tests/rl_scheduler_driver.py; the scripted server runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sprint.format.prompt_format import EXECUTOR_STOPS, FINAL_STOPS, PLANNER_STOPS, PromptFormat, load_agent_prompt
from sprint.format.trajectory import count_tokens, parse, token_counter
from tests.fake_server import Reply, ScriptedServer

REPO_ROOT = Path(__file__).resolve().parents[1]
RL_PYTHON = Path(os.environ.get("RL_VENV", REPO_ROOT / ".venv-rl")) / "bin" / "python"
TOKENIZER = "tokenizers/deepseek-r1-distill-qwen-7b"

PLAN_1 = ("<Plan_1>\nSplit the sum.\n<prompt_1.1> Add 2 and 3. </prompt_1.1>\n"
          "<prompt_1.2> Add 4 and 5. </prompt_1.2>\n</Plan_1>")
EXECUTIONS = {"1.1": "2 plus 3 is 5", "1.2": "4 plus 5 is 9"}
FINAL = "<Final_answer>\nThe sum is \\boxed{14}.\n</Final_answer>"
EXECUTOR_DELAY = 1.0  # long enough that overlapping executors are seen overlapping on a loaded machine


def handler(request: dict, endpoint: str) -> str | Reply:
    """Planner: phase 1 plans two prompts, phase 2 answers. Executors: their sums, after a delay.

    Row "fail" makes executor 1.2 fail (HTTP 400) so that the trajectory ends with an error.
    """
    assistant = request["messages"][-1]["content"]
    stop = tuple(request.get("stop") or ())
    question = request["messages"][0]["content"]
    if stop == EXECUTOR_STOPS:
        name = assistant.rsplit("<execution_", 1)[1].split(">", 1)[0]
        if "(6+7)" in question and name == "1.2":
            return Reply(status=400, error="scripted failure")
        return Reply(text=EXECUTIONS[name] + f"\n</execution_{name}>", delay=EXECUTOR_DELAY)
    if stop == PLANNER_STOPS:
        return PLAN_1 if "<Plan_1>" not in assistant else FINAL
    raise AssertionError(f"unexpected stop strings {stop}")


def rows(fmt: PromptFormat) -> list[dict]:
    def row(pid: str, question: str, gold: str) -> dict:
        return {"messages": [{"role": "user", "content": fmt.user_turn(question)}], "question": question,
                "task": "math", "problem_id": pid, "gold": json.dumps(gold), "reference_tokens": 100}

    return [row("ok", "What is (2+3)+(4+5)?", "14"), row("fail", "What is (2+3)+(6+7)?", "18")]


@pytest.mark.swift
def test_scheduler_run_against_the_scripted_server(shared_data: Path, tmp_path: Path, scripted_server: ScriptedServer):
    if not RL_PYTHON.exists():
        pytest.skip(f"RL venv missing ({RL_PYTHON}); run scripts/install_rl.sh")
    tokenizer = shared_data / TOKENIZER
    fmt = PromptFormat(agent_prompt=load_agent_prompt(), mode="chat", api="chat")
    (tmp_path / "rows.json").write_text(json.dumps(rows(fmt)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SPRINT_RL_PLANNER_MAX_TOKENS": "300",
           "SPRINT_RL_EXECUTOR_MAX_TOKENS": "200", "SPRINT_RL_MAX_PHASES": "5"}
    server = scripted_server(handler)
    result = subprocess.run([str(RL_PYTHON), str(REPO_ROOT / "tests" / "rl_scheduler_driver.py"), server.base_url,
                             str(tokenizer), str(tmp_path / "rows.json"), str(tmp_path / "out.json")],
                            capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    max_in_flight = server.max_in_flight
    out = json.loads((tmp_path / "out.json").read_text())
    # loaded by path through ms-swift, registered in its tables
    assert out["scheduler"].endswith(".SprintScheduler") and out["scheduler"].startswith("_swift_external_")
    assert out["reward_classes"] == {"sprint_correct": "SprintCorrect", "sprint_format": "SprintFormat",
                                     "sprint_latency": "SprintLatency"}
    ok, failed = out["results"]

    # --- the calls: planner, then both executors at once, then the planner again
    calls = ok["calls"]
    assert [tuple(c["stop"]) for c in calls] == [PLANNER_STOPS, EXECUTOR_STOPS, EXECUTOR_STOPS, PLANNER_STOPS]
    assert [c["max_tokens"] for c in calls] == [300, 200, 200, 300]
    assert all(c["return_details"] and c["seed"] is None and c["temperature"] == 0.7 for c in calls)
    user = fmt.user_turn("What is (2+3)+(4+5)?")
    assert calls[0]["messages"] == [{"role": "user", "content": user}, {"role": "assistant", "content": "<think>\n"}]
    plan = "<Plan_1>\nSplit the sum.\n<prompt_1.1> Add 2 and 3. </prompt_1.1>\n<prompt_1.2> Add 4 and 5. </prompt_1.2>\n</Plan_1>"
    head = "<think>\n" + plan + "\n\n<Execution_1>\n"
    assert sorted(c["messages"][-1]["content"] for c in calls[1:3]) == [head + "<execution_1.1>\n",
                                                                        head + "<execution_1.2>\n"]
    assert max_in_flight == 2  # the two executors overlapped on the server
    assert calls[3]["messages"][-1]["content"].endswith("</execution_1.2>\n</Execution_1>\n\n")

    # --- what run() returns: one output per call, all mapped back to the request
    outputs = ok["outputs"]
    assert len(outputs) == 4 and all(o["response_id"] == ok["uuid"] for o in outputs)
    assert [o["rollout_infos"]["call"]["role"] for o in outputs] == ["planner", "executor", "executor", "planner"]
    # the context each output continued (masked out of the loss) is one call's: the two executors reach
    # the server in either order, so an output is matched to its call by that context, not by position
    prefixes = [c["messages"][-1]["content"] for c in calls]
    assert sorted(o["masked_text"] for o in outputs) == sorted(prefixes)
    for o in outputs:
        c = calls[prefixes.index(o["masked_text"])]
        prefix = o["masked_text"]
        assert o["messages"][:-1] == c["messages"][:-1]
        assert o["messages"][-1]["content"] == prefix + o["trained_text"]  # the loss covers what it generated
        assert sum(o["loss_mask"][0]) > 0 and len(o["loss_mask"][0]) == len(o["token_ids"][0])
    assert outputs[0]["trained_text"] == "<Plan_1>\nSplit the sum.\n<prompt_1.1> Add 2 and 3. </prompt_1.1>\n" \
                                         "<prompt_1.2> Add 4 and 5. </prompt_1.2>\n"  # cut at the stop string
    assert {outputs[1]["trained_text"], outputs[2]["trained_text"]} == {"2 plus 3 is 5\n", "4 plus 5 is 9\n"}

    # --- the trajectory's accounting, the same in every output, and the rewards it leads to
    infos = outputs[0]["rollout_infos"]
    assert all({k: v for k, v in o["rollout_infos"].items() if k != "call"} ==
               {k: v for k, v in infos.items() if k != "call"} for o in outputs)
    traj = parse(infos["trajectory"])
    assert [e.text for e in traj.phases[0].executions] == ["2 plus 3 is 5", "4 plus 5 is 9"]
    assert traj.final_answer == "The sum is \\boxed{14}."
    counts = count_tokens(traj, token_counter(str(shared_data / TOKENIZER)))
    assert infos["sequential_tokens"] == counts.sequential and infos["total_tokens"] == counts.total
    assert (infos["num_turns"], infos["planner_calls"], infos["executor_calls"]) == (4, 2, 2)
    assert infos["generated_tokens"] == sum(sum(o["loss_mask"][0]) for o in outputs)
    assert infos["status"] == "ok" and infos["parses"] and not infos["forced_final"]
    print(f"\nsequential {infos['sequential_tokens']} / total {infos['total_tokens']} tokens; rewards {ok['rewards']}")
    assert ok["rewards"]["sprint_correct"] == [1.0] * 4 and ok["rewards"]["sprint_format"] == [1.0] * 4
    assert ok["rewards"]["sprint_latency"] == pytest.approx([1 - counts.sequential / 100] * 4)

    # --- a failing executor: it cancels its sibling, the trajectory errors; only the answered call (the
    # plan) is returned, and it is rewarded as a failure
    assert [tuple(c["stop"]) for c in failed["calls"]] == [PLANNER_STOPS, EXECUTOR_STOPS, EXECUTOR_STOPS]
    assert [o["rollout_infos"]["call"]["role"] for o in failed["outputs"]] == ["planner"]
    finfos = failed["outputs"][0]["rollout_infos"]
    assert finfos["status"] == "error" and "executor 1.2" in finfos["error"]
    assert failed["rewards"] == {"sprint_correct": [0.0], "sprint_format": [pytest.approx(1 / 3)],
                                 "sprint_latency": [0.0]}
    assert FINAL_STOPS not in [tuple(c["stop"]) for c in failed["calls"]]
