"""The stand-in teacher (`sprint teacher-server`): stages 1-2 run for real over HTTP against it, then `pack`.

Three hand-made Countdown traces with their answers (components + DAG) go through `sprint components`,
`sprint dag` and `sprint pack`; the records and trajectories must be exactly what the answers imply.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sprint.cli import main as cli_main
from sprint.core.errors import UserError
from sprint.curation.trace_lines import split_lines
from sprint.format.tokencount import load_counter
from sprint.mini.teacher import DEFAULT_MODEL, STAND_IN, find_answer, load_answers, teacher_server
from sprint.mini.tokenizer import MiniTokenizerConfig, make_tokenizer
from sprint.timing.replay import ReplayRequestError

OPS = (("+", lambda a, b: a + b), ("-", lambda a, b: max(a, b) - min(a, b)), ("*", lambda a, b: a * b))


def pair_lines(x: int, y: int, z: int, target: int) -> tuple[list[str], str | None]:
    """One pair tried: the opening line, one line per operation, then the verdict; and the solution if any."""
    lines = [f"Then {z} is left , and I need {target} ."]
    found = None
    for op, f in OPS:
        m = f(x, y)
        pair = f"{max(x, y)} - {min(x, y)}" if op == "-" else f"{x} {op} {y}"
        lines.append(f"{pair} = {m} , for {target} : " + " ".join(str(g(m, z)) for _, g in OPS) + " .")
        for op2, g in OPS:
            if found is None and g(m, z) == target:
                found = f"{z} - ( {pair} )" if op2 == "-" and z > m else f"( {pair} ) {op2} {z}"
    lines.append(f"Yes , {found} = {target} ." if found else f"None of these is {target} .")
    return lines, found


def countdown_trace(a: int, b: int, c: int, target: int) -> tuple[str, list[str], str]:
    """(question, thought lines, solution): three pairs tried in turn, then the check."""
    lines = [f"Okay , I need to make {target} from {a} {b} {c} ."]
    solution = None
    for x, y, z in ((a, b, c), (a, c, b), (b, c, a)):
        lines.append(f"Try {x} and {y} first .")
        tried, found = pair_lines(x, y, z, target)
        lines += tried
        solution = solution or found
    lines.append(f"Let me check {solution} = {target} , correct .")
    return f"Use {a} {b} {c} to make {target} .", lines, f"The answer is \\boxed{{ {solution} }} ."


def components_for(lines: list[str], *, comments: bool = False) -> list[dict[str, Any]]:
    """Stage 1's answer: each pair a component (plan: its `Try` line, the intro too for the first; execution:
    its opening, operations and verdict, or with `comments` the verdict as a comment), then the check."""
    out = []
    for k in range(3):
        try_line = 2 + 6 * k  # 1-based: line 1 is the intro, each pair takes 6 lines
        plan = f"1-{try_line}" if k == 0 else f"{try_line}-{try_line}"
        end = try_line + 5
        out.append({"description": f"try pair {k + 1}", "plan": plan,
                    "prompt": lines[try_line - 1].replace(" first .", " , then the third number ."),
                    "execution": f"{try_line + 1}-{end - 1 if comments else end}",
                    "comment": f"{end}-{end}" if comments else "not found"})
    out.append({"description": "check", "plan": f"{len(lines)}-{len(lines)}", "prompt": "not found",
                "execution": "not found", "comment": "not found"})
    return out


TRACES = [(2, 3, 7, 13), (4, 5, 6, 26), (3, 8, 2, 22)]
DAGS = [
    {"1": [], "2": [], "3": [], "4": [1]},  # three pairs at once, then the check: 2 phases, kept
    {"1": [], "2": [1], "3": [2], "4": [3]},  # a chain: 4 phases for 3 executions, dropped by the threshold
    {"1": [], "2": [], "3": [], "4": [3]},  # as the first, with the verdicts as comments (dropped by packing)
]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[dict]]:
    """(traces.jsonl with one extra trace the teacher has no answer for, ANSWERS.jsonl, the rows)."""
    root = tmp_path_factory.mktemp("teacher")
    rows, answers = [], []
    for i, (numbers, dag) in enumerate(zip(TRACES, DAGS)):
        question, lines, solution = countdown_trace(*numbers)
        assert split_lines("\n".join(lines)) == lines  # one sentence per line, as the line ranges assume
        rows.append({"id": f"cd-{i}", "question": question, "thought": "\n".join(lines), "solution": solution})
        answers.append({"id": f"cd-{i}", "question": question, "components": components_for(lines, comments=i == 2),
                        "dag": dag})
    question, lines, solution = countdown_trace(1, 2, 3, 9)
    rows.append({"id": "unknown", "question": question, "thought": "\n".join(lines), "solution": solution})
    traces_file, answers_file = root / "traces.jsonl", root / "answers.jsonl"
    traces_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    answers_file.write_text("".join(json.dumps(a) + "\n" for a in answers))
    return traces_file, answers_file, rows


@pytest.fixture(scope="module")
def mini_tokenizer(traces: tuple[Path, Path, list[dict]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(MiniTokenizerConfig(corpus=[str(traces[0])], out=str(out), fields="question,thought,solution"))
    return out


def records(folder: Path) -> dict[str, dict]:
    return {r["id"]: r for r in map(json.loads, (folder / "records.jsonl").read_text().splitlines())}


EXPECTED_FIRST = """<Plan_1>
Okay , I need to make 13 from 2 3 7 .
Try 2 and 3 first .

