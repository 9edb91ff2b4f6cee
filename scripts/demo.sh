#!/usr/bin/env bash
# Every hand-off on a bundled sample (`make demo-sample`): every SPRINT stage for real, at toy scale, on a CPU machine.
#
#   1-2. component separation + DAG creation on 8 bundled traces (examples/demo), answered from the
#        shipped response cache of hand-written answers — or by a real model when SERVER_URL and
#        MODEL are set;
#   3.   packing into trajectories and the SFT dataset;
#   4.   the SFT check and `swift sft` fine-tuning of a tiny random-weight Qwen2 for a few steps;
#   5.   vLLM (CPU build) serving that checkpoint, SPRINT orchestration and the sequential baseline
#        on 3 MATH-500 problems;
#   6.   evaluation: metrics.json + report.md.
#   7.   SPRINT working: the demo's own packed trajectories replayed through the real orchestrator
#        (`replay-server` with the latency model; barrier and stream schedules) against their
#        original sequential traces as the baseline;
#   8.   evaluation of the replay and the HTML viewer (`sprint view`): OUT/view/index.html.
# The tiny model writes gibberish, so the answers of steps 5-6 are wrong and reported as wrong: the
# point is that every hand-off between stages is real. Steps 7-8 show what a model that writes
# SPRINT's format gets: parallel phases, fewer sequential tokens, less time. Tokenizer and MATH-500 come from the hub unless
# SPRINT_LOCAL_DATA points at local copies (as on the CI machine: SPRINT_LOCAL_DATA=../shared/data).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${DEMO_DIR:-outputs/demo}"
PY="${PYTHON:-.venv/bin/python}"
VLLM_PY="${VLLM_PYTHON:-.venv-vllm/bin/python}"
BASE_TOKENIZER="${BASE_TOKENIZER:-deepseek-ai/DeepSeek-R1-Distill-Qwen-7B}"
MATH_DATA="${MATH_DATA:-HuggingFaceH4/MATH-500}"
PORT="${PORT:-8817}"
export PYTHON="$PY"
mkdir -p "$OUT"
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 )) s] $*"; }

TOKENIZER=$("$PY" -c "import sys; from sprint.core.data import resolve_local; print(resolve_local(sys.argv[1]) or sys.argv[1])" "$BASE_TOKENIZER")

step "0. tiny random-weight Qwen2 base model (tokenizer: $TOKENIZER)"
if [[ ! -f "$OUT/base-model/config.json" ]]; then
  "$VLLM_PY" scripts/make_tiny_model.py "$OUT/base-model" --tokenizer "$TOKENIZER"
fi

