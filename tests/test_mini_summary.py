"""The closing summary's before/after of GRPO on sampled runs (`sprint.mini.summary.sampled`): per
problem, the mean over draws of correctness, critical path and checking twice, read from run
folders laid out as the demo writes them (runs/sampled/NAME-seedK), counted in a real tokenizer."""

from __future__ import annotations

from pathlib import Path

from sprint.mini.summary import format_sampled, sampled
from tests.helpers import mini_trajectory, tokenizer_dir, write_run

PROBLEMS = {"cd-test-0000": ((4, 3, 4), 19), "cd-test-0001": ((2, 3, 4), 20)}


def write_draws(root: Path, name: str, draws: list[dict[str, tuple[bool, bool]]]) -> None:
    """One run folder per draw: {problem id: (correct, checks twice)}."""
    for seed, draw in enumerate(draws):
        records = [{"id": pid, "correct": ok, "trajectory": mini_trajectory(*PROBLEMS[pid], twice=twice)}
                   for pid, (ok, twice) in draw.items()]
        write_run(root / "runs" / "sampled" / f"{name}-seed{seed}", records)


def test_sampled_runs_before_and_after_are_read_per_problem(tmp_path: Path) -> None:
    (tmp_path / "tokenizer").symlink_to(tokenizer_dir(), target_is_directory=True)
    write_draws(tmp_path, "sprint", [{"cd-test-0000": (True, True), "cd-test-0001": (False, False)},
                                     {"cd-test-0000": (True, False), "cd-test-0001": (True, True)}])
    write_draws(tmp_path, "grpo", [{"cd-test-0000": (True, False), "cd-test-0001": (True, False)},
                                   {"cd-test-0000": (True, False), "cd-test-0001": (True, False)}])
    before, after = sampled(tmp_path, "sprint"), sampled(tmp_path, "grpo")
    assert before is not None and after is not None and sampled(tmp_path, "none") is None
    assert before.draws == 2
    assert before.correct == {"cd-test-0000": 1.0, "cd-test-0001": 0.5}
    assert before.twice == {"cd-test-0000": 0.5, "cd-test-0001": 0.5} and set(after.twice.values()) == {0.0}
    # checking twice lengthens the critical path by the recheck's tokens, half the time in each problem
    extra = {pid: before.critical_path[pid] - after.critical_path[pid] for pid in PROBLEMS}
    assert all(e > 5 for e in extra.values()), extra
    text = format_sampled(before, after)
    assert "accuracy 75.0" in text and "-> 100.0" in text
    assert f"change {-sum(extra.values()) / 2:+.1f}" in text
    assert "checks twice 50.0 [50.0, 50.0] -> 0.0 [0.0, 0.0] %" in text
