"""Build examples/demo/llm_cache: the response cache that answers stages 1-2 of the demo offline.

No capable model runs on the CI machine, so the demo's component separation (stage 1) and DAG
creation (stage 2) are answered from this cache. Its answers are in examples/demo/answers.jsonl,
hand-written in the format a capable model returns. For every trace this script computes the
exact request each stage sends (the stage's own prompt builder, the packaged template, the
stage's default sampling, `sprint.llm.client.cache_key`) and stores the answer under that key in the LLM
client's own cache format. Stage 2's request is built from the components parsed out of the
stage-1 answer, exactly as stage 1 records them.

Editing a prompt template (prompts/), the line splitter or a stage default changes the
requests, so the cache must then be rebuilt (tests/test_demo_data.py fails until it is):

    python scripts/build_demo_cache.py            # rewrite examples/demo/llm_cache
    python scripts/build_demo_cache.py --check    # exit 1 when the shipped cache is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.curation import components as stage1
from sprint.curation import dag as stage2
from sprint.core.data import Item, load_items
from sprint.core.errors import UserError
from sprint.llm.client import Completion, LLMClient, LLMConfig, Sampling, cache_key
from sprint.curation.stage_config import DEFAULT_MODEL
from sprint.curation.templates import load_prompt

DEMO_DIR = Path(__file__).resolve().parents[1] / "examples" / "demo"
KIND = "chat"  # both stages call client.chat
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.json")


@dataclass
class Entry:
    """One cache entry to write: what was asked (for the key) and what the model answered."""

    item_id: str
    stage: str
    messages: list[dict[str, str]]
    sampling: Sampling
    answer: str


def stage_sampling(config_cls: Any) -> Sampling:
    """The sampling a stage uses when run with its defaults (read from its config dataclass, not copied)."""
    defaults = {f.name: f.default for f in dataclasses.fields(config_cls)}
    return Sampling(max_tokens=defaults["max_tokens"], temperature=defaults["temperature"])


def user_messages(content: str) -> list[dict[str, str]]:
    """Both stages send one user message (see `separate_one` / `create_one`)."""
    return [{"role": "user", "content": content}]


def stage1_request(item: Item, template: str) -> tuple[list[dict[str, str]], list[tuple[int, int]]]:
    """The messages stage 1 sends for a trace, and the trace's line spans."""
    thought = item.thought or ""
    spans = stage1.line_spans(thought)
    lines = stage1.split_lines(thought)
    return user_messages(stage1.components_prompt(template, item.question, lines)), spans