<prompt_1.1> Try 2 and 3 , then the third number . </prompt_1.1>

Try 2 and 7 first .

<prompt_1.2> Try 2 and 7 , then the third number . </prompt_1.2>

Try 3 and 7 first .

<prompt_1.3> Try 3 and 7 , then the third number . </prompt_1.3>
</Plan_1>

<Execution_1>
<execution_1.1>
Then 7 is left , and I need 13 .
2 + 3 = 5 , for 13 : 12 2 35 .
3 - 2 = 1 , for 13 : 8 6 7 .
2 * 3 = 6 , for 13 : 13 1 42 .
Yes , ( 2 * 3 ) + 7 = 13 .
</execution_1.1>

<execution_1.2>
Then 3 is left , and I need 13 .
2 + 7 = 9 , for 13 : 12 6 27 .
7 - 2 = 5 , for 13 : 8 2 15 .
2 * 7 = 14 , for 13 : 17 11 42 .
None of these is 13 .
</execution_1.2>

<execution_1.3>
Then 2 is left , and I need 13 .
3 + 7 = 10 , for 13 : 12 8 20 .
7 - 3 = 4 , for 13 : 6 2 8 .
3 * 7 = 21 , for 13 : 23 19 42 .
None of these is 13 .
</execution_1.3>
</Execution_1>

<Plan_2>
Based on execution_1.1:
Let me check ( 2 * 3 ) + 7 = 13 , correct .
</Plan_2>

<Execution_2>
No prompt to execute.
</Execution_2>

