"""Generate realistic synthetic SPRINT trajectories for latency benchmarks.

Real fine-tuned-model trajectories are not available offline, so the replay benchmarks use
synthetic ones shaped like SPRINT's on MATH: 1-11 phases, 0-8 prompts per phase (at least 1.5
prompts per phase over the trajectory, the packing filter), plans and executions of tens to
hundreds of tokens, prompts interleaved with plan text, "Based on execution_x.y:" references,
a final answer with \\boxed{}. Each problem also gets a sequential baseline output whose length
is the SPRINT trajectory's total length times a factor (the paper's baseline writes about as
many tokens as SPRINT does in total, but all of them one after another).

Output (the SPRINT authors' log layout, which `python -m sprint replay-server` reads):
  OUT/planner_trajectory_<id>.txt, OUT/base_model_trajectory_<id>.txt, OUT/gold.csv

    python benchmarks/make_trajectories.py OUT --n 60 --seed 0
"""

from __future__ import annotations

import argparse
import csv
import random
from dataclasses import dataclass
from pathlib import Path

from sprint.format.trajectory import Execution, Phase, Trajectory, render_prompt, render_question

# (phases, weight): most SPRINT trajectories on MATH have 2-6 phases, a few run to the limit.
PHASE_WEIGHTS = [6, 12, 16, 15, 13, 10, 8, 6, 5, 4, 3]  # 1..11 phases
PROMPT_WEIGHTS = [8, 20, 24, 18, 12, 8, 5, 3, 2]  # 0..8 prompts in a phase
MIN_PARALLELISM = 1.5  # packing drops trajectories with fewer prompts per phase

_VARS = "xyzabnmk"
_NOUNS = [
    "the sum",
    "the product",
    "the remainder",
    "the discriminant",
    "the area",
    "the perimeter",
    "the number of solutions",
    "the largest root",
    "the expected value",
    "the slope",
]
_OBJECTS = [
    "the quadratic",
    "the triangle",
    "the sequence",
    "the polynomial",
    "the circle",
    "the set of divisors",
    "the inequality",
    "the function",
    "the system",
    "the grid",
]


def _expr(rng: random.Random) -> str:
    v = rng.choice(_VARS)
    a, b, c = rng.randint(2, 19), rng.randint(1, 40), rng.randint(1, 99)
    return rng.choice(
        [
            f"{a}{v} + {b} = {c}",
            f"{v}^2 - {a}{v} + {b}",
            f"\\frac{{{a}}}{{{b}}}",
            f"{a}^{rng.randint(2, 5)}",
            f"({v} - {a})({v} + {b})",
            f"\\sqrt{{{a * a * b}}}",
            f"{a} \\cdot {b} = {a * b}",
            f"{c} \\bmod {a} = {c % a}",
            f"\\binom{{{a + 3}}}{{{min(a, 3)}}}",
        ]
    )


def _sentence(rng: random.Random) -> str:
    e1, e2 = _expr(rng), _expr(rng)
    return rng.choice(
        [
            f"Let me write {rng.choice(_NOUNS)} of {rng.choice(_OBJECTS)} as ${e1}$.",
            f"Substituting gives ${e1}$, and simplifying we get ${e2}$.",
            f"So {rng.choice(_NOUNS)} is ${e1}$, which we can check against ${e2}$.",
            f"Wait, that does not look right; recompute ${e1}$ carefully.",
            f"Expanding, ${e1}$ becomes ${e2}$ after collecting terms.",
            f"If ${e1}$ then {rng.choice(_NOUNS)} of {rng.choice(_OBJECTS)} must be ${e2}$.",
            f"Checking the case ${rng.choice(_VARS)} = {rng.randint(0, 12)}$: ${e1}$ holds.",
            f"Hmm, so we need {rng.choice(_NOUNS)} of {rng.choice(_OBJECTS)} first.",
            f"By symmetry, ${e1}$ and ${e2}$ contribute equally.",
            f"That gives ${e1}$, so the next step is to bound ${e2}$.",
        ]
    )


def _text(rng: random.Random, words: int) -> str:
    """Math-flavoured sentences adding up to about `words` words."""
    out: list[str] = []
    count = 0
    while count < words:
        s = _sentence(rng)
        out.append(s)
        count += len(s.split())
    return " ".join(out)


def _length(rng: random.Random, median: float, low: int, high: int) -> int:
    """Lognormal lengths: mostly near the median, with a long tail, clipped."""
    return max(low, min(high, int(rng.lognormvariate(0, 0.6) * median)))


