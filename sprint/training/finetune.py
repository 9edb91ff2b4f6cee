"""Fine-tuning with ms-swift: `sprint finetune` (what run_finetune.sh runs).

ms-swift lives in its own environment (.venv-swift; it pins transformers<5.20 and datasets<4.8.5),
so this module never imports it: it builds the `swift sft` command line from a recipe in
configs/ plus the caller's overrides, checks the data with `sprint.training.sft_check`, and runs ms-swift
as a subprocess. Building the command is a pure function, so tests can parse exactly what a
cluster run would receive with ms-swift's own argument parser (`check_swift_args`).

The recipe (configs/finetune_full.yaml) is the paper's: full fine-tuning, 5 epochs, per-device
batch 1 (global 16), bf16, DeepSpeed ZeRO-3, 5% warmup then linear decay, eval/save every 100
steps keeping the best checkpoint by eval loss. Learning rate: the paper says 1e-5, the authors'
run script passes 1e-6; we default to the paper's 1e-5 (LR=1e-6 reproduces the script).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sprint.core.data import missing_path_message
from sprint.core.errors import UserError
from sprint.core.options import add_options, config_from, flag_name, option
from sprint.core.resources import SWIFT_ENV, config_file
from sprint.training.batches import ORDER_FILE, write_batch_order
from sprint.training.sft_check import check_sft

TUNERS = ("full", "lora")
DEFAULT_MODEL = "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"

# `float32_attention: true` in a recipe: ms-swift loads this plugin, which registers this attention (read by
# path, not imported here: it imports transformers, which this environment need not have)
ATTENTION_PLUGIN = Path(__file__).with_name("attention.py")
ATTENTION_NAME = "sdpa_fp32"

# Keys sprint fills in itself; a recipe that sets them would be silently overridden.
MANAGED_KEYS = ("model", "dataset", "val_dataset", "output_dir", "gradient_accumulation_steps")


def default_swift_bin() -> Path:
    """$SWIFT_BIN, else $SWIFT_VENV/bin/swift, else <checkout>/.venv-swift/bin/swift (a wheel has no
    checkout: then SWIFT_BIN or SWIFT_VENV must be set, a UserError says so).

    Never `swift` from PATH: that is often Apple's Swift compiler.
    """
    if os.environ.get("SWIFT_BIN"):
        return Path(os.environ["SWIFT_BIN"])
    return SWIFT_ENV.require("or SWIFT_BIN, or --swift-bin") / "bin" / "swift"


def config_path(tuner: str) -> Path:
    return config_file(f"finetune_{tuner}.yaml")


@dataclass
class Recipe:
    """A training recipe from configs/: ms-swift arguments plus the global batch size to keep,
    and whether each batch is sorted into micro-batches of like length (sprint.training.batches)."""

    swift_args: dict[str, Any]
    global_batch_size: int = 16
    path: str = ""
    sorted_micro_batches: bool = False
    float32_attention: bool = False  # attention in float32 under bf16 autocast (sprint/training/attention.py)


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"fine-tuning config {path} does not exist; pass --config or TUNER=full|lora")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    args = data.get("swift")
    if not isinstance(args, dict) or not args:
        raise UserError(f"{path} has no `swift:` mapping of ms-swift arguments")
    clash = [k for k in MANAGED_KEYS if k in args]
    if clash:
        raise UserError(f"{path} sets {clash}; these come from the command line (MODEL, TRAIN_DATA, ...), remove them")
    batch = data.get("global_batch_size", 16)
    if not isinstance(batch, int) or batch < 1:
        raise UserError(f"{path}: global_batch_size must be a positive integer, got {batch!r}")
    flags = {key: data.get(key, False) for key in ("sorted_micro_batches", "float32_attention")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise UserError(f"{path}: {key} must be true or false, got {value!r}")
    if flags["float32_attention"] and "attn_impl" in args:
        raise UserError(f"{path}: float32_attention picks the attention (attn_impl {ATTENTION_NAME}); remove attn_impl")
    return Recipe(dict(args), batch, str(path), **flags)


def _optional(kind: type):
    """argparse type where an empty string (an unset shell variable) means None."""

    def parse(text: str):
        return None if text.strip() == "" else kind(text)

    parse.__name__ = kind.__name__
    return parse


@dataclass
class FinetuneOptions:
    """What run_finetune.sh's variables set. None means: keep the recipe's value (configs/finetune_<tuner>.yaml)."""

    train_data: str = option(help="training .jsonl (messages layout, from the packing stage)", flags=("--train",),
                             var="TRAIN_DATA")
    output_dir: str = option(help="where ms-swift writes checkpoints, logging.jsonl, best/ and last/", var="OUTPUT_DIR")
    model: str = option(DEFAULT_MODEL, "model folder or hub id", var="MODEL")
    val_data: str | None = option(None, "validation .jsonl; without it there is no eval loss and no best checkpoint",
                                  flags=("--val",), type=_optional(str), var="VAL_DATA")
    tuner: str = option("full", "full (the paper) or lora", choices=TUNERS, var="TUNER")
    config: str | None = option(None, "recipe YAML (default configs/finetune_<tuner>.yaml)", type=_optional(str), var="CONFIG")
    nproc_per_node: int = option(1, "GPUs on this node (ms-swift runs torchrun)", var="NPROC_PER_NODE")
    # Multi-node: run the same command on every node with its own NODE_RANK; ms-swift hands these to
    # torchrun (its launcher reads NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT from the environment).
    nnodes: int = option(1, "nodes in the training job (torchrun --nnodes)", var="NNODES")
    node_rank: int = option(0, "this node's rank, 0 .. NNODES-1; node 0 hosts the rendezvous", var="NODE_RANK")
    master_addr: str | None = option(None, "address of node 0, reachable from every node (needed when NNODES > 1)",
                                     type=_optional(str), var="MASTER_ADDR")
    master_port: int = option(29500, "free TCP port on node 0 for the rendezvous (torchrun's default)",
                              var="MASTER_PORT")
    learning_rate: float | None = option(
        None, "learning rate (default: the config's, 1e-5 full as in the paper; the authors' script used 1e-6)",
        flags=("--lr",), type=_optional(float), var="LR")
    epochs: float | None = option(None, "epochs (default: the config's, 5)", type=_optional(float), var="EPOCHS")
    max_length: int | None = option(None, "max tokens per row; longer rows are dropped (default: the config's, 7168)",
                                    type=_optional(int), var="MAX_LENGTH")
    deepspeed: str | None = option(None, "zero2, zero3, a JSON file, or none (default: the config's)",
                                   type=_optional(str), var="DEEPSPEED")
    torch_dtype: str | None = option(None, "bfloat16 (GPU), float32 (CPU) (default: the config's)",
                                     type=_optional(str), var="TORCH_DTYPE")
    max_steps: int | None = option(None, "stop after this many optimizer steps", type=_optional(int), var="MAX_STEPS")
    eval_steps: int | None = option(None, "evaluate every N steps (default: config's)", type=_optional(int), var="EVAL_STEPS")
    save_steps: int | None = option(None, "save every N steps (default: config's)", type=_optional(int), var="SAVE_STEPS")
    model_type: str | None = option(None, "ms-swift model_type (default: config's, qwen2)", type=_optional(str),
                                    var="MODEL_TYPE")
    template: str | None = option(None, "ms-swift template (default: config's, deepseek_r1)", type=_optional(str),
                                  var="TEMPLATE")
    extra_args: list[str] = option(cli=False, default_factory=list)  # appended last, so they win


@dataclass
class FinetuneRun:
    """How `sprint finetune` runs the command (not part of the command itself)."""

    tokenizer: str | None = option(None, "tokenizer for the data check (default: --model)", type=_optional(str),
                                   var="TOKENIZER")
    swift_bin: str | None = option(None, "ms-swift launcher (default $SWIFT_BIN or .venv-swift/bin/swift)",
                                   type=_optional(str), var="SWIFT_BIN")
    skip_check: bool = option(False, "do not check the data before training", var="SKIP_CHECK")
    validate_args: bool = option(False, "have ms-swift's own parser check the arguments first (with --dry-run: check only)",
                                 var="VALIDATE")
    dry_run: bool = option(False, "print the swift command and stop", var="DRY_RUN")


@dataclass
class BatchOrder:
    """The file of rows in training order that the command reads (written before it runs)."""

    train: str
    out: str
    batch_size: int
    steps: int
    seed: int


@dataclass
class SwiftCommand:
    argv: list[str]
    env: dict[str, str]  # variables to add to the environment (NPROC_PER_NODE for torchrun)
    order: BatchOrder | None = None

    def shell(self) -> str:
        """The command as one copy-pasteable shell line."""
        prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(prefix + [shlex.quote(a) for a in self.argv])


def cpu_has_bf16(cpuinfo: str | Path = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AVX-512 BF16 or AMX); False where it cannot tell."""
    try:
        flags = set(Path(cpuinfo).read_text(encoding="utf-8", errors="replace").split())
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def resolve_swift_args(options: FinetuneOptions, recipe: Recipe) -> dict[str, Any]:
    """The recipe's ms-swift arguments with the options applied (a dict: key -> value)."""
    if options.tuner not in TUNERS:
        raise UserError(f"TUNER must be one of {TUNERS}, got {options.tuner!r}")
    if options.nproc_per_node < 1:
        raise UserError(f"NPROC_PER_NODE must be at least 1, got {options.nproc_per_node}")
    if options.nnodes < 1:
        raise UserError(f"NNODES must be at least 1, got {options.nnodes}")
    if not 0 <= options.node_rank < options.nnodes:
        raise UserError(f"NODE_RANK must be in 0..{options.nnodes - 1} (NNODES={options.nnodes}), got {options.node_rank}")
    if options.nnodes > 1 and not options.master_addr:
        raise UserError("NNODES > 1 needs MASTER_ADDR, the address of node 0 that every node can reach")
    if not 0 < options.master_port < 65536:
        raise UserError(f"MASTER_PORT must be a TCP port (1-65535), got {options.master_port}")
    args: dict[str, Any] = {"model": options.model, "dataset": [options.train_data]}
    if options.val_data:
        # ms-swift evaluates only when it has a validation set (or splits one off); without it
        # there is no eval loss and so no best checkpoint.
        args["val_dataset"] = [options.val_data]
    args.update(recipe.swift_args)
    overrides = {
        "learning_rate": options.learning_rate,
        "num_train_epochs": options.epochs,
        "max_length": options.max_length,
        "deepspeed": options.deepspeed,
        "torch_dtype": options.torch_dtype,
        "max_steps": options.max_steps,
        "eval_steps": options.eval_steps,
        "save_steps": options.save_steps,
        "model_type": options.model_type,
        "template": options.template,
    }
    args.update({k: v for k, v in overrides.items() if v is not None})
    if str(args.get("deepspeed", "")).lower() in ("", "none", "false", "no"):
        args.pop("deepspeed", None)
    if args.get("tuner_type") != options.tuner:
        raise UserError(
            f"config {recipe.path} trains tuner_type={args.get('tuner_type')!r} but TUNER={options.tuner}; "
            "pick the matching configs/finetune_<tuner>.yaml"
        )
    if not options.val_data:
        # Nothing to evaluate: keeping "the best by eval loss" would make transformers refuse to start.
        for key in ("eval_strategy", "eval_steps", "load_best_model_at_end", "metric_for_best_model"):
            args.pop(key, None)
    per_device = int(args.get("per_device_train_batch_size", 1))
    gpus = options.nproc_per_node * options.nnodes
    args["gradient_accumulation_steps"] = max(1, math.ceil(recipe.global_batch_size / (gpus * per_device)))
    args["output_dir"] = options.output_dir
    if args.get("use_cpu") and args.get("bf16") and not cpu_has_bf16():
        # without AVX-512 BF16 or AMX, PyTorch emulates bf16 matrix products on the CPU, hundreds of times slower
        # than float32 (measured on an AVX2-only EPYC: 1.2 s against 454 s for five 2000 x 2000 products)
        print("sprint finetune: this CPU has no bf16 instructions (avx512_bf16 / amx_bf16): training in float32",
              file=sys.stderr)
        args["bf16"] = False
    if recipe.float32_attention:
        # ms-swift imports the plugin by path before it builds the model; it registers the attention by name
        args["attn_impl"] = ATTENTION_NAME
        args["external_plugins"] = [*args.get("external_plugins", []), str(ATTENTION_PLUGIN)]
    if recipe.sorted_micro_batches:
        if gpus > 1:
            raise UserError(f"{recipe.path}: sorted_micro_batches is for one process; unset it for NPROC_PER_NODE/NNODES > 1")
        if int(args.get("max_steps", -1)) <= 0:
            raise UserError(f"{recipe.path}: sorted_micro_batches needs max_steps (MAX_STEPS): the order file holds that many batches")
        # ms-swift reads the batches as written: no shuffle at load, none in the sampler
        args["dataset"] = [str(Path(options.output_dir) / ORDER_FILE)]
        args["dataset_shuffle"] = False
        args["train_dataloader_shuffle"] = False
    return args


