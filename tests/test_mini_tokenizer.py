"""The mini experiment's tokenizer (`sprint mini-tokenizer`): round trips, single-token tags and numbers,
byte-identical rebuilds, and every loader (transformers in a qwen2 model folder included, tokencount, the chat
template) cuts text the same. Both pipelines: qwen2 (the default) and exact."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from sprint.core.errors import UserError
from sprint.format.prompt_format import build_prompt_format, load_agent_prompt
from sprint.format.tokencount import batch_counts, load_counter
from sprint.format.trajectory import load_tokenizer
from sprint.llm.serve import default_python
from sprint.mini import arithmetic
from sprint.mini.tokenizer import (
    CHAT_TEMPLATE, EOS_TOKEN, EXACT, PAD_TOKEN, QWEN2, SPECIAL_TOKENS, MiniTokenizerConfig, make_tokenizer, sprint_tags,
)

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "mini_tokenizer.json")
def corpus_rows(n: int = 60, seed: int = 0) -> list[dict]:
    """Countdown-like traces: a few dozen words, numbers, `,` `.` `:` `=` `+` `-` `*`, tagged trajectories."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b, c, t = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9), rng.randint(10, 300)
        thought = "\n".join([f"Okay , I need to make {t} from {a} {b} {c} .", f"Try {a} and {b} first .",
                             f"Then {c} is left , and I need {t} .", f"{a} + {b} = {a + b} , for {t} : {a * b} .",
                             f"None of these is {t} , so this pair does not work .", "Yes , let me check , correct ."])
        traj = (f"<Plan_1>\nOkay , I need {t} .\n<prompt_1.1> Try {a} and {b} first . </prompt_1.1>\n</Plan_1>\n\n"
                f"<Execution_1>\n<execution_1.1>\n{a} * {b} = {a * b} .\n</execution_1.1>\n</Execution_1>")
        rows.append({"id": str(i), "question": f"Use {a} {b} {c} to make {t} .", "thought": thought,
                     "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": traj}]})
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in corpus_rows()))
    return path


def build(corpus: Path, out: Path, pipeline: str) -> tuple[Path, dict]:
    cfg = MiniTokenizerConfig(corpus=[str(corpus)], out=str(out), fields="question,thought,messages", pipeline=pipeline)
    return out, make_tokenizer(cfg)


