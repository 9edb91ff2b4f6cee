"""A realistic evaluation corpus: real mathematical prose at the length distribution of R1 traces.

Synthetic sentences are cheap to tokenize; real reasoning text is not (LaTeX, digits, rare words),
so a benchmark on synthetic text under-reports what `evaluate` costs on a real run. This module
recombines MATH-500 problems and solutions (`../shared/data`) into SPRINT trajectories and
sequential generations whose token lengths follow what DeepSeek-R1-Distill models write on MATH:
lognormal, median about 1.7 k tokens, a tail past 8 k (about 6 % of traces), clipped at 16 k.
Lengths are aimed in tokens through the corpus' measured characters per token.

A SPRINT trajectory of T tokens: 2-8 phases (more for longer traces), 0-5 prompts per phase,
plans ~30 % of the tokens (with text between prompts), executions the rest, a final answer with
the `\\boxed{}` answer (75 % the gold as written, 10 % the gold written another way, the rest
wrong). A sequential generation draws its own length from the same distribution.

    from real_corpus import build_runs   # benchmarks/ is on sys.path when a benchmark runs
    sprint_dir, base_dir = build_runs(folder, 500, seed=0)
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

from sprint.core.data import resolve_local, safe_id
from sprint.core.records import RunDir
from sprint.format.trajectory import Execution, Phase, Trajectory, render_prompt

MEDIAN_TOKENS = 1700  # R1-Distill on MATH: median trace length
SIGMA = 0.95          # lognormal spread: P(> 8k tokens) ~ 5-6 %, mean ~ 2.7k
MIN_TOKENS, MAX_TOKENS = 200, 16000
PLAN_SHARE = 0.3      # share of a SPRINT trajectory's tokens written by the planner


def data_root() -> Path:
    """`SPRINT_LOCAL_DATA`, defaulting to ../shared/data next to the project (set for later imports)."""
    root = os.environ.get("SPRINT_LOCAL_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data")
    os.environ["SPRINT_LOCAL_DATA"] = root
    return Path(root)


def math_rows() -> list[dict]:
    data_root()
    path = resolve_local("HuggingFaceH4/MATH-500") or data_root() / "math500" / "test.jsonl"
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def trace_length(rng: random.Random) -> int:
    """A trace length in tokens, R1-like (see the module docstring)."""
    return max(MIN_TOKENS, min(MAX_TOKENS, int(MEDIAN_TOKENS * math.exp(rng.gauss(0.0, SIGMA)))))


class Prose:
    """Slices of real math text (MATH-500 problems and solutions, asy figures removed), cut at
    sentence or line ends, about `tokens` tokens long."""

    CHARS_PER_TOKEN = 2.56  # measured on this corpus with the R1 tokenizer (LaTeX-heavy text)

    def __init__(self, rows: list[dict], rng: random.Random) -> None:
        pieces = []
        for r in rows:
            for part in (r["problem"], r["solution"]):
                pieces.append(_drop_asy(part))
        self.text = "\n\n".join(pieces)
        self.cuts = [i + 1 for i, ch in enumerate(self.text) if ch in ".\n" and i + 1 < len(self.text)]
        self.rng = rng

    def __call__(self, tokens: int) -> str:
        chars = max(8, int(tokens * self.CHARS_PER_TOKEN))
        out: list[str] = []
        while chars > 0:  # a long piece wraps around the corpus
            take = min(chars, len(self.text) // 2)
            i = self.rng.randrange(len(self.cuts))
            start = self.cuts[i]
            end = start + take
            j = _bisect(self.cuts, end)
            stop = self.cuts[j] if j < len(self.cuts) else len(self.text)
            out.append(self.text[start:stop].strip())
            chars -= stop - start
        return "\n\n".join(p for p in out if p) or "We continue."


def _drop_asy(text: str) -> str:
    while "[asy]" in text and "[/asy]" in text:
        a = text.index("[asy]")
        b = text.index("[/asy]", a) + len("[/asy]")
        text = text[:a] + text[b:]
    return text


def _bisect(xs: list[int], x: int) -> int:
    lo, hi = 0, len(xs)
    while lo < hi:
        mid = (lo + hi) // 2
        if xs[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def answer_variant(gold: str, rng: random.Random) -> str:
    """What the model wrote: the gold (75 %), the gold written another way (10 %), a wrong answer."""
    r = rng.random()
    if r < 0.75:
        return gold
    if r < 0.85:
        return f"{gold}.0" if gold.isdigit() else " " + gold.replace("\\frac", "\\dfrac") + " "
    if gold.lstrip("-").isdigit():
        return str(int(gold) + rng.randint(1, 9))
    return f"{gold}+1"


def sprint_trajectory(question: str, answer: str, tokens: int, prose: Prose, rng: random.Random) -> Trajectory:
    """A SPRINT trajectory of about `tokens` tokens (tags excluded)."""
    n_phases = max(2, min(8, int(round(math.log2(max(tokens, 400) / 200))) + rng.randint(-1, 1)))
    per_phase = tokens / n_phases
    phases = []
    for p in range(1, n_phases + 1):
        k = rng.choices(range(6), weights=[1, 4, 4, 3, 2, 1])[0]
        plan_tokens = max(15, int(per_phase * PLAN_SHARE * rng.uniform(0.6, 1.4)))
        exec_tokens = max(0, int(per_phase - plan_tokens))
        shares = [rng.uniform(0.5, 1.5) for _ in range(k)]
        parts = [prose(max(10, plan_tokens // (k + 1)))]
        execs = []
        for j in range(1, k + 1):
            parts.append(render_prompt(f"{p}.{j}", prose(rng.randint(15, 60))))
            if rng.random() < 0.4:
                parts.append(prose(max(8, plan_tokens // (2 * k + 2))))
            execs.append(Execution(f"{p}.{j}", prose(max(20, int(exec_tokens * shares[j - 1] / sum(shares))))))
        phases.append(Phase(p, "\n\n".join(parts), execs))
    final = f"{prose(rng.randint(10, 60))}\n\nTherefore, the answer is $\\boxed{{{answer}}}$."
    return Trajectory(question, phases, final)


@dataclass
class CorpusStats:
    problems: int
    sprint_chars: int
    baseline_chars: int


def build_runs(folder: Path, n: int, seed: int = 0) -> tuple[Path, Path, CorpusStats]:
    """One SPRINT run folder and one sequential-baseline run folder of `n` problems each, as
    orchestration and the baseline write them (records.jsonl + trajectories/)."""
    rng = random.Random(seed)
    rows = math_rows()
    prose = Prose(rows, rng)
    sprint_dir, base_dir = folder / "sprint", folder / "baseline"
    run = RunDir(sprint_dir, "orchestration", {"task": "math", "mode": "sprint"}, overwrite=True)
    base = RunDir(base_dir, "orchestration", {"task": "math", "mode": "baseline"}, overwrite=True)
    (sprint_dir / "trajectories").mkdir(exist_ok=True)
    s_chars = b_chars = 0
    for i in range(n):
        row = rows[i % len(rows)]
        pid = safe_id(row["unique_id"]) + ("" if i < len(rows) else f"_{i}")
        gold = row["answer"]
        answer = answer_variant(gold, rng)
        # prompts and the answer add ~15 % to what the phases are aimed at
        text = sprint_trajectory(row["problem"], answer, int(0.85 * trace_length(rng)), prose, rng).render()
        s_chars += len(text)
        (sprint_dir / "trajectories" / f"{pid}.txt").write_text(text, encoding="utf-8")
        run.append({"id": pid, "question": row["problem"], "gold": gold, "predicted": answer, "trajectory": text,
                    "status": "ok" if rng.random() > 0.01 else "server_error",
                    "forced_final": rng.random() < 0.03, "calls": [], "mode": "sprint"})
        answer = answer_variant(gold, rng)
        generation = f"{prose(trace_length(rng))}\n\nSo the answer is $\\boxed{{{answer}}}$."
        b_chars += len(generation)
        base.append({"id": pid, "question": row["problem"], "gold": gold, "predicted": answer,
                     "generation": generation, "completion_tokens": None, "status": "ok", "forced_final": False,
                     "calls": [], "mode": "baseline"})
    for d in (run, base):
        close = getattr(d, "close", None)
        if close:
            close()
    return sprint_dir, base_dir, CorpusStats(n, s_chars, b_chars)
