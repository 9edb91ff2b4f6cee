"""`pack --executor-rows` and `pack --sequential`: the extra SFT rows, checked against what inference sends.

The executor rows are checked end to end: the real orchestration loop (`ProblemRun`, both schedules)
runs against a model that knows its training rows by heart, so every executor call must find the
one row that continues its prompt byte for byte, its untrained part being exactly that prompt and
its trained part exactly the execution. ms-swift's own encoder shows that only the execution is
trained (swift-marked). The sequential rows are checked against the prompt `sprint baseline` sends.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sprint.cli import main as cli_main
from sprint.curation.packing import PackSettings, pack, pack_record
from sprint.curation.sft_rows import (
    EXECUTOR_ROW_MODES,
    VIEW_SCHEDULES,
    assistant_text,
    executor_context,
    executor_id,
    executor_rows,
    executor_schedules,
)
from sprint.format.boxed import last_boxed
from sprint.format.prompt_format import (
    EXECUTOR_STOPS,
    PromptFormat,
    load_agent_prompt,
    sft_user_content,
)
from sprint.format.tags import THINK, THINK_END, execution_close
from sprint.format.trajectory import Trajectory
from sprint.inference.orchestration import LoopSettings, ProblemRun
from sprint.inference.run import RoleSampling
from sprint.inference.schedule import schedule_names
from sprint.llm.client import Completion, Sampling
from sprint.tasks.registry import Problem
from sprint.training.finetune import default_swift_bin, swift_python
from sprint.training.sft_check import answer_layout, check_split, load_tokenizer
from tests.test_packing import (
    AGENT_PROMPT,
    DATA,
    SEVERAL_PARENTS,
    comp,
    read_jsonl,
    record,
    synthetic_rows,
)

THOUGHT = "Okay, so x is what we need.\nLet me compute it.\nWait, check again: 7."


def traces() -> list[dict[str, Any]]:
    """Kept traces of several shapes (3 phases with a plan-only component; a phase without prompts; one
    multi-line plan), each with a thought; plus the synthetic mix of test_packing (kept, dropped, broken)."""
    several = [json.loads(json.dumps(SEVERAL_PARENTS)) | {"id": f"several{i}", "question": f"What is x, case {i}?"}
               for i in range(4)]
    example = json.loads((DATA / "packing_example.json").read_text()) | {"id": "example"}
    wide = record([comp("Split the sum.\nTwo halves.", "Add the first half: 1 + 2.", "1 + 2 = 3.", (1, 5)),
                   comp("And the rest.", "Add the second half: 3 + 1.", "3 + 1 = 4.", (6, 10)),
                   comp("Now combine.", "Add 3 and 4.", "3 + 4 = 7.", (11, 15))],
                  {"1": [], "2": [], "3": [1, 2]}) | {"id": "wide", "question": "What is 1 + 2 + 3 + 1?"}
    rows = several + [example, wide]
    for r in rows:
        r["thought"] = THOUGHT
    return rows + synthetic_rows(12)  # no thought: no sequential row, counted


def write_input(tmp_path: Path) -> Path:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in traces()))
    return src


def full_text(row: dict[str, Any]) -> str:
    """The user turn and the assistant turn as the model sees them (an executor row's two parts joined)."""
    return row["messages"][0]["content"] + assistant_text(row)


# ------------------------------------------------------------------------------------------
# The files pack writes


def test_executor_rows_add_train_rows_only_and_leave_the_released_rows_as_they_were(tmp_path: Path) -> None:
    src = write_input(tmp_path)
    pack(str(src), tmp_path / "plain", parallelization_threshold=1.0, seed=3)
    summary = pack(str(src), tmp_path / "more", parallelization_threshold=1.0, seed=3, executor_rows="both",
                   sequential=True)
    plain, more = tmp_path / "plain", tmp_path / "more"
    assert (more / "test.jsonl").read_bytes() == (plain / "test.jsonl").read_bytes()  # evaluation data unchanged
    assert (more / "records.jsonl").read_bytes() == (plain / "records.jsonl").read_bytes()
    lines = (more / "train.jsonl").read_text().splitlines(keepends=True)
    main = [line for line in lines if "#" not in json.loads(line)["id"]]
    assert "".join(main) == (plain / "train.jsonl").read_text()  # the released rows, byte for byte, last
    # executor rows first: their `loss` flags must be in the first chunk `datasets` settles the schema on
    assert lines[len(lines) - len(main):] == main

    records = {r["id"]: r for r in read_jsonl(more / "records.jsonl")}
    train_ids = [r["id"] for r in read_jsonl(plain / "train.jsonl")]
    expected = []
    for tid in train_ids:  # one row per executed prompt and schedule, of train traces only
        traj = Trajectory.parse(records[tid]["trajectory"])
        expected += [executor_id(tid, pr.name, s) for ph in traj.phases for pr in ph.prompts for s in VIEW_SCHEDULES]
    extra = [json.loads(line)["id"] for line in lines[: len(lines) - len(main)]]
    assert extra == expected and len(extra) == summary["executor_rows"]["train"] > 0
    assert summary["executor_rows"] == {"mode": "both", "train": len(expected)}
    assert summary["train"] == len(train_ids) and summary["test"] == len(read_jsonl(plain / "test.jsonl"))
    manifest = json.loads((more / "manifest.json").read_text())
    assert manifest["summary"] == summary and "sequential_train.jsonl" in manifest["files"]
    assert manifest["config"]["executor_rows"] == "both" and manifest["config"]["sequential"] is True


def test_executor_row_modes_and_the_schedules_agree() -> None:
    assert set(VIEW_SCHEDULES) == set(schedule_names())  # curation may not import inference: checked here
    assert [executor_schedules(m) for m in EXECUTOR_ROW_MODES] == [(), ("barrier",), ("stream",), ("barrier", "stream"),
                                                                  ("barrier", "stream")]


def test_distinct_executor_rows_train_every_view_once(tmp_path: Path) -> None:
    """`distinct` keeps every view `both` trains, each in one row, and none that the packed row holds verbatim."""
    src = write_input(tmp_path)
    rows = {}
    for mode in ("both", "distinct"):
        pack(str(src), tmp_path / mode, parallelization_threshold=1.0, test_frac=0.0, executor_rows=mode)
        rows[mode] = read_jsonl(tmp_path / mode / "train.jsonl")
    main = {r["id"]: full_text(r) for r in rows["both"] if "#" not in r["id"]}
    assert main == {r["id"]: full_text(r) for r in rows["distinct"] if "#" not in r["id"]}
    key = lambda r: (r["id"].split("#")[0], full_text(r))  # noqa: E731
    distinct = [key(r) for r in rows["distinct"] if "#" in r["id"]]
    assert len(distinct) == len(set(distinct))
    assert not any(main[tid].startswith(text) for tid, text in distinct)
    both = {key(r) for r in rows["both"] if "#" in r["id"]}
    assert set(distinct) == {(tid, text) for tid, text in both if not main[tid].startswith(text)}
    assert 0 < len(distinct) < len(both)


def test_an_executor_row_is_its_view_then_its_execution() -> None:
    res = pack_record("t", "What is x?", SEVERAL_PARENTS, PackSettings())
    traj = res.trajectory
    rows = executor_rows("U", "t", traj, ("stream",), 8)
    row = next(r for r in rows if r["id"] == "t#exec_2.2@stream")
    # worked out by hand: the past phase whole, the plan up to </prompt_2.2>, closed (no prompt 2.3),
    # then execution 2.2 alone, without its siblings
    past = traj.render_body().split("<Plan_2>")[0]
    # one assistant turn in two messages: the view (not trained), then the execution (trained)
    assert row["messages"] == [
        {"role": "user", "content": "U"},
        {"role": "assistant", "loss": False, "content": (
            "<think>\n" + past + "<Plan_2>\nBased on execution_1.1, execution_1.3:\nP4.\n\n<prompt_2.1> Q4 </prompt_2.1>\n\n"
            "P5.\nE5.\n\nBased on execution_1.2:\nP6.\n\n<prompt_2.2> Q6 </prompt_2.2>\n</Plan_2>\n\n<Execution_2>\n"
            "<execution_2.2>\n")},
        {"role": "assistant", "loss": True, "content": "E6.\n</execution_2.2>"}]
    barrier = next(r for r in executor_rows("U", "t", traj, ("barrier",), 8) if r["id"] == "t#exec_2.2@barrier")
    assert assistant_text(barrier) == (
        "<think>\n" + past + traj.phases[1].render_plan() + "\n\n<Execution_2>\n<execution_2.2>\nE6.\n</execution_2.2>")
    assert barrier["messages"][2] == row["messages"][2]  # the same execution trained under both schedules
    assert len(rows) == 7  # 3 + 3 + 1 executed prompts
    # plans over the prompt limit are skipped, as for the main rows: phases 1 and 2 hold 3 prompts each
    assert [r["id"] for r in executor_rows("U", "t", traj, ("barrier",), 2)] == ["t#exec_3.1@barrier"]


# ------------------------------------------------------------------------------------------
# What the orchestrator sends


class RowModel:
    """A model that knows its training rows by heart (planner calls: the main rows; executor calls: the
    executor rows): it continues a prompt with what the rows extending it say next, up to the first
    stop string, which is not returned (as vLLM does). No row, or rows that disagree, fail the call."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.executor_calls: list[tuple[str | None, str, str]] = []  # (the row that ends there, prompt, completion)

    def _continue(self, prompt: str, sampling: Sampling, on_text: Any, user: str | None = None) -> Completion:
        executor = sampling.stop == EXECUTOR_STOPS
        found = [full_text(r) for r in self.rows if ("#" in r["id"]) == executor and full_text(r).startswith(prompt)
                 and (user is None or r["messages"][0]["content"] == user)]
        texts = {rest[: min([rest.find(s) for s in sampling.stop if s in rest] or [len(rest)])]
                 for rest in (t[len(prompt):] for t in found)}
        assert len(texts) == 1, f"{len(found)} rows, {len(texts)} continuations of the {'executor' if executor else 'planner'} prompt"
        text = texts.pop()
        if executor:  # the row trained for exactly this call: the prompt, the execution, the closing tag
            ends = [r["id"] for r in self.rows if "#" in r["id"] and full_text(r).startswith(prompt + text)
                    and re.fullmatch(r"</execution_\d+\.\d+>", full_text(r)[len(prompt + text):])]
            self.executor_calls.append((ends[0] if len(ends) == 1 else None, prompt, text))
        if on_text is not None:  # streamed: chunk by chunk, so the stream schedule starts executors on the way
            for end in [i + 1 for i, ch in enumerate(text) if ch == ">"] + [len(text)]:
                on_text(text[:end])
        return Completion(text, "stop", None, 1, 1, False, 0.0, 0.0, 1)

    async def complete(self, prompt: str, sampling: Sampling, on_text: Any = None) -> Completion:
        return self._continue(prompt, sampling, on_text)

    async def chat(self, messages: list[dict[str, str]], sampling: Sampling, on_text: Any = None) -> Completion:
        user, assistant = messages[0]["content"], messages[1]["content"]
        return self._continue(user + assistant, sampling, on_text, user=user)


def orchestrate_from_rows(rows: list[dict[str, Any]], question: str, schedule: str, fmt: PromptFormat) -> tuple:
    """One problem through the real planner/executor loop, the model answering from `rows`."""
    model = RowModel(rows)
    sampling = RoleSampling(0.0, 1.0, 4096)
    settings = LoopSettings(planner=sampling, executor=sampling, final_max_tokens=512, max_phases=12,
                            planner_length_retries=0, executor_retries=1, problem_retries=0, seed=0, schedule=schedule)
    run = ProblemRun(Problem("p", 0, question, None), fmt, model, model, settings, asyncio.Semaphore(4))  # type: ignore[arg-type]
    return asyncio.run(run.run()), model


@pytest.mark.parametrize("agent", ["default", "none"])
@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("schedule", ["barrier", "stream"])
def test_every_executor_call_continues_its_executor_row_byte_for_byte(tmp_path: Path, schedule: str, api: str,
                                                                      agent: str) -> None:
    src = write_input(tmp_path)
    pack(str(src), tmp_path / "sft", parallelization_threshold=1.0, test_frac=0.0, executor_rows=schedule,
         **({"agent_prompt": "none"} if agent == "none" else {}))
    train = read_jsonl(tmp_path / "sft" / "train.jsonl")
    fmt = PromptFormat(agent_prompt=load_agent_prompt("none" if agent == "none" else None),
                       mode="chat" if api == "chat" else "raw", api=api)
    records = {r["id"]: r for r in read_jsonl(tmp_path / "sft" / "records.jsonl") if r["status"] == "ok"}
    for tid in ("several0", "example", "wide"):
        packed = Trajectory.parse(records[tid]["trajectory"])
        rows = [r for r in train if r["id"] == tid or r["id"].startswith(tid + "#")]
        outcome, model = orchestrate_from_rows(rows, packed.question, schedule, fmt)
        assert outcome.trajectory.render() == packed.render()  # the loop rebuilt the packed trajectory
        # every executor row was asked for exactly once, and the call's prompt is the row's text up to
        # the execution: the model is trained on exactly what it is sent
        executor_ids = sorted(r["id"] for r in rows if "#" in r["id"])
        assert sorted(i for i, _, _ in model.executor_calls) == executor_ids
        by_id = {r["id"]: r for r in rows}
        for row_id, prompt, text in model.executor_calls:
            name = row_id.split("#exec_")[1].split("@")[0]
            assert prompt + text + execution_close(name) == full_text(by_id[row_id])
            # and split where the call is: the untrained part is what the executor is sent (after the
            # user turn), the trained part exactly what it writes and the closing tag its stop string meets
            user_msg, context, execution = by_id[row_id]["messages"]
            assert (context["loss"], execution["loss"]) == (False, True)
            assert user_msg["content"] + context["content"] == prompt and execution["content"] == text + execution_close(name)
            phase = int(name.split(".")[0]) - 1
            prompt_obj = next(p for p in packed.phases[phase].prompts if p.name == name)
            user = by_id[row_id]["messages"][0]["content"]
            assert prompt == user + THINK + "\n" + executor_context(packed, phase, prompt_obj, schedule)
            if api == "completions":
                assert prompt == fmt.request(packed.question, executor_context(packed, phase, prompt_obj, schedule))[1]
        # without these rows the sibling views are unseen: only the views of a phase's first prompt that
        # show the whole plan (barrier; stream when the plan ends with that prompt) continue the main row
        main = full_text(by_id[tid])
        unseen = sorted(row_id for row_id, prompt, _ in model.executor_calls if not main.startswith(prompt))
        whole = {f"{tid}#exec_{ph.prompts[0].name}@{schedule}" for ph in packed.phases if ph.prompts
                 and (schedule == "barrier" or ph.streamed_view(ph.prompts[0]) == ph.render_plan())}
        expected = [i for i in executor_ids if i not in whole]
        assert unseen == sorted(expected) and unseen


_SWIFT_ENCODE = r"""
import json, sys
from swift import get_processor, get_template
model, rows = sys.argv[1], json.loads(sys.argv[2])
proc = get_processor(model, model_type="qwen2", use_hf=True)
out = {}
for name in ("chatml", "deepseek_r1"):
    tpl = get_template(proc, template_type=name, max_length=100000)
    tpl.set_mode("train")
    out[name] = []
    for messages in rows:
        e = tpl.encode({"messages": messages})
        ids, labels = e["input_ids"], e["labels"]
        trained = [k for k, x in enumerate(labels) if x != -100]
        decode = lambda part: proc.decode(part, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        out[name].append({"ids": ids, "trained": trained, "labels_are_ids": all(labels[k] == ids[k] for k in trained),
                          "text": decode(ids), "trained_text": decode([ids[k] for k in trained])})
print(json.dumps(out))
"""


@pytest.mark.swift
def test_ms_swift_trains_only_the_execution_of_an_executor_row(tmp_path: Path, request) -> None:
    """ms-swift 4.6's own encoder (the chatml template of the mini experiment and deepseek_r1 of the full
    one): the two assistant messages are one turn, token for token the single-message text, and the
    labels cover the execution, its closing tag and the end of turn only; a main row stays wholly trained."""
    python = swift_python(default_swift_bin())
    if not python.exists():
        pytest.skip(f"ms-swift venv missing ({python}); run scripts/install_swift.sh")
    model = request.getfixturevalue("tiny_model_dir")
    src = write_input(tmp_path)
    pack(str(src), tmp_path / "sft", parallelization_threshold=1.0, test_frac=0.0, executor_rows="stream")
    train = read_jsonl(tmp_path / "sft" / "train.jsonl")
    row = next(r for r in train if r["id"] == "several0#exec_2.2@stream")
    main = next(r for r in train if r["id"] == "several0")
    user, context, execution = row["messages"]
    joined = [user, {"role": "assistant", "content": assistant_text(row)}]  # the same turn in one message
    args = [str(python), "-c", _SWIFT_ENCODE, str(model), json.dumps([row["messages"], joined, main["messages"]])]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    ends = {"chatml": "<|im_end|>\n", "deepseek_r1": "<｜end▁of▁sentence｜>"}
    for name, (split, single, main_enc) in out.items():
        assert split["ids"] == single["ids"] and split["text"] == single["text"], name  # nothing added between the parts
        assert context["content"] + execution["content"] + ends[name] in split["text"]
        trained = split["trained"]  # one span, at the end: the context is all -100
        assert trained == list(range(len(split["ids"]) - len(trained), len(split["ids"]))) and split["labels_are_ids"]
        assert split["trained_text"] == execution["content"] + ends[name], name
        assert single["trained_text"] == assistant_text(row) + ends[name]  # what the layout takes off the loss
        assert main_enc["trained_text"] == main["messages"][1]["content"] + ends[name]


def test_agent_prompt_none_trains_the_user_turn_inference_sends(tmp_path: Path) -> None:
    question = "What is x?"
    assert sft_user_content("", question) == PromptFormat(agent_prompt="").user_turn(question) == \
        "<Question>\nWhat is x?\n</Question>\n\n"
    assert sft_user_content(AGENT_PROMPT, question) == PromptFormat(agent_prompt=load_agent_prompt()).user_turn(question)


# ------------------------------------------------------------------------------------------
# The sequential (RFT) rows


def test_sequential_rows_share_the_ids_and_split_and_continue_the_baseline_prompt(tmp_path: Path, capsys) -> None:
    src = write_input(tmp_path)
    summary = pack(str(src), tmp_path / "sft", parallelization_threshold=1.0, seed=1, test_frac=0.3, sequential=True)
    out = tmp_path / "sft"
    main = {split: read_jsonl(out / f"{split}.jsonl") for split in ("train", "test")}
    seq = {split: read_jsonl(out / f"sequential_{split}.jsonl") for split in ("train", "test")}
    with_thought = {r["id"] for r in traces() if r.get("thought")}
    for split in ("train", "test"):  # the same traces, in the same order, in the same split
        assert [r["id"] for r in seq[split]] == [r["id"] for r in main[split] if r["id"] in with_thought]
    assert seq["test"] and seq["train"]
    no_thought = sum(1 for r in main["train"] + main["test"] if r["id"] not in with_thought)
    assert summary["sequential"] == {"train": len(seq["train"]), "test": len(seq["test"]), "no_thought": no_thought} and no_thought
    assert f"warning: {no_thought} kept traces have no thought" in capsys.readouterr().out

    fmt = PromptFormat(agent_prompt=load_agent_prompt())
    chat = PromptFormat(agent_prompt=load_agent_prompt(), mode="chat", api="chat")
    questions = {r["id"]: r["question"] for r in traces()}
    solutions = {r["id"]: r["solution"] for r in traces()}
    main_user = {r["id"]: r["messages"][0]["content"] for r in main["train"] + main["test"]}
    for row in seq["train"] + seq["test"]:
        user, assistant = row["messages"][0]["content"], row["messages"][1]["content"]
        assert user == main_user[row["id"]]
        # what `sprint baseline` sends (raw completions; chat with the pre-filled assistant turn) is the row's start
        assert fmt.request(questions[row["id"]], "")[1] == user + THINK + "\n"
        assert chat.request(questions[row["id"]], "")[1] == [{"role": "user", "content": user},
                                                             {"role": "assistant", "content": THINK + "\n"}]
        assert assistant == f"{THINK}\n{THOUGHT}\n{THINK_END}\n\n{solutions[row['id']]}"
        # the baseline reads the last box of what it generated: the solution's
        assert last_boxed(assistant[len(THINK) + 1:]) == last_boxed(solutions[row["id"]]) is not None


def test_sequential_rows_from_the_command_line(tmp_path: Path) -> None:
    src = write_input(tmp_path)
    assert cli_main(["pack", "--input", str(src), "--out-dir", str(tmp_path / "o"), "--sequential",
                     "--executor-rows", "barrier", "--parallelization-threshold", "1"]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["executor_rows"]["mode"] == "barrier" and summary["sequential"]["train"] > 0
    assert not list((tmp_path / "o").glob("*.tmp"))
    # a later run without --sequential (a new configuration: --overwrite) leaves no stale sequential files
    assert cli_main(["pack", "--input", str(src), "--out-dir", str(tmp_path / "o"), "--overwrite"]) == 0
    assert not (tmp_path / "o" / "sequential_train.jsonl").exists()
    assert "executor_rows" not in json.loads((tmp_path / "o" / "summary.json").read_text())


# ------------------------------------------------------------------------------------------
# check-sft


def test_answer_layouts() -> None:
    assert answer_layout("<think>\n<Plan_1>\nx\n</Plan_1>\n</think>") == "trajectory"
    assert answer_layout("<think>\n<Execution_1>\n<execution_1.2>\nE\n</execution_1.2>") == "executor"
    assert answer_layout("<think>\nthought\n</think>\n\nSo \\boxed{7}.") == "sequential"
    assert answer_layout("no think at all") is None
    assert answer_layout("<think>\nnever closed") is None
    assert answer_layout("<think>\n<execution_1.2>\nE\n</execution_1.2> and more") is None


def test_check_sft_accepts_executor_and_sequential_rows(tmp_path: Path, tok_dir: Path) -> None:
    src = write_input(tmp_path)
    summary = pack(str(src), tmp_path / "sft", parallelization_threshold=1.0, executor_rows="both", sequential=True)
    tok = load_tokenizer(str(tok_dir))
    train = check_split(tmp_path / "sft" / "train.jsonl", "train", tok, 7168)
    assert (train.invalid, train.no_think, train.sequential_rows, train.unmasked_executor_rows) == (0, 0, 0, 0)
    assert train.executor_rows == summary["executor_rows"]["train"] and train.rows == summary["train"] + train.executor_rows
    assert train.masked_rows == train.executor_rows and train.load_error is None  # every executor row trains its execution only
    seq = check_split(tmp_path / "sft" / "sequential_train.jsonl", "train", tok, 7168)
    assert (seq.invalid, seq.no_think, seq.executor_rows, seq.sequential_rows) == (0, 0, 0, summary["sequential"]["train"])
