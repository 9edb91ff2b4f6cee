#!/usr/bin/env bash
# SPRINT inference: planner/executor orchestration against OpenAI-compatible servers (vLLM).
# Every variable can be set from the environment, e.g.
#   PLANNER_MODEL=sprint-7b RANGE=0:50 OUT_DIR=outputs/sprint-math500 ./run_agent_orchestration.sh
# A variable left empty passes no flag, so the default of `sprint orchestrate` applies
# (each default is written once, in sprint/inference/orchestration.py; see `sprint orchestrate --help`).
# Extra arguments are passed on to `sprint orchestrate`, e.g. the switches --overwrite (start the
# folder afresh), --no-retry-failed, --no-cache, --no-progress, --affinity-header NAME, or
# --max-connection-failures N (stop after N failed connections in a row).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

PLANNER_MODEL="${PLANNER_MODEL:-sprint}"                  # served model name of the planner
PLANNER_SERVER_URL="${PLANNER_SERVER_URL:-}"              # default: a local vLLM; url1,url2,...: replicas (README: Scaling out)
PLANNER_TEMP="${PLANNER_TEMP:-}"
PLANNER_TOP_P="${PLANNER_TOP_P:-}"
PLANNER_OUTPUT_TOKEN_LIMIT="${PLANNER_OUTPUT_TOKEN_LIMIT:-}"   # longer plans are redrawn
PLANNER_LENGTH_RETRIES="${PLANNER_LENGTH_RETRIES:-}"

EXECUTOR_MODEL="${EXECUTOR_MODEL:-}"                      # default: the planner model
EXECUTOR_SERVER_URL="${EXECUTOR_SERVER_URL:-}"            # default: the planner URL(s); a comma-separated list too
EXECUTOR_TEMP="${EXECUTOR_TEMP:-}"
EXECUTOR_TOP_P="${EXECUTOR_TOP_P:-}"

TEST_DATA="${TEST_DATA:-}"                                # hub id, .jsonl/.json/.parquet or stage folder
SPLIT="${SPLIT:-}"                                        # default: the task's evaluation split
SUBSET="${SUBSET:-}"                                      # e.g. gpqa_diamond
RANGE="${RANGE:-}"                                        # START:END of the rows (default: all)
TASK="${TASK:-}"                                          # math | gpqa | countdown | a registered task

MAX_PHASES="${MAX_PHASES:-}"                              # the answer is forced at this phase
MAX_PROBLEM_WORKERS="${MAX_PROBLEM_WORKERS:-}"
TIMED_PROBLEMS="${TIMED_PROBLEMS:-}"                      # the first N run one at a time (latency)
MAX_EXECUTION_WORKERS="${MAX_EXECUTION_WORKERS:-}"
MAX_TOKENS="${MAX_TOKENS:-}"                              # per executor call and for the final answer
PROMPT_MODE="${PROMPT_MODE:-}"                            # chat (training format) | raw (the authors' runs)
API="${API:-}"                                            # completions | chat
TOKENIZER="${TOKENIZER:-}"                                # chat template source (default: MODEL_PATH or the model name)
MODEL_PATH="${MODEL_PATH:-}"                              # local checkpoint: start vLLM if nothing answers locally
OUT_DIR="${OUT_DIR:-outputs/orchestration}"
CACHE_DIR="${CACHE_DIR:-}"                                # response cache, empty = OUT_DIR/llm_cache (pass --no-cache for none)
SCHEDULE="${SCHEDULE:-}"                                  # barrier (the authors' code) | stream (the paper's text)
SEED="${SEED:-}"                                          # base of the per-call seeds; none: the server's choice
TIMEOUT="${TIMEOUT:-}"                                    # seconds per model call
MAX_RETRIES="${MAX_RETRIES:-}"                            # HTTP retries per call
MAX_CONNECTION_FAILURES="${MAX_CONNECTION_FAILURES:-}"    # failed connections in a row that stop the run (exit 4)
EXECUTOR_RETRIES="${EXECUTOR_RETRIES:-}"                  # tries of an executor call
PROBLEM_RETRIES="${PROBLEM_RETRIES:-}"                    # re-runs of a problem after a transient failure
AGENT_PROMPT="${AGENT_PROMPT:-}"                          # agent prompt file (none: no agent prompt)
PRIORITY="${PRIORITY:-0}"                                 # 1/true/yes/on: send vLLM per-request priorities
AFFINITY_HEADER="${AFFINITY_HEADER:-}"                    # header with the problem id (default X-Session-Id; none: off)
REPLICAS="${REPLICAS:-}"                                  # with MODEL_PATH: start N vLLM replicas behind vllm-router (one per GPU)
ROUTER_POLICY="${ROUTER_POLICY:-}"                        # consistent_hash (default) | cache_aware | round_robin | ...
VLLM_ARGS="${VLLM_ARGS:-}"                                # with MODEL_PATH: extra flags for the vLLM it starts, e.g. --enforce-eager

args=(--planner-model "$PLANNER_MODEL" --out-dir "$OUT_DIR")
flag() {  # flag --name VALUE: pass the flag only when VALUE is set
  if [[ -n "$2" ]]; then args+=("$1" "$2"); fi
}
flag --planner-url "$PLANNER_SERVER_URL"
flag --planner-temp "$PLANNER_TEMP"
flag --planner-top-p "$PLANNER_TOP_P"
flag --planner-max-tokens "$PLANNER_OUTPUT_TOKEN_LIMIT"
flag --planner-length-retries "$PLANNER_LENGTH_RETRIES"
flag --executor-model "$EXECUTOR_MODEL"
flag --executor-url "$EXECUTOR_SERVER_URL"
flag --executor-temp "$EXECUTOR_TEMP"
flag --executor-top-p "$EXECUTOR_TOP_P"
flag --data "$TEST_DATA"
flag --split "$SPLIT"
flag --subset "$SUBSET"
flag --range "$RANGE"
flag --task "$TASK"
flag --max-phases "$MAX_PHASES"
flag --max-problem-workers "$MAX_PROBLEM_WORKERS"
flag --timed-problems "$TIMED_PROBLEMS"
flag --max-execution-workers "$MAX_EXECUTION_WORKERS"
flag --max-tokens "$MAX_TOKENS"
flag --prompt-mode "$PROMPT_MODE"
flag --api "$API"
flag --tokenizer "$TOKENIZER"
flag --model-path "$MODEL_PATH"
flag --cache-dir "$CACHE_DIR"
flag --schedule "$SCHEDULE"
flag --seed "$SEED"
flag --timeout "$TIMEOUT"
flag --max-retries "$MAX_RETRIES"
flag --max-connection-failures "$MAX_CONNECTION_FAILURES"
flag --executor-retries "$EXECUTOR_RETRIES"
flag --problem-retries "$PROBLEM_RETRIES"
flag --agent-prompt "$AGENT_PROMPT"
flag --affinity-header "$AFFINITY_HEADER"
flag --replicas "$REPLICAS"
flag --router-policy "$ROUTER_POLICY"
if [[ -n "$VLLM_ARGS" ]]; then args+=(--vllm-args="$VLLM_ARGS"); fi  # one string that starts with --
if is_true PRIORITY; then args+=(--priority); fi

case " $* " in
  *" -h "*|*" --help "*) ;;
  *) echo "to see the run when it is done (phases, call timelines; --baseline DIR compares):" \
       "sprint view $OUT_DIR --out $OUT_DIR/view, then open $OUT_DIR/view/index.html" ;;
esac
exec "${SPRINT[@]}" orchestrate "${args[@]}" "$@"
