#!/usr/bin/env bash
# Sequential baseline: one generation per problem with the same agent prompt and output layout
# as run_agent_orchestration.sh. Every variable can be set from the environment; one left empty
# passes no flag, so the default of `python -m sprint baseline` applies (written once, in
# sprint/baseline.py; see `python -m sprint baseline --help`).
# Extra arguments are passed on to `python -m sprint baseline`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi

MODEL="${MODEL:-deepseek-ai/DeepSeek-R1-Distill-Qwen-7B}"   # served model name
SERVER_URL="${SERVER_URL:-}"                              # default: a local vLLM (see --help)
TEMP="${TEMP:-}"
TOP_P="${TOP_P:-}"
MAX_TOKENS="${MAX_TOKENS:-}"                              # budget of the one generation

TEST_DATA="${TEST_DATA:-}"
SPLIT="${SPLIT:-}"                                        # default: the task's evaluation split
SUBSET="${SUBSET:-}"
RANGE="${RANGE:-}"                                        # START:END of the rows (default: all)
TASK="${TASK:-}"

MAX_PROBLEM_WORKERS="${MAX_PROBLEM_WORKERS:-}"
PROMPT_MODE="${PROMPT_MODE:-}"                            # chat | raw
API="${API:-}"                                            # completions | chat
TOKENIZER="${TOKENIZER:-}"
MODEL_PATH="${MODEL_PATH:-}"
OUT_DIR="${OUT_DIR:-outputs/baseline}"
CACHE_DIR="${CACHE_DIR:-}"                                # response cache, empty = OUT_DIR/llm_cache (pass --no-cache for none)

args=(--model "$MODEL" --out-dir "$OUT_DIR")
flag() {  # flag --name VALUE: pass the flag only when VALUE is set
  if [[ -n "$2" ]]; then args+=("$1" "$2"); fi
}
flag --server-url "$SERVER_URL"
flag --temp "$TEMP"
flag --top-p "$TOP_P"
flag --max-tokens "$MAX_TOKENS"
flag --data "$TEST_DATA"
flag --split "$SPLIT"
flag --subset "$SUBSET"
flag --range "$RANGE"
flag --task "$TASK"
flag --max-problem-workers "$MAX_PROBLEM_WORKERS"
flag --prompt-mode "$PROMPT_MODE"
flag --api "$API"
flag --tokenizer "$TOKENIZER"
flag --model-path "$MODEL_PATH"
flag --cache-dir "$CACHE_DIR"

exec "$PYTHON" -m sprint baseline "${args[@]}" "$@"
