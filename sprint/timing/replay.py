"""Replay recordings: which recorded text answers a request.

The replay server (`sprint.timing.replay_server`) lets the orchestrator (or any client) run against
*recorded* SPRINT trajectories with the timing of a real GPU server. This module is its
knowledge of the recordings, free of HTTP and timing:

- `load_library` reads trajectory .txt files, run folders and jsonl files into a `ReplayLibrary`
  keyed by the normalised question;
- `read_request` / `resolve` identify a request from the prompt itself: the `<Question>` block,
  then the last tag of the format before the point where generation starts. A planner request
  for phase p gets the recorded plan of phase p (or the recorded final answer once the phases
  run out), an executor request for prompt p.k the recorded `<execution_p.k>`, a baseline
  request (to the baseline model name) the recorded sequential output. What `resolve` returns
  is the whole continuation; `sprint.timing.wire.generate` cuts it at the request's stop strings.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sprint.core.calls import BASELINE, EXECUTOR, FINAL, PLANNER
from sprint.core.errors import UserError
from sprint.format import tags
from sprint.format.trajectory import Trajectory, TrajectoryError, parse, render_question


def question_key(question: str) -> str:
    """Questions are matched with whitespace collapsed: chat templates and stripping vary."""
    return " ".join(question.split())


# ---------------------------------------------------------------------------------------------
# The recorded trajectories.


@dataclass
class ReplayLibrary:
    """Recorded answers by normalised question: SPRINT trajectories and sequential outputs."""

    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    baselines: dict[str, str] = field(default_factory=dict)  # the output after the question
    names: dict[str, str] = field(default_factory=dict)  # question key -> file / record id
    baseline_names: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # inputs that held nothing usable, with why
    duplicates: int = 0

    def add_text(self, text: str, name: str, question: str | None = None) -> None:
        """Add one recorded text: a trajectory if it has phases or an answer, else a baseline."""
        try:
            traj = parse(text, strict=True)
        except TrajectoryError:
            traj = parse(text, strict=False)
        if not traj.question and question:
            traj.question = question.strip()
            text = render_question(question) + "\n\n" + text
        if not traj.question:
            self.skipped.append(f"{name}: no <Question> block")
            return
        key = question_key(traj.question)
        if traj.phases or traj.final_answer is not None:
            target: dict = self.trajectories
            names, value = self.names, traj
        else:
            output = text.partition(tags.QUESTION_END)[2].strip()
            if not output:
                self.skipped.append(f"{name}: nothing after the question")
                return
            target, names, value = self.baselines, self.baseline_names, output
        if key in target:
            self.duplicates += 1
            return
        target[key] = value
        names[key] = name

    def describe(self) -> str:
        extra = f", {len(self.baselines)} baseline outputs" if self.baselines else ""
        dup = f", {self.duplicates} duplicates ignored" if self.duplicates else ""
        return f"{len(self.trajectories)} trajectories{extra}{dup}"


def _add_records(library: ReplayLibrary, path: Path) -> None:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                library.skipped.append(f"{path}:{n}: not JSON")
                continue
            text = row.get("trajectory") if isinstance(row, dict) else None
            if not isinstance(text, str) or not text.strip():
                continue  # failed items carry no trajectory
            question = row.get("question") or row.get("problem")
            library.add_text(
                text, f"{path.parent.name}/{row.get('id', n)}", question if isinstance(question, str) else None
            )


def load_library(sources: Sequence[str | Path]) -> ReplayLibrary:
    """Read trajectory .txt files, folders of them (any names, searched recursively), run
    folders (`records.jsonl` rows with a `trajectory` field, `trajectories/*.txt`) and jsonl files."""
    library = ReplayLibrary()
    for source in sources:
        path = Path(source)
        if not path.exists():
            raise UserError(
                f"replay source {path} does not exist; pass folders of trajectory .txt files or run folders"
            )
        if path.is_file():
            files = [path]
        else:
            files = sorted(
                p for p in path.rglob("*") if p.is_file() and (p.suffix == ".txt" or p.name.endswith(".jsonl"))
            )
        for file in files:
            if file.name.endswith(".jsonl"):
                _add_records(library, file)
            elif file.suffix == ".txt":
                library.add_text(file.read_text(encoding="utf-8", errors="replace"), file.stem)
            else:
                raise UserError(f"{file} is neither a .txt trajectory nor a .jsonl run file")
    if not library.trajectories and not library.baselines:
        where = ", ".join(str(s) for s in sources)
        raise UserError(
            f"no recorded trajectories found in {where}; expected .txt files holding <Question>…</Question> "
            "and <Plan_1>… blocks, or run folders with records.jsonl rows that have a `trajectory`"
        )
    return library


# ---------------------------------------------------------------------------------------------
# Reading a request: which question, which role, which phase and prompt.


class ReplayRequestError(Exception):
    """The request cannot be answered from the recordings; `status` is the HTTP code to send."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class RequestView:
    """What a prompt asks for, read with the trajectory model.

    role and prompt as a call record names them: "planner" (phase `phase`; prompt FINAL for a forced
    final answer) or "executor" (prompt `prompt` = "p.k").
    opened: the prompt already ends with the opening tag of what it asks for (`<Plan_p>`,
    `<execution_p.k>`, `<Final_answer>`); otherwise the model is to write it.
    """

    question: str
    role: str
    phase: int | None
    prompt: str | None
    opened: bool
    newline: bool  # the opening tag is followed by its newline already
    separator: str  # what the model writes before its own `<Plan_p>` (the format's blank line)
    past: Trajectory  # the phases written in the prompt


