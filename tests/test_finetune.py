"""Fine-tuning: the swift command line built from configs/, run_finetune.sh, and ms-swift itself.

The fast tests check what we send. The `swift` tests have ms-swift 4.6 parse the exact GPU
command lines (a renamed or unknown flag fails here, not on a cluster) and train the tiny model
for two steps on the CPU through run_finetune.sh.
"""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from sprint.cli import build_parser
from sprint.core.errors import UserError
from sprint.training.finetune import (
    FinetuneOptions,
    SwiftCommand,
    build_command,
    check_swift_args,
    clear_checkpoint_links,
    config_path,
    cpu_has_bf16,
    default_swift_bin,
    load_recipe,
    parse_with_swift,
    run_finetune,
    swift_python,
    to_argv,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def options(**kw) -> FinetuneOptions:
    base = dict(model="/models/r1-7b", train_data="/data/train.jsonl", val_data="/data/test.jsonl",
                output_dir="/out", nproc_per_node=8)
    base.update(kw)
    return FinetuneOptions(**base)


def flags(command: SwiftCommand) -> dict[str, list[str]]:
    """--key v1 v2 … -> {key: [v1, v2]}, last occurrence wins (as argparse does)."""
    assert command.argv[1] == "sft"
    out: dict[str, list[str]] = {}
    key = None
    for token in command.argv[2:]:
        if token.startswith("--"):
            key = token[2:]
            out[key] = []
        else:
            out[key].append(token)
    return out


def sft_rows(n: int, start: int = 0) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        rows.append({
            "id": f"q{i}",
            "messages": [
                {"role": "user", "content": f"Plan, then execute.\n\n<Question>\nWhat is {i} + {i + 1}?\n</Question>\n\n"},
                {"role": "assistant", "content": (
                    f"<think>\n<Plan_1>\nAdd them.\n<prompt_1.1> Compute {i}+{i + 1}. </prompt_1.1>\n</Plan_1>\n\n"
                    f"<Execution_1>\n<execution_1.1>\n{i}+{i + 1}={2 * i + 1}\n</execution_1.1>\n</Execution_1>\n\n"
                    f"<Final_answer>\n\\boxed{{{2 * i + 1}}}\n</Final_answer>\n</think>")},
            ],
        })
    return rows


def write_data(folder: Path, n_train: int = 6, n_test: int = 2) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    train, test = folder / "train.jsonl", folder / "test.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in sft_rows(n_train)))
    test.write_text("".join(json.dumps(r) + "\n" for r in sft_rows(n_test, start=100)))
    return train, test


# --- the command line ----------------------------------------------------------------------------


def test_full_recipe_is_the_papers():
    cmd = build_command(options(), swift_bin="/venv/bin/swift")
    f = flags(cmd)
    assert cmd.argv[:2] == ["/venv/bin/swift", "sft"]
    expected = {
        "model": ["/models/r1-7b"], "dataset": ["/data/train.jsonl"], "val_dataset": ["/data/test.jsonl"],
        "output_dir": ["/out"], "tuner_type": ["full"], "template": ["deepseek_r1"], "model_type": ["qwen2"],
        "torch_dtype": ["bfloat16"], "deepspeed": ["zero3"], "num_train_epochs": ["5"],
        "per_device_train_batch_size": ["1"], "learning_rate": ["1e-05"], "lr_scheduler_type": ["linear"],
        "warmup_ratio": ["0.05"], "eval_steps": ["100"], "save_steps": ["100"], "eval_strategy": ["steps"],
        "load_best_model_at_end": ["true"], "metric_for_best_model": ["loss"], "truncation_strategy": ["delete"],
        "gradient_accumulation_steps": ["2"],  # 8 GPUs x 1 x 2 = the global batch of 16
    }
    for key, value in expected.items():
        assert f.get(key) == value, key
    assert "train_type" not in f  # ms-swift 3.x's name; 4.x rejects it
    assert cmd.env == {"NPROC_PER_NODE": "8"}


@pytest.mark.parametrize("nproc, accumulation", [(1, 16), (2, 8), (3, 6), (8, 2), (16, 1), (32, 1)])
def test_gradient_accumulation_keeps_the_global_batch(nproc: int, accumulation: int):
    f = flags(build_command(options(nproc_per_node=nproc)))
    assert f["gradient_accumulation_steps"] == [str(accumulation)]
    assert nproc * accumulation >= 16 and (accumulation == 1 or nproc * (accumulation - 1) < 16)


def test_overrides_replace_the_recipe():
    cmd = build_command(options(learning_rate=1e-6, epochs=2, max_length=4096, deepspeed="none", torch_dtype="float32",
                                max_steps=10, eval_steps=5, save_steps=5, nproc_per_node=1, template="qwen2_5",
                                model_type="llama"))
    f = flags(cmd)
    assert f["learning_rate"] == ["1e-06"] and f["num_train_epochs"] == ["2"] and f["max_length"] == ["4096"]
    assert f["torch_dtype"] == ["float32"] and f["max_steps"] == ["10"]
    assert f["eval_steps"] == ["5"] and f["save_steps"] == ["5"]
    assert f["template"] == ["qwen2_5"] and f["model_type"] == ["llama"]
    assert "deepspeed" not in f
    assert cmd.env == {}  # one process, no DeepSpeed: no torchrun


def test_deepspeed_on_one_gpu_still_uses_torchrun():
    assert build_command(options(nproc_per_node=1)).env == {"NPROC_PER_NODE": "1"}


def test_extra_args_come_last_and_win():
    cmd = build_command(options(extra_args=["--learning_rate", "3e-6", "--seed", "7"]))
    assert cmd.argv[-4:] == ["--learning_rate", "3e-6", "--seed", "7"]
    assert flags(cmd)["learning_rate"] == ["3e-6"]


def test_without_validation_data_nothing_asks_for_eval():
    f = flags(build_command(options(val_data=None)))
    for key in ("val_dataset", "eval_strategy", "eval_steps", "load_best_model_at_end", "metric_for_best_model"):
        assert key not in f
    assert f["save_steps"] == ["100"]


def test_lora_recipe():
    f = flags(build_command(options(tuner="lora")))
    assert f["tuner_type"] == ["lora"] and f["target_modules"] == ["all-linear"]
    assert int(f["lora_rank"][0]) > 0 and float(f["learning_rate"][0]) == pytest.approx(1e-4)
    assert f["deepspeed"] == ["zero2"] and f["template"] == ["deepseek_r1"]
    assert f["load_best_model_at_end"] == ["true"] and f["val_dataset"] == ["/data/test.jsonl"]


def test_recipes_default_learning_rates():
    """The paper's 1e-5 for full fine-tuning (the authors' script used 1e-6; see the config)."""
    assert load_recipe(config_path("full")).swift_args["learning_rate"] == pytest.approx(1e-5)
    assert load_recipe(config_path("lora")).swift_args["learning_rate"] == pytest.approx(1e-4)


def test_bad_inputs_are_user_errors(tmp_path: Path):
    with pytest.raises(UserError, match="TUNER"):
        build_command(options(tuner="qlora"))
    with pytest.raises(UserError, match="tuner_type='lora'"):
        build_command(options(tuner="full", config=str(config_path("lora"))))
    with pytest.raises(UserError, match="does not exist"):
        build_command(options(config=str(tmp_path / "missing.yaml")))
    managed = tmp_path / "managed.yaml"
    managed.write_text(yaml.safe_dump({"swift": {"tuner_type": "full", "output_dir": "/x"}}))
    with pytest.raises(UserError, match="output_dir"):
        build_command(options(config=str(managed)))
    with pytest.raises(UserError, match="NPROC_PER_NODE"):
        build_command(options(nproc_per_node=0))


def test_the_mini_recipe_reads_its_own_order_of_sorted_batches(tmp_path: Path):
    """sorted_micro_batches (finetune_mini.yaml): ms-swift reads OUTPUT_DIR/train_order.jsonl as
    written, in micro-batches of 4 accumulated 4 times (one batch of 16 a step)."""
    mini = dict(config=str(config_path("mini")), val_data=None, nproc_per_node=1, max_steps=30)
    cmd = build_command(options(**mini))
    f = flags(cmd)
    assert f["dataset"] == ["/out/train_order.jsonl"]
    assert f["dataset_shuffle"] == ["false"] and f["train_dataloader_shuffle"] == ["false"]
    assert f["per_device_train_batch_size"] == ["4"] and f["gradient_accumulation_steps"] == ["4"]
    assert cmd.order is not None and (cmd.order.train, cmd.order.batch_size, cmd.order.steps, cmd.order.seed) == (
        "/data/train.jsonl", 16, 30, 0)
    assert build_command(options()).order is None  # the paper's recipe reads the data as ms-swift shuffles it
    with pytest.raises(UserError, match="one process"):
        build_command(options(**{**mini, "nproc_per_node": 2}))
    no_steps = tmp_path / "no-steps.yaml"
    recipe = yaml.safe_load(config_path("mini").read_text())
    recipe["swift"].pop("max_steps")
    no_steps.write_text(yaml.safe_dump(recipe))
    with pytest.raises(UserError, match="needs max_steps"):
        build_command(options(**{**mini, "config": str(no_steps), "max_steps": None}))


def test_float32_attention_loads_the_plugin_that_registers_it(tmp_path: Path):
    """float32_attention (finetune_mini.yaml): ms-swift gets the plugin's path and the attention's name; the
    paper's recipe keeps ms-swift's own attention; a recipe may not also name one."""
    f = flags(build_command(options(config=str(config_path("mini")), val_data=None, nproc_per_node=1, max_steps=3)))
    plugin = REPO_ROOT / "sprint" / "training" / "attention.py"
    assert f["attn_impl"] == ["sdpa_fp32"] and f["external_plugins"] == [str(plugin)] and plugin.is_file()
    assert "attn_impl" not in flags(build_command(options())) and "external_plugins" not in flags(build_command(options()))
    both = tmp_path / "both.yaml"
    recipe = yaml.safe_load(config_path("mini").read_text())
    recipe["swift"]["attn_impl"] = "eager"
    both.write_text(yaml.safe_dump(recipe))
    with pytest.raises(UserError, match="remove attn_impl"):
        build_command(options(config=str(both), val_data=None, nproc_per_node=1, max_steps=3))
    recipe["swift"].pop("attn_impl")
    recipe["float32_attention"] = "yes"
    both.write_text(yaml.safe_dump(recipe))
    with pytest.raises(UserError, match="float32_attention must be true or false"):
        build_command(options(config=str(both), val_data=None, nproc_per_node=1, max_steps=3))


def test_cpu_bf16_autocast_only_where_the_cpu_has_bf16_instructions(tmp_path: Path, monkeypatch):
    """The mini recipe asks for bf16 autocast on the CPU; a CPU without AVX-512 BF16 or AMX emulates bf16 products
    hundreds of times slower than float32, so the run trains in float32 there. GPU recipes are untouched."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse avx avx2 fma\n")
    assert not cpu_has_bf16(info) and not cpu_has_bf16(tmp_path / "missing")
    info.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_bf16(info)
    mini = options(config=str(config_path("mini")), val_data=None, nproc_per_node=1, max_steps=3)
    monkeypatch.setattr("sprint.training.finetune.cpu_has_bf16", lambda: False)
    assert flags(build_command(mini))["bf16"] == ["false"]
    assert flags(build_command(options())).get("bf16", ["true"]) == ["true"]  # the paper's recipe: GPUs, no use_cpu
    monkeypatch.setattr("sprint.training.finetune.cpu_has_bf16", lambda: True)
    assert flags(build_command(mini))["bf16"] == ["true"]


def test_to_argv_follows_ms_swift_yaml_rules():
    argv = to_argv({"a": True, "b": False, "c": [1, "x"], "d": {"k": 1}, "e": 0.5})
    assert argv == ["--a", "true", "--b", "false", "--c", "1", "x", "--d", '{"k": 1}', "--e", "0.5"]


def test_subcommand_registers_and_dry_runs(capsys):
    parser = build_parser(["finetune"])
    args = parser.parse_args(["finetune", "--train", "t.jsonl", "--val", "", "--output-dir", "o", "--tuner", "lora",
                              "--deepspeed", "none", "--dry-run", "--swift-bin", "/s/swift", "--", "--seed", "3"])
    assert args.func(args) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("/s/swift sft --model deepseek-ai/DeepSeek-R1-Distill-Qwen-7B --dataset t.jsonl ")
    assert line.endswith("--output_dir o --seed 3") and "--tuner_type lora" in line and "--val_dataset" not in line


# --- run_finetune / run_finetune.sh without ms-swift -------------------------------------------


def fake_swift(folder: Path) -> Path:
    """A stand-in `swift` that records its arguments and NPROC_PER_NODE, then succeeds."""
    script = folder / "swift"
    script.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "NPROC_PER_NODE=${{NPROC_PER_NODE:-unset}}" "$@" > "{folder}/called.txt"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_run_checks_data_then_runs_swift(tmp_path: Path, tok_dir: Path, monkeypatch):
    monkeypatch.setenv("NPROC_PER_NODE", "4")  # an exported shell variable must not leak into ms-swift
    train, test = write_data(tmp_path / "data")
    swift = fake_swift(tmp_path)
    opts = options(train_data=str(train), val_data=str(test), output_dir=str(tmp_path / "out"),
                   nproc_per_node=1, deepspeed="none")
    assert run_finetune(opts, swift, tokenizer=str(tok_dir)) == 0
    called = (tmp_path / "called.txt").read_text().splitlines()
    assert called[0] == "NPROC_PER_NODE=unset"
    assert called[1:] == build_command(opts, swift).argv[1:]
    assert (tmp_path / "out" / "swift_command.sh").read_text().strip() == build_command(opts, swift).shell()


def test_run_writes_the_order_before_swift_starts(tmp_path: Path):
    train, _ = write_data(tmp_path / "data", n_train=40)
    swift = fake_swift(tmp_path)
    opts = options(config=str(config_path("mini")), train_data=str(train), val_data=None, nproc_per_node=1,
                   max_steps=5, output_dir=str(tmp_path / "out"))
    assert run_finetune(opts, swift, check_data=False) == 0
    order = (tmp_path / "out" / "train_order.jsonl").read_text().splitlines()
    assert len(order) == 5 * 16 and set(order) <= set(train.read_text().splitlines())
    assert "--dataset" in (called := (tmp_path / "called.txt").read_text().splitlines())
    assert called[called.index("--dataset") + 1] == str(tmp_path / "out" / "train_order.jsonl")


def test_run_refuses_bad_data_before_starting_swift(tmp_path: Path, tok_dir: Path):
    train, test = write_data(tmp_path / "data")
    with train.open("a") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}) + "\n")
    swift = fake_swift(tmp_path)
    opts = options(train_data=str(train), val_data=str(test), output_dir=str(tmp_path / "out"))
    with pytest.raises(UserError, match="data check failed"):
        run_finetune(opts, swift, tokenizer=str(tok_dir))
    assert not (tmp_path / "called.txt").exists()
    # --skip-check trains anyway
    assert run_finetune(opts, swift, check_data=False) == 0
    assert (tmp_path / "called.txt").exists()


def test_run_without_swift_says_how_to_install(tmp_path: Path):
    with pytest.raises(UserError, match="install_swift.sh"):
        run_finetune(options(output_dir=str(tmp_path)), tmp_path / "no-swift")


SCRIPT_VARS = ("MODEL", "DATA_DIR", "TRAIN_DATA", "VAL_DATA", "OUTPUT_DIR", "TUNER", "CONFIG", "NPROC_PER_NODE", "LR",
               "EPOCHS", "MAX_LENGTH", "DEEPSPEED", "TORCH_DTYPE", "MAX_STEPS", "EVAL_STEPS", "SAVE_STEPS",
               "MODEL_TYPE", "TEMPLATE", "TOKENIZER", "SWIFT_BIN", "SKIP_CHECK", "DRY_RUN", "VALIDATE")


def run_script(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """run_finetune.sh with only these of its variables set (none leaks in from the caller)."""
    keep = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    return subprocess.run(["bash", str(REPO_ROOT / "run_finetune.sh"), *args], capture_output=True, text=True,
                          env={**keep, **env}, timeout=timeout, cwd=REPO_ROOT)


def test_script_variables_reach_the_command():
    result = run_script({"DRY_RUN": "1", "MODEL": "/m", "TRAIN_DATA": "/d/tr.jsonl", "VAL_DATA": "/d/te.jsonl",
                         "OUTPUT_DIR": "/o", "NPROC_PER_NODE": "4", "LR": "1e-6", "EPOCHS": "3",
                         "MAX_LENGTH": "8192", "SWIFT_BIN": "/s/swift"}, "--seed", "1")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    expected = build_command(options(model="/m", train_data="/d/tr.jsonl", val_data="/d/te.jsonl", output_dir="/o",
                                     nproc_per_node=4, learning_rate=1e-6, epochs=3, max_length=8192,
                                     extra_args=["--seed", "1"]), "/s/swift")
    assert line == expected.shell()


def test_script_defaults_and_lora():
    result = run_script({"DRY_RUN": "1", "SWIFT_BIN": "/s/swift"})
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("NPROC_PER_NODE=8 /s/swift sft --model deepseek-ai/DeepSeek-R1-Distill-Qwen-7B ")
    assert "--dataset outputs/finetuning_data/train.jsonl --val_dataset outputs/finetuning_data/test.jsonl" in line
    lora = run_script({"DRY_RUN": "1", "TUNER": "lora", "VAL_DATA": "", "DEEPSPEED": "none", "NPROC_PER_NODE": "1"})
    assert lora.returncode == 0, lora.stderr
    line = lora.stdout.strip().splitlines()[-1]
    assert "--tuner_type lora" in line and "--val_dataset" not in line and "--deepspeed" not in line
    assert not line.startswith("NPROC_PER_NODE")


def test_script_rejects_an_unknown_tuner():
    result = run_script({"DRY_RUN": "1", "TUNER": "qlora"})
    assert result.returncode != 0 and "qlora" in result.stderr


# --- ms-swift itself ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def swift_bin() -> Path:
    swift = default_swift_bin()
    if not swift.exists() or not swift_python(swift).exists():
        pytest.skip(f"ms-swift venv missing ({swift}); run scripts/install_swift.sh")
    return swift


def gpu_commands(swift: Path, model: str, data: Path, out: Path) -> dict[str, SwiftCommand]:
    """The command lines run_finetune.sh gives a GPU node: full ZeRO-3 bf16 and LoRA."""
    common = dict(model=model, train_data=str(data / "train.jsonl"), val_data=str(data / "test.jsonl"), nproc_per_node=8)
    return {
        "full": build_command(FinetuneOptions(output_dir=str(out / "full"), tuner="full", **common), swift),
        "lora": build_command(FinetuneOptions(output_dir=str(out / "lora"), tuner="lora", **common), swift),
    }


@pytest.mark.swift
def test_ms_swift_parser_accepts_the_gpu_commands_and_rejects_renamed_flags(swift_bin: Path, tmp_path: Path):
    commands = gpu_commands(swift_bin, "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", tmp_path, tmp_path)
    full = commands["full"]
    renamed = SwiftCommand([a if a != "--tuner_type" else "--train_type" for a in full.argv], full.env)
    bad_value = SwiftCommand([*full.argv, "--torch_dtype", "bf16"], full.env)
    results = parse_with_swift([commands["full"], commands["lora"], bad_value], "parser")
    assert results[0] == {"ok": True} and results[1] == {"ok": True}
    assert not results[2]["ok"] and "bf16" in results[2]["error"]
    with pytest.raises(UserError, match="does not accept: --train_type full"):
        check_swift_args(renamed, "parser")


@pytest.mark.swift
def test_ms_swift_resolves_the_gpu_commands(swift_bin: Path, tmp_path: Path, request):
    """SftArguments built exactly as `swift sft` builds them: DeepSpeed preset, bf16, schedule, eval."""
    tiny_model_dir = request.getfixturevalue("tiny_model_dir")  # built only once ms-swift is known to exist
    train, _ = write_data(tmp_path / "data")
    commands = gpu_commands(swift_bin, str(tiny_model_dir), train.parent, tmp_path)
    # save steps that are no multiple of the eval steps: transformers refuses load_best_model_at_end
    broken = build_command(FinetuneOptions(model=str(tiny_model_dir), train_data=str(train),
                                           val_data=str(train.parent / "test.jsonl"), output_dir=str(tmp_path / "b"),
                                           eval_steps=30, save_steps=100), swift_bin)
    full, lora, refused = parse_with_swift([commands["full"], commands["lora"], broken], "full")
    assert full["ok"] and lora["ok"], (full, lora)
    assert full["tuner_type"] == "full" and lora["tuner_type"] == "lora"
    assert full["deepspeed_stage"] == 3 and lora["deepspeed_stage"] == 2
    assert full["learning_rate"] == pytest.approx(1e-5) and lora["learning_rate"] == pytest.approx(1e-4)
    for r in (full, lora):
        assert r["bf16"] is True and r["template"] == "deepseek_r1" and r["max_length"] == 7168
        assert r["num_train_epochs"] == 5 and r["per_device_train_batch_size"] == 1
        assert r["gradient_accumulation_steps"] == 2
        assert r["lr_scheduler_type"] == "linear" and r["warmup"] == pytest.approx(0.05)
        assert r["eval_strategy"] == "steps" and r["eval_steps"] == 100 and r["save_steps"] == 100
        assert r["load_best_model_at_end"] is True and r["metric_for_best_model"] == "loss"
        assert r["val_dataset"] == [str(train.parent / "test.jsonl")]
    assert not refused["ok"] and "multiple of the evaluation" in refused["error"]


@pytest.mark.swift
@pytest.mark.slow
def test_tiny_model_trains_on_cpu_through_run_finetune_sh(swift_bin: Path, tmp_path: Path, request):
    """Two real optimizer steps + one evaluation via the script's own code path, CPU overrides only."""
    tiny_model_dir = request.getfixturevalue("tiny_model_dir")
    data = tmp_path / "data"
    write_data(data, n_train=6, n_test=2)
    out = tmp_path / "out"
    env = {"MODEL": str(tiny_model_dir), "DATA_DIR": str(data), "OUTPUT_DIR": str(out), "NPROC_PER_NODE": "1",
           "TORCH_DTYPE": "float32", "DEEPSPEED": "none", "MAX_STEPS": "2", "EVAL_STEPS": "2", "SAVE_STEPS": "2",
           "MAX_LENGTH": "512", "SWIFT_BIN": str(swift_bin), "HF_HUB_OFFLINE": "1"}
    result = run_script(env, "--gradient_accumulation_steps", "1", "--dataloader_num_workers", "0",
                        "--report_to", "none", "--logging_steps", "1", timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "SFT data check" in result.stdout and "6 kept" in result.stdout

    checkpoints = sorted(out.glob("checkpoint-*"))
    assert [c.name for c in checkpoints] == ["checkpoint-2"]
    assert (checkpoints[0] / "model.safetensors").is_file() and (checkpoints[0] / "trainer_state.json").is_file()
    assert (out / "best").resolve() == checkpoints[0].resolve()

    logs = [json.loads(line) for line in (out / "logging.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logs if "loss" in r]
    eval_losses = [r["eval_loss"] for r in logs if "eval_loss" in r]
    assert len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert len(eval_losses) == 1 and math.isfinite(eval_losses[0])
    state = json.loads((checkpoints[0] / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["best_metric"] == pytest.approx(eval_losses[0])
    args = json.loads((out / "args.json").read_text())
    assert args["template"] == "deepseek_r1" and args["tuner_type"] == "full"


@pytest.mark.swift
@pytest.mark.slow
def test_sorted_micro_batches_take_the_step_of_the_whole_batch(swift_bin: Path, tmp_path: Path, request):
    """The mini recipe's order file read by ms-swift as micro-batches of 1 row accumulated 4 times
    logs the losses of the same batches read whole: the step does not depend on the cut."""
    tiny_model_dir = request.getfixturevalue("tiny_model_dir")
    train, _ = write_data(tmp_path / "data", n_train=12)
    losses = {}
    for per_device in (1, 4):
        recipe = yaml.safe_load(config_path("mini").read_text())
        recipe["global_batch_size"] = 4
        recipe["swift"].update(per_device_train_batch_size=per_device, logging_steps=1, save_strategy="no")
        config = tmp_path / f"mini-{per_device}.yaml"
        config.write_text(yaml.safe_dump(recipe))
        out = tmp_path / f"out-{per_device}"
        opts = FinetuneOptions(model=str(tiny_model_dir), train_data=str(train), output_dir=str(out), config=str(config),
                               max_steps=3, learning_rate=1e-3)
        assert run_finetune(opts, swift_bin, check_data=False) == 0
        logs = [json.loads(line) for line in (out / "logging.jsonl").read_text().splitlines()]
        losses[per_device] = [r["loss"] for r in logs if "loss" in r and "train_runtime" not in r]
    assert len(losses[1]) == 3 and all(math.isfinite(x) for x in losses[1])
    assert losses[1] == pytest.approx(losses[4], rel=1e-4)
    assert losses[1][0] != pytest.approx(losses[1][2], rel=1e-3)  # the weights moved between the steps


PLUGIN_CHECK = """
import sys, torch, transformers
from importlib.util import module_from_spec, spec_from_file_location
spec = spec_from_file_location("attention", sys.argv[1]); attention = module_from_spec(spec); spec.loader.exec_module(attention)
assert attention.NAME == sys.argv[2]
config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
stock = transformers.Qwen2ForCausalLM._from_config(config, attn_implementation="sdpa").eval()
ours = transformers.Qwen2ForCausalLM._from_config(config, attn_implementation=attention.NAME).eval()
ours.load_state_dict(stock.state_dict())
ids = torch.randint(0, 64, (2, 12)); mask = torch.ones_like(ids); mask[1, -3:] = 0  # right padding, as ms-swift pads
with torch.no_grad():
    gap = (ours(input_ids=ids, attention_mask=mask).logits - stock(input_ids=ids, attention_mask=mask).logits).abs().max()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = torch.randn(1, 2, 5, 16, dtype=torch.bfloat16)
        out, _ = attention.sdpa_fp32_attention(ours.model.layers[0].self_attn, q, q, q, None, dropout=0.0, scaling=0.25,
                                               is_causal=True)
print(float(gap), out.dtype)
"""


@pytest.mark.swift
def test_float32_attention_matches_the_stock_kernel(swift_bin: Path):
    """In ms-swift's environment the plugin registers the name `sprint finetune` passes, gives the stock
    SDPA's logits in float32 (right-padded rows too), and hands bf16 back under bf16 autocast."""
    from sprint.training.finetune import ATTENTION_NAME, ATTENTION_PLUGIN

    done = subprocess.run([str(swift_python(swift_bin)), "-c", PLUGIN_CHECK, str(ATTENTION_PLUGIN), ATTENTION_NAME],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    gap, dtype = done.stdout.split()
    assert float(gap) < 1e-5 and dtype == "torch.bfloat16"


def test_a_second_training_into_one_folder_clears_the_old_checkpoint_links(tmp_path: Path) -> None:
    """ms-swift makes `best` and `last` with os.symlink, which fails when an earlier run left them (a second
    `make demo-sample` crashed at the end of its training): the links go, a real folder of that name stays."""
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "best").symlink_to(tmp_path / "checkpoint-4")
    (tmp_path / "last").symlink_to(tmp_path / "gone")  # dangling: its checkpoint was deleted
    assert clear_checkpoint_links(tmp_path) == ["best", "last"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]
    (tmp_path / "last").mkdir()
    assert clear_checkpoint_links(tmp_path) == [] and (tmp_path / "last").is_dir()