@pytest.fixture(scope="module", params=[QWEN2, EXACT])
def built(request: pytest.FixtureRequest, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    return build(corpus, tmp_path_factory.mktemp(request.param), request.param)


def as_model_folder(tokenizer: Path, folder: Path, model_type: str) -> Path:
    """The tokenizer files beside a config.json of `model_type`, as in a model folder (no weights needed)."""
    folder.mkdir()
    for name in FILES[:3]:
        (folder / name).write_bytes((tokenizer / name).read_bytes())
    (folder / "config.json").write_text(json.dumps({"model_type": model_type, "transformers_version": "5.19.0"}))
    return folder


def random_text(rng: random.Random, n: int) -> str:
    """Anything a model might write: ASCII, accents, CJK, emoji, controls, lone combining marks, tags, specials."""
    pools = ["abc XYZ 0123456789 ,.;:!?+-*/=()[]{}<>\\\"'", " \t\n\r\x00\x0b\x0c\u2028\u00a0",
             "éèüñçøåß", "中文字符", "😀🚀🧮", "\u0301\u0308", "<Plan_1></Plan_1><|im_end|><think>"]
    parts = []
    for _ in range(n):
        pool = rng.choice(pools)
        if rng.random() < 0.1:
            parts.append(rng.choice(sprint_tags() + list(SPECIAL_TOKENS)))
        elif rng.random() < 0.05:
            parts.append(chr(rng.choice([rng.randint(0x20, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])))
        else:
            parts.append(rng.choice(pool))
    return "".join(parts)


def tag_soup(rng: random.Random, n: int) -> str:
    """Tags, broken tags, out-of-range tags and the text around them, glued without spaces or with."""
    broken = ["<Plan_", "</execution_1.", "<Plan_13>", "<prompt_1.9>", "<execution_0.1>", "Plan_1>", "<<Plan_1>>",
              "</ Plan_1>", "<think", "<|im_start", "|>", "<Question >"]
    glue = ["", " ", "\n", "\n\n", "x", "7", " ."]
    return "".join(rng.choice(sprint_tags() + broken + list(SPECIAL_TOKENS)) + rng.choice(glue) for _ in range(n))


def test_round_trip(built: tuple[Path, dict], tmp_path: Path) -> None:
    """exact: decode(encode(t)) == t for any t; qwen2: == NFC(t) (so == t for NFC text), as R1's tokenizer.
    In a model folder of the matching type transformers cuts every text into the same ids as `tokenizers`."""
    folder, summary = built
    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model_type = "qwen2" if summary["pipeline"] == QWEN2 else "qwen3"
    hf = AutoTokenizer.from_pretrained(as_model_folder(folder, tmp_path / "model", model_type))
    assert type(hf).__name__ == ("Qwen2Tokenizer" if model_type == "qwen2" else "TokenizersBackend")
    expect = (lambda t: unicodedata.normalize("NFC", t)) if summary["pipeline"] == QWEN2 else (lambda t: t)
    rng = random.Random(1)
    texts = [random_text(rng, rng.randint(0, 80)) for _ in range(300)] + [tag_soup(rng, 30) for _ in range(100)]
    texts += ["", " ", "\n", "  leading", "trailing  ", "a\r\nb", "\\boxed{ ( 2 * 3 ) + 7 }", "e\u0301 1234 x9"]
    # what a model samples is any id sequence; its text must round-trip too
    texts += [fast.decode([rng.randrange(fast.get_vocab_size()) for _ in range(400)], skip_special_tokens=False)
              for _ in range(5)]
    for text in texts:
        ids = fast.encode(text, add_special_tokens=False).ids
        assert fast.decode(ids, skip_special_tokens=False) == expect(text)
        assert hf(text, add_special_tokens=False).input_ids == ids
        assert hf.decode(ids) == expect(text)


def test_tags_numbers_and_corpus_words_are_single_tokens(built: tuple[Path, dict]) -> None:
    folder, summary = built
    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
    all_tags = sprint_tags(12, 8)
    assert len(all_tags) == 6 + 2 + 12 * (4 + 8 * 4)
    assert {"<Plan_12>", "</execution_12.8>", "<prompt_3.7>"} <= set(all_tags)
    ids = {tag: fast.encode(tag, add_special_tokens=False).ids for tag in all_tags}
    assert all(len(v) == 1 for v in ids.values()) and len({v[0] for v in ids.values()}) == len(all_tags)
    glued = fast.encode("x<Plan_3>7</execution_12.8>\n", add_special_tokens=False).ids
    assert ids["<Plan_3>"][0] in glued and ids["</execution_12.8>"][0] in glued
    for tag in ("<Plan_13>", "<prompt_1.9>"):  # beyond the range: ordinary text, still exact
        assert len(fast.encode(tag, add_special_tokens=False).ids) > 1
    for n in range(1000):
        assert len(fast.encode(f" {n}", add_special_tokens=False).ids) == 1, n
    for row in corpus_rows():  # every word, number and punctuation run as the corpus writes it: one token
        for line in [row["question"], *row["thought"].split("\n")]:
            assert len(fast.encode(line, add_special_tokens=False).ids) == len(line.split(" ")), line
    for word in ("Okay", "Then", "Try", "None", "Yes"):  # as they are written: starting a line
        assert len(fast.encode(word, add_special_tokens=False).ids) == 1, word
    for word in ("need", "make", "first", "left", "pair", "work", "check", "correct"):  # after a space
        assert len(fast.encode(" " + word, add_special_tokens=False).ids) == 1, word
    line = "Try 3 and 5 first , for 124 : 20 4 96 ."
    assert len(fast.encode(line, add_special_tokens=False).ids) == len(line.split())
    # tags are text of the format, not special: decoding without special tokens keeps them
    text = "<think>\n<Plan_1>\nOkay .\n</Plan_1><|im_end|>"
    assert fast.decode(fast.encode(text).ids, skip_special_tokens=True) == text.replace("<|im_end|>", "")
    size = summary["bpe_vocab_size"]
    assert summary["vocab_size"] == fast.get_vocab_size() == (size + 3 + len(all_tags) + summary["references"]
                                                              + summary["number_tokens"])
    assert summary["references"] == 0  # execution names are one token only with --execution-names
    assert summary["number_tokens"] == (1000 if summary["pipeline"] == QWEN2 else 0)
    assert summary["special_tokens"] == {"<|endoftext|>": size, "<|im_start|>": size + 1, "<|im_end|>": size + 2}
    assert summary["common_pieces_split"] == 0 and summary["corpus"]["texts"] == 60 * 4


def test_same_corpus_same_files(built: tuple[Path, dict], corpus: Path, tmp_path: Path) -> None:
    """Rebuilt in another process (another hash seed), from a copy of the corpus elsewhere: byte-identical files."""
    folder, summary = built
    copy = tmp_path / "elsewhere.jsonl"
    copy.write_bytes(corpus.read_bytes())
    done = subprocess.run([sys.executable, "-m", "sprint", "mini-tokenizer", str(copy), "--out", str(tmp_path / "t"),
                           "--fields", "question,thought,messages", "--pipeline", summary["pipeline"]],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": "123"},
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "tokens per text" in done.stdout
    for name in FILES:
        assert (tmp_path / "t" / name).read_bytes() == (folder / name).read_bytes(), name


def test_several_corpus_files(corpus: Path, tmp_path: Path) -> None:
    """Several corpus files (both models' training rows: README "The tokenizer's corpus"): every file's texts
    count, and a file without text is named in a one-line error (nothing written)."""
    rows = [{"messages": [{"role": "assistant", "content": f"Meanwhile , {n} wobbles ."}]} for n in range(3)]
    second = tmp_path / "second.jsonl"
    second.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = lambda out, *files: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "sprint", "mini-tokenizer", *map(str, files), "--out", str(out),
         "--fields", "question,thought,messages"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    done = run(tmp_path / "t", corpus, second)
    assert done.returncode == 0, done.stderr
    fast = Tokenizer.from_file(str(tmp_path / "t" / "tokenizer.json"))
    assert len(fast.encode(" wobbles", add_special_tokens=False).ids) == 1  # a word only the second file holds
    assert json.loads((tmp_path / "t" / "mini_tokenizer.json").read_text())["corpus"]["texts"] == 60 * 4 + 3
    empty = tmp_path / "no_text.jsonl"
    empty.write_text(json.dumps({"id": "1"}) + "\n")
    failed = run(tmp_path / "unused", corpus, empty)
    assert failed.returncode != 0 and f"{empty} has no text in the columns" in failed.stderr
    assert len(failed.stderr.strip().splitlines()) == 1 and not (tmp_path / "unused").exists()


def test_every_loader_reads_it(built: tuple[Path, dict]) -> None:
    folder, summary = built
    hf = AutoTokenizer.from_pretrained(folder)
    assert (hf.eos_token, hf.pad_token, hf.bos_token) == (EOS_TOKEN, PAD_TOKEN, None)
    assert len(hf) == Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size()
    assert hf.chat_template == CHAT_TEMPLATE
    # the inference prompt (sprint.format.prompt_format) renders the user turn and continues from <think>\n
    agent = load_agent_prompt()
    fmt = build_prompt_format("chat", "completions", str(folder), agent)
    head = fmt.head("Use 2 3 7 to make 13 .")
    user = fmt.user_turn("Use 2 3 7 to make 13 .")
    assert head == f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    turns = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\nA"}]
    continued = hf.apply_chat_template(turns, tokenize=False, continue_final_message=True)
    assert continued == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nA"
    # counting: exact, through `tokenizers`: tiktoken would match the number tokens " 1" / " 12" leftmost-first
    counter = load_counter(str(folder))
    fast = load_tokenizer(str(folder))
    samples = [head, "<Plan_1>\nTry 3 and 5 first .\n</Plan_1>", "é 😀 x\n\n y", " 123 45\n678 .\n 9"]
    assert (counter.engine, counter.splits_at_lines) == ("tokenizers", summary["pipeline"] == QWEN2)
    assert counter.count_many(samples) == [len(fast.encode(s, add_special_tokens=False).ids) for s in samples]
    assert batch_counts(str(folder), samples) == {"": 0, **dict(zip(samples, counter.count_many(samples)))}


def test_transformers_rebuilds_a_qwen2_folders_tokenizer(corpus: Path, tmp_path: Path) -> None:
    """Why there is a qwen2 pipeline: in a qwen2 model folder transformers ignores tokenizer.json's pipeline."""
    folder, _ = build(corpus, tmp_path / "exact", EXACT)
    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
    rebuilt = AutoTokenizer.from_pretrained(as_model_folder(folder, tmp_path / "qwen2", "qwen2"))
    assert type(rebuilt).__name__ == "Qwen2Tokenizer"
    assert rebuilt(" 123", add_special_tokens=False).input_ids != fast.encode(" 123").ids


@pytest.mark.vllm
def test_the_vllm_venvs_transformers_reads_it(built: tuple[Path, dict], tmp_path: Path) -> None:
    """vLLM's own transformers (another version) loads it the same: same ids, same chat template output."""
    python = default_python()
    if not python.exists():
        pytest.skip(f"vLLM venv missing ({python})")
    folder, summary = built
    model = as_model_folder(folder, tmp_path / "model", "qwen2" if summary["pipeline"] == QWEN2 else "qwen3")
    code = ("import json, sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "m = [{'role': 'user', 'content': 'Use 2 3 7 to make 13 .'}]; "
            "s = t.apply_chat_template(m, tokenize=False, add_generation_prompt=True) + '<think>\\n<Plan_1>\\n'; "
            "print(json.dumps([s, t(s, add_special_tokens=False).input_ids, t.eos_token_id, len(t)]))")
    done = subprocess.run([str(python), "-c", code, str(model)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    text, ids, eos, size = json.loads(done.stdout.strip().splitlines()[-1])
    hf = AutoTokenizer.from_pretrained(folder)
    assert text == "<|im_start|>user\nUse 2 3 7 to make 13 .<|im_end|>\n<|im_start|>assistant\n<think>\n<Plan_1>\n"
    assert (ids, eos, size) == (hf(text, add_special_tokens=False).input_ids, hf.eos_token_id, len(hf))


def test_execution_names_are_one_token_when_asked(corpus: Path, tmp_path: Path) -> None:
    """--execution-names (the arithmetic task's plans cite several results at once): ` execution_1.2` up to the
    tag range is one token, in context too; without it the vocabulary is the one the Countdown demo was made with."""
    done = subprocess.run([sys.executable, "-m", "sprint", "mini-tokenizer", str(corpus), "--out", str(tmp_path / "t"),
                           "--execution-names"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    fast = Tokenizer.from_file(str(tmp_path / "t" / "tokenizer.json"))
    for name in (" execution_1.2", " execution_12.8"):
        assert len(fast.encode(name, add_special_tokens=False).ids) == 1
    assert len(fast.encode(" execution_13.1", add_special_tokens=False).ids) > 1  # beyond the range: text
    assert len(fast.encode("Based on execution_1.2, execution_12.8:", add_special_tokens=False).ids) == 6
    assert json.loads((tmp_path / "t" / "mini_tokenizer.json").read_text())["references"] == 12 * 8


def test_phrases_become_one_token_each(tmp_path: Path) -> None:
    """--phrases (the arithmetic task's equation parts): each match the corpus holds --min-frequency times is one
    token, in context too and as transformers rebuilds a qwen2 folder's tokenizer; rarer matches stay text."""
    problems = [arithmetic.draw_problem(random.Random(i), arithmetic.DrawConfig()) for i in range(40)]
    texts = [t.question + "\n" + t.thought for t in map(arithmetic.make_trace, problems)]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in [*texts, "Q + 9 = Z once ."]))
    cfg = MiniTokenizerConfig(corpus=[str(path)], out=str(tmp_path / "t"), fields="text", extra_text="none",
                              max_number=9, phrases=arithmetic.PHRASES)
    summary = make_tokenizer(cfg)
    fast = Tokenizer.from_file(str(tmp_path / "t" / "tokenizer.json"))
    line = "C * 7 = A , where A is 6 , so x * 7 = 6 , try each digit :\n1 * 7 = 7 , no ."
    assert fast.encode(line).tokens[:6] == ["C", " * 7 = A", "Ġ,", "Ġwhere", " A is", " 6"]
    assert " * 7 = 7" in fast.encode(line).tokens
    assert len(fast.encode(" + 9 = Z", add_special_tokens=False).ids) > 1  # seen once: not a phrase
    assert summary["phrase_tokens"] == len({m for t in texts for m in re.findall(arithmetic.PHRASES, t)
                                            if sum(x.count(m) for x in texts) >= 2})
    rebuilt = AutoTokenizer.from_pretrained(as_model_folder(tmp_path / "t", tmp_path / "model", "qwen2"))
    for text in texts[:5] + [line]:
        ids = rebuilt(text, add_special_tokens=False).input_ids
        assert ids == fast.encode(text, add_special_tokens=False).ids
        assert rebuilt.decode(ids) == text
    with pytest.raises(UserError, match="not a regular expression"):
        MiniTokenizerConfig(corpus=[str(path)], out=str(tmp_path / "u"), phrases="[+")
