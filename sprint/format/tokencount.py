"""Fast exact token counting: `tiktoken` built from a `tokenizer.json`, or `tokenizers` otherwise.

Counting tokens is most of what `evaluate` costs (~3 M tokens for 500 + 500 real trajectories).
The `tokenizers` BPE takes ~3-4 s for that on two cores; `tiktoken` runs the same algorithm about
three times faster. A byte-level BPE whose vocabulary ids are in merge order (Qwen2 and the
DeepSeek-R1-Distill-Qwen models: the vocabulary was made with tiktoken and converted) gives the
same ids either way, provided the pre-tokenizer regex, the normaliser (NFC) and the added tokens
are carried over. `fast_spec` accepts only tokenizers where every one of those is checked; all
others are counted with `tokenizers`, just slower. tests/test_tokencount.py proves identical ids on
a corpus of real math text and edge cases.

`load_counter(name)` is the entry point (cached); `TokenCounter.count_many(texts)` counts a batch;
`batch_counts(name, texts)` counts many overlapping texts, each distinct piece once.
`sprint.format.trajectory.load_tokenizer` stays THE loader of `tokenizers`/`transformers` objects; this
module calls it for the fallback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from sprint.core.files import atomic_write
from sprint.format.trajectory import load_tokenizer, tokenizer_source

# The pre-tokenizer regex of Qwen2 / DeepSeek-R1-Distill-Qwen tokenizers.
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_decoder() -> dict[int, int]:
    """GPT-2's byte-level alphabet, reversed: code point of the printable stand-in -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    points = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            points.append(256 + extra)
            extra += 1
    return dict(zip(points, printable))


_TO_LATIN1 = {point: chr(byte) for point, byte in _byte_decoder().items()}


def splits_at_lines(spec: dict) -> bool:
    """Is count(a + b) == count(a) + count(b) whenever `a` ends with a newline and `b` starts with a
    printable non-space ASCII character, for the tokenizer described by `spec` (tokenizer.json)?

    True for byte-level BPE with the Qwen2 pre-tokenizer: no pre-token runs past a newline into a
    non-space character (every alternative that matches a newline continues with newlines or
    whitespace only, and the regex has no look-behind), BPE works inside pre-tokens, NFC does not
    compose across a newline, and no added token strips whitespace or holds a newline.
    """
    if spec.get("truncation") or spec.get("padding"):
        return False
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout"):
        return False
    normalizer = spec.get("normalizer") or {"type": "NFC"}
    if normalizer.get("type") != "NFC":
        return False
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") if pre.get("type") == "Sequence" else None
    if not steps or len(steps) != 2:
        return False
    split, byte_level = steps
    if not (split.get("type") == "Split" and (split.get("pattern") or {}).get("Regex") == QWEN2_SPLIT
            and split.get("behavior") == "Isolated" and not split.get("invert")):
        return False
    if not (byte_level.get("type") == "ByteLevel" and not byte_level.get("add_prefix_space")
            and not byte_level.get("use_regex")):
        return False
    return not any(a.get("lstrip") or a.get("rstrip") or "\n" in a.get("content", "")
                   for a in spec.get("added_tokens") or [])


def fast_spec(spec: dict) -> tuple[dict[bytes, int], dict[str, int]] | None:
    """tiktoken's (mergeable ranks, special tokens) for `spec` when they provably give the ids
    `tokenizers` gives, else None.

    Checked: the Qwen2 pre-tokenizer and NFC (`splits_at_lines` covers both), a plain byte-level
    BPE (no dropout, no byte fallback, no word prefixes/suffixes, merges not skipped), every merge
    producing a vocabulary token whose id grows with the merge's priority (tiktoken merges by
    token id), and added tokens matched as written (not normalised, not single-word, none the start of another).
    """
    if not splits_at_lines(spec):
        return None
    model = spec["model"]
    if (model.get("byte_fallback") or model.get("ignore_merges") or model.get("continuing_subword_prefix")
            or model.get("end_of_word_suffix") or model.get("fuse_unk")):
        return None
    vocab: dict[str, int] = model.get("vocab") or {}
    last = -1
    for merge in model.get("merges") or []:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        rank = vocab.get(left + right)
        if rank is None or rank <= last:
            return None
        last = rank
    try:
        ranks = {token.translate(_TO_LATIN1).encode("latin-1"): rank for token, rank in vocab.items()}
    except UnicodeEncodeError:  # a token outside the byte-level alphabet
        return None
    if len(ranks) != len(vocab) or not all(bytes([b]) in ranks for b in range(256)):
        return None
    specials = {}
    for added in spec.get("added_tokens") or []:
        if added.get("normalized") or added.get("single_word"):
            return None
        specials[added["content"]] = added["id"]
    # tiktoken matches added tokens leftmost-first, `tokenizers` leftmost-longest: they differ only when
    # one added token starts another (the mini tokenizer's " 1" and " 12"); sorted, such a pair is adjacent.
    contents = sorted(specials)
    if any(b.startswith(a) for a, b in zip(contents, contents[1:])):
        return None
    return ranks, specials


