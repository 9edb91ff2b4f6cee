#!/usr/bin/env bash
# CI step: the sprint wheel works on its own, away from this checkout.
#
# 1. builds the wheel from the files git knows (tracked + new, not ignored) copied to a temporary
#    folder, so nothing left over in build/ or *.egg-info can slip in;
# 2. checks it holds every file of the package: every subpackage, the viewer's assets, and the
#    top-level prompt templates and recipes (prompts/, configs/) mapped in as sprint/prompts and
#    sprint/configs: the same names, each byte-identical to the checkout's file;
# 3. installs it into a fresh venv outside the checkout and, from a temporary folder: the prompts and
#    recipes read from the installed package (no checkout to find); `sprint --help`;
#    stages 1-2 on the demo's traces answered from its shipped response cache (keys cover the prompt
#    text, so every hit proves the packaged templates are the checkout's, byte for byte); `sprint
#    pack` (the packaged agent prompt); `sprint evaluate` of the packed trajectories against the
#    traces' answers; `finetune` / `grpo` dry runs (the packaged recipes); and the clear errors that
#    `serve`, `finetune` and `grpo` give when no helper venv is named (a wheel has no checkout).
#
#   bash scripts/wheel_smoke.sh                        # dependencies reused from .venv (quick, offline)
#   WHEEL_SMOKE_DEPS=pypi bash scripts/wheel_smoke.sh  # dependencies installed from PyPI (slow)
#   WHEEL_SMOKE_DEPS=/path/to/venv bash scripts/wheel_smoke.sh
#
# Reusing a venv's dependencies: the fresh venv gets that venv's site-packages as a path (a .pth
# line); its .pth files are not run, so the checkout's editable `sprint` is not importable there,
# and the script checks that `sprint` is imported from the fresh venv. `pip check` then confirms
# that the wheel's declared requirements are met. Evaluation needs the R1 tokenizer: the hub, or
# SPRINT_LOCAL_DATA (default ../shared/data, as CI).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE_PYTHON="${BASE_PYTHON:-python3}"          # the interpreter the fresh venv is made from
DEPS="${WHEEL_SMOKE_DEPS:-$ROOT/.venv}"        # `pypi`, or a venv whose packages are reused
export SPRINT_LOCAL_DATA="${SPRINT_LOCAL_DATA:-$(cd "$ROOT/.." && pwd)/shared/data}"
unset PYTHON VLLM_PYTHON VLLM_VENV SWIFT_BIN SWIFT_VENV RL_VENV  # nothing may point back at the checkout
start=$(date +%s)
TMP="$(mktemp -d "${TMPDIR:-/tmp}/sprint-wheel-smoke.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
step() { echo "--- [$(( $(date +%s) - start )) s] $*"; }
fail() { echo "wheel smoke FAILED: $*" >&2; exit 1; }

step "wheel: build from the files git knows"
SRC="$TMP/src"
mkdir -p "$SRC"
if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard) |
    while IFS= read -r -d '' f; do if [[ -f "$ROOT/$f" ]]; then printf '%s\0' "$f"; fi; done |
    tar -C "$ROOT" --null -T - -cf - | tar -C "$SRC" -xf -
else
  tar -C "$ROOT" --exclude='.venv*' --exclude=build --exclude='*.egg-info' --exclude=outputs \
      --exclude=__pycache__ -cf - . | tar -C "$SRC" -xf -
fi
"$BASE_PYTHON" -m pip wheel "$SRC" -w "$TMP/dist" --no-deps --disable-pip-version-check -q
WHEEL="$(ls "$TMP"/dist/sprint-*.whl)"

step "wheel: contents"
"$BASE_PYTHON" - "$WHEEL" "$SRC" "$ROOT" <<'EOF'
import sys
import zipfile
from pathlib import Path

wheel, src, root = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
MAPPED = {"prompts": "sprint/prompts", "configs": "sprint/configs"}  # pyproject.toml's package-dir
archive = zipfile.ZipFile(wheel)
names = set(archive.namelist())


