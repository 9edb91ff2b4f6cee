"""The step-cost probe: what it imports, and a run on a CPU with a tiny config, read back by every reader.

The same code path as on a GPU except the CUDA-graph capture, which needs CUDA."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sprint import cli
from sprint.core.errors import UserError
from sprint.evaluation.evaluate import evaluate
from sprint.latency import probe_command
from sprint.latency.model import load_latency_model
from sprint.latency.shapes import SHAPES, parameter_count
from sprint.timing.replay_server import ReplayConfig
from tests.test_evaluate import BASELINE, TRAJECTORY

LATENCY = Path(probe_command.__file__).parent


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_measuring_part_imports_torch_and_the_standard_library_only() -> None:
    """So it runs where only PyTorch is installed (`python -m sprint.latency.probe` from a checkout)."""
    allowed = set(sys.stdlib_module_names) | {"__future__", "torch"}
    for name, extra in (("probe.py", {"sprint.latency.stepfit", "sprint.latency.shapes"}), ("stepfit.py", set()),
                        ("shapes.py", set())):
        outside = {m for m in _imports(LATENCY / name) if m.split(".")[0] not in allowed} - extra
        assert not outside, f"{name} imports {outside}"
    for init in (LATENCY / "__init__.py", LATENCY.parent / "__init__.py"):
        assert not _imports(init) - {"__future__"}, init


@pytest.fixture(scope="module")
def torch_python() -> str:
    try:
        python = probe_command.torch_python(None)
    except UserError as exc:
        pytest.skip(f"no Python with torch: {exc}")
    return python or sys.executable


def test_probe_on_a_cpu_writes_a_latency_file_every_reader_takes(tmp_path: Path, torch_python: str, tok_dir: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cpu.json"
    assert cli.main(["gpu-probe", "--shape", "tiny", "--out", str(out), "--python", torch_python,
                     "--batch-sizes", "1,2", "--contexts", "16,64", "--prefill", "0:8,0:32"]) == 0
    said = capsys.readouterr().out
    assert "modelled GPU: CPU" in said
    data = json.loads(out.read_text())
    assert [(c["k"], c["L"]) for c in data["decode"]] == [(1, 16), (2, 16), (1, 64), (2, 64)]
    assert len(data["prefill"]) == 2 and data["copy_TBps"] > 0 and data["matmul_TFLOPs"] > 0
    assert data["method"]["graphs"] is False and "two batched matmuls" in data["method"]["decode"]
    # embedding + head 2 x 512 x 64, two layers of (64 x 128 + 128 qkv, 64 x 64 out, 3 x 64 x 128 MLP, 2 x 64 norms), a norm
    assert data["params"] == 65_536 + 2 * 37_120 + 64 and data["config"]["hidden"] == 64
    assert all(c["step_ms"] > 0 for c in data["decode"]) and data["fit"]["decode"]["cells"] == 4
    model = load_latency_model(out)
    assert model.gpu.startswith("CPU") and model.step(1, 16) > 0
    served = ReplayConfig(latency_from=str(out)).latency
    assert served is not None and served.step_base_s == model.step_base_s
    # evaluate --latency reads it too: the modelled seconds are labelled with the probe's device
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "planner_trajectory_1.txt").write_text(TRAJECTORY)
    (logs / "base_model_trajectory_1.txt").write_text(BASELINE)
    ev = evaluate(logs, gold={"1": "14"}, planner_tokenizer=str(tok_dir), out_dir=tmp_path / "out", latency=str(out),
                  resamples=0, workers=1, plots=False)
    assert ev.table2["modelled"] == f"modelled: {model.gpu}, one problem at a time"
    assert all(r["modelled_seconds"]["value"] > 0 for r in ev.table2["rows"])


def test_probe_reads_a_model_folders_shape_and_stops_at_its_time_cap(tmp_path: Path, torch_python: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 1, "vocab_size": 100}))
    out = tmp_path / "capped.json"
    done = subprocess.run([torch_python, "-m", "sprint.latency.probe", "--shape", str(folder), "--out", str(out),
                           "--time-cap", "0"], cwd=probe_command.PACKAGE_ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "time cap of 0 s reached: 9 cells not measured" in done.stdout
    data = json.loads(out.read_text())
    assert data["config"] == {"hidden": 32, "inter": 64, "layers": 1, "heads": 4, "kv": 1, "hd": 8, "vocab": 100}
    assert data["decode"] == [] and data["method"]["skipped_cells"] == 9 and "latency_model" not in data
    with pytest.raises(UserError, match="holds no latency model"):
        load_latency_model(out)


def test_parameter_count_of_the_7b_shape() -> None:
    """Qwen2.5-7B's published count, which R1-Distill-Qwen-7B (a fine-tune of it) shares. The H200 table says
    7,615,612,928: 3,584 fewer, one hidden-size vector (its final norm) left uncounted."""
    assert parameter_count(SHAPES["r1-distill-qwen-7b"]) == 7_615_616_512


def test_unknown_shape_is_a_user_error(tmp_path: Path) -> None:
    assert cli.main(["gpu-probe", "--shape", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.json")]) == 2
