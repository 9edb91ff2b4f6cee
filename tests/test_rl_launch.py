"""run_grpo.sh: the three commands it builds, and ms-swift's own parsers accepting them."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sprint.core.resources import config_file
from sprint.llm.serve import free_port
from sprint.rl.launch import GRPOOptions, build_commands

REPO_ROOT = Path(__file__).resolve().parents[1]
RL_PYTHON = Path(os.environ.get("RL_VENV", REPO_ROOT / ".venv-rl")) / "bin" / "python"
SCRIPT_VARS = ("MODEL", "DATA", "TASK", "SPLIT", "RANGE", "REFERENCE_RUN", "REFERENCE_COLUMN", "OUTPUT_DIR", "CONFIG",
               "NPROC_PER_NODE", "NNODES", "ROLLOUT_HOST", "ROLLOUT_PORT", "ROLLOUT_URL", "ROLLOUT_DEVICES",
               "TRAIN_DEVICES", "ROLLOUT_TIMEOUT", "ROLLOUT_ARGS", "NUM_GENERATIONS", "LR", "BETA", "REWARD_WEIGHTS", "MAX_STEPS",
               "SWIFT_BIN", "CPU", "DRY_RUN", "VLLM_PLUGINS")


def dry_run(env: dict[str, str], *args: str) -> dict[str, list[str]]:
    clean = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    result = subprocess.run(["bash", str(REPO_ROOT / "run_grpo.sh"), *args], capture_output=True, text=True,
                            env={**clean, "DRY_RUN": "1", "PYTHON": str(REPO_ROOT / ".venv" / "bin" / "python"), **env},
                            timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    return {line[2:]: shlex.split(nxt) for line, nxt in zip(lines, lines[1:] + [""])
            if line[2:] in ("data", "rollout", "rlhf")}


def values(argv: list[str], flag: str) -> list[str]:
    """The values after `flag` (up to the next flag)."""
    i = argv.index(flag)
    out = []
    for a in argv[i + 1:]:
        if a.startswith("--"):
            break
        out.append(a)
    return out


def test_dry_run_prints_the_data_rollout_and_training_commands():
    cmds = dry_run({"DATA": "train.jsonl", "TASK": "countdown", "MODEL": "/ckpt", "REFERENCE_RUN": "/runs/base",
                    "NUM_GENERATIONS": "4", "LR": "2e-6", "BETA": "0.01", "REWARD_WEIGHTS": "1,0.5,1",
                    "NPROC_PER_NODE": "2", "ROLLOUT_PORT": "9100", "ROLLOUT_DEVICES": "0", "TRAIN_DEVICES": "1,2",
                    "OUTPUT_DIR": "/out", "ROLLOUT_ARGS": "--vllm_max_model_len 8192"}, "--seed", "7")
    assert list(cmds) == ["data", "rollout", "rlhf"]
    data, rollout, rlhf = cmds["data"], cmds["rollout"], cmds["rlhf"]
    assert data[1:4] == ["-m", "sprint.rl.grpo_data", "--data"] and values(data, "--reference-run") == ["/runs/base"]
    assert values(data, "--output") == ["/out/grpo_rows.jsonl"] and values(data, "--task") == ["countdown"]

    env = dict(a.split("=", 1) for a in rollout[: rollout.index(next(a for a in rollout if a.endswith("swift")))])
    assert env["SPRINT_RL_MAX_PHASES"] == "12" and env["SPRINT_RL_SCHEDULE"] == "barrier"
    assert env["CUDA_VISIBLE_DEVICES"] == "0" and env["VLLM_PLUGINS"] == "none"
    assert "rollout" in rollout and values(rollout, "--model") == ["/ckpt"] and values(rollout, "--port") == ["9100"]
    assert values(rollout, "--multi_turn_scheduler") == ["sprint"] and values(rollout, "--vllm_use_async_engine") == ["true"]
    assert values(rollout, "--external_plugins") == [str(REPO_ROOT / "sprint" / "rl" / "plugin.py")]
    assert rollout[-2:] == ["--vllm_max_model_len", "8192"]  # ROLLOUT_ARGS comes last: it wins

    assert rlhf[0] == "NPROC_PER_NODE=2" and "CUDA_VISIBLE_DEVICES=1,2" in rlhf[:3]
    assert values(rlhf, "--rlhf_type") == ["grpo"] and values(rlhf, "--dataset") == ["/out/grpo_rows.jsonl"]
    assert values(rlhf, "--reward_funcs") == ["sprint_correct", "sprint_format", "sprint_latency"]
    assert values(rlhf, "--reward_weights") == ["1", "0.5", "1"]
    assert values(rlhf, "--num_generations") == ["4"] and values(rlhf, "--beta") == ["0.01"]
    assert float(values(rlhf, "--learning_rate")[0]) == 2e-6
    assert values(rlhf, "--vllm_mode") == ["server"] and values(rlhf, "--vllm_server_port") == ["9100"]
    assert values(rlhf, "--vllm_server_pass_dataset") == ["true"] and rlhf[-2:] == ["--seed", "7"]


def test_defaults_come_from_the_config_and_an_external_server_is_not_started():
    cmds = dry_run({"DATA": "d.jsonl", "ROLLOUT_URL": "http://10.0.0.2:8000"})
    assert list(cmds) == ["data", "rlhf"]  # no rollout command: the server runs elsewhere
    rlhf = cmds["rlhf"]
    assert values(rlhf, "--num_generations") == ["8"] and values(rlhf, "--reward_weights") == ["1.0", "0.2", "0.5"]
    assert values(rlhf, "--beta") == ["0.001"] and values(rlhf, "--vllm_server_base_url") == ["http://10.0.0.2:8000"]
    assert values(rlhf, "--model") == ["deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"] and "NPROC_PER_NODE=1" not in rlhf


def test_a_rollout_flag_alone_in_rollout_args_is_passed_on():
    """ROLLOUT_ARGS=--flag (one word starting with --) is a value, not an option of `sprint grpo`."""
    rollout = dry_run({"DATA": "d.jsonl", "ROLLOUT_ARGS": "--vllm_enforce_eager"})["rollout"]
    assert rollout[-1] == "--vllm_enforce_eager"


def test_rollout_timeout_bounds_the_wait_for_the_rollout_server(tmp_path: Path, shared_data: Path):
    """ROLLOUT_TIMEOUT, which the timeout's own error message tells the user to raise, reaches `sprint grpo`."""
    with open(shared_data / "countdown" / "countdown_3to4_uft.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(2)]
    data = tmp_path / "countdown.jsonl"
    data.write_text("".join(json.dumps({**r, "reference_tokens": 64}) + "\n" for r in rows))
    clean = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    env = {**clean, "PYTHON": str(REPO_ROOT / ".venv" / "bin" / "python"), "DATA": str(data), "TASK": "countdown",
           "SPLIT": "train", "REFERENCE_COLUMN": "reference_tokens", "OUTPUT_DIR": str(tmp_path / "out"),
           "ROLLOUT_URL": f"http://127.0.0.1:{free_port()}", "ROLLOUT_TIMEOUT": "1", "SWIFT_BIN": sys.executable}
    result = subprocess.run(["bash", str(REPO_ROOT / "run_grpo.sh")], capture_output=True, text=True, env=env,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "did not answer /health/ within 1s; raise ROLLOUT_TIMEOUT" in result.stderr
    assert (tmp_path / "out" / "grpo_rows.jsonl").is_file()  # the rows come first, then the wait


def test_missing_data_is_a_clear_error():
    result = subprocess.run(["bash", str(REPO_ROOT / "run_grpo.sh")], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}, timeout=60)
    assert result.returncode == 2 and "set DATA" in result.stderr


_PARSE = r"""
import json, sys
from swift.arguments import RLHFArguments, RolloutArguments
from swift.utils.utils import _patch_get_type_hints
from transformers import HfArgumentParser
out = {}
requests = json.loads(sys.argv[1])
for key in requests:
    name = key.split(":")[0]
    cls = RolloutArguments if name == "rollout" else RLHFArguments
    argv = requests[key]
    with _patch_get_type_hints():
        parser = HfArgumentParser([cls])
    try:
        ns, rest = parser.parse_known_args(argv)
        out[key] = {"rest": rest, "ns": {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, list, type(None)))}}
    except SystemExit:
        out[key] = {"rest": ["<argparse error>"], "ns": {}}
print(json.dumps(out, default=str))
"""


@pytest.mark.swift
def test_ms_swift_parsers_accept_both_commands_and_reject_a_renamed_flag(tmp_path: Path):
    if not RL_PYTHON.exists():
        pytest.skip(f"RL venv missing ({RL_PYTHON}); run scripts/install_rl.sh")
    cmds = build_commands(GRPOOptions(data="d.jsonl", model="/m", output_dir=str(tmp_path)))
    argvs = {"rollout": cmds["rollout"].argv[2:], "rlhf": cmds["rlhf"].argv[2:]}  # drop "swift rollout"/"swift rlhf"
    # the mini experiment's recipe, on a CPU: `python -m sprint.rl.cpu_rollout` takes `swift rollout`'s arguments
    mini = build_commands(GRPOOptions(data="d.jsonl", model="/m", output_dir=str(tmp_path), cpu=True,
                                      config=str(config_file("grpo_mini.yaml"))))
    assert mini["rollout"].argv[1:3] == ["-m", "sprint.rl.cpu_rollout"]
    assert mini["rollout"].env["SPRINT_RL_CPU_WEIGHT_SYNC"] == mini["rlhf"].env["SPRINT_RL_CPU_WEIGHT_SYNC"] == "1"
    argvs.update({"rollout:mini": mini["rollout"].argv[3:], "rlhf:mini": mini["rlhf"].argv[2:]})
    bad = {"rollout:bad": argvs["rollout"] + ["--vllm_async_engine", "true"],
           "rlhf:bad": [a if a != "--num_generations" else "--num_samples" for a in argvs["rlhf"]]}
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([str(RL_PYTHON), "-c", _PARSE, json.dumps({**argvs, **bad})], capture_output=True,
                            text=True, env=env, timeout=600)  # one process: importing ms-swift is slow
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    assert parsed["rollout"]["rest"] == [] and parsed["rlhf"]["rest"] == []
    rollout, rlhf = parsed["rollout"]["ns"], parsed["rlhf"]["ns"]
    assert rollout["multi_turn_scheduler"] == "sprint" and rollout["vllm_use_async_engine"] is True
    assert rlhf["rlhf_type"] == "grpo" and rlhf["num_generations"] == 8 and rlhf["beta"] == pytest.approx(0.001)
    assert rlhf["reward_funcs"] == ["sprint_correct", "sprint_format", "sprint_latency"]
    assert [float(w) for w in rlhf["reward_weights"]] == [1.0, 0.2, 0.5] and rlhf["vllm_mode"] == "server"
    for key in ("rollout:mini", "rlhf:mini"):
        assert parsed[key]["rest"] == [], parsed[key]["rest"]
    assert parsed["rlhf:mini"]["ns"]["reward_funcs"][-1] == "sprint_critical_path"
    assert [float(w) for w in parsed["rlhf:mini"]["ns"]["reward_weights"]] == [1.0, 0.2, 0.5, 0.0]
    assert parsed["rollout:bad"]["rest"][:1] == ["--vllm_async_engine"]
    assert "--num_samples" in parsed["rlhf:bad"]["rest"]
