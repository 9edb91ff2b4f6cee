"""What SPRINT orchestration and the sequential baseline share: their options, the run's setup and
finish (manifest), the problem pool, the call records, the summary.

Both stages write the same run folder layout (records.jsonl, trajectories/<id>.txt, manifest.json),
so `sprint evaluate` reads either, and a baseline is compared with a SPRINT run problem by problem.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sprint.core.calls import CallRecord
from sprint.core.data import safe_id
from sprint.core.errors import ServerStopped, UserError, failed_items_exit
from sprint.llm.client import DEFAULT_MAX_CONNECTION_FAILURES, Completion, LLMConfig, OnText, Sampling
from sprint.llm.failures import TRANSIENT_KINDS
from sprint.core.options import add_options, check_range, config_from, flag_name, optional_int, option
from sprint.format.prompt_format import APIS, PROMPT_MODES, PromptFormat, build_prompt_format, load_agent_prompt
from sprint.core.records import RunDir
from sprint.core.files import atomic_write
from sprint.llm.replicas import AFFINITY_HEADER, ReplicaPool, split_urls
from sprint.llm.fleet import ensure_replicas
from sprint.llm.router import DEFAULT_POLICY, POLICIES, RouterWatch
from sprint.llm.serve import ensure_server, is_local, list_models
from sprint.core.items import Tally, crash_record, resolve_cache_dir, row_hash, run_items
from sprint.tasks.registry import Problem, TaskAdapter, TaskChoices, get_task, load_problems, task_names

DEFAULT_URL = "http://127.0.0.1:8000/v1"  # a local vLLM server on its usual port


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(kw_only=True)
class InferenceOptions:
    """The options both inference stages take; each stage adds its model settings.

    `max_tokens`, `max_problem_workers` and `timeout` have no default here: one generation of the
    baseline needs far more room and time than one SPRINT call, so each stage states its own.
    """

    data: str = option("HuggingFaceH4/MATH-500", "hub id, .jsonl/.json/.parquet file or stage folder", var="TEST_DATA")
    split: str | None = option(None, "dataset split (default: the task's evaluation split: test; train for gpqa)",
                               var="SPLIT")
    subset: str | None = option(None, "hub config name, e.g. gpqa_diamond", var="SUBSET")
    range: str | None = option(None, "START:END of the rows to run, e.g. 0:100 (default: all)", metavar="START:END",
                               var="RANGE")
    task: str = option("math", "task: how a row becomes a question, and how the answer is read and graded",
                       choices=TaskChoices(), var="TASK")
    out_dir: str = option(help="run folder (records.jsonl, trajectories/, manifest.json)", var="OUT_DIR")
    max_tokens: int = option(help="token budget of a call")
    max_problem_workers: int = option(help="problems in flight", var="MAX_PROBLEM_WORKERS")
    timed_problems: int = option(0, "run the first N problems one at a time, before the others go with "
                                 "MAX_PROBLEM_WORKERS in flight: their seconds are latency (Table 2's seconds "
                                 "column reads the problems that ran alone), the rest only need answers; 0: none",
                                 var="TIMED_PROBLEMS")
    prompt_mode: str = option("chat", "chat: the model's chat template, as in training; raw: the authors' "
                              "untemplated text", choices=PROMPT_MODES, var="PROMPT_MODE")
    api: str = option("completions", "completions, or chat: /v1/chat/completions continuing the assistant turn "
                      "(needs vLLM's continue_final_message; hosted APIs that cannot prefill will not continue it)",
                      choices=APIS, var="API")
    tokenizer: str | None = option(None, "tokenizer for the chat template (default: --model-path, else the model name)",
                                   var="TOKENIZER")
    agent_prompt: str | None = option(None, "agent prompt file (default: prompts/agent.txt; 'none' for no agent prompt)",
                                      var="AGENT_PROMPT")
    seed: int | None = option(0, "base of the per-call seeds ('none': the server's choice)", type=optional_int,
                              var="SEED")
    problem_retries: int = option(1, "re-runs of a problem after a transient LLM failure", var="PROBLEM_RETRIES")
    timeout: float = option(help="seconds per model call")
    max_retries: int = option(3, "HTTP retries per call on transient errors", var="MAX_RETRIES")
    max_connection_failures: int = option(
        DEFAULT_MAX_CONNECTION_FAILURES, "stop the run (exit 4) after this many failed connections in a row to a "
        "server (0: never); the same command continues it", var="MAX_CONNECTION_FAILURES")
    cache_dir: str | None = option(None, "on-disk response cache (default: OUT_DIR/llm_cache); calls answered before "
                                   "a crash are not paid again on resume. Sampled answers are replayed: change --seed "
                                   "for new samples", var="CACHE_DIR")
    use_cache: bool = option(True, "do not read or write the response cache", flags=("--no-cache",))
    model_path: str | None = option(None, "local checkpoint: start vLLM on the local URL when nothing answers",
                                    var="MODEL_PATH")
    affinity_header: str = option(AFFINITY_HEADER, "header carrying the problem id on every request, so a router "
                                  "in front of several servers keeps a problem on one ('none': no header)",
                                  var="AFFINITY_HEADER")
    replicas: int = option(1, "with --model-path and nothing answering on the local URL: start this many vLLM "
                           "replicas behind vllm-router there (`sprint serve --replicas`)", var="REPLICAS")
    router_policy: str = option(DEFAULT_POLICY, "vllm-router policy for --replicas", choices=POLICIES,
                                var="ROUTER_POLICY")
    vllm_args: str = option("", "with --model-path: extra flags for the vLLM it starts, as one string "
                            '(e.g. "--enforce-eager", "--tensor-parallel-size 2")', var="VLLM_ARGS")

    def __post_init__(self) -> None:
        if self.task not in task_names():
            get_task(self.task)  # the registry's error: unknown task, and the known ones
        cls = type(self)
        check_range(cls, "max_problem_workers", self.max_problem_workers, low=1)
        check_range(cls, "timed_problems", self.timed_problems, low=0)
        check_range(cls, "problem_retries", self.problem_retries, low=0)
        check_range(cls, "max_retries", self.max_retries, low=0)
        check_range(cls, "max_connection_failures", self.max_connection_failures, low=0)
        check_range(cls, "timeout", self.timeout, low=0.001)  # 0 s would fail every call
        check_range(cls, "max_tokens", self.max_tokens, low=1)
        check_range(cls, "replicas", self.replicas, low=1)

    def cache_path(self) -> Path | None:
        return resolve_cache_dir(Path(self.out_dir), self.cache_dir, self.use_cache)

    def llm_config(self, url: str, model: str, concurrency: int) -> LLMConfig:
        return LLMConfig(url, model, max_concurrency=concurrency, timeout=self.timeout, max_retries=self.max_retries,
                         cache_dir=self.cache_path(), max_connection_failures=self.max_connection_failures)

    def pool(self, urls: str, model: str, concurrency: int) -> ReplicaPool:
        """The clients of one role: one per URL of the comma-separated list, a problem's calls on one."""
        header = None if self.affinity_header.strip().lower() in ("", "none") else self.affinity_header.strip()
        return ReplicaPool(self.llm_config(split_urls(urls)[0], model, concurrency), split_urls(urls),
                           affinity_header=header)

    def identity(self) -> dict[str, Any]:
        """Config for RunDir (the manifest's `config`; its non-volatile keys are the run's identity).

        The model path is kept out (where a model was loaded from is not what it is). `cache_dir`
        holds the cache actually used (None: no cache); it is volatile in sprint.core.records, so a run
        resumed with another cache location, or none, is the same run.
        """
        config = asdict(self)
        config.pop("model_path")
        config.pop("replicas")  # how the local servers were started, like the model path: not the run's identity
        config.pop("router_policy")
        config.pop("vllm_args")
        config.pop("use_cache")
        cache = self.cache_path()
        config["cache_dir"] = str(cache) if cache is not None else None
        config["agent_prompt_sha256"] = hashlib.sha256(load_agent_prompt(self.agent_prompt).encode()).hexdigest()[:16]
        return config