def read_request(text: str) -> RequestView:
    """Classify a planner / executor / final-answer prompt (raw or chat-templated).

    The question comes from the `<Question>` block; the role from the last tag of the format:
    `<Plan_p>` (planner, phase p), `</Execution_n>` / `<think>` / `</Question>` (planner of the
    next phase, writing its own `<Plan_p>`), `<execution_p.k>` (executor), `<Final_answer>`.
    """
    past = parse(text, strict=False)
    if not past.question:
        raise ReplayRequestError(
            400, "the prompt has no <Question>…</Question> block; replay identifies problems by their question"
        )
    last = tags.last_tag(text)
    assert last is not None  # there is one at least: the question's closing tag
    tail = text[last.end :]
    newline = tail.startswith("\n")
    view = RequestView(past.question, PLANNER, None, None, False, newline, "", past)
    if last.is_boundary:
        # The model starts a phase and writes `<Plan_p>` itself, after the newlines the format puts
        # there (one after <think>, a blank line after a block) less those the prompt already has.
        # Chat templates may put their own markers after the boundary: then nothing is added.
        view.phase = (last.phase or 0) + 1  # </Execution_n>: phase n + 1; </Question>, <think>: phase 1
        required = "\n" if last.is_think else "\n\n"
        view.separator = required[len(tail) :] if not tail.strip() and required.startswith(tail) else ""
        return view
    if tail.strip():
        raise ReplayRequestError(
            400,
            f"the prompt ends inside a block ({len(tail.strip())} characters after {last.text}); "
            "replay answers prompts that end at a phase boundary, <Plan_p>, <execution_p.k> or <Final_answer>",
        )
    if last.opens_plan:
        view.phase, view.opened = last.phase, True
    elif last.opens_execution:
        view.role, view.phase, view.prompt, view.opened = EXECUTOR, last.phase, last.prompt, True
    elif last.opens_final:
        view.prompt, view.opened = FINAL, True
    else:
        raise ReplayRequestError(
            400,
            f"cannot tell what the prompt asks for: it ends with {last.text}; a planner prompt ends after "
            "</Execution_n> or with <Plan_p>, an executor prompt with <execution_p.k>, a forced answer with <Final_answer>",
        )
    return view