def order_for(options: FinetuneOptions, recipe: Recipe, args: dict[str, Any]) -> BatchOrder | None:
    """What the order file must hold for these resolved arguments (None without sorted micro-batches)."""
    if not recipe.sorted_micro_batches:
        return None
    return BatchOrder(options.train_data, args["dataset"][0],
                      int(args.get("per_device_train_batch_size", 1)) * args["gradient_accumulation_steps"],
                      int(args["max_steps"]), int(args.get("data_seed", args.get("seed", 42))))


def to_argv(args: dict[str, Any]) -> list[str]:
    """ms-swift's own YAML-to-argv rule: lists become several values, dicts JSON, bools true/false."""
    argv: list[str] = []
    for key, value in args.items():
        argv.append(f"--{key}")
        if isinstance(value, (list, tuple)):
            argv.extend(_scalar(v) for v in value)
        elif isinstance(value, dict):
            argv.append(json.dumps(value, ensure_ascii=False))
        else:
            argv.append(_scalar(value))
    return argv


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # EPOCHS=3 reads as 3.0; ms-swift gets "3" either way
    return str(value)


def build_command(options: FinetuneOptions, swift_bin: str | Path | None = None) -> SwiftCommand:
    """The exact `swift sft …` invocation (and environment) for these options."""
    recipe = load_recipe(options.config or config_path(options.tuner))
    args = resolve_swift_args(options, recipe)
    argv = [str(swift_bin or default_swift_bin()), "sft", *to_argv(args), *options.extra_args]
    env: dict[str, str] = {}
    # ms-swift launches torchrun when NPROC_PER_NODE is set. DeepSpeed needs the distributed
    # environment torchrun sets up even on one GPU, so set it then too.
    if options.nproc_per_node > 1 or options.nnodes > 1 or "deepspeed" in args:
        env["NPROC_PER_NODE"] = str(options.nproc_per_node)
    if options.nnodes > 1:
        env.update({"NNODES": str(options.nnodes), "NODE_RANK": str(options.node_rank),
                    "MASTER_ADDR": str(options.master_addr), "MASTER_PORT": str(options.master_port)})
    return SwiftCommand(argv, env, order_for(options, recipe, args))


