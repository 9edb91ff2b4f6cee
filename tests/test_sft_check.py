"""check-sft: row validation, token lengths as ms-swift encodes them, drop counts, split assistant turns
(executor rows: `"loss": false` on the context), the file schema `datasets` can load, the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from sprint.cli import main as cli_main
from sprint.core.errors import UserError
from sprint.training import sft_check
from sprint.training.finetune import default_swift_bin, swift_python
from sprint.training.sft_check import (
    check_sft,
    join_turns,
    load_tokenizer,
    render_deepseek_r1,
    resolve_data,
    schema_problem,
    validate_messages,
)


def sft_row(question: str, body: str, **extra) -> dict:
    """A row in the layout packing writes."""
    return {
        "messages": [
            {"role": "user", "content": f"Plan, then execute.\n\n<Question>\n{question}\n</Question>\n\n"},
            {"role": "assistant", "content": f"<think>\n<Plan_1>\n{body}\n</Plan_1>\n</think>"},
        ],
        **extra,
    }


def executor_row(question: str, execution: str = "E.", **extra) -> dict:
    """A row in the layout of `pack --executor-rows`: the context untrained, then the execution."""
    user, _ = sft_row(question, "x")["messages"]
    return {
        "messages": [
            user,
            {"role": "assistant", "content": "<think>\n<Plan_1>\nP.\n\n<prompt_1.1> Q </prompt_1.1>\n</Plan_1>\n\n"
                                             "<Execution_1>\n<execution_1.1>\n", "loss": False},
            {"role": "assistant", "content": f"{execution}\n</execution_1.1>", "loss": True},
        ],
        **extra,
    }


def write_jsonl(path: Path, rows: list) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


@pytest.fixture(scope="module")
def tokenizer(tok_dir: Path):
    return load_tokenizer(str(tok_dir))


def test_validate_messages_accepts_training_layouts():
    assert validate_messages(sft_row("1+1?", "add"))[1]["role"] == "assistant"
    with_system = {"messages": [{"role": "system", "content": "s"}, *sft_row("q", "b")["messages"]]}
    assert len(validate_messages(with_system)) == 3
    two_rounds = {"messages": sft_row("a", "b")["messages"] + sft_row("c", "d")["messages"]}
    assert len(validate_messages(two_rounds)) == 4


def test_split_assistant_turns_are_one_turn():
    row = executor_row("1+1?")
    assert validate_messages(row) == row["messages"]
    turns = join_turns(row["messages"])
    assert turns == [{"role": "user", "content": row["messages"][0]["content"]},
                     {"role": "assistant", "content": row["messages"][1]["content"] + row["messages"][2]["content"]}]
    two_rounds = {"messages": row["messages"] + executor_row("2+2?")["messages"]}
    assert [t["role"] for t in join_turns(validate_messages(two_rounds))] == ["user", "assistant"] * 2
    no_flag = {"messages": [*row["messages"][:2], {**row["messages"][2], "loss": None}]}
    assert validate_messages(no_flag)  # no flag: ms-swift's default (assistant text trained)
    as_numbers = {"messages": [row["messages"][0], {**row["messages"][1], "loss": 0}, {**row["messages"][2], "loss": 1}]}
    assert validate_messages(as_numbers)


ASSISTANT = {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    "messages, reason",
    [
        ([{"role": "user", "content": "q"}, {**ASSISTANT, "loss": True}, {**ASSISTANT, "loss": False}], "target would not"),
        ([{"role": "user", "content": "q", "loss": False}, ASSISTANT], "only assistant messages"),
        ([{"role": "user", "content": "q"}, {**ASSISTANT, "loss": 0}], "target would not"),
        ([{"role": "user", "content": "q"}, {**ASSISTANT, "loss": 2}, ASSISTANT], "true or false"),
        ([{"role": "user", "content": "q"}, {**ASSISTANT, "loss": "no"}], "true or false"),
        ([{"role": "user", "content": "q"}, {"role": "user", "content": "q"}, ASSISTANT], "roles"),
    ],
)
def test_loss_flags_are_checked(messages, reason):
    with pytest.raises(ValueError, match=reason):
        validate_messages({"messages": messages})


@pytest.mark.parametrize(
    "row, reason",
    [
        ([1, 2], "not a JSON object"),
        ({"conversations": []}, "no 'messages'"),
        ({"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]}, "roles"),
        ({"messages": [{"role": "user", "content": "only a question"}]}, "roles"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  \n"}]}, "empty content"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None}]}, "not a string"),
        ({"messages": [{"content": "q"}, {"role": "assistant", "content": "a"}]}, "no 'role'"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "bot", "content": "a"}]}, "roles"),
    ],
)
def test_validate_messages_rejects(row, reason):
    with pytest.raises(ValueError, match=reason):
        validate_messages(row)


def test_render_matches_the_tokenizers_chat_template(tokenizer):
    """The shared R1-distill tokenizer's own template renders the same text as our deepseek_r1 rendering."""
    messages = sft_row("What is 2+3?", "Add.\n<prompt_1.1> 2+3 </prompt_1.1>")["messages"]
    ours = render_deepseek_r1(messages, tokenizer.bos_token, tokenizer.eos_token)
    assert ours == tokenizer.apply_chat_template(messages, tokenize=False)


