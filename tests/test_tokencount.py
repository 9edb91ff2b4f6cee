"""The fast counting engine (tiktoken built from tokenizer.json) gives exactly the ids of `tokenizers`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from sprint.format.tokencount import batch_counts, fast_spec, load_counter
from sprint.format.trajectory import token_counter

TOKENIZERS = ("deepseek-r1-distill-qwen-7b", "qwen2.5-7b-instruct")

EDGE_CASES = [
    "",
    " ",
    "\n\n\n",
    "  leading and trailing  ",
    "tabs\tand\r\nwindows\rlines\n\n  \n",
    "It's they'RE we'll I'M you'd IT'S",
    "12345678901234567890 3.14159 1,000,000 -42 x^{10}",
    "café cafe\u0301 Å A\u030a ﬁ ①",  # NFC composes the decomposed ones
    "数学问题：求 $x^2 = 4$ 的解。 Ελληνικά русский עברית العربية",
    "emoji 🙂🚀 flags 🇫🇷 zwj 👩‍💻",
    "<think>\nreasoning\n</think>\n\nanswer <｜User｜>hi<｜Assistant｜> <|im_start|>user<|im_end|> <|endoftext|>",
    "<Plan_1>\nplan <prompt_1.1> do it </prompt_1.1>\n</Plan_1>\n\n<Execution_1>\n<execution_1.1>\nx\n</execution_1.1>\n</Execution_1>",
    "\\[\\frac{a}{b} + \\sqrt{\\left(\\dfrac{1}{2}\\right)}\\]   $$\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}$$",
    "a" * 3000 + " " + "ab" * 1000 + "\n" * 50 + " " * 50 + "!" * 40,
    "\x00\x01\x7f control \u200b zero width \ufeff bom",
]


def _corpus(shared_data: Path) -> list[str]:
    rows = [json.loads(line) for line in open(shared_data / "math500" / "test.jsonl", encoding="utf-8")]
    texts = [r["problem"] for r in rows] + [r["solution"] for r in rows]
    texts += ["\n\n".join(r["solution"] for r in rows[i:i + 20]) for i in range(0, len(rows), 20)]  # long texts
    return texts + EDGE_CASES


@pytest.mark.parametrize("name", TOKENIZERS)
def test_tiktoken_engine_gives_identical_ids(shared_data: Path, name: str) -> None:
    folder = shared_data / "tokenizers" / name
    counter = load_counter(str(folder))
    assert counter.engine == "tiktoken" and counter.splits_at_lines
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = _corpus(shared_data)
    for text in texts:
        assert counter.ids(text) == reference.encode(text, add_special_tokens=False).ids, text[:80]
    assert counter.count_many(texts) == [len(reference.encode(t, add_special_tokens=False).ids) for t in texts]


def _tampered(shared_data: Path, tmp_path: Path, change) -> Path:
    spec = json.loads((shared_data / "tokenizers" / TOKENIZERS[0] / "tokenizer.json").read_text(encoding="utf-8"))
    change(spec)
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return folder


def _swap_merges(spec: dict) -> None:
    merges = spec["model"]["merges"]
    merges[1000], merges[2000] = merges[2000], merges[1000]


def _other_regex(spec: dict) -> None:
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+"


@pytest.mark.parametrize("change", [_swap_merges, _other_regex])
def test_unproven_tokenizers_fall_back_to_tokenizers(shared_data: Path, tmp_path: Path, change) -> None:
    """Merges out of id order or another pre-tokenizer: tiktoken could differ, so it is not used."""
    folder = _tampered(shared_data, tmp_path, change)
    spec = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert fast_spec(spec) is None
    counter = load_counter(str(folder))
    assert counter.engine == "tokenizers"
    plain = token_counter(str(folder))
    texts = _corpus(shared_data)[:50] + EDGE_CASES
    assert counter.count_many(texts) == [plain(t) for t in texts]
    assert batch_counts(str(folder), texts) == {"": 0, **{t: plain(t) for t in texts}}


def test_batch_counts_equal_plain_counts_with_either_engine(shared_data: Path, monkeypatch) -> None:
    folder = str(shared_data / "tokenizers" / TOKENIZERS[0])
    texts = _corpus(shared_data)[:300] + EDGE_CASES
    plain = token_counter(folder)
    want = {"": 0, **{t: plain(t) for t in texts}}
    assert batch_counts(folder, texts) == want
    load_counter.cache_clear()
    monkeypatch.setenv("SPRINT_TOKENCOUNT", "tokenizers")
    try:
        assert load_counter(folder).engine == "tokenizers"
        assert batch_counts(folder, texts) == want
    finally:
        load_counter.cache_clear()


def test_the_checked_vocabulary_is_cached_and_a_bad_cache_is_rebuilt(shared_data: Path, tmp_path: Path,
                                                                      monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = str(shared_data / "tokenizers" / TOKENIZERS[0])
    texts = _corpus(shared_data)[:100] + EDGE_CASES
    load_counter.cache_clear()
    try:
        first = load_counter(folder).count_many(texts)
        cached = list((tmp_path / "sprint" / "tokencount").glob("*.pickle"))
        assert len(cached) == 1
        load_counter.cache_clear()
        assert load_counter(folder).engine == "tiktoken" and load_counter(folder).count_many(texts) == first
        cached[0].write_bytes(b"not a pickle")
        load_counter.cache_clear()
        assert load_counter(folder).engine == "tiktoken" and load_counter(folder).count_many(texts) == first
        assert cached[0].read_bytes().startswith(b"\x80")  # rewritten as a pickle
    finally:
        load_counter.cache_clear()
    plain = token_counter(folder)
    assert first == [plain(t) for t in texts]
