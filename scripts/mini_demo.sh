#!/usr/bin/env bash
# The paper's experiment in miniature, on one CPU (`make demo`; README "The experiment in miniature").
#
#   0. problems and R1-style planned-search traces (Countdown, `sprint mini-data`), held-out problems;
#   1-2. component separation and DAG creation over the OpenAI protocol, answered by a deterministic
#        stand-in for GPT-4o (`sprint teacher-server`: the generator's own components and DAG) —
#        or by a real model when SERVER_URL and MODEL are set;
#   3. packing (the default, byte-faithful rules) into SPRINT rows, plus executor-view rows and the
#      same traces in sequential form (RFT);
#   4. the project's own tokenizer and one random-init Qwen2; `swift sft` trains two models from it
#      with one recipe: SPRINT on the packed rows, RFT on the sequential traces;
#   5. vLLM (CPU) serves each; `orchestrate` (barrier and stream) for SPRINT, `baseline` for RFT, on
#      the held-out problems, the same concurrency for all;
#   6. `evaluate`: Table 2 (accuracy, sequential and total tokens, seconds per problem, with CIs),
#      report.md, table2.json; `view`: the HTML site.
# Outputs stay in OUT (default outputs/mini): the tokenizer in OUT/tokenizer, the checkpoints in
# OUT/sprint-model and OUT/rft-model, so the same commands can be pointed at other problems.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${DEMO_DIR:-outputs/mini}"
PY="${PYTHON:-.venv/bin/python}"
SPRINT_BIN="${SPRINT_BIN:-.venv/bin/sprint}"
N_TEST="${N_TEST:-200}"                  # held-out problems (the issue asks for >= 200)
MAX_STEPS="${MAX_STEPS:-600}"            # SFT steps of each model (batch 16)
EXECUTOR_ROWS="${EXECUTOR_ROWS:-barrier}" # executor-view rows (none: the released layout; both: stream views too, not yet measured)
PROBLEM_WORKERS="${PROBLEM_WORKERS:-16}" # problems in flight, the same for every method
PORT="${PORT:-8827}"
HIDDEN="${HIDDEN:-128}"
LAYERS="${LAYERS:-4}"
export SPRINT_LOCAL_DATA="${SPRINT_LOCAL_DATA:-}"
mkdir -p "$OUT"
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

step "0. problems, traces and the teacher's answers"
"$SPRINT_BIN" mini-data --out "$OUT/data" --n-test "$N_TEST"

if [[ -z "${SERVER_URL:-}" ]]; then
  step "1-2. the stand-in teacher (not GPT-4o: the generator's own components and DAG)"
  TPORT=$("$PY" -c "from sprint.llm.serve import free_port; print(free_port())")
  "$SPRINT_BIN" teacher-server "$OUT/data/teacher.jsonl" --port "$TPORT" > "$OUT/teacher.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q "teacher server at" "$OUT/teacher.log" && break; sleep 0.2; done
  head -n 1 "$OUT/teacher.log"
  LLM_ENV=(SERVER_URL="http://127.0.0.1:$TPORT/v1" MODEL=standin-for-gpt-4o)
else
  LLM_ENV=(SERVER_URL="$SERVER_URL" MODEL="${MODEL:?set MODEL with SERVER_URL}")
fi
step "1. component separation"
env "${LLM_ENV[@]}" DATA="$OUT/data/train_traces.jsonl" OUT_DIR="$OUT/components" NUM_WORKERS=8 \
  bash run_component_separation.sh --no-progress
step "2. DAG creation"
env "${LLM_ENV[@]}" DATA="$OUT/components" OUT_DIR="$OUT/dag" NUM_WORKERS=8 bash run_dag_creation.sh --no-progress

step "3. packing: SPRINT rows (+ executor views), and the same traces in sequential form for RFT"
DATA="$OUT/dag" OUT_DIR="$OUT/sft" TEST_FRAC=0.02 AGENT_PROMPT=none EXECUTOR_ROWS="$EXECUTOR_ROWS" SEQUENTIAL=1 \
  bash run_finetuning_data_preparation.sh

