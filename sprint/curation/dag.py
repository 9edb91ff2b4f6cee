"""Stage 2, DAG creation: which components must finish before each one can start.

The components of a stage-1 record are shown to an LLM, which answers with a parent dictionary
`{node: [parents]}`. The answer is read with `ast.literal_eval` on the extracted dict literal only
(it accepts literals, never runs code) and checked: every node known, every parent smaller than
its child (so there can be no cycle). Component 1 may be left out (it can have no parents); any
other missing component is an error, because a forgotten dependency would wrongly make that
component run in parallel with the work it needs.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sprint.core.data import Item, check_stage_input
from sprint.core.errors import UserError
from sprint.llm.client import LLMClient, Sampling
from sprint.core.options import option
from sprint.curation.ask import ask_checked, usage_of
from sprint.curation.stage import LLMStage, StageOutcome
from sprint.curation.stage_config import LLMStageConfig
from sprint.curation.templates import fill

PROMPT_NAME = "dag_creation"
REQUIRED_PLACEHOLDERS = ("question", "components")  # {num_components} is optional
MAX_LITERAL_CHARS = 100_000  # literal_eval of a huge or deeply nested string is slow; no real DAG is that long

Dag = dict[int, list[int]]


class DagError(ValueError):
    """The model's answer is not a usable parent dictionary."""


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------


def render_components(components: list[dict[str, Any]]) -> str:
    """Components as the DAG prompt shows them, one tagged block each (comments left out)."""
    blocks = []
    for c in components:
        n = c["number"]
        execution = (c.get("execution_text") or "").strip() or "not found"
        prompt = (c.get("prompt") or "").strip() or "not found"
        blocks.append(
            f"<Component_{n}>\n"
            f"<description> {(c.get('description') or '').strip()} </description>\n"
            f"<plan> {(c.get('plan_text') or '').strip()} </plan>\n"
            f"<prompt> {prompt} </prompt>\n"
            f"<execution> {execution} </execution>\n"
            f"</Component_{n}>"
        )
    return "\n\n".join(blocks)


def dag_prompt(template: str, question: str, components: list[dict[str, Any]]) -> str:
    return fill(
        template,
        question=question.strip(),
        components=render_components(components),
        num_components=str(len(components)),
    )


# ----------------------------------------------------------------------------------------------
# Parsing
# ----------------------------------------------------------------------------------------------


def _balanced(text: str, start: int, open_ch: str, close_ch: str) -> str | None:
    """The bracketed text starting at `start`, or None when it never closes."""
    depth = 0
    for i in range(start, len(text)):
        ch = text[i]
        if ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def _literal(candidate: str) -> Any:
    """A Python or JSON literal, or None. `ast.literal_eval` evaluates literals only, never code."""
    if len(candidate) > MAX_LITERAL_CHARS:
        return None
    try:
        return ast.literal_eval(candidate)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    try:
        return json.loads(candidate)
    except (json.JSONDecodeError, RecursionError):
        return None


def extract_dict(text: str) -> dict:
    """The last dict literal in the answer (models explain first, then answer), fences and prose allowed."""
    if not text or not text.strip():
        raise DagError("the answer is empty")
    body = text.replace("```python", "```").replace("```json", "```").replace("```", "\n")
    found: dict | None = None
    for m in re.finditer(r"\{", body):
        candidate = _balanced(body, m.start(), "{", "}")
        if candidate is None:
            continue
        value = _literal(candidate)
        if isinstance(value, dict) and value:
            found = value  # keep scanning: a later dict is the answer, an earlier one may be an example
    if found is not None:
        return found
    for m in re.finditer(r"\[", body):
        candidate = _balanced(body, m.start(), "[", "]")
        value = _literal(candidate) if candidate else None
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            raise DagError("the answer is a list of lists, not a dictionary {component: [parents]}")
    if re.search(r"\{\s*\}", body):
        raise DagError("the answer is an empty dictionary")
    raise DagError("no dictionary {component: [parents]} found in the answer")


