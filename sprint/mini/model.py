"""A random-init Qwen2 for the mini experiment, sized by flags, for a given tokenizer (`sprint mini-model`).

SPRINT and its sequential baseline must start from the same weights, so the model is written once,
from a seed: a Qwen2ForCausalLM (the architecture of R1-Distill-Qwen, so vLLM serves it and
ms-swift trains it as `qwen2`) whose vocabulary is the tokenizer's, with tied embeddings, in
safetensors, the tokenizer files beside it. The pipeline venv has no torch, so the weights are made
by `weights.py` run with a torch venv's Python; this module builds its spec and checks the result.

transformers 5 loads the tokenizer of every qwen2 folder as its Qwen2Tokenizer, rebuilding the
pipeline (NFC, Qwen2's split) whatever tokenizer.json says; a tokenizer made with another pipeline
(`sprint mini-tokenizer --pipeline exact`) would be cut differently by vLLM and ms-swift than by
`tokenizers`, so it is refused for qwen2 and goes with `--architecture qwen3` (left alone).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from sprint.core.errors import UserError
from sprint.core.options import add_options, check_range, config_from, option
from sprint.core.resources import SWIFT_ENV, VLLM_ENV, package_file
from sprint.format.tokencount import QWEN2_SPLIT

WEIGHTS_SCRIPT = package_file("mini", "weights.py")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM 0.32's CPU attention
DTYPES = ("float32", "bfloat16")
ARCHITECTURES = ("qwen2", "qwen3")  # model types; qwen3 keeps a tokenizer's own pipeline in transformers 5


@dataclass
class MiniModelConfig:
    """The model's size and seed (defaults: the mini experiment's ~1M-parameter body)."""

    tokenizer: str = option(help="tokenizer folder (`sprint mini-tokenizer`'s output); its vocabulary sizes the model",
                            flags=("tokenizer",))
    out: str = option(help="folder to write config.json, model.safetensors and the tokenizer files into",
                      flags=("--out", "-o"))
    architecture: str = option("qwen2", "qwen2 (R1-Distill-Qwen's) needs a --pipeline qwen2 tokenizer; qwen3 takes "
                               "either (ms-swift: MODEL_TYPE=qwen3)", choices=ARCHITECTURES)
    hidden_size: int = option(128, "width of the residual stream")
    num_layers: int = option(4, "decoder layers")
    num_heads: int = option(2, "attention heads")
    num_kv_heads: int = option(2, "key/value heads (a divisor of --num-heads; fewer = grouped-query attention)")
    head_dim: int | None = option(None, "size of one head (default: hidden size / heads); vLLM's CPU attention takes "
                                  + ", ".join(map(str, VLLM_CPU_HEAD_SIZES)))
    intermediate_size: int = option(512, "width of the MLP")
    max_positions: int = option(4096, "longest sequence (max_position_embeddings; vLLM's default max_model_len)")
    rope_theta: float = option(10000.0, "RoPE base")
    init_std: float = option(0.02, "standard deviation of the random init (initializer_range)")
    seed: int = option(0, "torch seed of the init: the same seed gives the same weights")
    dtype: str = option("float32", "weights' dtype (float32 for CPU training and serving)", choices=DTYPES)
    python: str | None = option(None, "a Python with torch + transformers (default: this one if it has torch, else "
                                ".venv-swift's, else .venv-vllm's)")

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_positions"):
            check_range(MiniModelConfig, name, getattr(self, name), 1)
        if self.num_heads % self.num_kv_heads:
            raise UserError(f"--num-kv-heads {self.num_kv_heads} must divide --num-heads {self.num_heads}")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise UserError(f"--hidden-size {self.hidden_size} is not a multiple of --num-heads {self.num_heads}; "
                                "change one or pass --head-dim")
            self.head_dim = self.hidden_size // self.num_heads


def _special_id(tok: Tokenizer, settings: dict[str, Any], role: str) -> int | None:
    value = settings.get(role)
    content = value.get("content") if isinstance(value, dict) else value
    if content is None:
        return None
    token_id = tok.token_to_id(content)
    if token_id is None:
        raise UserError(f"tokenizer_config.json names {role} {content!r}, which tokenizer.json does not hold")
    return token_id


def is_qwen2_pipeline(tokenizer_json: Path) -> bool:
    """Whether tokenizer.json cuts text as transformers' Qwen2Tokenizer rebuilds it: NFC, Qwen2's split, bytes."""
    spec = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") or []
    return ((spec.get("normalizer") or {}).get("type") == "NFC" and len(steps) == 2
            and steps[0].get("type") == "Split" and (steps[0].get("pattern") or {}).get("Regex") == QWEN2_SPLIT
            and steps[1].get("type") == "ByteLevel" and not steps[1].get("add_prefix_space"))


def model_spec(cfg: MiniModelConfig) -> dict[str, Any]:
    """What weights.py builds: model type and config kwargs, generation defaults, seed, dtype, files to copy."""
    folder = Path(cfg.tokenizer)
    missing = [name for name in TOKENIZER_FILES[:2] if not (folder / name).is_file()]
    if missing:
        raise UserError(f"{folder} lacks {', '.join(missing)}; pass a tokenizer folder written by "
                        "`sprint mini-tokenizer`")
    if cfg.architecture == "qwen2" and not is_qwen2_pipeline(folder / "tokenizer.json"):
        raise UserError(f"{folder}'s tokenizer does not cut text as Qwen2Tokenizer does (NFC, Qwen2's split), and "
                        "transformers 5 gives every qwen2 model folder that class, so vLLM and ms-swift would cut "
                        "it differently; make it with `sprint mini-tokenizer --pipeline qwen2` or pass "
                        "--architecture qwen3")
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos, pad, bos = (_special_id(tok, settings, role) for role in ("eos_token", "pad_token", "bos_token"))
    if eos is None:
        raise UserError(f"{folder}/tokenizer_config.json has no eos_token; vLLM would never stop a generation")
    # Stop at the end of a turn and at the end of a text, as Qwen2-Instruct's generation config does.
    eos_ids = [eos] + [pad] * (pad is not None and pad != eos)
    config = {
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_positions,
        "rope_theta": cfg.rope_theta,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": cfg.dtype,
    }
    return {
        "model_type": cfg.architecture,
        "config": config,
        "generation": {"bos_token_id": bos, "eos_token_id": eos_ids, "pad_token_id": pad},
        "seed": cfg.seed,
        "dtype": cfg.dtype,
        "out": str(Path(cfg.out).resolve()),
        "tokenizer": str(folder.resolve()),
        "tokenizer_files": [name for name in TOKENIZER_FILES if (folder / name).is_file()],
    }


def torch_python(given: str | None = None) -> Path:
    """The Python that writes the weights: `given`, this one when it has torch, else a torch venv's."""
    if given:
        return Path(given)
    if importlib.util.find_spec("torch") is not None:
        return Path(sys.executable)
    for venv in (SWIFT_ENV, VLLM_ENV):
        path = venv.path()
        if path is not None and (path / "bin" / "python").exists():
            return path / "bin" / "python"
    raise UserError("no Python with torch found (this one has none, nor .venv-swift or .venv-vllm); "
                    "run `make install-swift` or pass --python")


