"""Adding a task through the registry alone: a toy task runs through orchestration and evaluation.

"echo" is registered here and nowhere else: its gold answer is a word, the answer is the last
word the model wrote, and grading is equality. If orchestration or evaluation kept their own list
of task names or their own answer rule, this would fail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.fake_server import ScriptedServer

from sprint import cli
from sprint.core.errors import UserError
from sprint.evaluation.evaluate import evaluate
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.tasks.registry import TASKS, TaskAdapter, get_task, register_task, task_names
from sprint.format.trajectory import strip_tags, token_counter

WORDS = ("apple", "river", "stone")


@dataclass(frozen=True)
class EchoTask(TaskAdapter):
    """Repeat a word: gold = the row's answer; the answer = the last word of the output."""

    name: str = "echo"

    def extract(self, text: str | None) -> str | None:
        words = re.findall(r"[A-Za-z]+", strip_tags(text or ""))
        return words[-1].lower() if words else None

    def grade(self, pred: str | None, gold: Any) -> bool | None:
        if gold is None:
            return None
        return pred == gold


@pytest.fixture
def echo() -> Iterator[None]:
    register_task("echo", lambda seed: EchoTask())
    yield
    del TASKS["echo"]


def test_registered_task_is_listed_and_built(echo: None) -> None:
    assert task_names()[-1] == "echo" and "math" in task_names()
    task = get_task("echo", seed=7)
    assert isinstance(task, EchoTask)
    assert task.extract("<Final_answer>\nThe word is Apple.\n</Final_answer>") == "apple"
    assert task.grade_many(["apple", "pear"], ["apple", "apple"]) == [True, False]
    with pytest.raises(UserError, match="echo"):
        get_task("chess")  # the error lists every registered task


def test_toy_task_runs_through_orchestration_and_evaluate(echo: None, tmp_path: Path, tok_dir: Path,
                                                          scripted_server: ScriptedServer) -> None:
    data = tmp_path / "echo.jsonl"
    data.write_text("".join(json.dumps({"question": f"Say the word {w}.", "answer": w, "id": f"e{i}"}) + "\n"
                            for i, w in enumerate(WORDS)))
    agent = tmp_path / "agent.txt"
    agent.write_text("Solve it in phases.\n")

    def planner_and_executor(body: dict, endpoint: str) -> str:
        prompt = body["prompt"]
        m = re.search(r"<execution_(\d+\.\d+)>\n$", prompt)
        if m:
            return f"The word to repeat is in the question.\n</execution_{m.group(1)}>"
        if "<Plan_1>" not in prompt:
            return "<Plan_1>\nFind the word.\n<prompt_1.1> Read the question. </prompt_1.1>\n</Plan_1>"
        word = re.search(r"Say the word (\w+)\.", prompt).group(1)
        said = "pear" if word == "stone" else word  # the model gets the last one wrong
        return f"<Final_answer>\nThe word is {said}\n</Final_answer>"

    srv = scripted_server(planner_and_executor)
    orchestrate(OrchestrationConfig(
        planner_model="test-model", planner_server_url=srv.base_url, out_dir=str(tmp_path / "run"),
        data=str(data), task="echo", prompt_mode="raw", agent_prompt=str(agent), planner_max_tokens=200,
        max_tokens=100, max_retries=0, timeout=20.0), progress=False)
    records = {r["id"]: r for r in map(json.loads, (tmp_path / "run" / "records.jsonl").read_text().splitlines())}
    assert sorted(records) == ["e0", "e1", "e2"]
    assert all(r["status"] == "ok" and r["task"] == "echo" and r["gold"] == w
               for r, w in zip((records[k] for k in ("e0", "e1", "e2")), WORDS))
    assert "Say the word river." in records["e1"]["trajectory"]  # the adapter's question reached the planner
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["task"] == "echo"

    # evaluate takes the task from the run's manifest, re-extracts with the adapter and grades
    ev = evaluate(tmp_path / "run", planner_tokenizer=str(tok_dir), write=False, resamples=0, workers=1, plots=False)
    assert ev.metrics["task"] == "echo"
    rows = ev.metrics["runs"][0]["problems"]
    assert [r["id"] for r in rows] == ["e0", "e1", "e2"]
    assert [r["predicted"] for r in rows] == ["apple", "river", "pear"]
    assert [r["correct"] for r in rows] == [True, True, False]
    assert ev.metrics["runs"][0]["summary"]["accuracy"] == pytest.approx(2 / 3)
    plain = token_counter(str(tok_dir))
    final = "The word is apple"
    assert rows[0]["planner"] == plain("Find the word.\n Read the question. ") + plain(final)

    # and through the CLI, whose --task choices are read from the registry when the parser is built
    out = tmp_path / "eval"
    code = cli.main(["evaluate", str(tmp_path / "run"), "--task", "echo", "--planner-tokenizer", str(tok_dir),
                     "--out", str(out), "--bootstrap", "0", "--workers", "1", "--no-plots"])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [r["correct"] for r in metrics["runs"][0]["problems"]] == [True, True, False]
