#!/usr/bin/env bash
# Sequential baseline: one generation per problem with the same agent prompt and output layout
# as run_agent_orchestration.sh. Every variable can be overridden from the environment.
# Extra arguments are passed on to `python -m sprint baseline` (see its --help).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi

MODEL="${MODEL:-deepseek-ai/DeepSeek-R1-Distill-Qwen-7B}"   # served model name
SERVER_URL="${SERVER_URL:-http://127.0.0.1:8000/v1}"
TEMP="${TEMP:-0.6}"
TOP_P="${TOP_P:-0.95}"
MAX_TOKENS="${MAX_TOKENS:-16384}"                         # budget of the one generation

TEST_DATA="${TEST_DATA:-HuggingFaceH4/MATH-500}"
SPLIT="${SPLIT:-test}"
SUBSET="${SUBSET:-}"
RANGE="${RANGE:-:}"
TASK="${TASK:-math}"

MAX_PROBLEM_WORKERS="${MAX_PROBLEM_WORKERS:-8}"
PROMPT_MODE="${PROMPT_MODE:-chat}"                        # chat | raw
API="${API:-completions}"                                 # completions | chat
TOKENIZER="${TOKENIZER:-}"
MODEL_PATH="${MODEL_PATH:-}"
OUT_DIR="${OUT_DIR:-outputs/baseline}"
CACHE_DIR="${CACHE_DIR:-}"                                # response cache, empty = OUT_DIR/llm_cache (pass --no-cache for none)

args=(
  --model "$MODEL" --server-url "$SERVER_URL" --temp "$TEMP" --top-p "$TOP_P" --max-tokens "$MAX_TOKENS"
  --data "$TEST_DATA" --split "$SPLIT" --range "$RANGE" --task "$TASK"
  --max-problem-workers "$MAX_PROBLEM_WORKERS" --prompt-mode "$PROMPT_MODE" --api "$API" --out-dir "$OUT_DIR"
)
if [[ -n "$SUBSET" ]]; then args+=(--subset "$SUBSET"); fi
if [[ -n "$TOKENIZER" ]]; then args+=(--tokenizer "$TOKENIZER"); fi
if [[ -n "$MODEL_PATH" ]]; then args+=(--model-path "$MODEL_PATH"); fi
if [[ -n "$CACHE_DIR" ]]; then args+=(--cache-dir "$CACHE_DIR"); fi

exec "$PYTHON" -m sprint baseline "${args[@]}" "$@"