def _as_number(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise DagError(f"{what} {value!r} is not a component number")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(?:component[\s_]*)?(\d+)\s*", value, re.I)
        if m:
            return int(m.group(1))
    raise DagError(f"{what} {value!r} is not a component number")


def parse_dag_answer(text: str) -> Dag:
    """Read the parent dictionary (keys and parents as ints, duplicates dropped); no validation."""
    raw = extract_dict(text)
    dag: Dag = {}
    for key, parents in raw.items():
        node = _as_number(key, "key")
        if isinstance(parents, (int, str)) and not isinstance(parents, bool):
            raise DagError(f"the parents of {node} are {parents!r}, not a list")
        if not isinstance(parents, (list, tuple)):
            raise DagError(f"the parents of {node} are a {type(parents).__name__}, not a list")
        numbers = sorted({_as_number(p, f"parent of {node}") for p in parents})
        if node in dag:
            raise DagError(f"component {node} appears twice as a key")
        dag[node] = numbers
    return dag


def validate_dag(dag: Dag, num_components: int) -> tuple[Dag, list[str]]:
    """(the DAG with node 1 filled in when missing and keys in order, the errors found)."""
    errors: list[str] = []
    known = range(1, num_components + 1)
    unknown = sorted(n for n in dag if n not in known)
    if unknown:
        errors.append(f"unknown component(s) {', '.join(map(str, unknown))} (there are {num_components})")
    missing = [n for n in known if n not in dag and n != 1]
    if missing:
        errors.append(f"component(s) {', '.join(map(str, missing))} missing from the DAG")
    for node in sorted(dag):
        for parent in dag[node]:
            if parent not in known:
                errors.append(f"component {node} has unknown parent {parent}")
            elif parent >= node:
                errors.append(f"component {node} has parent {parent}, which is not an earlier component")
    full = {n: list(dag.get(n, [])) for n in known}
    return full, errors


def dag_to_json(dag: Dag) -> dict[str, list[int]]:
    """String keys for JSON: {"1": [], "2": [1]}."""
    return {str(node): list(parents) for node, parents in sorted(dag.items())}


def dag_from_json(obj: dict[str, Any]) -> Dag:
    """The inverse of `dag_to_json` (datasets may fill absent keys of a struct with None)."""
    return {int(k): [int(p) for p in v] for k, v in obj.items() if v is not None}


# ----------------------------------------------------------------------------------------------
# The stage
# ----------------------------------------------------------------------------------------------


def empty_dag_record(item: Item) -> dict[str, Any]:
    """The stage-1 record carried over, with stage 2's keys always present (one schema per file)."""
    record = {k: v for k, v in item.row.items() if k not in ("status", "error", "retryable")}
    record.update(
        {
            "id": item.id,
            "dag": None,
            "status": "ok",
            "error": None,
            "retryable": False,
            "dag_answer": None,
            "dag_usage": usage_of(None),
        }
    )
    return record


async def create_one(item: Item, client: LLMClient, template: str, sampling: Sampling) -> dict[str, Any]:
    """One stage-1 record -> one record with its DAG; every failure becomes a status."""
    record = empty_dag_record(item)
    components = item.row.get("components") or []
    if not item.question.strip():
        return {**record, "status": "no_question", "error": "the record has no question (problem) text"}
    if not components:
        return {**record, "status": "no_components", "error": "the record has no components"}
    if not isinstance(components, list) or not all(isinstance(c, dict) and "number" in c for c in components):
        return {
            **record,
            "status": "invalid_components",
            "error": "the record's components are not a list of component objects (as `components` writes them)",
        }
    if len(components) == 1:  # nothing to ask: a single component has no possible parent
        return {**record, "dag": dag_to_json({1: []})}
    content = dag_prompt(template, item.question, components)
    checked = await ask_checked(client, content, sampling, record, "dag",
                                lambda answer: validate_dag(parse_dag_answer(answer), len(components)), DagError,
                                lambda found: found[1])
    if checked is None:
        return record
    record["dag"] = dag_to_json(checked[0])  # node 1 filled in when the answer left it out
    return record


@dataclass
class DagConfig(LLMStageConfig):
    """`sprint dag` settings: the shared LLM-stage ones (a parent dictionary is a short answer)."""

    input: str = option(help="stage 1's output folder (or a .jsonl of its records)", flags=("--input", "-i"), var="DATA")
    max_tokens: int = option(2048, "answer length limit (a parent dictionary is short)", var="MAX_TOKENS")


def _needs_llm(item: Item) -> bool:
    # a single component is answered without a call; a record without a question is refused without one
    return len(item.row.get("components") or []) > 1 and bool(item.question.strip())


def _prompt_text(item: Item, template: str) -> str:
    components = item.row.get("components")
    ok = isinstance(components, list) and all(isinstance(c, dict) and "number" in c for c in components)
    return dag_prompt(template, item.question, components) if ok else ""


def _check_components(source: str, items: list[Item]) -> None:
    check_stage_input(source, "components", "dag", "components", "--input (DATA)")
    if not any(isinstance(it.row.get("components"), list) for it in items):
        raise UserError(f"input {source!r} has no components; pass the output folder of `sprint components`")


DAG_STAGE = LLMStage(
    name="dag",
    description=(
        "Stage 2 (DAG creation). Reads the ok records of a `components` output folder, shows each "
        "record's components to an LLM and reads back a parent dictionary {component: [parents]}. "
        "Every parent must be an earlier component. Re-running the same command resumes. The API "
        "key is read from OPENAI_API_KEY."
    ),
    config_cls=DagConfig,
    prompt_name=PROMPT_NAME,
    placeholders=REQUIRED_PLACEHOLDERS,
    require=("question",),
    check_items=_check_components,
    needs_llm=_needs_llm,
    prompt_text=_prompt_text,
    process=create_one,
    base_record=empty_dag_record,
)


def create_dag(input: str, out_dir: str | Path, **settings: Any) -> StageOutcome:
    """Stage 2: a parent dictionary for each ok record of stage 1's folder `input`.

    Resumable like stage 1. Keyword arguments are the fields of `DagConfig`.
    """
    return DAG_STAGE.run(input, out_dir, **settings)


def register(parser: argparse.ArgumentParser) -> None:
    DAG_STAGE.register(parser)


def handle(args: argparse.Namespace) -> int:
    return DAG_STAGE.handle(args)
