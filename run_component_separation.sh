#!/usr/bin/env bash
# Stage 1: split reasoning traces into components (plan / prompt / execution / comment) with an LLM.
# Every variable can be overridden from the environment, e.g.
#   DATA=my_traces.jsonl RANGE=0:100 MODEL=gpt-4o ./run_component_separation.sh
# The API key is read from OPENAI_API_KEY only. Re-running the same command resumes.
# Extra arguments are passed on to `python -m sprint components` (see its --help).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi

MODEL="${MODEL:-gpt-4o}"
SERVER_URL="${SERVER_URL:-https://api.openai.com/v1}"   # any OpenAI-compatible endpoint (vLLM: http://127.0.0.1:8000/v1)
DATA="${DATA:-}"                                        # traces: hub id, .jsonl/.json/.parquet file or folder
SPLIT="${SPLIT:-train}"
SUBSET="${SUBSET:-}"                                    # hub dataset configuration, if any
RANGE="${RANGE:-}"                                      # START:END of the input rows, empty = all
NUM_WORKERS="${NUM_WORKERS:-8}"                         # concurrent requests
MAX_TOKENS="${MAX_TOKENS:-8192}"
TEMPERATURE="${TEMPERATURE:-0}"
OUT_DIR="${OUT_DIR:-outputs/component_separation}"
CACHE_DIR="${CACHE_DIR:-}"                              # response cache, empty = OUT_DIR/llm_cache

if [[ -z "$DATA" ]]; then
  echo "error: set DATA to the reasoning traces (a .jsonl/.json/.parquet file, a folder or a hub id)" >&2
  exit 2
fi

args=(--input "$DATA" --out-dir "$OUT_DIR" --model "$MODEL" --server-url "$SERVER_URL"
      --split "$SPLIT" --num-workers "$NUM_WORKERS" --max-tokens "$MAX_TOKENS" --temperature "$TEMPERATURE")
[[ -n "$SUBSET" ]] && args+=(--subset "$SUBSET")
[[ -n "$RANGE" ]] && args+=(--range "$RANGE")
[[ -n "$CACHE_DIR" ]] && args+=(--cache-dir "$CACHE_DIR")

exec "$PYTHON" -m sprint components "${args[@]}" "$@"