def make_model(cfg: MiniModelConfig) -> dict[str, Any]:
    """Write the model; returns the spec with what weights.py reported (parameters, files)."""
    spec = model_spec(cfg)
    python = torch_python(cfg.python)
    with tempfile.TemporaryDirectory(prefix="sprint-mini-model-") as tmp:
        spec_file = Path(tmp) / "spec.json"
        spec_file.write_text(json.dumps(spec), encoding="utf-8")
        done = subprocess.run([str(python), str(WEIGHTS_SCRIPT), str(spec_file)], capture_output=True, text=True)
    if done.returncode != 0:
        raise UserError(f"writing the weights with {python} failed (exit {done.returncode}): "
                        f"{done.stderr.strip()[-1500:]}")
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise UserError(f"{WEIGHTS_SCRIPT.name} printed no report: {done.stdout[-500:]!r} "
                        f"{done.stderr[-1000:]!r}") from None
    return {**spec, **report}


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write a random-init Qwen2ForCausalLM (or Qwen3) for a tokenizer folder: vocabulary size and special tokens "
        "from the tokenizer, size from the flags, weights from --seed (same seed, same weights), tied "
        "embeddings, safetensors, the tokenizer files beside it. Both models of the mini experiment start "
        "from it. Needs a Python with torch (.venv-swift or .venv-vllm is found by itself)."
    )
    add_options(parser, MiniModelConfig)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(MiniModelConfig, args)
    if cfg.head_dim not in VLLM_CPU_HEAD_SIZES:
        print(f"warning: head size {cfg.head_dim} is not one vLLM's CPU attention takes ({VLLM_CPU_HEAD_SIZES})",
              file=sys.stderr)
    report = make_model(cfg)
    c = report["config"]
    print(f"{cfg.architecture} model written to {cfg.out}: {report['parameters']:,} parameters (vocabulary "
          f"{c['vocab_size']}, hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
          f"{c['num_attention_heads']} heads of {c['head_dim']}, MLP {c['intermediate_size']}), seed {cfg.seed}, "
          f"{cfg.dtype}")
    return 0
