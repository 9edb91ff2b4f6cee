# Sourced by the run_*.sh scripts (after they set HERE): the `sprint` command to run, and the one
# rule for their boolean variables.
#
# SPRINT: the installed console script, never `python -m sprint`: that puts the current directory
# first on the import path, so a folder named `sprint` there (OUT_DIR=sprint) or a sprint.py would
# be imported instead of the tool. PYTHON=/path/to/python runs that interpreter the same safe way.
if [[ -n "${PYTHON:-}" ]]; then
  # -c puts the current directory first on sys.path; drop it before importing (works on every Python)
  SPRINT=("$PYTHON" -c 'import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; from sprint.cli import main; sys.argv[0] = "sprint"; sys.exit(main())')
elif [[ -x "$HERE/.venv/bin/sprint" ]]; then
  SPRINT=("$HERE/.venv/bin/sprint")
elif command -v sprint >/dev/null 2>&1; then
  SPRINT=(sprint)
else
  echo "error: no \`sprint\` command: install the project (make install, or pip install -e .) or set PYTHON to a Python that has it" >&2
  exit 2
fi

# is_true VAR: the variable's value as a boolean, as `sprint.core.options.parse_bool` reads one:
# 1/true/yes/on -> true, 0/false/no/off (or empty) -> false, any case; anything else stops the script.
is_true() {
  local value="${!1:-}"
  local word
  word="$(tr '[:upper:]' '[:lower:]' <<< "${value}" | tr -d '[:space:]')"
  case "$word" in
    1|true|yes|on) return 0 ;;
    0|false|no|off|"") return 1 ;;
    *) echo "error: $1=$value is not a boolean; use 1/true/yes/on or 0/false/no/off" >&2; exit 2 ;;
  esac
}