def test_check_counts_lengths_and_drops(tmp_path: Path, tok_dir: Path, tokenizer):
    short = sft_row("1+1?", "add the numbers", id="a")
    long = sft_row("Sum the list.", "step " * 400, id="b")
    train = write_jsonl(tmp_path / "train.jsonl", [short, long, short])
    test = write_jsonl(tmp_path / "test.jsonl", [sft_row("2+2?", "add", id="c")])
    short_len = len(tokenizer(render_deepseek_r1(short["messages"], tokenizer.bos_token, tokenizer.eos_token),
                              add_special_tokens=False)["input_ids"])

    report = check_sft(train, test, str(tok_dir), max_length=short_len + 50)
    assert (report.train.rows, report.train.invalid, report.train.too_long, report.train.kept) == (3, 0, 1, 2)
    assert report.train.lengths[0] == short_len and report.train.lengths[1] > 400
    assert report.test is not None and report.test.kept == 1
    assert report.ok
    assert "1 longer than" in report.format()

    # max_length exactly the row's length keeps it (ms-swift drops only `length > max_length`).
    assert check_sft(train, None, str(tok_dir), max_length=short_len).train.kept == 2
    assert check_sft(train, None, str(tok_dir), max_length=short_len - 1).train.kept == 0


def test_check_reports_invalid_rows_with_line_numbers(tmp_path: Path, tok_dir: Path):
    rows = [
        sft_row("ok", "fine"),
        "{not json",
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "no think tags"}]},
    ]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    report = check_sft(train, None, str(tok_dir), max_length=4096)
    assert (report.train.rows, report.train.invalid, report.train.kept, report.train.no_think) == (4, 2, 2, 1)
    assert report.train.errors[0].startswith("line 2:") and report.train.errors[1].startswith("line 3:")
    assert not report.ok
    assert "NOT OK" in report.format()


def test_executor_rows_are_counted_and_measured_as_one_turn(tmp_path: Path, tok_dir: Path, tokenizer):
    row = executor_row("1+1?", id="a#exec_1.1@stream")
    whole = {"messages": join_turns(row["messages"])}  # the old layout: the view trained too
    train = write_jsonl(tmp_path / "train.jsonl", [row, whole, sft_row("q", "b")])
    report = check_sft(train, None, str(tok_dir), 4096)
    split = report.train
    assert (split.rows, split.invalid, split.no_think, split.executor_rows) == (3, 0, 0, 2)
    assert (split.masked_rows, split.unmasked_executor_rows, split.load_error) == (1, 1, None)
    assert split.lengths[0] == split.lengths[1]  # the same text: no end of turn between the two parts
    assert split.lengths[0] == len(tokenizer(render_deepseek_r1(whole["messages"], tokenizer.bos_token,
                                                                 tokenizer.eos_token), add_special_tokens=False)["input_ids"])
    text = report.format()
    assert "1 rows train only part of their assistant turn" in text
    assert "warning: 1 executor-view rows train their context too" in text and report.ok


