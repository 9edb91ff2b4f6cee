#!/usr/bin/env bash
# How many seconds does SPRINT save on your GPUs? No fine-tuned checkpoint and no weight download:
#
#   1. writes a model folder with DeepSeek-R1-Distill-Qwen-7B's architecture (the config values
#      below, copied from its config.json) and its tokenizer (a local folder or a hub id);
#   2. serves it with vLLM, random weights (`--load-format dummy`), prefix caching on;
#   3. replays recorded runs with `python -m sprint time-replay` (both schedules and the
#      baseline; every call with its recorded context, forced to its recorded length) and fits the
#      replay server's latency model to what it measured (`python -m sprint fit-latency`).
#
# The engine's work depends only on token counts and prefix sharing, not on what the weights say,
# so these are the seconds the fine-tuned 7B would take on the same hardware.
#
#   RUN=outputs/sprint BASELINE=outputs/baseline scripts/time_on_gpus.sh
#   scripts/time_on_gpus.sh                 # no RUN: synthetic SPRINT-shaped trajectories
#   DRY_RUN=1 scripts/time_on_gpus.sh       # write + check the model folder, print the commands
#
# Every variable can be set from the environment.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$HERE"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ -z "${VLLM_PYTHON:-}" ]]; then   # a Python with vLLM (and torch) on the GPU machine
  if [[ -x "$HERE/.venv-vllm/bin/python" ]]; then VLLM_PYTHON="$HERE/.venv-vllm/bin/python"; else VLLM_PYTHON=python3; fi
fi

TOKENIZER="${TOKENIZER:-deepseek-ai/DeepSeek-R1-Distill-Qwen-7B}"  # local folder or hub id
MODEL_DIR="${MODEL_DIR:-outputs/r1-distill-qwen-7b-shape}"
SERVED_NAME="${SERVED_NAME:-r1-distill-qwen-7b-random}"
PORT="${PORT:-8123}"
TP="${TP:-1}"                                   # tensor-parallel GPUs
GPU_MEMORY_UTILIZATION="${GPU_MEMORY_UTILIZATION:-0.90}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-32768}"
VLLM_ARGS="${VLLM_ARGS:-}"                      # more vLLM flags, one string
RUN="${RUN:-}"                                  # recorded SPRINT run; empty: synthetic trajectories
BASELINE="${BASELINE:-}"                        # recorded baseline run (default: RUN's own, if any)
N_SYNTHETIC="${N_SYNTHETIC:-50}"
SCHEDULE="${SCHEDULE:-both}"
CONCURRENCY="${CONCURRENCY:-1}"
LIMIT="${LIMIT:-}"
OUT_DIR="${OUT_DIR:-outputs/time_on_gpus}"
DRY_RUN="${DRY_RUN:-0}"

say() { printf '+ %s\n' "$(printf '%q ' "$@")"; }
run() { say "$@"; if [[ "$DRY_RUN" != 1 ]]; then "$@"; fi; }

# ---- 1. the model folder: R1-Distill-Qwen-7B's shape, no weights -------------------------------
mkdir -p "$MODEL_DIR"
"$PYTHON" - "$MODEL_DIR" "$TOKENIZER" <<'PY'
import json, shutil, sys
from pathlib import Path

from sprint.format.trajectory import tokenizer_source

out, tokenizer = Path(sys.argv[1]), sys.argv[2]
# The tokenizer files as published (copied, not re-saved: vLLM's transformers may be older than ours).
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
source = Path(tokenizer_source(tokenizer))
for name in FILES:
    if source.is_dir():
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)
    else:
        from huggingface_hub import hf_hub_download
        try:
            shutil.copyfile(hf_hub_download(tokenizer, name), out / name)
        except Exception as exc:
            if name in FILES[:2]:
                raise SystemExit(f"cannot get {name} of {tokenizer} ({type(exc).__name__}); set TOKENIZER to a local folder")
if not (out / "tokenizer.json").is_file():
    raise SystemExit(f"{tokenizer} has no tokenizer.json; set TOKENIZER to a folder with the R1-distill tokenizer")
