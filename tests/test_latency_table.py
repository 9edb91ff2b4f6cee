"""The latency model against measured step costs: the H200 table (../shared), the stdlib fit, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sprint import cli
from sprint.latency.model import H200, LatencyModel, load_latency_model, resolve_latency
from sprint.latency.stepfit import fit_step_table, nonnegative_fit, table_errors
from sprint.timing.replay_server import ReplayConfig
from tests.helpers import shared_path

H200_TABLE = "gpu/h200-r1-distill-qwen-7b-step-cost.json"


def synthetic_table(base_ms: float, per_seq_ms: float, per_ctx_ms: float) -> dict:
    decode = [{"k": k, "L": L, "step_ms": base_ms + per_seq_ms * k + per_ctx_ms * k * L}
              for k in (1, 2, 4, 8) for L in (100, 1000, 5000)]
    prefill = [{"cached": c, "new": n, "ms": 0.02 * n + 1e-6 * n * (c + n / 2)} for c, n in
               ((0, 1000), (0, 4000), (2000, 2000), (0, 100))]
    return {"device": "synthetic", "decode": decode, "prefill": prefill}


def test_the_fit_recovers_known_terms_and_keeps_them_non_negative() -> None:
    fit = fit_step_table(synthetic_table(5.0, 0.2, 2e-5))
    terms = fit["terms"]
    assert terms["step_base_s"] == pytest.approx(5e-3) and terms["step_per_seq_s"] == pytest.approx(2e-4)
    assert terms["step_per_context_s"] == pytest.approx(2e-8) and fit["decode"]["max_error"] < 1e-9
    # prefill: the 100-token cell, the fastest (2 ms), is taken for launch overhead and left out
    assert terms["prefill_per_token_s"] == pytest.approx(2e-5) and terms["prefill_per_pair_s"] == pytest.approx(1e-9)
    assert fit["prefill"]["cells"] == 3 and terms["prefill_floor_s"] == pytest.approx(5.2e-3)
    # a term the free fit would make negative is dropped: steps that get faster with more sequences
    fit = nonnegative_fit([[1.0] * 4, [1.0, 2.0, 3.0, 4.0]], [10.0, 9.9, 9.8, 9.7])
    assert fit.coef[1] == 0.0 and fit.coef[0] == pytest.approx(9.85, rel=0.01)


def test_the_model_reproduces_the_h200_table_within_5_percent_per_cell() -> None:
    path = shared_path(H200_TABLE)
    table = json.loads(path.read_text())
    fit = fit_step_table(table)
    assert len(table["decode"]) == 40 and fit["decode"]["max_error"] < 0.05
    assert fit["decode"]["max_error"] == pytest.approx(0.040, abs=0.001)  # the figure README quotes
    assert fit["prefill"]["max_error"] < 0.05  # the compute-bound cells (fresh 2k, 8k, 16k)
    # the defaults are this fit (rounded), so the default model is within 5 % of every cell too
    errors = table_errors(table["decode"], lambda k, L: H200.step(k, k * L) * 1000)
    assert max(abs(e) for e in errors) < 0.05
    loaded = load_latency_model(path)  # a raw table is fitted on load
    assert loaded.gpu == "NVIDIA H200"
    for name in ("step_base_s", "step_per_context_s", "prefill_per_token_s", "prefill_per_pair_s"):
        assert getattr(loaded, name) == pytest.approx(getattr(H200, name), rel=1e-4), name


def test_the_earlier_model_misses_the_table() -> None:
    """The step priced by the number of sequences alone (7.1 ms, +0.6 % a sequence): up to 36 % off, at 16 x 16k."""
    table = json.loads(shared_path(H200_TABLE).read_text())
    old = LatencyModel.simple()
    errors = table_errors(table["decode"], lambda k, L: old.step(k, k * L) * 1000)
    worst = max(range(len(errors)), key=lambda i: abs(errors[i]))
    assert abs(errors[worst]) == pytest.approx(0.358, abs=0.005)
    assert (table["decode"][worst]["k"], table["decode"][worst]["L"]) == (16, 16384)


def test_fit_latency_on_a_table_writes_a_file_every_reader_takes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps(synthetic_table(6.0, 0.0, 3e-5)))
    out = tmp_path / "latency.json"
    assert cli.main(["fit-latency", str(table), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "every cell within 0.0%" in said and "step_per_context_s" in said
    model = load_latency_model(out)
    assert model.step(1, 0) == pytest.approx(6e-3) and model.step_per_context_s == pytest.approx(3e-8)
    assert resolve_latency(str(out)) == model and resolve_latency(None) == H200 and resolve_latency("H100").gpu.startswith("NVIDIA H100")
    served = ReplayConfig(latency_from=str(out), capacity=2).latency
    assert served is not None and served.step_per_context_s == model.step_per_context_s and served.capacity == 2
    assert cli.main(["fit-latency", str(tmp_path / "none.json")]) == 2