def stage1_components(item: Item, answer: str, spans: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """The components stage 1 would record for this answer; raises UserError if it would not accept it."""
    try:
        parsed = stage1.parse_components(answer)
    except stage1.AnswerError as exc:
        raise UserError(f"{item.id}: the stage-1 answer cannot be parsed ({exc}); fix examples/demo/answers.jsonl") from None
    errors = stage1.validate_components(parsed, len(spans), strict=True)  # hand-written: no slips at all
    uncovered = stage1.uncovered_lines(parsed, len(spans))
    if uncovered:
        errors.append(f"lines {uncovered} are not covered")
    if errors:
        raise UserError(f"{item.id}: the stage-1 answer is invalid ({'; '.join(errors)}); fix examples/demo/answers.jsonl")
    return [stage1.component_record(c, item.thought or "", spans) for c in parsed]


def check_dag_answer(item: Item, answer: str, n: int) -> None:
    try:
        dag = stage2.parse_dag_answer(answer)
    except stage2.DagError as exc:
        raise UserError(f"{item.id}: the stage-2 answer cannot be parsed ({exc}); fix examples/demo/answers.jsonl") from None
    _, errors = stage2.validate_dag(dag, n)
    if errors:
        raise UserError(f"{item.id}: the stage-2 answer is invalid ({'; '.join(errors)}); fix examples/demo/answers.jsonl")


def load_answers(path: Path) -> dict[str, dict[str, str]]:
    answers: dict[str, dict[str, str]] = {}
    for lineno, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not raw.strip():
            continue
        row = json.loads(raw)
        missing = {"id", "components_answer", "dag_answer"} - row.keys()
        if missing:
            raise UserError(f"{path}: line {lineno} lacks {sorted(missing)}; every row needs id, components_answer, dag_answer")
        answers[str(row["id"])] = row
    return answers


def demo_entries(traces: Path, answers_path: Path) -> list[Entry]:
    """Every request stages 1-2 send for the demo traces, paired with its hand-written answer."""
    answers = load_answers(answers_path)
    items = load_items(str(traces), require=("question", "thought"))
    extra = sorted(set(answers) - {it.id for it in items})
    if extra:
        raise UserError(f"{answers_path}: answers for unknown trace ids {extra}")
    template1 = load_prompt(stage1.PROMPT_NAME)
    template2 = load_prompt(stage2.PROMPT_NAME)
    sampling1 = stage_sampling(stage1.ComponentsConfig)
    sampling2 = stage_sampling(stage2.DagConfig)
    entries = []
    for item in items:
        if item.id not in answers:
            raise UserError(f"{answers_path}: no answers for trace {item.id!r}; add a row for it")
        row = answers[item.id]
        messages, spans = stage1_request(item, template1)
        entries.append(Entry(item.id, "components", messages, sampling1, row["components_answer"]))
        components = stage1_components(item, row["components_answer"], spans)
        if len(components) < 2:  # stage 2 does not call the model for a single component
            continue
        check_dag_answer(item, row["dag_answer"], len(components))
        messages = user_messages(stage2.dag_prompt(template2, item.question, components))
        entries.append(Entry(item.id, "dag", messages, sampling2, row["dag_answer"]))
    return entries


def write_cache(entries: list[Entry], cache_dir: Path, model: str) -> set[Path]:
    """Write the entries with the LLM client's own cache writer; returns the files it wrote."""
    client = LLMClient(LLMConfig(base_url="http://unused.invalid/v1", model=model, cache_dir=cache_dir))
    written = set()
    for e in entries:
        key = cache_key(KIND, model, e.messages, e.sampling)
        done = Completion(
            text=e.answer,
            finish_reason="stop",
            stop_reason=None,
            prompt_tokens=0,  # no API produced these answers, so there are no token counts to report
            completion_tokens=0,
            cached=False,
            start=0.0,
            end=0.0,
            attempts=1,
        )
        client._cache_put(key, KIND, done)  # the client's writer, so the format is the client's
        path = client._cache_path(key)
        assert path is not None
        written.add(path)
    return written


def cache_files(cache_dir: Path) -> set[Path]:
    """The cache entries in a folder (`ab/<sha256>.json`), nothing else."""
    if not cache_dir.is_dir():
        return set()
    return {p for p in cache_dir.glob("*/*.json") if _ENTRY_NAME.fullmatch(p.name) and p.parent.name == p.name[:2]}


def build(cache_dir: Path, traces: Path, answers: Path, model: str = DEFAULT_MODEL) -> tuple[int, int]:
    """Rewrite the cache folder to hold exactly the demo's entries; returns (written, removed)."""
    entries = demo_entries(traces, answers)
    written = write_cache(entries, cache_dir, model)
    stale = cache_files(cache_dir) - written
    for path in stale:
        path.unlink()
    for folder in {p.parent for p in stale}:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return len(written), len(stale)


def compare(built: Path, shipped: Path) -> list[str]:
    """How the shipped cache differs from a fresh build (empty when it is up to date)."""
    a = {p.relative_to(built): p for p in cache_files(built)}
    b = {p.relative_to(shipped): p for p in cache_files(shipped)}
    problems = [f"missing {rel}" for rel in sorted(a.keys() - b.keys())]
    problems += [f"stale {rel}" for rel in sorted(b.keys() - a.keys())]
    problems += [f"differs {rel}" for rel in sorted(a.keys() & b.keys()) if a[rel].read_bytes() != b[rel].read_bytes()]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=DEMO_DIR / "traces.jsonl")
    parser.add_argument("--answers", type=Path, default=DEMO_DIR / "answers.jsonl")
    parser.add_argument("--cache-dir", type=Path, default=DEMO_DIR / "llm_cache")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"model name in the cache keys (default: {DEFAULT_MODEL})")
    parser.add_argument("--check", action="store_true", help="do not write: exit 1 when --cache-dir is not up to date")
    args = parser.parse_args(argv)
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                build(Path(tmp), args.traces, args.answers, args.model)
                problems = compare(Path(tmp), args.cache_dir)
            if problems:
                print(f"{args.cache_dir} is out of date ({len(problems)} entries); run python scripts/build_demo_cache.py")
                for line in problems:
                    print(f"  {line}")
                return 1
            print(f"{args.cache_dir} is up to date")
            return 0
        written, removed = build(args.cache_dir, args.traces, args.answers, args.model)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {written} cache entries for model {args.model!r} to {args.cache_dir} ({removed} stale removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