<Final_answer>
The answer is \\boxed{ ( 2 * 3 ) + 7 } .
</Final_answer>"""


def test_stages_1_2_over_http_then_pack(traces: tuple[Path, Path, list[dict]], mini_tokenizer: Path,
                                        tmp_path: Path) -> None:
    traces_file, answers_file, rows = traces
    with teacher_server(answers_file, tokenizer=str(mini_tokenizer)) as srv:
        flags = ["--model", DEFAULT_MODEL, "--server-url", srv.base_url, "--no-progress", "--max-retries", "0"]
        # the trace without an answer fails alone (HTTP 400 -> llm_bad_request); the run goes on: exit 3
        assert cli_main(["components", "--input", str(traces_file), "--out-dir", str(tmp_path / "c"), *flags]) == 3
        assert cli_main(["dag", "--input", str(tmp_path / "c"), "--out-dir", str(tmp_path / "d"), *flags]) == 0
        assert dict(srv.answered) == {"components": 4 - 1, "dag": 3}
    assert cli_main(["pack", "-i", str(tmp_path / "d"), "-o", str(tmp_path / "p"), "--test-frac", "0"]) == 0

    stage1 = records(tmp_path / "c")
    assert stage1["unknown"]["status"] == "llm_bad_request" and STAND_IN in stage1["unknown"]["error"]
    counter = load_counter(str(mini_tokenizer))
    for i, row in enumerate(rows[:3]):
        rec = stage1[row["id"]]
        assert rec["status"] == "ok" and not rec["warnings"] and rec["uncovered_lines"] == []
        assert rec["components_answer"].startswith("```json\n[")  # GPT-4o's way of writing it
        lines = row["thought"].split("\n")
        got = [(c["plan_text"], c["execution_text"], c["comment_text"]) for c in rec["components"]]
        verdict = lines[6::6][:3]
        assert got[3] == (lines[-1], None, None)
        for k in range(3):
            plan = "\n".join(lines[:2]) if k == 0 else lines[1 + 6 * k]
            execution = lines[2 + 6 * k: 7 + 6 * k - (i == 2)]
            assert got[k] == (plan, "\n".join(execution), verdict[k] if i == 2 else None)
        usage = rec["components_usage"]
        assert usage["completion_tokens"] == counter.count(rec["components_answer"]) > 0
        assert usage["prompt_tokens"] > counter.count(row["thought"])
    stage2 = records(tmp_path / "d")
    assert {rid: r["dag"] for rid, r in stage2.items()} == {f"cd-{i}": DAGS[i] for i in range(3)}
    assert all(r["dag_answer"].startswith("```python\n{1: []") for r in stage2.values())

    packed = records(tmp_path / "p")
    assert packed["cd-1"]["status"] == "dropped" and "parallel" in packed["cd-1"]["reason"]
    first = packed["cd-0"]
    assert (first["status"], first["phases"], first["prompts"]) == ("ok", 2, 3)
    assert first["trajectory"].split("</Question>\n\n", 1)[1] == EXPECTED_FIRST
    third = packed["cd-2"]["trajectory"]  # comments are not rendered (the released data has none)
    assert "Yes ," not in third and "None of these" not in third and "Based on execution_1.3:" in third
    train = [json.loads(line) for line in (tmp_path / "p" / "train.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in train) == ["cd-0", "cd-2"]

    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert manifest["config"]["model"] == DEFAULT_MODEL == "standin-for-gpt-4o"


def test_models_listing_and_refusals(traces: tuple[Path, Path, list[dict]]) -> None:
    with teacher_server(traces[1]) as srv:
        listing = json.loads(urllib.request.urlopen(srv.base_url + "/models", timeout=10).read())
        entry = listing["data"][0]
        assert entry["id"] == DEFAULT_MODEL and entry["stand_in_for"] == "gpt-4o" and STAND_IN in entry["description"]
        request = urllib.request.Request(srv.base_url + "/chat/completions", method="POST", data=json.dumps(
            {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode())
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=10)
        assert err.value.code == 404 and "does not exist" in json.loads(err.value.read())["error"]["message"]
        # streamed, as the client streams when it shows progress: the same answer, usage 0 without a tokenizer
        question = traces[2][0]["question"]
        body = {"model": DEFAULT_MODEL, "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"<Question>\n{question}\n</Question>\n\n<Component_1>"}]}
        request = urllib.request.Request(srv.base_url + "/chat/completions", method="POST",
                                         data=json.dumps(body).encode())
        events = [line[6:] for line in urllib.request.urlopen(request, timeout=10).read().decode().splitlines()
                  if line.startswith("data: ")]
        chunks = [json.loads(e) for e in events[:-1]]
        assert events[-1] == "[DONE]" and chunks[-1]["usage"]["prompt_tokens"] == 0
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == "```python\n{1: [], 2: [], 3: [], 4: [1]}\n```"


def test_find_answer_tells_stage_and_trace_apart(traces: tuple[Path, Path, list[dict]]) -> None:
    answers = load_answers(traces[1])
    q = traces[2][1]["question"]
    assert find_answer(f"x\n<Question>\n{q}\n</Question>\n\n<Line 1> a </Line 1>", answers)[0] == "components"
    stage, answer = find_answer(f"<Question>\n{q}\n</Question>\n\n<Component_1>\n", answers)
    assert (stage, answer.id) == ("dag", "cd-1")
    for prompt in (f"<Question>\n{q}\n</Question>\nno stage", "<Question>\nother\n</Question>\n<Line 1>", "hello"):
        with pytest.raises(ReplayRequestError) as err:
            find_answer(prompt, answers)
        assert err.value.status == 400


def test_bad_answers_are_refused_at_load(tmp_path: Path) -> None:
    comp = [{"description": "a", "plan": "1-1", "prompt": "p", "execution": "2-5", "comment": "not found"},
            {"description": "b", "plan": "6-6", "prompt": "q", "execution": "7-9", "comment": "not found"}]
    cases = [({"question": "Q", "components": comp, "dag": {"1": [], "2": [2]}}, "not an earlier component"),
             ({"question": "Q", "components": [{"description": "a", "plan": "one"}], "dag": {}}, "not a line range"),
             ({"question": "Q", "components": comp}, "parent dict")]
    for row, message in cases:
        path = tmp_path / "answers.jsonl"
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(UserError, match=message):
            load_answers(path)
    path.write_text(json.dumps({"id": "a", "question": "Q", "components": comp, "dag": {"1": [], "2": []}}) + "\n"
                    + json.dumps({"id": "b", "question": "Q ", "components": comp, "dag": {"1": [], "2": [1]}}) + "\n")
    with pytest.raises(UserError, match="same question with different answers"):
        load_answers(path)


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_the_command_says_it_is_a_stand_in(traces: tuple[Path, Path, list[dict]], tmp_path: Path,
                                           stop: signal.Signals) -> None:
    """`sprint teacher-server` prints its URL and what it is, serves, and stops cleanly on Ctrl-C or `kill`,
    also when started like a script's background job (SIGINT ignored)."""
    process = subprocess.Popen([sys.executable, "-m", "sprint", "teacher-server", str(traces[1]), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        line = process.stdout.readline()
        m = re.match(r"teacher server at (http://127\.0\.0\.1:\d+/v1) \(model standin-for-gpt-4o: a deterministic "
                     r"stand-in for GPT-4o, answering stages 1-2 for 3 traces; usage 0: no --tokenizer given\)", line)
        assert m, line + process.stderr.read() if process.poll() is not None else line
        listing = json.loads(urllib.request.urlopen(m.group(1) + "/models", timeout=10).read())
        assert listing["data"][0]["id"] == DEFAULT_MODEL
    finally:
        process.send_signal(stop)
        out, _ = process.communicate(timeout=30)
    assert process.returncode == 0 and "stopped after answering {} (0 refused)" in out
