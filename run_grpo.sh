#!/usr/bin/env bash
# Latency-aware RL of a SPRINT model: GRPO with ms-swift whose rollouts are SPRINT planner/executor
# runs and whose reward pays for a shorter critical path (configs/grpo.yaml; sprint/rl/).
# 1. builds the GRPO rows (question, gold, task, reference length) from DATA;
# 2. starts `swift rollout` (vLLM async engine + the sprint scheduler plugin) unless ROLLOUT_URL is set;
# 3. runs `swift rlhf --rlhf_type grpo` against it with the correctness/format/latency rewards.
# Needs .venv-rl (ms-swift + vLLM + sprint in one venv): bash scripts/install_rl.sh; this script runs
# `sprint grpo` from it (PYTHON=/path/to/python picks another interpreter).
#
# Every variable can be overridden from the environment, e.g.
#   MODEL=outputs/finetune/best DATA=train.jsonl TASK=math REFERENCE_RUN=outputs/baseline ./run_grpo.sh
#   ROLLOUT_DEVICES=0 TRAIN_DEVICES=1,2,3 NPROC_PER_NODE=3 ./run_grpo.sh
#   DRY_RUN=1 ./run_grpo.sh            # print the three commands only
# Several training nodes (NNODES>1, with NODE_RANK/MASTER_ADDR/MASTER_PORT as torchrun wants them):
# start the rollout server once, on its own GPUs, with the printed command, and set ROLLOUT_URL on
# every training node so that none starts another.
# Extra arguments are passed on to `swift rlhf` (they win over the config), e.g. ./run_grpo.sh --seed 1;
# ROLLOUT_ARGS="--vllm_max_model_len 8192" adds flags to `swift rollout`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# the RL venv's Python when it is installed (its `swift` and vLLM run the rollouts), else run_env.sh's choice
if [[ -z "${PYTHON:-}" && -x "$HERE/.venv-rl/bin/python" ]]; then PYTHON="$HERE/.venv-rl/bin/python"; fi
source "$HERE/scripts/run_env.sh"  # SPRINT: the `sprint` command (of PYTHON when set); is_true VAR: booleans

# An empty variable passes no flag: `sprint grpo --help` shows what it defaults to
# (MODEL: deepseek-ai/DeepSeek-R1-Distill-Qwen-7B, TASK: math, SWIFT_BIN: .venv-rl/bin/swift,
# ROLLOUT_TIMEOUT: 1800 seconds).
MODEL="${MODEL:-}"                       # the SPRINT checkpoint to train (folder or hub id)
DATA="${DATA:-}"                         # training problems (MATH train-style rows, Countdown, ...)
TASK="${TASK:-}"                         # math | countdown | gpqa
SPLIT="${SPLIT:-}"
RANGE="${RANGE:-}"                       # start:end slice of the problems
REFERENCE_RUN="${REFERENCE_RUN:-}"       # a `sprint baseline` run: each problem's sequential length
REFERENCE_COLUMN="${REFERENCE_COLUMN:-}" # ... or a data column holding it
OUTPUT_DIR="${OUTPUT_DIR:-outputs/grpo}"
CONFIG="${CONFIG:-}"                     # empty: configs/grpo.yaml
NPROC_PER_NODE="${NPROC_PER_NODE:-1}"    # trainer processes per node
NNODES="${NNODES:-1}"
ROLLOUT_HOST="${ROLLOUT_HOST:-127.0.0.1}"
ROLLOUT_PORT="${ROLLOUT_PORT:-8000}"
ROLLOUT_URL="${ROLLOUT_URL:-}"           # a rollout server already running elsewhere
ROLLOUT_DEVICES="${ROLLOUT_DEVICES:-}"   # CUDA_VISIBLE_DEVICES of `swift rollout`
TRAIN_DEVICES="${TRAIN_DEVICES:-}"       # CUDA_VISIBLE_DEVICES of `swift rlhf`
ROLLOUT_TIMEOUT="${ROLLOUT_TIMEOUT:-}"   # seconds to wait for the rollout server to answer /health/
ROLLOUT_ARGS="${ROLLOUT_ARGS:-}"
# Empty values keep the config's: NUM_GENERATIONS 8, LR 1e-6, BETA (KL) 0.001, REWARD_WEIGHTS "1 0.2 0.5".
NUM_GENERATIONS="${NUM_GENERATIONS:-}"
LR="${LR:-}"
BETA="${BETA:-}"
REWARD_WEIGHTS="${REWARD_WEIGHTS:-}"
MAX_STEPS="${MAX_STEPS:-}"
SWIFT_BIN="${SWIFT_BIN:-}"
CPU="${CPU:-0}"                          # 1: no CUDA device (vLLM-CPU rollouts, gloo weight sync; small models only)
DRY_RUN="${DRY_RUN:-0}"

if [[ -z "$DATA" ]]; then echo "error: set DATA (training problems); see the header of $0" >&2; exit 2; fi
args=(--data "$DATA" --output-dir "$OUTPUT_DIR" --nproc-per-node "$NPROC_PER_NODE" --nnodes "$NNODES"
      --rollout-host "$ROLLOUT_HOST" --rollout-port "$ROLLOUT_PORT")
# `--flag=VALUE`: a value that itself starts with `--` (ROLLOUT_ARGS=--enforce_eager) is not read as a flag
if [[ -n "$ROLLOUT_ARGS" ]]; then args+=(--rollout-args="$ROLLOUT_ARGS"); fi
flag() { if [[ -n "$2" ]]; then args+=("$1" "$2"); fi; }
flag --model "$MODEL"; flag --task "$TASK"; flag --split "$SPLIT"; flag --range "$RANGE"
flag --reference-run "$REFERENCE_RUN"; flag --reference-column "$REFERENCE_COLUMN"; flag --config "$CONFIG"
flag --rollout-url "$ROLLOUT_URL"; flag --rollout-devices "$ROLLOUT_DEVICES"; flag --train-devices "$TRAIN_DEVICES"
flag --rollout-timeout "$ROLLOUT_TIMEOUT"
flag --num-generations "$NUM_GENERATIONS"; flag --lr "$LR"; flag --beta "$BETA"
flag --reward-weights "$REWARD_WEIGHTS"; flag --max-steps "$MAX_STEPS"; flag --swift-bin "$SWIFT_BIN"
if is_true CPU; then args+=(--cpu); fi
if is_true DRY_RUN; then args+=(--dry-run); fi

exec "${SPRINT[@]}" grpo "${args[@]}" -- "$@"