def test_a_message_key_first_seen_after_the_first_chunk_fails_the_load(tmp_path: Path, tok_dir: Path, monkeypatch):
    main = [sft_row(f"q{i}", "b" * 50) for i in range(20)]
    executor = [executor_row(f"q{i}") for i in range(3)]
    late = write_jsonl(tmp_path / "late.jsonl", main + executor)
    early = write_jsonl(tmp_path / "early.jsonl", executor + main)
    monkeypatch.setattr(sft_check, "DATASETS_CHUNK_BYTES", 1000)
    assert "line 21: its messages have the key(s) loss" in (schema_problem(late) or "")
    assert schema_problem(early) is None  # mixed keys in the first chunk: `datasets` stores messages as JSON
    assert schema_problem(write_jsonl(tmp_path / "main.jsonl", main)) is None
    monkeypatch.setattr(sft_check, "DATASETS_CHUNK_BYTES", 10 << 20)
    assert schema_problem(late) is None  # all of it in the first chunk
    monkeypatch.setattr(sft_check, "DATASETS_CHUNK_BYTES", 1000)
    report = check_sft(late, None, str(tok_dir), 4096)
    assert report.train.load_error and report.train.invalid == 0 and not report.ok
    assert "cannot be loaded: line 21" in report.format()


def test_everything_too_long_is_not_ok(tmp_path: Path, tok_dir: Path):
    train = write_jsonl(tmp_path / "train.jsonl", [sft_row("q", "a b c d e f g")])
    report = check_sft(train, None, str(tok_dir), max_length=5)
    assert report.train.kept == 0 and not report.ok


def test_test_prompts_seen_in_train_are_counted(tmp_path: Path, tok_dir: Path):
    train = write_jsonl(tmp_path / "train.jsonl", [sft_row("q1", "a"), sft_row("q2", "a")])
    test = write_jsonl(tmp_path / "test.jsonl", [sft_row("q2", "other answer"), sft_row("q3", "a")])
    assert check_sft(train, test, str(tok_dir), 4096).test_in_train == 1


def test_resolve_data_folder_and_files(tmp_path: Path):
    write_jsonl(tmp_path / "train.jsonl", [sft_row("q", "a")])
    assert resolve_data(tmp_path, None) == (tmp_path / "train.jsonl", None)
    write_jsonl(tmp_path / "test.jsonl", [sft_row("q", "a")])
    assert resolve_data(tmp_path, None) == (tmp_path / "train.jsonl", tmp_path / "test.jsonl")
    assert resolve_data(tmp_path / "train.jsonl", None) == (tmp_path / "train.jsonl", None)
    with pytest.raises(UserError, match="no training data"):
        resolve_data(tmp_path / "missing", None)


def test_unloadable_tokenizer_is_a_user_error(tmp_path: Path):
    write_jsonl(tmp_path / "train.jsonl", [sft_row("q", "a")])
    with pytest.raises(UserError, match="cannot load the tokenizer"):
        check_sft(tmp_path / "train.jsonl", None, str(tmp_path / "no-such-model"), 4096)