@dataclass
class TokenCounter:
    """Counts tokens of many texts (no special tokens added), exactly as `tokenizers` would.

    `engine`: "tiktoken" or "tokenizers"; `splits_at_lines`: see `splits_at_lines`.
    """

    name: str
    engine: str
    splits_at_lines: bool
    _impl: Any

    def count_many(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        if self.engine == "tiktoken":
            # One thread: tiktoken's per-text thread pool costs more than it saves on short pieces,
            # and evaluate's other core is grading.
            encode, nfc = self._impl.encode, unicodedata.normalize
            return [len(encode(t if unicodedata.is_normalized("NFC", t) else nfc("NFC", t),
                               allowed_special="all", disallowed_special=())) for t in texts]
        tok = self._impl
        if tok.padding or tok.truncation:  # batch encoding would pad or cut; count one by one
            return [len(tok.encode(t, add_special_tokens=False).ids) for t in texts]
        return [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]

    def ids(self, text: str) -> list[int]:
        """The token ids (what the counts are the lengths of; tests compare the two engines)."""
        if self.engine == "tiktoken":
            return self._impl.encode(unicodedata.normalize("NFC", text), allowed_special="all", disallowed_special=())
        return self._impl.encode(text, add_special_tokens=False).ids

    def count(self, text: str) -> int:
        return self.count_many([text])[0] if text else 0


def _spec_file(name: str) -> Path | None:
    path = Path(tokenizer_source(name))
    if path.is_dir():
        path = path / "tokenizer.json"
    return path if path.is_file() else None


@lru_cache(maxsize=8)
def load_counter(name: str) -> TokenCounter:
    """The fastest exact counter for a tokenizer name (hub id or local folder/file; cached).

    `SPRINT_TOKENCOUNT=tokenizers` forces the `tokenizers` engine (to compare the two).
    """
    name = str(name)
    path = _spec_file(name)
    spec: dict | None = None
    if path is not None and os.environ.get("SPRINT_TOKENCOUNT") != "tokenizers":
        cached = _cached_encoding(name, path)
        if cached is not None:
            return TokenCounter(name, "tiktoken", True, cached)
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            spec = None  # the loader below names the problem
    found = fast_spec(spec) if spec is not None else None
    fast = _tiktoken_encoding(name, *found) if found is not None else None
    if fast is not None:
        assert path is not None and found is not None
        _save_encoding(path, *found)
        return TokenCounter(name, "tiktoken", True, fast)
    tok = load_tokenizer(name)
    if spec is None:
        spec = json.loads(tok.to_str())
    return TokenCounter(name, "tokenizers", splits_at_lines(spec), tok)


def _tiktoken_encoding(name: str, ranks: dict[bytes, int], specials: dict[str, int]) -> Any:
    """A tiktoken Encoding of checked ranks (`fast_spec`); None without tiktoken or when it refuses them."""
    try:
        import tiktoken  # optional speed-up: without it counting takes the `tokenizers` path
    except ImportError:
        return None
    try:
        return tiktoken.Encoding(f"sprint:{name}", pat_str=QWEN2_SPLIT, mergeable_ranks=ranks,
                                 special_tokens=specials)
    except Exception:  # noqa: BLE001 - a tiktoken that rejects the vocabulary: count with tokenizers
        return None


# Reading tokenizer.json and checking it takes ~0.3 s; the checked vocabulary is kept in the user's
# cache (keyed by the file's path, size and modification time), so the next evaluation starts at once.
CACHE_VERSION = 2  # 2: no tokenizer whose added tokens overlap (see fast_spec) is cached any more


def _cache_file(path: Path) -> Path | None:
    try:
        st = path.stat()
    except OSError:
        return None
    key = hashlib.sha256(f"{CACHE_VERSION}:{path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:24]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sprint" / "tokencount"
    return root / f"{key}.pickle"


def _cached_encoding(name: str, path: Path) -> Any:
    file = _cache_file(path)
    if file is None or not file.is_file():
        return None
    try:
        with open(file, "rb") as f:
            ranks, specials = pickle.load(f)  # our own file, written by _save_encoding
        return _tiktoken_encoding(name, ranks, specials)
    except Exception:  # noqa: BLE001 - unreadable or from another version: rebuilt from tokenizer.json
        with contextlib.suppress(OSError):
            file.unlink()
        return None


def _save_encoding(path: Path, ranks: dict[bytes, int], specials: dict[str, int]) -> None:
    file = _cache_file(path)
    if file is None or file.is_file():
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        data = pickle.dumps((ranks, specials), protocol=pickle.HIGHEST_PROTOCOL)
        atomic_write(file, data, private_tmp=True)  # several processes may write it at once
    except Exception:  # noqa: BLE001 - a read-only home: no cache, just a slower start
        pass


# A cut between a newline and a printable ASCII character (not a space): `splits_at_lines`'s safe cut.
_SAFE_CUT = re.compile(r"(?<=\n)(?=[!-~])")


def batch_counts(name: str, texts: Sequence[str]) -> dict[str, int]:
    """Token counts of many texts, equal to `token_counter(name)(text)` for each (and 0 for "").

    Every distinct piece of text is counted once: texts are cut into lines where that provably
    leaves the count unchanged (`splits_at_lines`), so the text shared by a plan's prompt prefixes,
    its whole plan and the total is encoded once; the distinct pieces go to `load_counter(name)`.
    """
    counter = load_counter(str(name))
    unique = list(dict.fromkeys(t for t in texts if t))
    out = {"": 0}
    if not unique:
        return out
    parts = {t: (_SAFE_CUT.split(t) if counter.splits_at_lines else [t]) for t in unique}
    pieces = list(dict.fromkeys(p for ps in parts.values() for p in ps if p))
    table = {"": 0, **dict(zip(pieces, counter.count_many(pieces)))}
    for t, ps in parts.items():
        out[t] = sum(table[p] for p in ps)
    return out
