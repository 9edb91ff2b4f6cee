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

DATA="${DATA:-outputs/component_separation}"            # stage 1's output folder (its ok records are used)
args=(--input "$DATA" --out-dir "${OUT_DIR:-outputs/dag_creation}")
# Each of these that is set passes its flag (NUM_WORKERS -> --num-workers); unset ones keep the defaults
# `python -m sprint dag --help` shows. RANGE: START:END of the input records.
for var in MODEL SERVER_URL SPLIT SUBSET RANGE NUM_WORKERS MAX_TOKENS TEMPERATURE CACHE_DIR; do
  if [[ -n "${!var:-}" ]]; then args+=("--$(tr '[:upper:]_' '[:lower:]-' <<< "$var")=${!var}"); fi
done

exec "$PYTHON" -m sprint dag "${args[@]}" "$@"