def node_commands(options: FinetuneOptions, swift_bin: str | Path | None = None) -> list[SwiftCommand]:
    """The command of every node of the job (they differ only in NODE_RANK)."""
    return [build_command(dataclasses.replace(options, node_rank=rank), swift_bin) for rank in range(options.nnodes)]


# Runs inside ms-swift's Python (.venv-swift), never in this one; reads {"level", "argvs"} as JSON
# on stdin and prints one result per argv. Level "parser": ms-swift's HfArgumentParser over
# SftArguments, the one `swift sft` uses, rejects unknown flags, bad types and values outside
# Literal choices; nothing is loaded. Level "full": it also builds SftArguments as `swift sft`
# does (model config read, DeepSpeed preset resolved, transformers' TrainingArguments checks) and
# stops before loading weights. Without a GPU, transformers' "bf16 needs a GPU" check is answered
# yes: this only parses, it never trains.
_ARGCHECK = r"""
import contextlib, io, json, sys
request = json.load(sys.stdin)
from swift.arguments import SftArguments
from swift.utils.utils import _patch_get_type_hints, parse_args
from transformers import HfArgumentParser
import transformers.training_args as ta
ta.is_torch_bf16_gpu_available = lambda: True

def enum(v):
    return str(getattr(v, "value", v))

def resolve(argv):
    if request["level"] == "parser":
        with _patch_get_type_hints():
            parser = HfArgumentParser([SftArguments])
        _, rest = parser.parse_known_args(argv)
        return rest, {}
    args, rest = parse_args(SftArguments, argv)
    t = args.training_args
    ds = t.deepspeed if isinstance(t.deepspeed, dict) else {}
    return rest, {"tuner_type": args.tuner_type, "learning_rate": t.learning_rate,
        "num_train_epochs": t.num_train_epochs, "per_device_train_batch_size": t.per_device_train_batch_size,
        "gradient_accumulation_steps": t.gradient_accumulation_steps, "bf16": t.bf16,
        "lr_scheduler_type": enum(t.lr_scheduler_type), "warmup": t.warmup_steps or getattr(t, "warmup_ratio", 0),
        "eval_strategy": enum(t.eval_strategy), "eval_steps": t.eval_steps, "save_steps": t.save_steps,
        "load_best_model_at_end": t.load_best_model_at_end, "metric_for_best_model": t.metric_for_best_model,
        "deepspeed_stage": ds.get("zero_optimization", {}).get("stage"), "max_length": args.max_length,
        "template": args.template, "val_dataset": args.val_dataset}

results = []
for argv in request["argvs"]:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rest, resolved = resolve(argv)
        if rest:
            results.append({"ok": False, "error": "ms-swift does not accept: " + " ".join(rest)})
        else:
            results.append({"ok": True, **resolved})
    except SystemExit:  # argparse: bad type or choice
        results.append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:]})
    except Exception as exc:  # __post_init__ checks of ms-swift / transformers
        results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(results))
"""


