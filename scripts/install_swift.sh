#!/usr/bin/env bash
# Create the ms-swift training environment (.venv-swift), separate from the pipeline's .venv:
# ms-swift 4.6 pins transformers<5.20 and datasets<4.8.5, which the pipeline does not want.
# The two environments exchange JSONL files only. Idempotent: re-running it is cheap.
#
#   bash scripts/install_swift.sh                  # CPU/GPU machine, default pins
#   SWIFT_VENV=/opt/swift-env bash scripts/install_swift.sh
#   SWIFT_EXTRAS="liger-kernel" bash scripts/install_swift.sh   # more packages
#
# DeepSpeed is installed too (the recipe trains with ZeRO-3; ms-swift does not depend on it). It
# needs no GPU to install or import, and the tests use it to resolve `--deepspeed zero3` on a CPU.
#
# torch is installed first and on its own, pinned: an unpinned `torch` pulled in by ms-swift would
# resolve to the newest CUDA build (several GB). On a GPU cluster set SWIFT_TORCH to the build
# that matches your CUDA driver.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SWIFT_VENV="${SWIFT_VENV:-$ROOT/.venv-swift}"
PYTHON="${PYTHON:-python3}"
SWIFT_VERSION="${SWIFT_VERSION:-4.6.0}"
SWIFT_TORCH="${SWIFT_TORCH:-torch==2.13.0}"
DEEPSPEED_VERSION="${DEEPSPEED_VERSION:-0.19.8}"   # empty: do not install DeepSpeed
SWIFT_EXTRAS="${SWIFT_EXTRAS:-}"

if [[ ! -x "$SWIFT_VENV/bin/python" ]]; then
    echo "creating $SWIFT_VENV"
    "$PYTHON" -m venv "$SWIFT_VENV"
fi
PIP=("$SWIFT_VENV/bin/python" -m pip install --disable-pip-version-check -q)

installed() {  # installed PKG: its version without a local label (2.13.0+cpu -> 2.13.0), or nothing
    "$SWIFT_VENV/bin/python" -c "import importlib.metadata as m; print(m.version('$1').split('+')[0])" 2>/dev/null || true
}

if [[ "$SWIFT_TORCH" == torch==* && "$(installed torch)" == "${SWIFT_TORCH#torch==}" ]]; then
    echo "torch $(installed torch) already installed"
else
    echo "installing $SWIFT_TORCH"
    "${PIP[@]}" "$SWIFT_TORCH"
fi

if [[ "$(installed ms-swift)" == "$SWIFT_VERSION" ]]; then
    echo "ms-swift $SWIFT_VERSION already installed"
else
    echo "installing ms-swift==$SWIFT_VERSION"
    # Passing the installed torch again keeps the resolver from swapping it for another build.
    "${PIP[@]}" "ms-swift==$SWIFT_VERSION" "torch==$(installed torch)"
fi

if [[ -z "$DEEPSPEED_VERSION" ]]; then
    echo "DEEPSPEED_VERSION is empty: not installing DeepSpeed (the ZeRO-3 recipe needs it)"
elif [[ "$(installed deepspeed)" == "$DEEPSPEED_VERSION" ]]; then
    echo "deepspeed $DEEPSPEED_VERSION already installed"
else
    echo "installing deepspeed==$DEEPSPEED_VERSION"
    "${PIP[@]}" "deepspeed==$DEEPSPEED_VERSION" "torch==$(installed torch)"
fi

if [[ -n "$SWIFT_EXTRAS" ]]; then
    # shellcheck disable=SC2086
    "${PIP[@]}" $SWIFT_EXTRAS
fi

"$SWIFT_VENV/bin/python" - <<'PY'
import importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "absent"
print(" | ".join(f"{n} {version(n)}" for n in ("ms-swift", "torch", "transformers", "datasets", "deepspeed")))
PY
echo "swift binary: $SWIFT_VENV/bin/swift"