def test_cli_exit_codes_and_json(tmp_path: Path, tok_dir: Path, capsys):
    write_jsonl(tmp_path / "train.jsonl", [sft_row("q1", "a"), sft_row("q2", "b")])
    write_jsonl(tmp_path / "test.jsonl", [sft_row("q3", "c")])
    out = tmp_path / "report.json"
    code = cli_main(["check-sft", str(tmp_path), "--tokenizer", str(tok_dir), "--json", str(out)])
    assert code == 0
    summary = json.loads(out.read_text())
    assert summary["ok"] and summary["train"]["kept"] == 2 and summary["test"]["rows"] == 1
    assert "train: 2 rows" in capsys.readouterr().out

    assert cli_main(["check-sft", str(tmp_path), "--tokenizer", str(tok_dir), "--max-length", "3"]) == 1
    assert cli_main(["check-sft", str(tmp_path / "nope"), "--tokenizer", str(tok_dir)]) == 2


# --- against ms-swift itself -------------------------------------------------------------------

_ENCODE = r"""
import json, sys
from swift import get_processor, get_template
model, data = sys.argv[1], sys.argv[2]
proc = get_processor(model, model_type="qwen2", use_hf=True)
tpl = get_template(proc, template_type="deepseek_r1", max_length=100000)
tpl.set_mode("train")
rows = [json.loads(l) for l in open(data, encoding="utf-8")]
print(json.dumps([len(tpl.encode({"messages": r["messages"]})["input_ids"]) for r in rows]))
"""


@pytest.mark.swift
def test_lengths_equal_ms_swift_encoding(tmp_path: Path, request):
    """Our count is the length ms-swift's deepseek_r1 template encodes (what --max_length compares)."""
    python = swift_python(default_swift_bin())
    if not python.exists():
        pytest.skip(f"ms-swift venv missing ({python}); run scripts/install_swift.sh")
    tiny_model_dir = request.getfixturevalue("tiny_model_dir")
    rows = [
        sft_row("What is 2+3?", "Add.\n<prompt_1.1> 2+3 </prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n5"),
        sft_row("Un problème: ∫x dx?", "Intègre.  Résultat: x²/2 + C\n\n\n"),
        {"messages": [{"role": "system", "content": "You plan."}, *sft_row("q", "b")["messages"]]},
        executor_row("Un problème: 2+2?", "2 + 2 = 4 ."),
    ]
    data = write_jsonl(tmp_path / "train.jsonl", rows)
    result = subprocess.run([str(python), "-c", _ENCODE, str(tiny_model_dir), str(data)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    swift_lengths = json.loads(result.stdout.strip().splitlines()[-1])
    ours = check_sft(data, None, str(tiny_model_dir), 100000).train.lengths
    assert ours == swift_lengths


_DATASETS_LOAD = r"""
import sys, datasets
try:
    datasets.load_dataset("json", data_files=sys.argv[1], split="train", cache_dir=sys.argv[2], chunksize=int(sys.argv[3]))
    print("loads")
except Exception as exc:
    print("fails", repr(exc.__cause__ or exc)[:300].replace("\\n", " "))
"""


@pytest.mark.swift
def test_schema_problem_is_what_datasets_does(tmp_path: Path, monkeypatch):
    """The JSONL loader of ms-swift's venv (datasets, chunk size made small) fails exactly where check-sft says."""
    python = swift_python(default_swift_bin())
    if not python.exists():
        pytest.skip(f"ms-swift venv missing ({python}); run scripts/install_swift.sh")
    main = [sft_row(f"q{i}", "b" * 50) for i in range(40)]
    executor = [executor_row(f"q{i}") for i in range(3)]
    chunk = 2000
    monkeypatch.setattr(sft_check, "DATASETS_CHUNK_BYTES", chunk)
    for name, rows in (("late", main + executor), ("early", executor + main), ("few", main[:3] + executor)):
        path = write_jsonl(tmp_path / f"{name}.jsonl", rows)
        done = subprocess.run([str(python), "-c", _DATASETS_LOAD, str(path), str(tmp_path / f"cache-{name}"), str(chunk)],
                              capture_output=True, text=True, timeout=300)
        result = done.stdout.strip().splitlines()[-1]
        assert result.startswith("fails" if schema_problem(path) else "loads"), (name, result, done.stderr[-2000:])
        assert (name == "late") == result.startswith("fails"), (name, result)
