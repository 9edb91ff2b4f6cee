#!/usr/bin/env bash
# Stage 1: split reasoning traces into components (plan / prompt / execution / comment) with an LLM.
# Every variable can be overridden from the environment, e.g.
#   DATA=my_traces.jsonl RANGE=0:100 MODEL=gpt-4o ./run_component_separation.sh
# The API key is read from OPENAI_API_KEY only. Re-running the same command resumes.
# Extra arguments are passed on to `sprint components` (see its --help), e.g. the switches --overwrite,
# --no-progress, --no-cache, --no-check (no GET /models first), or the batch options --batch-file-only,
# --batch-results FILE, --batch-poll SECONDS.
# Before any call the run prints its estimated size and cost; items whose prompt is estimated over
# MAX_INPUT_TOKENS are skipped as too_long unless ALLOW_LONG=1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

DATA="${DATA:-}"                                        # traces: hub id, .jsonl/.json/.parquet file or folder
if [[ -z "$DATA" ]]; then
  echo "error: set DATA to the reasoning traces (a .jsonl/.json/.parquet file, a folder or a hub id)" >&2
  exit 2
fi
args=(--input "$DATA" --out-dir "${OUT_DIR:-outputs/component_separation}")
# Each of these that is set passes its flag (SERVER_URL -> --server-url); unset ones keep the defaults
# `sprint components --help` shows (gpt-4o on api.openai.com, 8 workers, 8192 tokens, ...).
# SUBSET: hub dataset configuration; RANGE: START:END of the input rows; CACHE_DIR: default OUT_DIR/llm_cache.
for var in MODEL SERVER_URL SPLIT SUBSET RANGE NUM_WORKERS MAX_TOKENS TEMPERATURE CACHE_DIR TPM RPM TIMEOUT MAX_RETRIES PROMPT MAX_CONNECTION_FAILURES MAX_INPUT_TOKENS QUESTION_COLUMN ID_COLUMN; do
  if [[ -n "${!var:-}" ]]; then args+=("--$(tr '[:upper:]_' '[:lower:]-' <<< "$var")=${!var}"); fi
done
# STRICT=true also rejects answers with a named warning (no plan, plan = execution, overlapping ranges);
# by default they are kept, as the authors kept them, and listed in each record's `warnings`.
if is_true STRICT; then args+=(--strict); fi

# TPM / RPM: tokens / requests per minute the API allows (paced, 429s adapted to).
# BATCH=true sends the requests through the OpenAI Batch API (half price; a re-run resumes it).
if is_true BATCH; then args+=(--batch); fi
if is_true ALLOW_LONG; then args+=(--allow-long); fi

exec "${SPRINT[@]}" components "${args[@]}" "$@"