# Stages 1-2: the shipped cache answers for model gpt-4o; with SERVER_URL set, a real model answers.
if [[ -z "${SERVER_URL:-}" ]]; then
  mkdir -p "$OUT/llm_cache" && cp -rn examples/demo/llm_cache/. "$OUT/llm_cache/"
  LLM_ENV=(MODEL=gpt-4o SERVER_URL=http://127.0.0.1:9/v1 CACHE_DIR="$OUT/llm_cache")
  LLM_ARGS=(--no-check)
else
  LLM_ENV=(MODEL="${MODEL:?set MODEL with SERVER_URL}" SERVER_URL="$SERVER_URL" CACHE_DIR="$OUT/llm_cache")
  LLM_ARGS=()
fi

step "1. component separation"
env "${LLM_ENV[@]}" DATA=examples/demo/traces.jsonl OUT_DIR="$OUT/components" \
  bash run_component_separation.sh "${LLM_ARGS[@]}"

step "2. DAG creation"
env "${LLM_ENV[@]}" DATA="$OUT/components" OUT_DIR="$OUT/dag" bash run_dag_creation.sh "${LLM_ARGS[@]}"

step "3. packing -> SFT dataset"
DATA="$OUT/dag" OUT_DIR="$OUT/sft" TEST_FRAC=0.15 bash run_finetuning_data_preparation.sh

step "4. SFT check + fine-tuning with ms-swift (CPU, a few steps)"
MODEL="$OUT/base-model" DATA_DIR="$OUT/sft" OUTPUT_DIR="$OUT/finetune" TOKENIZER="$OUT/base-model" \
  NPROC_PER_NODE=1 TORCH_DTYPE=float32 DEEPSPEED=none MAX_STEPS=4 EVAL_STEPS=2 SAVE_STEPS=2 MAX_LENGTH=4096 \
  bash run_finetune.sh --gradient_accumulation_steps 1 --logging_steps 1 --dataloader_num_workers 0 --report_to none
CKPT=$(readlink -f "$OUT/finetune/best" || readlink -f "$OUT/finetune/last")
echo "checkpoint: $CKPT"

step "5a. SPRINT orchestration on 3 MATH-500 problems (vLLM serves $CKPT)"
PLANNER_MODEL=sprint-tiny MODEL_PATH="$CKPT" PLANNER_SERVER_URL="http://127.0.0.1:$PORT/v1" \
  TEST_DATA="$MATH_DATA" RANGE=0:3 MAX_PHASES=3 MAX_TOKENS=64 PLANNER_OUTPUT_TOKEN_LIMIT=64 \
  TOKENIZER="$CKPT" OUT_DIR="$OUT/orchestration" bash run_agent_orchestration.sh

step "5b. sequential baseline on the same problems"
MODEL=sprint-tiny MODEL_PATH="$CKPT" SERVER_URL="http://127.0.0.1:$PORT/v1" \
  TEST_DATA="$MATH_DATA" RANGE=0:3 MAX_TOKENS=192 TOKENIZER="$CKPT" OUT_DIR="$OUT/baseline" \
  bash run_baseline_evaluation.sh

step "6. evaluation"
"$PY" -m sprint evaluate "$OUT/orchestration" --baseline "$OUT/baseline" --task math \
  --planner-tokenizer "$TOKENIZER" --out "$OUT/evaluation"

step "7. replay: the packed trajectories through the real orchestrator (replay server, latency model)"
REPLAY="$OUT/replay"
TIME_SCALE="${TIME_SCALE:-0.5}"   # the replay server's delays x this; the viewer divides it back out
"$PY" scripts/demo_replay.py "$OUT"
RPORT=$("$PY" -c "from sprint.llm.serve import free_port; print(free_port())")
"$PY" -m sprint replay-server "$REPLAY/recorded" --port "$RPORT" --time-scale "$TIME_SCALE" \
  --tokenizer "$TOKENIZER" > "$REPLAY/server.log" 2>&1 &
RPID=$!
trap 'kill "$RPID" 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "replay server at" "$REPLAY/server.log" && break; sleep 0.2; done
grep "replay server at" "$REPLAY/server.log" || { cat "$REPLAY/server.log"; exit 1; }
rm -rf "$REPLAY/sprint-barrier" "$REPLAY/sprint-stream" "$REPLAY/baseline"  # fresh timings on every demo run
for schedule in barrier stream; do
  PLANNER_MODEL=sprint-replay PLANNER_SERVER_URL="http://127.0.0.1:$RPORT/v1" TEST_DATA="$REPLAY/problems.jsonl" \
    PROMPT_MODE=raw PLANNER_OUTPUT_TOKEN_LIMIT=8000 MAX_TOKENS=8000 MAX_PROBLEM_WORKERS=8 MAX_EXECUTION_WORKERS=32 \
    OUT_DIR="$REPLAY/sprint-$schedule" bash run_agent_orchestration.sh --schedule "$schedule" --no-cache
done
MODEL=sprint-replay-baseline SERVER_URL="http://127.0.0.1:$RPORT/v1" TEST_DATA="$REPLAY/problems.jsonl" \
  PROMPT_MODE=raw MAX_TOKENS=100000 MAX_PROBLEM_WORKERS=8 OUT_DIR="$REPLAY/baseline" \
  bash run_baseline_evaluation.sh --no-cache
kill "$RPID" && wait "$RPID" 2>/dev/null || true
trap - EXIT

step "8. evaluation of the replay + the HTML viewer"
"$PY" -m sprint view "$REPLAY/sprint-barrier" "$REPLAY/sprint-stream" --baseline "$REPLAY/baseline" \
  --planner-tokenizer "$TOKENIZER" --time-scale "$TIME_SCALE" --out "$OUT/view"

step "done"
"$PY" scripts/check_demo.py "$OUT" "$CKPT" "$TIME_SCALE"