def swift_python(swift_bin: str | Path) -> Path:
    """The Python next to the swift launcher (same venv)."""
    return Path(swift_bin).parent / "python"


def parse_with_swift(commands: list[SwiftCommand], level: str = "parser", timeout: float = 600) -> list[dict[str, Any]]:
    """Have ms-swift itself parse each command's arguments, all in one process (its import is slow).

    Returns, per command, {"ok": True, ...what ms-swift resolved ("full" level)} or
    {"ok": False, "error": ...}. "parser" needs nothing but ms-swift; "full" also needs the model
    folder (config.json) and, for --deepspeed, the deepspeed package.
    """
    if level not in ("parser", "full"):
        raise ValueError(f"level must be parser or full, got {level!r}")
    if not commands:
        return []
    python = swift_python(commands[0].argv[0])
    if not python.exists():
        raise UserError(f"ms-swift's Python {python} is missing; run scripts/install_swift.sh or set SWIFT_BIN")
    env = command_env(commands[0])
    for key in TORCHRUN_VARS:  # parse in one process; torchrun is not involved in parsing
        env.pop(key, None)
    request = json.dumps({"level": level, "argvs": [c.argv[2:] for c in commands]})  # drop "swift sft"
    result = subprocess.run([str(python), "-c", _ARGCHECK], input=request, capture_output=True, text=True,
                            env=env, timeout=timeout)
    if result.returncode != 0:
        raise UserError(f"ms-swift could not parse arguments (exit {result.returncode}): {result.stderr.strip()[-2000:]}")
    results = json.loads(result.stdout.strip().splitlines()[-1])
    for r in results:
        if isinstance(r.get("error"), list):
            r["error"] = " ".join(r["error"])
    return results


