#!/usr/bin/env bash
# Stage 3: pack components + DAGs into SPRINT trajectories and write the SFT dataset:
# OUT_DIR/train.jsonl + test.jsonl (messages layout, what run_finetune.sh reads), records.jsonl
# (one line per trace: kept or why dropped), summary.json and manifest.json.
# Every variable can be overridden from the environment, e.g.
#   DATA=outputs/dag_creation PARALLELIZATION_THRESHOLD=1.5 ./run_finetuning_data_preparation.sh
# Extra arguments are passed on to `sprint pack` (see its --help), e.g. --overwrite to replace an
# output folder written with another configuration.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

DATA="${DATA:-outputs/dag_creation}"                            # stage 2's output folder (its ok records are used)
OUT_DIR="${OUT_DIR:-outputs/finetuning_data}"
PUSH_TO_HUB="${PUSH_TO_HUB:-false}"                             # 1/true/yes/on: also push train/test to OUTPUT_HUB_PATH
OUTPUT_HUB_PATH="${OUTPUT_HUB_PATH:-}"                          # hub dataset repo id, e.g. me/sprint-sft

args=(--input "$DATA" --out-dir "$OUT_DIR")
# Each of these that is set passes its flag (TEST_FRAC -> --test-frac); unset ones keep the defaults
# `sprint pack --help` shows: PARALLELIZATION_THRESHOLD (drop traces with fewer executions
# per phase), MAX_PHASES (drop traces with more than MAX_PHASES-1 phases), TEST_FRAC (test split),
# SEED (split seed), RANGE (START:END of the input records), SPLIT / SUBSET (hub datasets),
# MAX_PROMPTS_PER_PLAN, AGENT_PROMPT (the system text of every example), COMMENTS (drop: as the released
# training data, the default; observe: comments rendered as the paper describes), EXECUTOR_ROWS
# (none, the default: the released layout; barrier/stream/both: also train each executor's view; distinct: both
# schedules' views, each once and none the packed row holds verbatim).
# SEQUENTIAL (1/true/yes/on): also write sequential_train.jsonl / sequential_test.jsonl (RFT data).
for var in PARALLELIZATION_THRESHOLD MAX_PHASES TEST_FRAC SEED RANGE COMMENTS SPLIT SUBSET MAX_PROMPTS_PER_PLAN AGENT_PROMPT EXECUTOR_ROWS; do
  if [[ -n "${!var:-}" ]]; then args+=("--$(tr '[:upper:]_' '[:lower:]-' <<< "$var")=${!var}"); fi
done
if is_true SEQUENTIAL; then args+=(--sequential); fi
if is_true PUSH_TO_HUB; then
  if [[ -z "$OUTPUT_HUB_PATH" ]]; then
    echo "error: PUSH_TO_HUB=$PUSH_TO_HUB needs OUTPUT_HUB_PATH (a hub dataset repo id)" >&2
    exit 2
  fi
  args+=(--push-to-hub "$OUTPUT_HUB_PATH")
fi

exec "${SPRINT[@]}" pack "${args[@]}" "$@"