# deepseek-ai/DeepSeek-R1-Distill-Qwen-7B config.json (Qwen2.5-Math-7B's architecture)
config = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "hidden_act": "silu",
    "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 10000.0,
    "rope_scaling": None, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
    "sliding_window": None, "use_sliding_window": False, "max_window_layers": 28,
    "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    "bos_token_id": 151646, "eos_token_id": 151643, "torch_dtype": "bfloat16",
}
(out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
h, i, v, layers = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["num_hidden_layers"]
kv = config["num_key_value_heads"] * h // config["num_attention_heads"]
per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h  # q, k, v (biased), o, MLP, norms
params = 2 * v * h + layers * per_layer + h
print(f"wrote {out}/config.json + tokenizer: Qwen2, {layers} layers, hidden {h}, {params / 1e9:.3f}B parameters "
      f"({2 * params / 1e9:.1f} GB in bf16)")
PY
# Check the config with transformers' own class and count its parameters on the meta device
# (no memory allocated); skipped where that Python has no torch.
"$VLLM_PYTHON" - "$MODEL_DIR" <<'PY' || echo "(config check skipped: $VLLM_PYTHON has no torch/transformers)"
import sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM

config = AutoConfig.from_pretrained(sys.argv[1])
with torch.device("meta"):
    model = AutoModelForCausalLM.from_config(config)
n = sum(p.numel() for p in model.parameters())
print(f"checked with transformers {type(config).__name__} -> {type(model).__name__}: {n:,} parameters on the meta device")
PY

# ---- 2. the workload ---------------------------------------------------------------------------
if [[ -z "$RUN" ]]; then
  RUN="$OUT_DIR/synthetic_logs"
  BASELINE="${BASELINE:-$RUN}"
  echo "no RUN given: timing $N_SYNTHETIC synthetic SPRINT-shaped trajectories (benchmarks/make_trajectories.py)"
  run "$PYTHON" benchmarks/make_trajectories.py "$RUN" --n "$N_SYNTHETIC"
fi

# ---- 3. vLLM with random weights ---------------------------------------------------------------
URL="http://127.0.0.1:$PORT/v1"
serve=("$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" --served-model-name "$SERVED_NAME"
       --port "$PORT" --load-format dummy --dtype bfloat16 --enable-prefix-caching --enable-prompt-tokens-details
       --max-model-len "$MAX_MODEL_LEN" --gpu-memory-utilization "$GPU_MEMORY_UTILIZATION" --tensor-parallel-size "$TP")
# shellcheck disable=SC2206
serve+=($VLLM_ARGS)
say "${serve[@]}" ">" "$OUT_DIR/vllm.log" "&"
if [[ "$DRY_RUN" != 1 ]]; then
  mkdir -p "$OUT_DIR"
  "${serve[@]}" > "$OUT_DIR/vllm.log" 2>&1 &
  SERVER_PID=$!
  trap 'kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true' EXIT
  "$PYTHON" - "$URL" "$SERVER_PID" <<'PY'
import os, sys, time, urllib.request

url, pid = sys.argv[1], int(sys.argv[2])
for _ in range(1800):
    try:
        urllib.request.urlopen(url + "/models", timeout=2)
        print(f"vLLM ready at {url}")
        raise SystemExit(0)
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            raise SystemExit("vLLM exited; see its log")
        time.sleep(1)
raise SystemExit("vLLM did not become ready in 30 minutes")
PY
fi

# ---- 4. time the run, fit the latency model ----------------------------------------------------
replay=("$PYTHON" -m sprint time-replay "$RUN" --server "$URL" --model "$SERVED_NAME" --tokenizer "$MODEL_DIR"
        --schedule "$SCHEDULE" --concurrency "$CONCURRENCY" --out "$OUT_DIR")
if [[ -n "$BASELINE" ]]; then replay+=(--baseline "$BASELINE"); fi
if [[ -n "$LIMIT" ]]; then replay+=(--limit "$LIMIT"); fi
run "${replay[@]}"
run "$PYTHON" -m sprint fit-latency "$OUT_DIR"
