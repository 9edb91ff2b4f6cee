"""Write a random-init causal LM (Qwen2, or Qwen3) from a JSON spec: the torch half of `sprint mini-model`.

Run as a script by a Python with torch + transformers (.venv-swift, .venv-vllm), which do not have
sprint installed, so this file imports neither sprint nor anything outside torch, transformers and
the standard library. `sprint.mini.model` writes the spec and checks what comes back.

    python sprint/mini/weights.py SPEC.json   # prints one JSON line: parameters, files
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig


def build(spec: dict) -> dict:
    """The model of `spec` (model type, config, seed, dtype, out, tokenizer files), saved; returns what was written."""
    torch.manual_seed(spec["seed"])
    config = AutoConfig.for_model(spec["model_type"], **spec["config"])
    model = AutoModelForCausalLM.from_config(config).to(getattr(torch, spec["dtype"]))
    model.generation_config = GenerationConfig(**spec["generation"])
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in spec["tokenizer_files"]:
        shutil.copyfile(Path(spec["tokenizer"]) / name, out / name)
    parameters = sum(p.numel() for p in model.parameters())  # tied embeddings are counted once
    return {"parameters": parameters, "files": sorted(p.name for p in out.iterdir())}


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print(json.dumps(build(spec)))


if __name__ == "__main__":
    main()
