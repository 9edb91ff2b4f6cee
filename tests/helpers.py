"""What test modules share besides fixtures (import as `tests.helpers`): where the shared data lives,
the skip when it is missing, and the one run-folder writer.

These are plain functions, not only fixtures, because some tests need a path at import time (skipif
conditions) or inside helpers that are not fixtures; conftest.py wraps them as fixtures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sprint.core.data import iter_jsonl
from sprint.core.errors import UserError
from sprint.llm.serve import default_python, free_port
from sprint.mini.countdown import ANSWER, CHECK, INTRO, branches, make_trace, search
from sprint.mini.generate import write_mini_data
from sprint.mini.model import MiniModelConfig, make_model, torch_python
from sprint.mini.problems import MiniDataConfig
from sprint.mini.tokenizer import MiniTokenizerConfig, make_tokenizer
from sprint.training.finetune import default_swift_bin, swift_python

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = "tokenizers/deepseek-r1-distill-qwen-7b"  # the R1-distill tokenizer, under the shared data
# Every skip for a missing ../shared starts with this, so conftest's summary can count them.
SHARED_MISSING = "shared data missing"
# Every vLLM a test starts runs without torch.compile: the tests read answers, usage and protocol, not decode
# speed, and such a server is up in about 40 s instead of 86 on this CPU (docs/experiments.md, "Time")
EAGER = ("--enforce-eager",)


def shared_data_dir() -> Path:
    """SPRINT_LOCAL_DATA, else ../shared/data beside the repo (read-only; never copy from it), made
    absolute: tests hand it to subprocesses that run in other folders."""
    return Path(os.environ.get("SPRINT_LOCAL_DATA") or REPO_ROOT.parent / "shared" / "data").resolve()


def shared_missing(path: Path) -> str:
    """The skip reason for a missing shared file: a fresh clone without ../shared skips, never fails."""
    return f"{SHARED_MISSING}: {path} not found; set SPRINT_LOCAL_DATA to the shared data folder"


def shared_path(relative: str | Path = "") -> Path:
    """`relative` under the shared data folder; skips the calling test when it is not there."""
    path = shared_data_dir() / relative
    if not path.exists():
        pytest.skip(shared_missing(path))
    return path


def shared_example(name: str) -> Path:
    """A file of ../shared/examples (the data folder's sibling); skips the calling test when absent."""
    path = shared_data_dir().parent / "examples" / name
    if not path.is_file():
        pytest.skip(shared_missing(path))
    return path


def tokenizer_dir() -> Path:
    """The shared R1-distill tokenizer folder; skips the calling test when its tokenizer.json is missing."""
    return shared_path(f"{TOKENIZER}/tokenizer.json").parent


def write_run(folder: Path, records: list[dict], *, files: dict[str, str] | None = None, tail: str = "",
              stage: str = "orchestrate", config: dict | None = None) -> Path:
    """A run folder as orchestration (or the baseline) writes it, for tests of what reads one:
    records.jsonl (`tail` appended raw, e.g. a torn last line), manifest.json (`config` defaults to
    the math task) and trajectories/<id>.txt for each of `files`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    manifest_config = {"task": "math"} if config is None else config
    (folder / "manifest.json").write_text(json.dumps({"stage": stage, "config": manifest_config}))
    if files:
        (folder / "trajectories").mkdir(exist_ok=True)
        for pid, text in files.items():
            (folder / "trajectories" / f"{pid}.txt").write_text(text)
    return folder


def mini_trajectory(nums: tuple[int, int, int], target: int, *, executions: list[str] | None = None,
                    based: int | None = None, check: str | None = None, answer: str | None = None,
                    twice: bool = False) -> str:
    """A mini-task SPRINT trajectory as the packer lays it out (the three pairs in phase 1, the check
    in phase 2, `twice`: followed by the recheck), for tests of what reads one; the keyword
    arguments override one part (the executions, the pair the check is based on, the check's
    expression, the answer)."""
    trace = make_trace(nums, target, recheck=twice)
    found = [search(pair, rest, target) for pair, rest in branches(nums)]
    executions = executions or ["\n".join(b.lines[1:]) for b in found]
    based = trace.winner + 1 if based is None else based
    prompts = "\n\n".join(f"<prompt_1.{k}> {b.lines[0]} </prompt_1.{k}>" for k, b in enumerate(found, 1))
    execs = "\n\n".join(f"<execution_1.{k}>\n{text}\n</execution_1.{k}>" for k, text in enumerate(executions, 1))
    check_lines = "\n".join([CHECK.format(expr=check or trace.expr, t=target)] + (trace.lines[-2:] if twice else []))
    a, b, c = nums
    return (f"<Question>\n{trace.question}\n</Question>\n\n<Plan_1>\n{INTRO.format(t=target, a=a, b=b, c=c)}\n\n{prompts}\n"
            f"</Plan_1>\n\n<Execution_1>\n{execs}\n</Execution_1>\n\n<Plan_2>\nBased on execution_1.{based}:\n"
            f"{check_lines}\n</Plan_2>\n\n<Execution_2>\nNo prompt to execute.\n</Execution_2>\n\n"
            f"<Final_answer>\n{ANSWER.format(expr=answer or check or trace.expr)}\n</Final_answer>")


def teacher_stages(data: Path, n: int, out: Path, *pack_args: str) -> tuple[list[dict], list[dict]]:
    """The first `n` traces of a `sprint mini-data` folder through the real stages: stages 1-2 against the
    real stand-in teacher server, then `pack` (with `pack_args`). Returns (the traces, pack's records)."""
    sprint = [sys.executable, "-m", "sprint"]
    rows = list(iter_jsonl(data / "train_traces.jsonl"))[:n]
    traces = out / "traces.jsonl"
    traces.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers = out / "answers.jsonl"
    answers.write_text("".join(line + "\n" for line in (data / "teacher.jsonl").read_text().splitlines()[:n]))
    server = subprocess.Popen([*sprint, "teacher-server", str(answers), "--port", "0"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        first = server.stdout.readline() if server.stdout else ""
        url = first.split(" at ", 1)[1].split()[0]
        llm = ["--server-url", url, "--model", "standin-for-gpt-4o", "--no-progress"]
        for stage, src, dst in (("components", traces, out / "c"), ("dag", out / "c", out / "d")):
            done = subprocess.run([*sprint, stage, "-i", str(src), "--out-dir", str(dst), *llm], capture_output=True,
                                  text=True)
            assert done.returncode == 0, done.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
    packed = subprocess.run([*sprint, "pack", "-i", str(out / "d"), "--out-dir", str(out / "p"), *pack_args],
                            capture_output=True, text=True)
    assert packed.returncode == 0, packed.stderr
    return rows, list(iter_jsonl(out / "p" / "records.jsonl"))


def tiny_arithmetic(folder: Path, *, n_test: int, n_train: int, phrases: str = "") -> Path:
    """Arithmetic problems (seed 5) in folder/data, the project's tokenizer of them in folder/tok and a one-layer
    random-init model in folder/init, for the probe scripts run with a torch Python; returns that Python (skips
    the calling test where there is none)."""
    try:
        python = torch_python()
    except UserError as exc:
        pytest.skip(str(exc))
    write_mini_data(MiniDataConfig(out=str(folder / "data"), task="arithmetic", n_test=n_test, n_train=n_train, seed=5))
    make_tokenizer(MiniTokenizerConfig(corpus=[str(folder / "data" / "corpus.jsonl")], out=str(folder / "tok"),
                                       max_number=9, phrases=phrases))
    make_model(MiniModelConfig(tokenizer=str(folder / "tok"), out=str(folder / "init"), hidden_size=32,
                               num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=64, seed=1))
    return python


def run_mini_demo(out: Path, settings: dict[str, str], *, timeout: int, label: str) -> Path:
    """`scripts/mini_demo.sh` into `out` with `settings` (its variables) on a free port, for the CI-sized runs of
    the miniature; skips the calling test when the vLLM or ms-swift venv is missing, fails it with the script's
    tail when the script fails."""
    if not default_python().exists():
        pytest.skip("vLLM venv missing; run scripts/install_vllm.sh")
    if not default_swift_bin().exists() or not swift_python(default_swift_bin()).exists():
        pytest.skip("ms-swift venv missing; run scripts/install_swift.sh")
    env = {**os.environ, "EAGER": "1", **settings, "DEMO_DIR": str(out), "PORT": str(free_port())}
    started = time.monotonic()
    done = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "mini_demo.sh")], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    print(f"{label} took {time.monotonic() - started:.0f} s; its steps began at:")
    print("\n".join(line for line in done.stdout.splitlines() if line.startswith("=== [")))
    if done.returncode != 0:
        pytest.fail(f"scripts/mini_demo.sh failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    print(done.stdout[-3000:])
    return out
