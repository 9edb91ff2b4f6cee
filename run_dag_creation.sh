#!/usr/bin/env bash
# Stage 2: ask an LLM which components depend on which (a parent dictionary per trace).
# Every variable can be overridden from the environment, e.g.
#   DATA=outputs/component_separation MODEL=gpt-4o ./run_dag_creation.sh
# The API key is read from OPENAI_API_KEY only. Re-running the same command resumes.
# Extra arguments are passed on to `sprint dag` (see its --help), e.g. the switches --overwrite,
# --no-progress, --no-cache, --no-check (no GET /models first), or the batch options --batch-file-only,
# --batch-results FILE, --batch-poll SECONDS.
# Before any call the run prints its estimated size and cost; items whose prompt is estimated over
# MAX_INPUT_TOKENS are skipped as too_long unless ALLOW_LONG=1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

DATA="${DATA:-outputs/component_separation}"            # stage 1's output folder (its ok records are used)
args=(--input "$DATA" --out-dir "${OUT_DIR:-outputs/dag_creation}")
# Each of these that is set passes its flag (NUM_WORKERS -> --num-workers); unset ones keep the defaults
# `sprint dag --help` shows. RANGE: START:END of the input records.
for var in MODEL SERVER_URL SPLIT SUBSET RANGE NUM_WORKERS MAX_TOKENS TEMPERATURE CACHE_DIR TPM RPM TIMEOUT MAX_RETRIES PROMPT MAX_CONNECTION_FAILURES MAX_INPUT_TOKENS; do
  if [[ -n "${!var:-}" ]]; then args+=("--$(tr '[:upper:]_' '[:lower:]-' <<< "$var")=${!var}"); fi
done

# TPM / RPM: tokens / requests per minute the API allows (paced, 429s adapted to).
# BATCH=true sends the requests through the OpenAI Batch API (half price; a re-run resumes it).
if is_true BATCH; then args+=(--batch); fi
if is_true ALLOW_LONG; then args+=(--allow-long); fi

exec "${SPRINT[@]}" dag "${args[@]}" "$@"