@dataclass
class Resolved:
    """A request matched to a recording: the text a model would go on to write from there.

    role, phase and prompt name the call as a call record does (`sprint.core.calls`); the recording's
    final answer is the planner's FINAL call.
    """

    role: str  # planner | executor | baseline
    name: str  # recording name (file stem or record id)
    phase: int | None
    prompt: str | None  # p.k for an executor, FINAL for the final answer
    continuation: str


def _short(question: str) -> str:
    q = question_key(question)
    return q if len(q) <= 80 else q[:77] + "..."


def resolve(library: ReplayLibrary, text: str, baseline: bool = False) -> Resolved:
    """Match a prompt to its recording; ReplayRequestError (404/400) when it cannot be."""
    if baseline:
        question = parse(text, strict=False).question
        if not question:
            raise ReplayRequestError(
                400, "the prompt has no <Question>…</Question> block; replay identifies problems by their question"
            )
        key = question_key(question)
        output = library.baselines.get(key)
        if output is None:
            raise ReplayRequestError(
                404, f"no recorded baseline output for the question {_short(question)!r} ({library.describe()} loaded)"
            )
        if text.rstrip().endswith(tags.THINK) and output.startswith(tags.THINK):
            output = output[len(tags.THINK) :].lstrip("\n")  # the template already opened it
        return Resolved(BASELINE, library.baseline_names.get(key, ""), None, None, output)

    view = read_request(text)
    key = question_key(view.question)
    traj = library.trajectories.get(key)
    if traj is None:
        raise ReplayRequestError(
            404,
            f"no recorded trajectory for the question {_short(view.question)!r} ({library.describe()} loaded); "
            "serve the folder that holds its trajectory",
        )
    name = library.names.get(key, "")
    body = traj.render_body()
    phases = {ph.number: ph for ph in traj.phases}

    prompt, marker = view.prompt, ""
    if view.role == EXECUTOR:
        phase = phases.get(view.phase or 0)
        if phase is None:
            raise ReplayRequestError(
                404,
                f"recording {name!r} has no phase {view.phase} (it has {len(traj.phases)}); cannot execute prompt_{view.prompt}",
            )
        if phase.execution(view.prompt or "") is None:
            known = ", ".join(e.name for e in phase.executions) or "none"
            raise ReplayRequestError(
                404, f"recording {name!r} has no execution_{view.prompt} (phase {view.phase} has: {known})"
            )
        marker = tags.execution_open(view.prompt or "")
    elif view.prompt != FINAL and view.phase in phases:
        marker = tags.plan_open(view.phase or 0)
    else:  # a forced answer, or a planner past the recorded phases: the recorded final answer
        if traj.final_answer is None:
            if view.prompt == FINAL:
                raise ReplayRequestError(404, f"recording {name!r} has no final answer")
            raise ReplayRequestError(
                404,
                f"recording {name!r} has {len(traj.phases)} phases and no final answer; nothing to plan for phase {view.phase}",
            )
        prompt, marker = FINAL, tags.FINAL
    at = body.find(marker)
    if at < 0:  # render_body always writes the marker of an existing block
        raise ReplayRequestError(500, f"recording {name!r} renders without {marker}")
    # a request that opened its own block gets the rest of it (a planner only the plan it opened)
    own_block = view.role == EXECUTOR or view.prompt == FINAL or marker == tags.plan_open(view.phase or 0)
    opened_here = view.opened and own_block
    if opened_here:
        start = at + len(marker)
        if view.newline and body.startswith("\n", start):
            start += 1
        continuation = body[start:]
    else:
        continuation = ("" if view.opened else view.separator) + body[at:]
    return Resolved(view.role, name, view.phase, prompt, continuation)


def prompt_text(request: dict, endpoint: str) -> str:
    """The text to identify and count: the prompt, or the chat messages' contents in order."""
    if endpoint == "completions":
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ReplayRequestError(400, "`prompt` must be one string (token ids and batches are not replayed)")
        return prompt
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ReplayRequestError(400, "`messages` must be a non-empty list")
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        parts.append(content if isinstance(content, str) else "")
    return "\n\n".join(parts)
