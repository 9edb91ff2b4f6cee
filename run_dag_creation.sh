#!/usr/bin/env bash
# Stage 2: ask an LLM which components depend on which (a parent dictionary per trace).
# Every variable can be overridden from the environment, e.g.
#   DATA=outputs/component_separation MODEL=gpt-4o ./run_dag_creation.sh
# The API key is read from OPENAI_API_KEY only. Re-running the same command resumes.
# Extra arguments are passed on to `python -m sprint dag` (see its --help).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi

MODEL="${MODEL:-gpt-4o}"
SERVER_URL="${SERVER_URL:-https://api.openai.com/v1}"   # any OpenAI-compatible endpoint (vLLM: http://127.0.0.1:8000/v1)
DATA="${DATA:-outputs/component_separation}"            # stage 1's output folder (its ok records are used)
SPLIT="${SPLIT:-train}"
SUBSET="${SUBSET:-}"
RANGE="${RANGE:-}"                                      # START:END of the input records, empty = all
NUM_WORKERS="${NUM_WORKERS:-8}"                         # concurrent requests
MAX_TOKENS="${MAX_TOKENS:-2048}"
TEMPERATURE="${TEMPERATURE:-0}"
OUT_DIR="${OUT_DIR:-outputs/dag_creation}"
CACHE_DIR="${CACHE_DIR:-}"                              # response cache, empty = OUT_DIR/llm_cache

args=(--input "$DATA" --out-dir "$OUT_DIR" --model "$MODEL" --server-url "$SERVER_URL"
      --split "$SPLIT" --num-workers "$NUM_WORKERS" --max-tokens "$MAX_TOKENS" --temperature "$TEMPERATURE")
[[ -n "$SUBSET" ]] && args+=(--subset "$SUBSET")
[[ -n "$RANGE" ]] && args+=(--range "$RANGE")
[[ -n "$CACHE_DIR" ]] && args+=(--cache-dir "$CACHE_DIR")

exec "$PYTHON" -m sprint dag "${args[@]}" "$@"