@dataclass(frozen=True)
class RoleSampling:
    """Per-role sampling: how hot and how long (its defaults are the stages' options)."""

    temperature: float
    top_p: float
    max_tokens: int

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise UserError(f"max tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UserError(f"bad sampling: temperature {self.temperature} (>= 0), top_p {self.top_p} (in (0, 1])")


def add_stage_arguments(parser: argparse.ArgumentParser, cls: type[InferenceOptions]) -> None:
    """The flags of `sprint orchestrate` / `sprint baseline` from `cls`: the stage's own (its models)
    first, then the shared ones, then run control."""
    shared = [f.name for f in fields(InferenceOptions)]
    add_options(parser, cls, skip=shared)
    add_options(parser, cls, skip=[f.name for f in fields(cls) if f.name not in shared])
    # how to treat the run folder and the terminal: not part of the run's configuration
    parser.add_argument("--overwrite", action="store_true", help="replace a run folder holding a different configuration")
    parser.add_argument("--no-retry-failed", dest="retry_failed", action="store_false",
                        help="keep failed records on resume (default: redo the retryable ones)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


def handle_stage(args: argparse.Namespace, cls: type[InferenceOptions], entry: Callable[..., dict[str, Any]]) -> int:
    """What `sprint orchestrate` / `sprint baseline` do: `entry(cfg, ...)`, then the summary line; exit 3
    when problems failed (sprint.core.errors), with the count by kind and the command that retries them."""
    cfg = config_from(cls, args)
    summary = entry(cfg, overwrite=args.overwrite, retry_failed=args.retry_failed, progress=args.progress)
    print_summary(summary, cfg.out_dir)
    return failed_items_exit(summary.get("failed_kinds") or {}, summary.get("retryable", 0), what="problems",
                             argv=getattr(args, "argv", None),
                             retry_hint="a re-run keeps them; --overwrite starts the run afresh")


# ---------------------------------------------------------------------------------------------
# Calls and records


def answered_call(role: str, phase: int, prompt: str | None, done: Completion, draw: int = 1,
                  run: int = 1) -> CallRecord:
    """The record of a call the server (or the response cache) answered."""
    return CallRecord(role, phase, prompt, done.prompt_tokens, done.completion_tokens, done.finish_reason,
                      done.start, done.end, done.cached, draw, run, cached_tokens=done.cached_tokens,
                      server=done.server)


def failed_call(role: str, phase: int, prompt: str | None, started: float, error: str, draw: int = 1,
                run: int = 1) -> CallRecord:
    """The record of a call that failed or was cancelled: no tokens, not kept."""
    return CallRecord(role, phase, prompt, start=started, end=time.time(), draw=draw, run=run, kept=False,
                      error=error)


def call_seed(seed: int | None, *parts: object) -> int | None:
    """A per-call seed fixed by the run seed and the call's place (problem, role, phase, draw)."""
    if seed is None:
        return None
    key = ":".join(str(p) for p in (seed, *parts))
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") & 0x7FFFFFFF


async def request(
    client: ReplicaPool | Any, endpoint: str, payload: Any, sampling: Sampling, on_text: OnText | None = None, *,
    key: str = "", body: dict[str, Any] | None = None,
) -> Completion:
    """One call on the endpoint the prompt format chose, on the replica that owns `key` (the problem id).

    Any other client with `complete`/`chat` (e.g. the RL rollout's engine client) is called as is."""
    if isinstance(client, ReplicaPool):
        return await client.call(endpoint, payload, sampling, on_text, key=key, body=body)
    send = client.complete if endpoint == "completions" else client.chat
    return await send(payload, sampling, on_text)


def prefix_cache_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Prefix-cache hit ratio per role: cached / prompt tokens over the calls whose server reported
    `cached_tokens` (vLLM with --enable-prompt-tokens-details); None where no call reported it."""
    out: dict[str, Any] = {}
    for record in records:
        for call in record.get("calls") or ():
            if not isinstance(call.get("cached_tokens"), int):
                continue
            role = out.setdefault(call.get("role") or "?", {"calls": 0, "prompt_tokens": 0, "cached_tokens": 0})
            role["calls"] += 1
            role["prompt_tokens"] += int(call.get("prompt_tokens") or 0)
            role["cached_tokens"] += call["cached_tokens"]
    for role in out.values():
        role["hit_ratio"] = round(role["cached_tokens"] / role["prompt_tokens"], 4) if role["prompt_tokens"] else None
    return out


def outcome_fields(calls: list[CallRecord], attempts: int, started: float, failure: BaseException | None) -> dict[str, Any]:
    """The last keys of every record: its calls, attempts, timing and status (error fields on failure)."""
    fields_ = {"calls": [c.as_dict() for c in calls], "attempts": attempts, "start": started, "end": time.time(),
               "status": "ok", "error": None}
    if failure is not None:
        fields_.update(failure_fields(failure))
    return fields_


def is_transient(exc: BaseException) -> bool:
    """Worth another try now: a transient failure, unless the circuit breaker refused the call (the
    server stopped answering; a retry would fail at once and count as an attempt never made)."""
    return getattr(exc, "kind", None) in TRANSIENT_KINDS and not getattr(exc, "stopped", False)


def failure_fields(exc: BaseException) -> dict[str, Any]:
    kind = getattr(exc, "kind", None)
    return {"status": "error", "error": str(exc), "error_kind": kind, "retryable": kind in TRANSIENT_KINDS}


def problem_fields(problem: Problem, task: TaskAdapter) -> dict[str, Any]:
    """The first keys of every record: which problem, and what it is graded against."""
    return {"id": problem.id, "index": problem.index, "task": task.name, "question": problem.question,
            "gold": problem.gold}


def crashed(problem: Problem, task: TaskAdapter, exc: BaseException, text: dict[str, Any]) -> dict[str, Any]:
    """The record of a problem whose solving raised something unexpected (a bug, a surprise in
    grading): retryable, so a fixed re-run redoes it; `text` gives the stage's text fields."""
    base = {
        **problem_fields(problem, task), "predicted": None, "correct": None, **text,
        "prompt_tokens": 0, "completion_tokens": 0, "calls": [], "attempts": 0, "error_kind": None,
    }
    return crash_record(base, exc)


def no_question(problem: Problem, task: TaskAdapter, text: dict[str, Any]) -> dict[str, Any]:
    """The record of a row without question text: refused before any call, for good (as every stage does)."""
    now = time.time()
    return {
        **problem_fields(problem, task), "predicted": None, "correct": None, **text,
        "prompt_tokens": 0, "completion_tokens": 0, "calls": [], "attempts": 0, "start": now, "end": now,
        "status": "no_question", "error": "the row has no question text (check the data's question column)",
        "error_kind": None, "retryable": False,
    }


# ---------------------------------------------------------------------------------------------
# Summary and progress


def _answered(record: dict) -> bool:
    """A problem that ended with a final answer (as sprint.evaluation.metrics counts `answered`)."""
    return record.get("status") == "ok" and record.get("predicted") is not None


def accuracy_text(correct: int, answered: int, total: int) -> str:
    """`80.0% (24/30; 100.0% of answered)`: over all problems first (failed and unanswered ones
    count as wrong, the primary metric), the flattering over-answered figure only beside it."""
    if not total:
        return "n/a"
    of_answered = f"{correct / answered:.1%}" if answered else "n/a"
    return f"{correct / total:.1%} ({correct}/{total}; {of_answered} of answered)"


class AccuracyTally(Tally):
    """The progress bar's postfix for inference: accuracy so far (resumed records included) and errors."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = 0
        self.correct = 0
        self.answered = 0

    def add(self, record: dict[str, Any]) -> None:
        super().add(record)
        self.seen += 1
        self.correct += record.get("correct") is True
        self.answered += _answered(record)

    def text(self) -> str:
        acc = accuracy_text(self.correct, self.answered, self.seen) if self.seen else "-"
        return f"acc={acc}, errors={self.failed}"


def summarize_run(records: list[dict]) -> dict[str, Any]:
    """Headline counts of a run. `accuracy` is over all problems (failed and unanswered ones count
    as wrong, as in sprint.evaluation.metrics); `accuracy_answered` only over those with a final answer."""
    ok = [r for r in records if r.get("status") == "ok"]
    correct = sum(1 for r in ok if r.get("correct") is True)
    answered = sum(1 for r in records if _answered(r))
    out: dict[str, Any] = {
        "problems": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "correct": correct,
        "answered": answered,
        "accuracy": round(correct / len(records), 4) if records else None,
        "accuracy_answered": round(correct / answered, 4) if answered else None,
        "no_answer": sum(1 for r in ok if r.get("predicted") is None),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in records),
        "failed_kinds": _failed_kinds(records),  # failed problems by error kind (the exit code's message)
        "retryable": sum(1 for r in records if r.get("status") != "ok" and r.get("retryable")),
    }
    if ok and "num_phases" in ok[0]:
        out["mean_phases"] = round(sum(r["num_phases"] for r in ok) / len(ok), 3)
        out["mean_prompts"] = round(sum(r["num_prompts"] for r in ok) / len(ok), 3)
        out["forced_final"] = sum(1 for r in ok if r.get("forced_final"))
        out["context_full"] = sum(1 for r in ok if r.get("context_full"))
    return out


def _failed_kinds(records: list[dict]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        if r.get("status") != "ok":
            kind = r.get("error_kind") or r.get("status") or "error"
            out[kind] = out.get(kind, 0) + 1
    return out


def print_summary(summary: dict[str, Any], out_dir: str) -> None:
    acc_text = accuracy_text(summary["correct"], summary["answered"], summary["problems"])
    print(f"{summary['problems']} problems ({summary['errors']} errors), accuracy {acc_text}; results in {out_dir}")


# ---------------------------------------------------------------------------------------------
# A run: setup, the problem pool, finish


@dataclass
class InferenceRun:
    """What both stages set up before the first call: problems, prompt format, run folder."""

    task: TaskAdapter
    problems: list[Problem]
    agent_prompt: str
    tokenizer: str  # the chat template's source (used only when `fmt.template` is set)
    fmt: PromptFormat
    run_dir: RunDir

    @classmethod
    def open(cls, cfg: InferenceOptions, stage: str, model: str, *, think: bool = True, overwrite: bool = False,
             retry_failed: bool = True) -> InferenceRun:
        task = get_task(cfg.task, seed=cfg.seed or 0)
        problems = load_problems(task, cfg.data, cfg.split, cfg.subset, cfg.range, flag=flag_name(type(cfg), "data"))
        agent_prompt = load_agent_prompt(cfg.agent_prompt)
        tokenizer = cfg.tokenizer or cfg.model_path or model
        fmt = build_prompt_format(cfg.prompt_mode, cfg.api, tokenizer, agent_prompt, think=think)
        run_dir = RunDir(Path(cfg.out_dir), stage, cfg.identity(), overwrite=overwrite, retry_failed=retry_failed)
        # what the manifest written with the first record carries
        run_dir.manifest_fields = {"inputs": inputs_of(cfg, task, problems), "prompts": {"agent": agent_prompt}}
        return cls(task, problems, agent_prompt, tokenizer, fmt, run_dir)

    def pending(self) -> bool:
        return any(not self.run_dir.is_done(p.id) for p in self.problems)

    async def solve_all(
        self,
        solve: Callable[[Problem], Awaitable[dict[str, Any]]],
        workers: int,
        progress: bool,
        text_of: Callable[[dict], str],
        crash_text: Callable[[Problem], dict[str, Any]],
        timed: int = 0,
    ) -> None:
        """Solve the problems not yet in the folder with `sprint.core.items.run_items`, writing each
        record's text to trajectories/<id>.txt; a crash becomes a record with `crash_text`'s fields.
        The first `timed` problems go one at a time, before the rest: a latency sample on a fixed subset
        while the others, which only need answers, share the server."""
        folder = self.run_dir.path / "trajectories"
        started: dict[str, float] = {}

        def keep_text(record: dict[str, Any]) -> dict[str, Any]:
            folder.mkdir(parents=True, exist_ok=True)  # with the first record: a refused run leaves nothing
            atomic_write(folder / f"{safe_id(record['id'])}.txt", text_of(record) + "\n")
            return record

        async def process(problem: Problem) -> dict[str, Any]:
            started[problem.id] = time.time()
            if not problem.question.strip():  # never sent: an empty prompt costs a call and answers nothing
                return keep_text(no_question(problem, self.task, crash_text(problem)))
            return keep_text(await solve(problem))

        def on_crash(problem: Problem, exc: BaseException) -> dict[str, Any]:
            record = crashed(problem, self.task, exc, crash_text(problem))
            return keep_text({**record, "start": started.get(problem.id, time.time()), "end": time.time()})

        parts = [(self.problems[:timed], 1, " (timed, one at a time)"), (self.problems[timed:], workers, "")]
        for problems, in_flight, what in parts:
            if problems:
                await run_items(problems, process, self.run_dir, workers=in_flight, on_crash=on_crash,
                                desc=self.run_dir.stage + what, unit="problem", progress=progress,
                                tally=AccuracyTally(), input_hash=lambda p: row_hash([p.question, p.gold]))

    def execute(self, cfg: InferenceOptions, targets: list[tuple[str, str, str | None]],
                main: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Run `main()` (returns usage) with the folder locked and local servers up, then `finish`.

        The manifest is finished even when a server stopped answering, so it counts what was done.
        """
        # the folder's lock is released however the run ends
        with self.run_dir, local_servers(targets, cfg.replicas, cfg.router_policy, cfg.vllm_args):
            # behind a router the records cannot name the replica: count per worker before and after
            watch = RouterWatch.start([u for urls, _, _ in targets for u in split_urls(urls)])
            try:
                usage = asyncio.run(main())
            except ServerStopped:
                self.finish(cfg, {}, watch.delta())
                raise
            return self.finish(cfg, usage, watch.delta())

    def finish(self, cfg: InferenceOptions, usage: dict[str, Any],
               routers: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the manifest (inputs, prompt, usage, summary) and return the summary."""
        done = self.run_dir.done
        records = [done[p.id] for p in self.problems if p.id in done]
        summary = summarize_run(records)
        self.run_dir.write_manifest(
            inputs=inputs_of(cfg, self.task, self.problems),
            prompts={"agent": self.agent_prompt},
            usage=usage,
            extra={"summary": summary, "model_path": cfg.model_path,
                   "tokenizer_used": self.tokenizer if self.fmt.template else None,
                   "prefix_cache": prefix_cache_stats(records), **({"routers": routers} if routers else {})},
        )
        return summary


def inputs_of(cfg: InferenceOptions, task: TaskAdapter, problems: list[Problem]) -> dict[str, Any]:
    """The manifest's `inputs`: which rows of which data were asked."""
    return {"data": cfg.data, "split": cfg.split or task.default_split, "subset": cfg.subset, "range": cfg.range,
            "items": len(problems), "fingerprint": problems_fingerprint(problems)}


def problems_fingerprint(problems: list[Problem]) -> str:
    """A short hash of exactly what was asked and graded, for the manifest."""
    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p.id, p.question, p.gold], sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


@contextlib.contextmanager
def local_servers(targets: list[tuple[str, str, str | None]], replicas: int = 1,
                  policy: str = DEFAULT_POLICY, vllm_args: str = "") -> Iterator[None]:
    """Start vLLM for local URLs where nothing answers and a model path is known (`replicas` > 1:
    that many behind vllm-router on the URL's port), with `vllm_args`; stop them after."""
    with contextlib.ExitStack() as stack:
        seen: set[tuple[str, str]] = set()
        for urls, model, model_path in targets:
            for url in split_urls(urls):
                if (url, model) in seen or not model_path or not is_local(url):
                    continue
                seen.add((url, model))
                if replicas > 1 and list_models(url) is None:
                    stack.enter_context(ensure_replicas(url, model, model_path, replicas, policy,
                                                        vllm_args=vllm_args))
                else:
                    stack.enter_context(ensure_server(url, model, model_path, vllm_args=vllm_args))
        yield
