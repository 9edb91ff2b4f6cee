"""Multi-node fine-tuning: NNODES / NODE_RANK / MASTER_ADDR / MASTER_PORT reach ms-swift's torchrun
launcher, every node's command is printed by DRY_RUN=1, and ms-swift's own code accepts them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sprint.core.errors import UserError
from sprint.training.finetune import (
    TORCHRUN_VARS, FinetuneOptions, build_command, check_swift_args, command_env, default_swift_bin, node_commands,
    swift_python,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def options(**kw) -> FinetuneOptions:
    base = dict(model="/models/r1-7b", train_data="/data/train.jsonl", val_data="/data/test.jsonl",
                output_dir="/out", nproc_per_node=8, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    base.update(kw)
    return FinetuneOptions(**base)


def _accumulation(command) -> int:
    return int(command.argv[command.argv.index("--gradient_accumulation_steps") + 1])


def test_multi_node_env_and_global_batch() -> None:
    command = build_command(options(nproc_per_node=2))
    assert command.env == {"NPROC_PER_NODE": "2", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                           "MASTER_PORT": "29500"}
    assert _accumulation(command) == 4  # global batch 16 = 2 nodes x 2 GPUs x 1 per device x 4
    single = build_command(options(nnodes=1, node_rank=0, master_addr=None, nproc_per_node=2))
    assert "NNODES" not in single.env and _accumulation(single) == 8
    nodes = node_commands(options())
    assert [c.env["NODE_RANK"] for c in nodes] == ["0", "1"]
    assert nodes[0].argv == nodes[1].argv  # the same training arguments on every node


def test_multi_node_mistakes_are_one_line_errors() -> None:
    with pytest.raises(UserError, match="MASTER_ADDR"):
        build_command(options(master_addr=None))
    with pytest.raises(UserError, match="NODE_RANK must be in 0..1"):
        build_command(options(node_rank=2))
    with pytest.raises(UserError, match="NNODES must be at least 1"):
        build_command(options(nnodes=0, node_rank=0))


def test_inherited_torchrun_variables_do_not_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in TORCHRUN_VARS:
        monkeypatch.setenv(key, "7")
    env = command_env(build_command(options(nnodes=1, node_rank=0, master_addr=None, nproc_per_node=1,
                                            deepspeed="none")))
    assert not any(key in env for key in TORCHRUN_VARS)


def test_dry_run_prints_every_node(tmp_path: Path) -> None:
    env = {**os.environ, "DRY_RUN": "1", "NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1",
           "OUTPUT_DIR": str(tmp_path / "out")}
    result = subprocess.run(["bash", str(REPO_ROOT / "run_finetune.sh")], env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "# node 0 of 2:" in lines and "# node 1 of 2 (this node):" in lines
    node0 = lines[lines.index("# node 0 of 2:") + 1]
    node1 = lines[lines.index("# node 1 of 2 (this node):") + 1]
    assert node0.startswith("MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=2 NODE_RANK=0 NPROC_PER_NODE=8 ")
    assert node1.startswith("MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 NNODES=2 NODE_RANK=1 NPROC_PER_NODE=8 ")
    assert " sft " in node1 and "--deepspeed zero3" in node1
    assert any("torchrun --nproc_per_node 8 --nnodes 2 --node_rank 1 --master_addr 10.0.0.1" in x for x in lines)
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


_TORCHRUN_ARGS = "import json; from swift.cli.main import get_torchrun_args; print(json.dumps(get_torchrun_args()))"


@pytest.mark.swift
def test_ms_swift_reads_the_multi_node_settings() -> None:
    swift = default_swift_bin()
    if not swift.exists():
        pytest.skip(f"ms-swift missing ({swift}); run scripts/install_swift.sh")
    command = build_command(options(), swift)
    assert check_swift_args(command)["ok"]  # ms-swift's own parser takes the arguments
    # ms-swift's launcher turns the environment into torchrun's flags
    result = subprocess.run([str(swift_python(swift)), "-c", _TORCHRUN_ARGS], env=command_env(command),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    args = json.loads(result.stdout.strip().splitlines()[-1])
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs == {"--nproc_per_node": "8", "--master_port": "29500", "--nnodes": "2", "--node_rank": "1",
                     "--master_addr": "10.0.0.1"}