def check_swift_args(command: SwiftCommand, level: str = "parser") -> dict[str, Any]:
    """parse_with_swift for one command; UserError when ms-swift rejects it."""
    result = parse_with_swift([command], level)[0]
    if not result["ok"]:
        raise UserError(f"ms-swift rejected the arguments: {result['error']}")
    return result


CHECKPOINT_LINKS = ("best", "last")  # ms-swift's create_checkpoint_symlink links in the output folder


def clear_checkpoint_links(output_dir: Path) -> list[str]:
    """Remove the `best`/`last` links an earlier run left in `output_dir`: ms-swift makes them with
    `os.symlink`, which fails at the end of a second training into the same folder. Only links go; a
    folder of that name is the user's and stays."""
    removed = []
    for name in CHECKPOINT_LINKS:
        link = output_dir / name
        if link.is_symlink():
            link.unlink()
            removed.append(name)
    return removed


def run_finetune(
    options: FinetuneOptions,
    swift_bin: str | Path | None = None,
    *,
    dry_run: bool = False,
    check_data: bool = True,
    validate: bool = False,
    tokenizer: str | None = None,
) -> int:
    """Check the data, then run `swift sft`; returns ms-swift's exit code.

    dry_run prints the command and stops (after ms-swift has parsed it, with validate). A real run
    checks ms-swift and the data first, so a mistake there is its one line, not a command then an error.
    """
    command = build_command(options, swift_bin)
    swift = Path(command.argv[0])
    if (validate or not dry_run) and not swift.exists():
        raise UserError(f"ms-swift not found at {swift}; run scripts/install_swift.sh (or set SWIFT_BIN / SWIFT_VENV)")
    if check_data and not dry_run:
        _check_data(options, tokenizer, command)
    if dry_run and options.nnodes > 1:
        for rank, other in enumerate(node_commands(options, swift_bin)):
            mark = " (this node)" if rank == options.node_rank else ""
            print(f"# node {rank} of {options.nnodes}{mark}:\n{other.shell()}", flush=True)
        torchrun = " ".join(f"--{k.lower()} {command.env[k]}" for k in TORCHRUN_VARS)
        print(f"# ms-swift starts on this node: torchrun {torchrun} .../swift/cli/sft.py ...", flush=True)
    else:
        print(command.shell(), flush=True)
    if validate:
        check_swift_args(command, "parser")
        print("ms-swift accepts these arguments", flush=True)
    if dry_run:
        return 0
    Path(options.output_dir).mkdir(parents=True, exist_ok=True)
    clear_checkpoint_links(Path(options.output_dir))
    if command.order:
        o = command.order
        write_batch_order(o.train, o.out, o.batch_size, o.steps, o.seed)
        print(f"{o.out}: {o.steps} batches of {o.batch_size} rows of {o.train}, each sorted by length", flush=True)
    (Path(options.output_dir) / "swift_command.sh").write_text(command.shell() + "\n", encoding="utf-8")
    return subprocess.run(command.argv, env=command_env(command)).returncode


