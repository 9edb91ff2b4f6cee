#!/usr/bin/env bash
# Sequential baseline: one generation per problem with the same agent prompt and output layout
# as run_agent_orchestration.sh. Every variable can be set from the environment; one left empty
# passes no flag, so the default of `sprint baseline` applies (written once, in
# sprint/inference/baseline.py; see `sprint baseline --help`).
# Extra arguments are passed on to `sprint baseline`, e.g. the switches --overwrite (start the
# folder afresh), --no-retry-failed, --no-cache, --no-progress, --affinity-header NAME, or
# --max-connection-failures N (stop after N failed connections in a row).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

MODEL="${MODEL:-deepseek-ai/DeepSeek-R1-Distill-Qwen-7B}"   # served model name
SERVER_URL="${SERVER_URL:-}"                              # default: a local vLLM; url1,url2,...: replicas
TEMP="${TEMP:-}"
TOP_P="${TOP_P:-}"
MAX_TOKENS="${MAX_TOKENS:-}"                              # budget of the one generation

TEST_DATA="${TEST_DATA:-}"
SPLIT="${SPLIT:-}"                                        # default: the task's evaluation split
SUBSET="${SUBSET:-}"
RANGE="${RANGE:-}"                                        # START:END of the rows (default: all)
TASK="${TASK:-}"

MAX_PROBLEM_WORKERS="${MAX_PROBLEM_WORKERS:-}"
TIMED_PROBLEMS="${TIMED_PROBLEMS:-}"                      # the first N run one at a time (latency)
PROMPT_MODE="${PROMPT_MODE:-}"                            # chat | raw
API="${API:-}"                                            # completions | chat
TOKENIZER="${TOKENIZER:-}"
MODEL_PATH="${MODEL_PATH:-}"
OUT_DIR="${OUT_DIR:-outputs/baseline}"
CACHE_DIR="${CACHE_DIR:-}"                                # response cache, empty = OUT_DIR/llm_cache (pass --no-cache for none)
THINK="${THINK:-1}"                                       # 0/false/no/off: do not pre-fill <think> (--no-think)
SEED="${SEED:-}"                                          # base of the per-call seeds; none: the server's choice
TIMEOUT="${TIMEOUT:-}"                                    # seconds per model call
MAX_RETRIES="${MAX_RETRIES:-}"                            # HTTP retries per call
MAX_CONNECTION_FAILURES="${MAX_CONNECTION_FAILURES:-}"    # failed connections in a row that stop the run (exit 4)
PROBLEM_RETRIES="${PROBLEM_RETRIES:-}"                    # re-runs of a problem after a transient failure
AGENT_PROMPT="${AGENT_PROMPT:-}"                          # agent prompt file (none: no agent prompt)
AFFINITY_HEADER="${AFFINITY_HEADER:-}"                    # header with the problem id (default X-Session-Id; none: off)
REPLICAS="${REPLICAS:-}"                                  # with MODEL_PATH: start N vLLM replicas behind vllm-router (one per GPU)
ROUTER_POLICY="${ROUTER_POLICY:-}"                        # consistent_hash (default) | cache_aware | round_robin | ...
VLLM_ARGS="${VLLM_ARGS:-}"                                # with MODEL_PATH: extra flags for the vLLM it starts, e.g. --enforce-eager

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
flag --timed-problems "$TIMED_PROBLEMS"
flag --prompt-mode "$PROMPT_MODE"
flag --api "$API"
flag --tokenizer "$TOKENIZER"
flag --model-path "$MODEL_PATH"
flag --cache-dir "$CACHE_DIR"
flag --seed "$SEED"
flag --timeout "$TIMEOUT"
flag --max-retries "$MAX_RETRIES"
flag --max-connection-failures "$MAX_CONNECTION_FAILURES"
flag --problem-retries "$PROBLEM_RETRIES"
flag --agent-prompt "$AGENT_PROMPT"
flag --affinity-header "$AFFINITY_HEADER"
flag --replicas "$REPLICAS"
flag --router-policy "$ROUTER_POLICY"
if [[ -n "$VLLM_ARGS" ]]; then args+=(--vllm-args="$VLLM_ARGS"); fi  # one string that starts with --
if ! is_true THINK; then args+=(--no-think); fi

exec "${SPRINT[@]}" baseline "${args[@]}" "$@"