def files_of(folder: Path, prefix: str) -> set[str]:
    return {f"{prefix}/{p.relative_to(folder).as_posix()}" for p in folder.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


want = files_of(src / "sprint", "sprint")
for top, inside in MAPPED.items():
    want |= files_of(src / top, inside)
missing = sorted(want - names)
extra = sorted(n for n in names if n.startswith("sprint/") and n not in want)
subpackages = sorted(n.split("/")[1] for n in names if n.count("/") == 2 and n.endswith("/__init__.py"))
data = sorted(n for n in names if n.startswith("sprint/") and not n.endswith(".py"))
print(f"{Path(wheel).name}: {len(names)} files, {len(want)} of them the package's")
print(f"subpackages: {' '.join(subpackages)}")
print(f"data files: {' '.join(data)}")
if missing or extra:
    sys.exit(f"wheel smoke FAILED: the wheel lacks {missing} / has files the source has not {extra}")
for needed in ("sprint/prompts/agent.txt", "sprint/configs/grpo.yaml", "sprint/rl/plugin.py"):
    if needed not in names:
        sys.exit(f"wheel smoke FAILED: the wheel lacks {needed}")

# The mapped folders against the checkout's top-level ones: the same names, each byte for byte.
for top, inside in MAPPED.items():
    packaged = {n[len(inside) + 1:] for n in names if n.startswith(inside + "/")}
    checkout = {p.relative_to(root / top).as_posix() for p in (root / top).rglob("*") if p.is_file()}
    if packaged != checkout:
        sys.exit(f"wheel smoke FAILED: the wheel's {inside}/ and the checkout's {top}/ hold different files; "
                 f"only in the wheel: {sorted(packaged - checkout)}, only in the checkout: {sorted(checkout - packaged)}")
    differ = sorted(n for n in packaged if archive.read(f"{inside}/{n}") != (root / top / n).read_bytes())
    if differ:
        sys.exit(f"wheel smoke FAILED: the wheel's {inside}/ differs from the checkout's {top}/ in {differ}")
    print(f"{inside}/ = {top}/, byte for byte: {' '.join(sorted(packaged))}")
EOF

step "install: a fresh venv outside the checkout (dependencies: $DEPS)"
VENV="$TMP/venv"
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if [[ "$DEPS" == pypi ]]; then
  "${PIP[@]}" install "$WHEEL"
else
  [[ -x "$DEPS/bin/python" ]] || fail "no venv at $DEPS to reuse dependencies from; run make install, or set WHEEL_SMOKE_DEPS=pypi"
  purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
  version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
  [[ "$(version "$DEPS/bin/python")" == "$(version "$VENV/bin/python")" ]] ||
    fail "$DEPS has Python $(version "$DEPS/bin/python"), $BASE_PYTHON is $(version "$VENV/bin/python"); set BASE_PYTHON"
  purelib "$DEPS/bin/python" > "$(purelib "$VENV/bin/python")/_wheel_smoke_deps.pth"
  "${PIP[@]}" install --no-index --no-deps "$WHEEL"
fi
"${PIP[@]}" check >/dev/null || { "${PIP[@]}" check; fail "the wheel's requirements are not met"; }

WORK="$TMP/work"
mkdir -p "$WORK"
cd "$WORK"
SPRINT="$VENV/bin/sprint"
where="$("$VENV/bin/python" -c 'import sprint; print(sprint.__file__)')"
[[ "$where" == "$VENV"/* ]] || fail "sprint is imported from $where, not from the installed wheel"
echo "sprint imported from $where"
# no checkout beside the installed package: the prompts and recipes are read from its own copies
"$VENV/bin/python" - "$VENV" "$ROOT" <<'EOF'
import sys
from pathlib import Path

from sprint.core.resources import checkout_root, config_file, prompt_file

venv, root = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
if checkout_root() is not None:
    sys.exit(f"wheel smoke FAILED: the installed package takes {checkout_root()} for a checkout")
for found, top in ((prompt_file("agent"), root / "prompts" / "agent.txt"),
                   (config_file("grpo.yaml"), root / "configs" / "grpo.yaml")):
    if not found.resolve().is_relative_to(venv) or found.read_bytes() != top.read_bytes():
        sys.exit(f"wheel smoke FAILED: {found} is not the installed copy of {top}")
    print(f"read from the installed package: {found}")
EOF

step "sprint --help"
"$SPRINT" --help > help.txt
grep -q "pack" help.txt && grep -q "evaluate" help.txt || { cat help.txt; fail "sprint --help lists no pack/evaluate"; }

step "stages 1-2 on the demo traces, answered from the shipped response cache"
cp "$SRC/examples/demo/traces.jsonl" traces.jsonl
cp -r "$SRC/examples/demo/llm_cache" llm_cache
LLM=(--model gpt-4o --server-url http://127.0.0.1:9/v1 --cache-dir llm_cache --no-check --no-progress)
"$SPRINT" components --input traces.jsonl --out-dir components "${LLM[@]}" > components.log 2>&1 ||
  { cat components.log; fail "sprint components"; }
"$SPRINT" dag --input components --out-dir dag "${LLM[@]}" > dag.log 2>&1 || { cat dag.log; fail "sprint dag"; }
for log in components.log dag.log; do
  grep -Eq "over ([0-9]+) calls \(\1 from cache" "$log" ||
    { cat "$log"; fail "$log: not every request was a cache hit (does a packaged template differ?)"; }
done

step "sprint pack"
"$SPRINT" pack --input dag --out-dir pack | tee pack.log
grep -q "kept 7" pack.log || fail "pack kept other than the demo's 7 traces"

step "sprint evaluate (the 7 packed trajectories as a run, graded against the traces' answers)"
mkdir -p run
"$VENV/bin/python" -c 'import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    if json.loads(line)["status"] == "ok":
        sys.stdout.write(line)' pack/records.jsonl > run/records.jsonl
"$SPRINT" evaluate run --gold traces.jsonl --task math --out evaluation --bootstrap 50 --no-plots --workers 1 \
  > evaluate.log 2>&1 || { cat evaluate.log; fail "sprint evaluate"; }
cat evaluate.log
grep -q "accuracy 100.0%" evaluate.log || fail "the packed trajectories do not all carry their trace's answer"
[[ -f evaluation/metrics.json && -f evaluation/report.md ]] || fail "evaluate wrote no metrics.json/report.md"

step "packaged recipes: finetune and grpo dry runs"
SWIFT_BIN=/opt/ms-swift/bin/swift "$SPRINT" finetune --train pack/train.jsonl --val pack/test.jsonl \
  --output-dir ft --dry-run > finetune.log 2>&1 || { cat finetune.log; fail "sprint finetune --dry-run"; }
grep -q -- "--learning_rate" finetune.log || { cat finetune.log; fail "the finetune command carries no recipe"; }
MINI=$("$VENV/bin/python" -c "from sprint.core.resources import config_file; print(config_file('finetune_mini.yaml'))")
SWIFT_BIN=/opt/ms-swift/bin/swift "$SPRINT" finetune --train pack/train.jsonl --val "" --output-dir ft-mini --config "$MINI" \
  --nproc-per-node 1 --max-steps 3 --dry-run > finetune-mini.log 2>&1 || { cat finetune-mini.log; fail "sprint finetune --dry-run (mini)"; }
PLUGIN=$(grep -o -- "--external_plugins [^ ]*" finetune-mini.log | cut -d' ' -f2)
[[ "$PLUGIN" == "$VENV"/* && -f "$PLUGIN" ]] || { cat finetune-mini.log; fail "mini recipe: not the installed attention plugin"; }
RL_VENV=/opt/rl "$SPRINT" grpo --data traces.jsonl --task math --dry-run > grpo.log 2>&1 ||
  { cat grpo.log; fail "sprint grpo --dry-run"; }
grep -q "/opt/rl/bin/swift rlhf" grpo.log && grep -q -- "--external_plugins $VENV/" grpo.log ||
  { cat grpo.log; fail "grpo: not the RL_VENV launcher or not the installed plugin"; }

step "no checkout, no helper venv named: clear errors"
mkdir -p fake-model && echo '{}' > fake-model/config.json
expect_user_error() {  # expect_user_error VARIABLE COMMAND...: exit 2 and a message naming VARIABLE
  local var="$1" code=0
  shift
  "$SPRINT" "$@" > err.log 2>&1 || code=$?
  [[ "$code" == 2 ]] && grep -q "$var" err.log || { cat err.log; fail "sprint $1: exit $code, want 2 naming $var"; }
  echo "sprint $1: $(grep -m 1 "error" err.log)"
}
expect_user_error VLLM_VENV serve fake-model --port 9
expect_user_error SWIFT_VENV finetune --train pack/train.jsonl --output-dir ft --dry-run
expect_user_error RL_VENV grpo --data traces.jsonl --dry-run

echo "wheel smoke passed in $(( $(date +%s) - start )) s"
