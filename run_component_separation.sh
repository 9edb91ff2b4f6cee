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

DATA="${DATA:-}"                                        # traces: hub id, .jsonl/.json/.parquet file or folder
if [[ -z "$DATA" ]]; then
  echo "error: set DATA to the reasoning traces (a .jsonl/.json/.parquet file, a folder or a hub id)" >&2
  exit 2
fi
args=(--input "$DATA" --out-dir "${OUT_DIR:-outputs/component_separation}")
# Each of these that is set passes its flag (SERVER_URL -> --server-url); unset ones keep the defaults
# `python -m sprint components --help` shows (gpt-4o on api.openai.com, 8 workers, 8192 tokens, ...).
# SUBSET: hub dataset configuration; RANGE: START:END of the input rows; CACHE_DIR: default OUT_DIR/llm_cache.
for var in MODEL SERVER_URL SPLIT SUBSET RANGE NUM_WORKERS MAX_TOKENS TEMPERATURE CACHE_DIR; do
  if [[ -n "${!var:-}" ]]; then args+=("--$(tr '[:upper:]_' '[:lower:]-' <<< "$var")=${!var}"); fi
done

exec "$PYTHON" -m sprint components "${args[@]}" "$@"
