#!/usr/bin/env bash
# SPRINT inference: planner/executor orchestration against OpenAI-compatible servers (vLLM).
# Every variable can be overridden from the environment, e.g.
#   PLANNER_MODEL=sprint-7b RANGE=0:50 OUT_DIR=outputs/sprint-math500 ./run_agent_orchestration.sh
# Extra arguments are passed on to `python -m sprint orchestrate` (see its --help).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$HERE/.venv/bin/python" ]]; then PYTHON="$HERE/.venv/bin/python"; else PYTHON=python3; fi
fi

PLANNER_MODEL="${PLANNER_MODEL:-sprint}"                  # served model name of the planner
PLANNER_SERVER_URL="${PLANNER_SERVER_URL:-http://127.0.0.1:8000/v1}"
PLANNER_TEMP="${PLANNER_TEMP:-0.6}"
PLANNER_TOP_P="${PLANNER_TOP_P:-0.95}"
PLANNER_OUTPUT_TOKEN_LIMIT="${PLANNER_OUTPUT_TOKEN_LIMIT:-1000}"   # longer plans are redrawn
PLANNER_LENGTH_RETRIES="${PLANNER_LENGTH_RETRIES:-2}"

EXECUTOR_MODEL="${EXECUTOR_MODEL:-$PLANNER_MODEL}"
EXECUTOR_SERVER_URL="${EXECUTOR_SERVER_URL:-$PLANNER_SERVER_URL}"
EXECUTOR_TEMP="${EXECUTOR_TEMP:-0.6}"
EXECUTOR_TOP_P="${EXECUTOR_TOP_P:-0.95}"

TEST_DATA="${TEST_DATA:-HuggingFaceH4/MATH-500}"          # hub id, .jsonl/.json/.parquet or stage folder
SPLIT="${SPLIT:-test}"
SUBSET="${SUBSET:-}"                                      # e.g. gpqa_diamond
RANGE="${RANGE:-:}"                                       # START:END of the rows
TASK="${TASK:-math}"                                      # math | gpqa | countdown

MAX_PHASES="${MAX_PHASES:-12}"                            # the answer is forced at this phase
MAX_PROBLEM_WORKERS="${MAX_PROBLEM_WORKERS:-5}"
MAX_EXECUTION_WORKERS="${MAX_EXECUTION_WORKERS:-5}"
MAX_TOKENS="${MAX_TOKENS:-4096}"                          # per executor call and for the final answer
PROMPT_MODE="${PROMPT_MODE:-chat}"                        # chat (training format) | raw (the authors' runs)
API="${API:-completions}"                                 # completions | chat
TOKENIZER="${TOKENIZER:-}"                                # chat template source (default: MODEL_PATH or the model name)
MODEL_PATH="${MODEL_PATH:-}"                              # local checkpoint: start vLLM if nothing answers locally
OUT_DIR="${OUT_DIR:-outputs/orchestration}"
CACHE_DIR="${CACHE_DIR:-}"                                # response cache, empty = OUT_DIR/llm_cache (pass --no-cache for none)

args=(
  --planner-model "$PLANNER_MODEL" --planner-url "$PLANNER_SERVER_URL"
  --planner-temp "$PLANNER_TEMP" --planner-top-p "$PLANNER_TOP_P"
  --planner-max-tokens "$PLANNER_OUTPUT_TOKEN_LIMIT" --planner-length-retries "$PLANNER_LENGTH_RETRIES"
  --executor-model "$EXECUTOR_MODEL" --executor-url "$EXECUTOR_SERVER_URL"
  --executor-temp "$EXECUTOR_TEMP" --executor-top-p "$EXECUTOR_TOP_P"
  --data "$TEST_DATA" --split "$SPLIT" --range "$RANGE" --task "$TASK"
  --max-phases "$MAX_PHASES" --max-problem-workers "$MAX_PROBLEM_WORKERS"
  --max-execution-workers "$MAX_EXECUTION_WORKERS" --max-tokens "$MAX_TOKENS"
  --prompt-mode "$PROMPT_MODE" --api "$API" --out-dir "$OUT_DIR"
)
if [[ -n "$SUBSET" ]]; then args+=(--subset "$SUBSET"); fi
if [[ -n "$TOKENIZER" ]]; then args+=(--tokenizer "$TOKENIZER"); fi
if [[ -n "$MODEL_PATH" ]]; then args+=(--model-path "$MODEL_PATH"); fi
if [[ -n "$CACHE_DIR" ]]; then args+=(--cache-dir "$CACHE_DIR"); fi

exec "$PYTHON" -m sprint orchestrate "${args[@]}" "$@"
