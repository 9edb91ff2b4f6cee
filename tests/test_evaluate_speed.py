"""The fast evaluation path: grading in a process started early, counting with the exact fast engine.
Both must give exactly what the plain path gives (thread grading, `tokenizers` text by text)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from sprint.evaluation import evaluate as E
from sprint.evaluation import grader
from sprint.core.records import RunDir
from sprint.format.tokencount import load_counter
from sprint.format.trajectory import Execution, Phase, Trajectory, count_tokens, parse, render_prompt, token_counter


def _runs(folder: Path, shared_data: Path, n: int) -> tuple[Path, Path]:
    """`n` SPRINT + `n` baseline problems of MATH-500 prose, some answers right, some written otherwise, some wrong."""
    rng = random.Random(5)
    rows = [json.loads(x) for x in (shared_data / "math500" / "test.jsonl").read_text().splitlines()]
    words = "\n\n".join(r["solution"] for r in rows).split(" ")

    def prose(k: int) -> str:
        start = rng.randrange(len(words) - k)
        return " ".join(words[start:start + k])

    def answer(gold: str) -> str:
        r = rng.random()
        return gold if r < 0.7 else gold.replace("\\frac", "\\dfrac") + " " if r < 0.85 else f"{gold}+1"

    sprint = RunDir(folder / "sprint", "orchestration", {"task": "math", "mode": "sprint"})
    base = RunDir(folder / "base", "orchestration", {"task": "math", "mode": "baseline"})
    for i in range(n):
        row = rows[i]
        phases = []
        for p in range(1, rng.randint(2, 4) + 1):
            k = rng.randint(0, 3)
            plan = "\n\n".join([prose(40)] + [render_prompt(f"{p}.{j}", prose(15)) for j in range(1, k + 1)])
            phases.append(Phase(p, plan, [Execution(f"{p}.{j}", prose(80)) for j in range(1, k + 1)]))
        text = Trajectory(row["problem"], phases, f"So $\\boxed{{{answer(row['answer'])}}}$.").render()
        sprint.append({"id": f"p{i}", "question": row["problem"], "gold": row["answer"], "trajectory": text,
                       "status": "ok", "mode": "sprint", "calls": []})
        base.append({"id": f"p{i}", "question": row["problem"], "gold": row["answer"], "status": "ok",
                     "generation": prose(300) + f" The answer is $\\boxed{{{answer(row['answer'])}}}$.",
                     "mode": "baseline", "calls": []})
    sprint.close()
    base.close()
    return folder / "sprint", folder / "base"


def test_process_grading_and_fast_counting_equal_the_plain_path(tmp_path: Path, shared_data: Path, monkeypatch) -> None:
    tok = str(shared_data / "tokenizers" / "deepseek-r1-distill-qwen-7b")
    assert load_counter(tok).engine == "tiktoken"
    sprint_dir, base_dir = _runs(tmp_path, shared_data, grader.GRADING_PROCESS_MIN // 2 + 10)
    started = []
    real_start = grader.GradingProcess.start.__func__

    def spy(cls, problems, workers):
        got = real_start(cls, problems, workers)
        started.append(got is not None)
        return got

    monkeypatch.setattr(grader.GradingProcess, "start", classmethod(spy))
    fast = E.evaluate(sprint_dir, base_dir, planner_tokenizer=tok, write=False, resamples=0)
    slow = E.evaluate(sprint_dir, base_dir, planner_tokenizer=tok, write=False, resamples=0, workers=0)
    assert started == [True, False]  # a grading process for the first, a thread for the second
    for key in ("runs", "baselines"):
        assert fast.metrics[key] == slow.metrics[key]
    rows = fast.metrics["runs"][0]["problems"]
    assert 0 < sum(r["correct"] for r in rows) < len(rows)  # some right, some wrong: grading was exercised
    plain = token_counter(tok)
    texts = {json.loads(x)["id"]: json.loads(x)["trajectory"] for x in (sprint_dir / "records.jsonl").read_text().splitlines()}
    for r in rows:
        want = count_tokens(parse(texts[r["id"]]), plain)
        assert (r["sequential"], r["total"]) == (want.sequential, want.total)
