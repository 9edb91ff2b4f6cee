"""Evaluation numbers on tables small enough to work out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sprint.evaluation import metrics as M
from sprint.evaluation.metrics import Pair, ProblemResult


def _pair(pid: str, s_ok: bool, b_ok: bool, s_tok: float | None = 100.0, b_tok: float | None = 100.0) -> Pair:
    return Pair(pid, s_ok, b_ok, s_tok, b_tok, M.bucket_of(b_tok))


# --------------------------------------------------------------------------- McNemar


@pytest.mark.parametrize(
    "b, c, expected",
    [
        (0, 0, 1.0),  # no discordant pair: no evidence either way
        (1, 6, 2 * (1 + 7) / 2**7),  # 0.125
        (6, 1, 2 * (1 + 7) / 2**7),  # symmetric
        (2, 10, 2 * (1 + 12 + 66) / 2**12),  # 0.0386
        (0, 5, 2 / 2**5),  # 0.0625
        (5, 5, 1.0),  # 2 * 638/1024 > 1, capped
    ],
)
def test_mcnemar_exact_hand_values(b: int, c: int, expected: float) -> None:
    assert M.mcnemar_exact(b, c) == pytest.approx(expected, rel=1e-12)


def test_mcnemar_exact_large_tables_stay_finite() -> None:
    p = M.mcnemar_exact(400, 520)  # 2**920 overflows a float; exact integers do not
    assert 0 < p < 0.001
    assert M.mcnemar_exact(460, 460) == 1.0


def test_mcnemar_table_from_pairs() -> None:
    # both right 3, only SPRINT right 1, only baseline right 4, neither 2
    pairs = (
        [_pair(f"b{i}", True, True) for i in range(3)]
        + [_pair("s0", True, False)]
        + [_pair(f"o{i}", False, True) for i in range(4)]
        + [_pair(f"n{i}", False, False) for i in range(2)]
    )
    got = M.mcnemar(pairs)
    assert (got["both_correct"], got["sprint_only"], got["baseline_only"], got["neither"]) == (3, 1, 4, 2)
    # n = 5 discordant, k = 1: 2 * (C(5,0) + C(5,1)) / 32 = 12/32
    assert got["p_value"] == pytest.approx(0.375)


# --------------------------------------------------------------------------- buckets, reduction


@pytest.mark.parametrize(
    "tokens, bucket",
    [(0, "<2000"), (1999, "<2000"), (2000, "2000-4000"), (3999.5, "2000-4000"), (4000, "4000-8000"),
     (7999, "4000-8000"), (8000, ">8000"), (50000, ">8000"), (None, None)],
)
def test_bucket_edges_lower_inclusive(tokens: float | None, bucket: str | None) -> None:
    assert M.bucket_of(tokens) == bucket


def test_bucket_labels_follow_edges() -> None:
    assert M.bucket_labels() == ["<2000", "2000-4000", "4000-8000", ">8000"]
    assert M.bucket_labels((10, 20)) == ["<10", "10-20", ">20"]
    assert M.bucket_of(15, (10, 20)) == "10-20"


def test_reduction_is_one_minus_ratio_of_means() -> None:
    assert M.reduction([100, 300], [400, 400]) == pytest.approx(0.5)
    assert M.reduction([500], [400]) == pytest.approx(-0.25)  # SPRINT longer: negative
    assert M.reduction([], []) is None
    assert M.reduction([1], [0]) is None


def test_compare_per_bucket_reductions_and_accuracies() -> None:
    pairs = [
        _pair("a", True, True, 500, 1000),     # <2000
        _pair("b", False, True, 1500, 1000),   # <2000
        _pair("c", True, False, 3000, 9000),   # >8000
        _pair("d", True, True, 5000, 11000),   # >8000
        _pair("e", True, True, None, 3000),    # 2000-4000, SPRINT text missing
    ]
    got = M.compare(pairs, resamples=200, seed=1)
    assert got["paired"] == 5
    overall = got["overall"]
    assert overall["with_tokens"] == 4
    # (500+1500+3000+5000)/4 = 2500 vs (1000+1000+9000+11000)/4 = 5500
    assert overall["reduction"] == pytest.approx(1 - 2500 / 5500)
    by = {b["bucket"]: b for b in got["buckets"]}
    assert by["<2000"]["problems"] == 2
    assert by["<2000"]["reduction"] == pytest.approx(1 - 1000 / 1000)  # 0.0
    assert by["<2000"]["sprint_accuracy"] == 0.5 and by["<2000"]["baseline_accuracy"] == 1.0
    assert by[">8000"]["reduction"] == pytest.approx(1 - 4000 / 10000)
    assert by["2000-4000"]["problems"] == 1 and by["2000-4000"]["reduction"] is None
    assert by["4000-8000"]["problems"] == 0 and by["4000-8000"]["reduction"] is None
    assert got["accuracy_difference"] == pytest.approx(4 / 5 - 4 / 5)
    assert got["mcnemar"]["sprint_only"] == 1 and got["mcnemar"]["baseline_only"] == 1


def test_decoded_reduction_has_its_own_interval_on_the_same_resamples() -> None:
    # decoded = sequential + 50 tag tokens on every problem: the decoded reduction is smaller,
    # and with the same seed each bound is the plain bound's resample shifted by 50/mean(baseline)
    base = [1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0]
    seq = [400.0, 1500.0, 900.0, 3000.0, 2500.0, 1000.0]
    pairs = [Pair(str(i), True, True, s, b, M.bucket_of(b), s + 50) for i, (s, b) in enumerate(zip(seq, base))]
    got = M.compare(pairs, resamples=500, seed=3)["overall"]
    assert got["reduction"] == pytest.approx(1 - sum(seq) / sum(base))
    assert got["reduction_decoded"] == pytest.approx(1 - (sum(seq) + 300) / sum(base))
    lo, hi = got["reduction_ci"]
    dlo, dhi = got["reduction_decoded_ci"]
    assert dlo < got["reduction_decoded"] < dhi and dlo < lo and dhi < hi
    without = [Pair(p.id, True, True, p.sprint_tokens, p.baseline_tokens, p.bucket) for p in pairs]
    none = M.compare(without, resamples=500, seed=3)["overall"]
    assert none["reduction_decoded"] is None and none["reduction_decoded_ci"] is None
    agg = M.aggregate_comparisons([M.compare(pairs, resamples=50, seed=0), M.compare(pairs, resamples=50, seed=1)])
    assert agg["reduction_decoded"]["mean"] == pytest.approx(got["reduction_decoded"])


def test_pair_matches_ids_and_uses_reference_lengths() -> None:
    sprint = [ProblemResult("x", True, True, sequential=10), ProblemResult("y", False, False, sequential=20),
              ProblemResult("only_sprint", True, True, sequential=5)]
    base = [ProblemResult("y", True, True, sequential=3000), ProblemResult("x", False, True, sequential=9000)]
    pairs = M.pair(sprint, base)
    assert [p.id for p in pairs] == ["x", "y"]
    assert pairs[0].baseline_tokens == 9000 and pairs[0].bucket == ">8000"
    ref = {"x": 1000.0, "y": 5000.0}
    pairs = M.pair(sprint, base, ref)
    assert [p.bucket for p in pairs] == ["<2000", "4000-8000"]


def test_baseline_reference_is_mean_over_seeds() -> None:
    seed0 = [ProblemResult("a", True, True, sequential=1000), ProblemResult("b", True, True, sequential=None)]
    seed1 = [ProblemResult("a", True, True, sequential=3000), ProblemResult("b", True, True, sequential=500)]
    assert M.baseline_reference([seed0, seed1]) == {"a": 2000.0, "b": 500.0}


# --------------------------------------------------------------------------- one run


def test_summarize_counts_no_answer_as_wrong_and_authors_variant() -> None:
    results = [
        ProblemResult("1", True, True, sequential=100, total=150, phases=2, prompts=3, prompts_per_phase=[2, 1]),
        ProblemResult("2", True, True, sequential=300, total=350, phases=4, prompts=1, prompts_per_phase=[1, 0, 0, 0],
                      forced_final=True),
        ProblemResult("3", False, True, sequential=200, total=200, phases=1, prompts=0, prompts_per_phase=[0]),
        ProblemResult("4", False, False, status="server_error"),  # no text, no answer
    ]
    s = M.summarize_results(results, resamples=300)
    assert s["problems"] == 4 and s["correct"] == 2 and s["answered"] == 3 and s["no_answer"] == 1
    assert s["accuracy"] == pytest.approx(0.5)
    assert s["accuracy_answered"] == pytest.approx(2 / 3)
    assert s["failed"] == 1 and s["missing_text"] == 1 and s["forced_final"] == 1
    assert s["mean_sequential"] == pytest.approx(200) and s["mean_total"] == pytest.approx(700 / 3)
    assert s["mean_phases"] == pytest.approx(7 / 3) and s["mean_prompts"] == pytest.approx(4 / 3)
    assert s["mean_prompts_per_phase"] == pytest.approx(4 / 7)
    lo, hi = s["accuracy_ci"]
    assert 0 <= lo <= 0.5 <= hi <= 1


def test_summarize_baseline_has_no_phase_numbers() -> None:
    s = M.summarize_results([ProblemResult("1", True, True, sequential=10, total=10)], resamples=0)
    assert s["mean_phases"] is None and s["mean_prompts"] is None and s["accuracy_ci"] is None


# --------------------------------------------------------------------------- bootstrap, spread


def test_bootstrap_is_seeded_and_brackets_the_estimate() -> None:
    rng = np.random.default_rng(3)
    x = (rng.random(400) < 0.7).astype(float)
    a = M.bootstrap_ci(lambda r: r.mean(axis=1), [x], resamples=1000, seed=5)
    b = M.bootstrap_ci(lambda r: r.mean(axis=1), [x], resamples=1000, seed=5)
    assert a == b
    lo, hi = a
    assert lo < x.mean() < hi
    # binomial standard error ~ sqrt(.7*.3/400) = 0.023: a 95% interval is about ±0.045 wide
    assert 0.06 < hi - lo < 0.12


def test_bootstrap_constant_data_and_empty() -> None:
    assert M.bootstrap_ci(lambda r: r.mean(axis=1), [np.ones(10)], resamples=50) == (1.0, 1.0)
    assert M.bootstrap_ci(lambda r: r.mean(axis=1), [np.array([])]) is None


def test_spread_over_seeds() -> None:
    sp = M.spread([1.0, 2.0, 3.0])
    assert (sp.mean, sp.std, sp.min, sp.max, sp.n) == (2.0, 1.0, 1.0, 3.0, 3)
    one = M.spread([0.4])
    assert one.mean == 0.4 and one.std == 0.0
    none = M.spread([None, float("nan")])
    assert none.mean is None and none.n == 0


def test_aggregate_comparisons_over_seeds() -> None:
    def comp(red: float, p: float) -> dict:
        return {"overall": {"reduction": red}, "accuracy_difference": 0.0, "mcnemar": {"p_value": p},
                "buckets": [{"bucket": "<2000", "problems": 3, "reduction": red / 2,
                             "mean_baseline_tokens": 100.0, "mean_sprint_sequential": 50.0}]}

    agg = M.aggregate_comparisons([comp(0.3, 0.5), comp(0.5, 0.1)])
    assert agg["reduction"]["mean"] == pytest.approx(0.4)
    assert agg["reduction"]["std"] == pytest.approx(math.sqrt(0.02))
    assert agg["p_value"]["values"] == [0.5, 0.1]
    assert agg["buckets"][0]["reduction"]["mean"] == pytest.approx(0.2)