def _question(rng: random.Random, index: int) -> str:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    return (
        rng.choice(
            [
                f"Find all real $x$ such that $x^2 - {a + b}x + {a * b} = 0$, and give their sum.",
                f"How many positive integers less than {a * b * 10} are divisible by {a} or {b}?",
                f"A triangle has sides {a}, {b} and {a + b - 1}. Compute its area squared.",
                f"What is the remainder when ${a}^{{{b * 7}}}$ is divided by {b + 5}?",
                f"The sequence satisfies $u_{{n+1}} = {a}u_n - {b}$ with $u_0 = 1$. Find $u_{{{a % 7 + 3}}}$.",
            ]
        )
        + f" (Problem {index}.)"
    )


def make_trajectory(rng: random.Random, index: int) -> tuple[Trajectory, str]:
    """One synthetic trajectory and its answer; resampled until it passes the parallelization filter."""
    while True:
        n_phases = rng.choices(range(1, 12), PHASE_WEIGHTS)[0]
        counts = [rng.choices(range(0, 9), PROMPT_WEIGHTS)[0] for _ in range(n_phases)]
        if n_phases > 1 and rng.random() < 0.6:
            counts[-1] = min(counts[-1], 1)  # a closing phase that checks one thing or nothing
        if sum(counts) / n_phases >= MIN_PARALLELISM:
            break
    phases: list[Phase] = []
    previous: list[str] = []
    for p, k_count in enumerate(counts, 1):
        parts: list[str] = []
        if previous and rng.random() < 0.7:
            refs = rng.sample(previous, min(len(previous), rng.randint(1, 2)))
            parts.append(f"Based on {', '.join('execution_' + r for r in refs)}:")
        parts.append(_text(rng, _length(rng, 40, 12, 250)))
        executions: list[Execution] = []
        for k in range(1, k_count + 1):
            if k > 1 and rng.random() < 0.5:
                parts.append(_text(rng, _length(rng, 18, 6, 90)))  # plan text between prompts
            name = f"{p}.{k}"
            parts.append(render_prompt(name, _text(rng, _length(rng, 20, 8, 60))))
            executions.append(Execution(name, _text(rng, _length(rng, 80, 20, 500))))
        if rng.random() < 0.3:
            parts.append(_text(rng, _length(rng, 15, 5, 60)))  # a closing remark after the prompts
        phases.append(Phase(p, "\n".join(parts), executions))
        previous = [e.name for e in executions] or previous
    answer = str(rng.randint(-50, 500))
    final = f"Putting the pieces together, the answer is $\\boxed{{{answer}}}$."
    return Trajectory(_question(rng, index), phases, final), answer


@dataclass
class Problem:
    id: str
    trajectory: Trajectory
    baseline: str  # the sequential model's output, after the question
    answer: str


def make_problems(n: int = 60, seed: int = 0, baseline_factor: float = 1.0, jitter: float = 0.2) -> list[Problem]:
    """`n` problems: a SPRINT trajectory, a baseline output and the gold answer each."""
    rng = random.Random(seed)
    problems = []
    for i in range(n):
        traj, answer = make_trajectory(rng, i)
        total_words = len(traj.render_body().split())
        words = max(50, int(total_words * baseline_factor * rng.uniform(1 - jitter, 1 + jitter)))
        baseline = f"<think>\n{_text(rng, words)}\n</think>\n\nThe answer is $\\boxed{{{answer}}}$."
        problems.append(Problem(f"synth_{i:04d}", traj, baseline, answer))
    return problems


def write_problems(out: Path, problems: list[Problem]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for pr in problems:
        (out / f"planner_trajectory_{pr.id}.txt").write_text(pr.trajectory.render() + "\n", encoding="utf-8")
        question = render_question(pr.trajectory.question)
        (out / f"base_model_trajectory_{pr.id}.txt").write_text(f"{question}\n\n{pr.baseline}\n", encoding="utf-8")
    with (out / "gold.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "question", "answer"])
        for pr in problems:
            writer.writerow([pr.id, pr.trajectory.question, pr.answer])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument("--n", type=int, default=60, help="number of problems (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--baseline-factor",
        type=float,
        default=1.0,
        help="baseline length / SPRINT total length (default: %(default)s, ±20%% per problem)",
    )
    args = parser.parse_args(argv)
    problems = make_problems(args.n, args.seed, args.baseline_factor)
    write_problems(args.out, problems)
    phases = [len(p.trajectory.phases) for p in problems]
    prompts = [len(ph.prompts) for p in problems for ph in p.trajectory.phases]
    words = [len(p.trajectory.render_body().split()) for p in problems]
    print(
        f"wrote {len(problems)} problems to {args.out}: phases {min(phases)}-{max(phases)}, "
        f"prompts per phase {min(prompts)}-{max(prompts)}, words per trajectory {min(words)}-{max(words)} "
        f"(median {sorted(words)[len(words) // 2]})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
