#!/usr/bin/env bash
# Seconds on a real engine: replay a recorded SPRINT run (and its baseline) on a vLLM server with
# every call's context and output length as recorded, then print seconds per problem and the
# speedup. Any model of the recorded model's shape will do (random weights too, see
# scripts/time_on_gpus.sh). Every variable can be set from the environment; one left empty passes
# no flag, so the default of `sprint time-replay` applies (written once, in
# sprint/timing/time_replay.py; see `sprint time-replay --help`).
# Extra arguments are passed on to `sprint time-replay`, e.g. --prompt-mode, --agent-prompt FILE,
# --temperature, --top-p, --timeout SECONDS, --warmup N, --resamples N (see its --help).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/scripts/run_env.sh"  # SPRINT: the installed `sprint` command; is_true VAR: booleans

RUN="${RUN:-outputs/sprint}"                # recorded SPRINT run (run folder or the authors' logs)
BASELINE="${BASELINE:-}"                    # recorded sequential baseline run (empty: none)
SERVER_URL="${SERVER_URL:-http://127.0.0.1:8000/v1}"
MODEL="${MODEL:-deepseek-ai/DeepSeek-R1-Distill-Qwen-7B}"   # served model name
TOKENIZER="${TOKENIZER:-}"                  # default: the run's manifest, else MODEL
SCHEDULE="${SCHEDULE:-}"                    # barrier | stream | both
CONCURRENCY="${CONCURRENCY:-}"              # problems in flight
LIMIT="${LIMIT:-}"                          # first N problems only
OUT_DIR="${OUT_DIR:-outputs/time_replay}"

args=("$RUN" --server "$SERVER_URL" --model "$MODEL" --out "$OUT_DIR")
flag() {  # flag --name VALUE: pass the flag only when VALUE is set
  if [[ -n "$2" ]]; then args+=("$1" "$2"); fi
}
flag --baseline "$BASELINE"
flag --tokenizer "$TOKENIZER"
flag --schedule "$SCHEDULE"
flag --concurrency "$CONCURRENCY"
flag --limit "$LIMIT"

# fit-latency reads what time-replay wrote: an extra --out wins over OUT_DIR (the last one counts, as in
# argparse); --help only shows time-replay's options, there is nothing to fit.
fit_dir="$OUT_DIR"
prev=""
for arg in "$@"; do
  case "$arg" in
    -h|--help) exec "${SPRINT[@]}" time-replay "${args[@]}" "$@" ;;
    --out=*) fit_dir="${arg#--out=}" ;;
  esac
  if [[ "$prev" == "--out" ]]; then fit_dir="$arg"; fi
  prev="$arg"
done

"${SPRINT[@]}" time-replay "${args[@]}" "$@"
exec "${SPRINT[@]}" fit-latency "$fit_dir"
