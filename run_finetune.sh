#!/usr/bin/env bash
# Stage 4: fine-tune an R1-Distill model on the SPRINT trajectories with ms-swift 4.x.
# Checks the data (sprint check-sft), then runs `swift sft` with the paper's recipe from
# configs/finetune_${TUNER}.yaml: full fine-tuning, 5 epochs, per-device batch 1 (global 16),
# bf16, DeepSpeed ZeRO-3, 5% warmup then linear decay, eval + save every 100 steps keeping the
# best checkpoint by eval loss (OUTPUT_DIR/best). Needs .venv-swift: bash scripts/install_swift.sh
#
# Every variable can be overridden from the environment, e.g.
#   MODEL=/models/DeepSeek-R1-Distill-Qwen-7B NPROC_PER_NODE=4 ./run_finetune.sh
#   TUNER=lora NPROC_PER_NODE=1 ./run_finetune.sh
#   DRY_RUN=1 ./run_finetune.sh           # print the swift command only
#   DRY_RUN=1 VALIDATE=1 ./run_finetune.sh  # ... and have ms-swift's own parser check it
#   DRY_RUN=1 NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 ./run_finetune.sh  # every node's command
# Extra arguments are passed on to `swift sft` (they win over the config), e.g. ./run_finetune.sh --seed 0
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

# An empty variable passes no flag, so `sprint finetune --help` shows what it defaults to
# (MODEL: deepseek-ai/DeepSeek-R1-Distill-Qwen-7B, TUNER: full, SWIFT_BIN: .venv-swift/bin/swift).
MODEL="${MODEL:-}"                                         # folder or Hugging Face id
DATA_DIR="${DATA_DIR:-outputs/finetuning_data}"            # run_finetuning_data_preparation.sh's OUT_DIR
TRAIN_DATA="${TRAIN_DATA:-$DATA_DIR/train.jsonl}"
VAL_DATA="${VAL_DATA-$DATA_DIR/test.jsonl}"                # set but empty: no evaluation, no best checkpoint
OUTPUT_DIR="${OUTPUT_DIR:-outputs/finetune}"
TUNER="${TUNER:-}"                                         # full (the paper) | lora
CONFIG="${CONFIG:-}"                                       # empty: configs/finetune_${TUNER}.yaml
NPROC_PER_NODE="${NPROC_PER_NODE:-8}"                      # this script targets the paper's 8-GPU node (the CLI: 1)
# Several nodes: run this script on every node with the same settings and its own NODE_RANK, e.g.
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 ./run_finetune.sh   # on 10.0.0.1
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 ./run_finetune.sh   # on the other node
NNODES="${NNODES:-}"                                       # empty: 1 (one node)
NODE_RANK="${NODE_RANK:-}"                                 # this node's rank, 0 .. NNODES-1
MASTER_ADDR="${MASTER_ADDR:-}"                             # node 0's address (needed when NNODES > 1)
MASTER_PORT="${MASTER_PORT:-}"                             # empty: 29500
# Empty values below keep the config's: LR 1e-5 (the paper; the authors' script used 1e-6, LR=1e-6
# reproduces it; lora: 1e-4), EPOCHS 5, MAX_LENGTH 7168, DEEPSPEED zero3 (lora: zero2; "none" disables),
# TORCH_DTYPE bfloat16, eval/save every 100 steps, MAX_STEPS unlimited.
LR="${LR:-}"
EPOCHS="${EPOCHS:-}"
MAX_LENGTH="${MAX_LENGTH:-}"
DEEPSPEED="${DEEPSPEED:-}"
TORCH_DTYPE="${TORCH_DTYPE:-}"
MAX_STEPS="${MAX_STEPS:-}"
EVAL_STEPS="${EVAL_STEPS:-}"
SAVE_STEPS="${SAVE_STEPS:-}"
MODEL_TYPE="${MODEL_TYPE:-}"                               # ms-swift model_type (config: qwen2)
TEMPLATE="${TEMPLATE:-}"                                   # ms-swift template (config: deepseek_r1)
TOKENIZER="${TOKENIZER:-}"                                 # for the data check; empty: MODEL
SWIFT_BIN="${SWIFT_BIN:-}"                                 # the ms-swift launcher
SKIP_CHECK="${SKIP_CHECK:-0}"                              # 1: train without checking the data
DRY_RUN="${DRY_RUN:-0}"                                    # 1: print the swift command and stop
VALIDATE="${VALIDATE:-0}"                                  # 1: ms-swift's parser checks the arguments first

args=(--train "$TRAIN_DATA" --val "$VAL_DATA" --output-dir "$OUTPUT_DIR" --nproc-per-node "$NPROC_PER_NODE")
flag() { if [[ -n "$2" ]]; then args+=("$1" "$2"); fi; }  # an empty variable passes no flag
flag --model "$MODEL"; flag --tuner "$TUNER"; flag --config "$CONFIG"; flag --lr "$LR"; flag --epochs "$EPOCHS"
flag --max-length "$MAX_LENGTH"; flag --deepspeed "$DEEPSPEED"; flag --torch-dtype "$TORCH_DTYPE"
flag --max-steps "$MAX_STEPS"; flag --eval-steps "$EVAL_STEPS"; flag --save-steps "$SAVE_STEPS"
flag --model-type "$MODEL_TYPE"; flag --template "$TEMPLATE"; flag --tokenizer "$TOKENIZER"; flag --swift-bin "$SWIFT_BIN"
flag --nnodes "$NNODES"; flag --node-rank "$NODE_RANK"; flag --master-addr "$MASTER_ADDR"; flag --master-port "$MASTER_PORT"
if is_true SKIP_CHECK; then args+=(--skip-check); fi
if is_true DRY_RUN; then args+=(--dry-run); fi
if is_true VALIDATE; then args+=(--validate-args); fi

exec "${SPRINT[@]}" finetune "${args[@]}" -- "$@"