TORCHRUN_VARS = ("NPROC_PER_NODE", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def command_env(command: SwiftCommand) -> dict[str, str]:
    """This process's environment with the command's variables; an inherited NPROC_PER_NODE or NNODES
    (run_finetune.sh's variables, often exported) must not switch ms-swift to torchrun on its own."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS}
    env.update(command.env)
    return env


def _check_data(options: FinetuneOptions, tokenizer: str | None, command: SwiftCommand) -> None:
    for field in ("train_data", "val_data"):  # before the tokenizer: a missing file is the likelier mistake
        path = getattr(options, field)
        if path and not Path(path).expanduser().exists():
            raise UserError(missing_path_message(path, flag_name(FinetuneOptions, field)))
    args = _argv_values(command.argv)
    max_length = int(args.get("max_length", ["0"])[0]) or None
    if max_length is None:
        raise UserError("the config sets no max_length; add one so over-long rows are dropped knowingly")
    report = check_sft(options.train_data, options.val_data, tokenizer or options.model, max_length, args.get("template", ["deepseek_r1"])[0])
    print(report.format(), flush=True)
    if not report.ok:
        raise UserError("the SFT data check failed (see above); fix the data, or pass --skip-check to train anyway")


def _argv_values(argv: list[str]) -> dict[str, list[str]]:
    """--key v1 v2 … -> {key: [v1, v2]}; a later --key wins, as in argparse."""
    values: dict[str, list[str]] = {}
    key = None
    for token in argv[2:]:
        if token.startswith("--"):
            key = token[2:]
            values[key] = []
        elif key is not None:
            values[key].append(token)
    return values


def options_from_args(args: argparse.Namespace) -> FinetuneOptions:
    extra = list(args.extra or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    return config_from(FinetuneOptions, args, extra_args=extra)


def register(parser: argparse.ArgumentParser) -> None:
    """Every flag of `sprint finetune`, from the two dataclasses."""
    parser.description = __doc__
    add_options(parser, FinetuneOptions)
    add_options(parser, FinetuneRun)
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more `swift sft` arguments (they win)")


def handle(args: argparse.Namespace) -> int:
    how = config_from(FinetuneRun, args)
    return run_finetune(options_from_args(args), how.swift_bin, dry_run=how.dry_run, check_data=not how.skip_check,
                        validate=how.validate_args, tokenizer=how.tokenizer)
