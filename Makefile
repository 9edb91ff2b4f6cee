# Thin entry points. Each environment is separate: ms-swift and vLLM pin their own
# transformers/datasets, the pipeline talks to them through files and HTTP.
PYTHON ?= python3
VENV := .venv

.PHONY: install install-vllm install-swift install-rl test test-fast wheel-smoke demo bench clean

install: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

install-vllm:
	bash scripts/install_vllm.sh

install-swift:
	bash scripts/install_swift.sh

# ms-swift + vLLM + sprint in one venv, for latency-aware GRPO (run_grpo.sh, tests/test_rl_*.py).
install-rl:
	bash scripts/install_rl.sh

# Everything, real vLLM server and real ms-swift training included.
test: install install-vllm install-swift install-rl
	$(VENV)/bin/python -m pytest -q

# Offline unit tests only (no vLLM, no ms-swift).
test-fast: install
	$(VENV)/bin/python -m pytest -q -m "not vllm and not swift"

# The wheel works away from the checkout: built, installed into a fresh venv (dependencies reused
# from $(VENV)), run from a temporary folder; WHEEL_SMOKE_DEPS=pypi installs them from PyPI instead.
wheel-smoke: install
	bash scripts/wheel_smoke.sh

# The main job: every stage for real on a small bundled sample (see README).
demo: install install-vllm install-swift
	bash scripts/demo.sh

# The paper's experiment in miniature (work in progress, issue 23): Countdown traces, the stand-in
# teacher, pack, two models trained from one random init by swift sft (SPRINT and RFT), vLLM,
# orchestrate/baseline on held-out problems, Table 2 (scripts/mini_demo.sh; outputs/mini).
mini: install install-vllm install-swift
	bash scripts/mini_demo.sh

bench: install
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf outputs .pytest_cache