step "4a. the project's own tokenizer and one random-init model"
"$SPRINT_BIN" mini-tokenizer "$OUT/data/corpus.jsonl" --out "$OUT/tokenizer" --extra-text "$OUT/sft/train.jsonl"
"$SPRINT_BIN" mini-model "$OUT/tokenizer" --out "$OUT/init" --hidden-size "$HIDDEN" --num-layers "$LAYERS" --seed 0

train() {  # train NAME TRAIN_FILE
  local name="$1" data="$2"
  rm -rf "$OUT/$name-train"
  MODEL="$OUT/init" TRAIN_DATA="$data" VAL_DATA= OUTPUT_DIR="$OUT/$name-train" CONFIG=sprint/configs/finetune_mini.yaml \
    TUNER=full NPROC_PER_NODE=1 MAX_STEPS="$MAX_STEPS" SAVE_STEPS="$MAX_STEPS" TOKENIZER="$OUT/tokenizer" \
    bash run_finetune.sh
  rm -rf "$OUT/$name-model"
  cp -r "$OUT/$name-train/checkpoint-$MAX_STEPS" "$OUT/$name-model"
}
step "4b. swift sft: SPRINT on the packed rows"
train sprint "$OUT/sft/train.jsonl"
step "4c. swift sft: RFT on the same traces, sequential (same init, recipe and steps)"
train rft "$OUT/sft/sequential_train.jsonl"

serve() {  # serve NAME PORT: vLLM on the CPU for OUT/NAME-model
  "$SPRINT_BIN" serve "$OUT/$1-model" --served-model-name "$1" --port "$2" --dtype float32 --max-model-len 1024 \
    --log "$OUT/$1-vllm.log" > "$OUT/$1-serve.out" 2>&1 &
  pids+=($!)
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$2/v1/models" > /dev/null && return 0; sleep 1; done
  echo "vLLM did not start for $1; see $OUT/$1-vllm.log" >&2; exit 1
}
COMMON=(TEST_DATA="$OUT/data/test.jsonl" TASK=countdown-mini AGENT_PROMPT=none TOKENIZER="$OUT/tokenizer"
        MAX_PROBLEM_WORKERS="$PROBLEM_WORKERS" SEED=0)
step "5a. vLLM serves SPRINT: orchestrate, barrier and stream"
serve sprint "$PORT"
for schedule in barrier stream; do
  rm -rf "$OUT/runs/sprint-$schedule"
  env "${COMMON[@]}" PLANNER_MODEL=sprint PLANNER_SERVER_URL="http://127.0.0.1:$PORT/v1" PLANNER_TEMP=0 EXECUTOR_TEMP=0 \
    MAX_TOKENS=512 PLANNER_OUTPUT_TOKEN_LIMIT=512 MAX_EXECUTION_WORKERS=64 OUT_DIR="$OUT/runs/sprint-$schedule" \
    bash run_agent_orchestration.sh --schedule "$schedule" --no-cache --no-progress
done
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'
step "5b. vLLM serves RFT: the sequential baseline"
serve rft "$PORT"
rm -rf "$OUT/runs/rft"
env "${COMMON[@]}" MODEL=rft SERVER_URL="http://127.0.0.1:$PORT/v1" TEMP=0 MAX_TOKENS=1024 OUT_DIR="$OUT/runs/rft" \
  bash run_baseline_evaluation.sh --no-cache --no-progress
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'

step "6. evaluate (Table 2) and view"
"$SPRINT_BIN" evaluate "$OUT/runs/sprint-barrier=SPRINT barrier" "$OUT/runs/sprint-stream=SPRINT stream" \
  --baseline "$OUT/runs/rft=RFT" --task countdown-mini --planner-tokenizer "$OUT/tokenizer" --out "$OUT/evaluation"
"$SPRINT_BIN" view "$OUT/runs/sprint-barrier=SPRINT barrier" "$OUT/runs/sprint-stream=SPRINT stream" \
  --baseline "$OUT/runs/rft=RFT" --planner-tokenizer "$OUT/tokenizer" --out "$OUT/view"

step "done"
"$PY" scripts/check_mini.py "$OUT"
