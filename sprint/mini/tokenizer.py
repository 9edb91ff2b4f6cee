"""The mini experiment's own tokenizer: a small byte-level BPE learned from a corpus (`sprint mini-tokenizer`).

A tiny model trained on a CPU pays for every token, so the vocabulary fits the task's text: every
word and punctuation run the corpus uses often becomes one token (with the space before it, GPT-2
style), every number 0..999 written after a space is one token, and every SPRINT tag is one token (with
--execution-names, so is each execution's name as a later plan's `Based on` line cites it, ` execution_1.2`).
It is still a real tokenizer that anything can read: a Hugging Face `tokenizers` BPE saved as
tokenizer.json + tokenizer_config.json (ChatML special tokens and chat template), so transformers,
vLLM, ms-swift and `sprint.format.tokencount` load it like the R1 tokenizer. Same corpus and flags,
byte-identical files.

Two pipelines, because transformers 5 loads the tokenizer of every `qwen2` model folder as its
`Qwen2Tokenizer`, which rebuilds the pipeline from the vocabulary: NFC, then Qwen2's split (one
digit per piece), then bytes. `qwen2` (the default, for a Qwen2 model) is that pipeline, so
transformers, vLLM, ms-swift and a plain `tokenizers` load all cut text the same; numbers are added
tokens (` 123`), since the split never lets BPE join digits; decode(encode(text)) == NFC(text),
so == text for any NFC text (all the task writes), as with the R1 tokenizer. `exact` has no
normaliser and keeps digit runs whole for BPE: decode(encode(text)) == text for any text, but only a
model type transformers leaves alone can use it (`sprint mini-model --architecture qwen3`).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from sprint.core.data import load_rows
from sprint.core.errors import UserError
from sprint.core.files import atomic_write
from sprint.core.options import add_options, check_range, config_from, option
from sprint.core.resources import prompt_file
from sprint.format import tags
from sprint.format.tokencount import QWEN2_SPLIT

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # the first ids after the learned vocabulary, as in Qwen2
PAD_TOKEN = ENDOFTEXT
# A chat model ends its turn with <|im_end|> (ms-swift's chatml template trains it to): vLLM must stop there.
EOS_TOKEN = IM_END

QWEN2, EXACT = "qwen2", "exact"
PIPELINES = (QWEN2, EXACT)
# The exact pipeline's pieces: a word, a number or a punctuation run, each with the one space before
# it; newline runs (with the spaces before them); other whitespace. Digits stay together.
EXACT_SPLIT = r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s*[\r\n]+|\s+(?!\S)|\s+"
SPLITS = {QWEN2: QWEN2_SPLIT, EXACT: EXACT_SPLIT}

# ChatML without a default system turn: exactly what ms-swift's `chatml` template renders, so the
# text a model is trained on (swift sft --template chatml) is the text it is served
# (`sprint.format.prompt_format` renders the user turn with this and continues from `<think>\n`).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

NUMBER_FORMS = ("spaced", "bare", "both")
DEFAULT_FIELDS = "question,problem,thought,solution,answer,text,messages"
SUMMARY_FILE = "mini_tokenizer.json"


def sprint_tags(max_phase: int = 12, max_prompt: int = 8) -> list[str]:
    """Every tag of the format up to phase `max_phase` and prompt `max_prompt` (from `sprint.format.tags`)."""
    out = [tags.QUESTION, tags.QUESTION_END, tags.THINK, tags.THINK_END, tags.FINAL, tags.FINAL_END,
           "<prompt>", "</prompt>"]  # the unnumbered prompt tag a model may write (tags.TAG_RE knows it)
    for p in range(1, max_phase + 1):
        out += [tags.plan_open(p), tags.plan_close(p), tags.executions_open(p), tags.executions_close(p)]
        for k in range(1, max_prompt + 1):
            name = f"{p}.{k}"
            out += [tags.prompt_open(name), tags.prompt_close(name),
                    tags.execution_open(name), tags.execution_close(name)]
    assert all(tags.TAG_RE.fullmatch(t) for t in out)
    return out


@dataclass
class MiniTokenizerConfig:
    """What the tokenizer is learned from and what it must hold."""

    corpus: list[str] = option(help="texts to learn from: .jsonl/.json/.parquet files or stage folders (one or more)",
                               flags=("corpus",))
    out: str = option(help="folder to write tokenizer.json, tokenizer_config.json, special_tokens_map.json into",
                      flags=("--out", "-o"))
    fields: str = option(DEFAULT_FIELDS, "comma-separated columns holding text; a list column (chat `messages`) "
                         "gives each item's text or `content`; columns a row lacks are skipped")
    extra_text: str = option(str(prompt_file("agent")), "a text file learned as if it were --min-frequency corpus "
                             "texts (the agent prompt every SFT example and call carries); `none` for nothing",
                             metavar="FILE")
    pipeline: str = option(QWEN2, "qwen2: the pipeline transformers gives every qwen2 model folder (NFC, one digit "
                           "per piece, numbers as added tokens; exact round trip for NFC text); exact: no normaliser, "
                           "digit runs whole, exact round trip for any text (needs a model type other than qwen2)",
                           choices=PIPELINES)
    vocab_size: int = option(4096, "cap on the learned BPE vocabulary (256 bytes + merges; special tokens, tags and "
                             "qwen2's number tokens come on top); learning stops earlier when no piece is "
                             "--min-frequency common")
    min_frequency: int = option(2, "a word or punctuation run (exact: also a number) seen this often becomes one token")
    max_number: int = option(999, "numbers 0..N are one token each (in the --number-forms)")
    number_forms: str = option("spaced", "which numbers are one token: spaced (' 123', as the task writes them), bare "
                               "('123', e.g. at a line start; about 1000 more tokens) or both", choices=NUMBER_FORMS)
    execution_names: bool = option(False, "also make each execution's name as a later plan's `Based on` line cites it "
                                   "(` execution_1.2`) one token, up to --max-phase and --max-prompt (the arithmetic "
                                   "task's plans cite several at once)")
    phrases: str = option("", "a regular expression: each text it matches in the corpus at least --min-frequency "
                          "times becomes one token (the arithmetic task's equation parts: a copy of one token is "
                          "learned far sooner than of three; docs/experiments.md, \"Digit equations\")",
                          metavar="REGEX")
    max_phase: int = option(12, "tags are single tokens up to this phase (<Plan_12>)")
    max_prompt: int = option(8, "... and up to this prompt number (<prompt_12.8>)")
    model_max_length: int = option(4096, "tokenizer_config's model_max_length (the longest sequence meant)")

    def __post_init__(self) -> None:
        for name, low in (("vocab_size", 257), ("min_frequency", 1), ("max_number", 0), ("max_phase", 1),
                          ("max_prompt", 1), ("model_max_length", 16)):
            check_range(MiniTokenizerConfig, name, getattr(self, name), low)

        try:
            re.compile(self.phrases)
        except re.error as exc:
            raise UserError(f"--phrases {self.phrases!r} is not a regular expression ({exc})") from None

    def field_names(self) -> list[str]:
        names = [f.strip() for f in self.fields.split(",") if f.strip()]
        if not names:
            raise UserError("--fields names no column; pass e.g. --fields question,thought")
        return names


def row_texts(row: dict[str, Any], fields: Sequence[str]) -> Iterator[str]:
    """The texts of one corpus row: string columns, and the strings or `content`s of list columns."""
    for name in fields:
        value = row.get(name)
        items = value if isinstance(value, list) else [value]
        for item in items:
            text = item.get("content") if isinstance(item, dict) else item
            if isinstance(text, str) and text:
                yield text


def read_corpus(sources: Sequence[str], fields: Sequence[str]) -> list[str]:
    texts = []
    for source in sources:
        rows = load_rows(source, split=None, flag="CORPUS")
        found = [t for row in rows for t in row_texts(row, fields)]
        if not found:
            raise UserError(f"{source} has no text in the columns {', '.join(fields)}; "
                            "name the text columns with --fields")
        texts += found
    return texts


def _untagged(texts: Sequence[str]) -> Iterator[str]:
    """The texts cut at tags and special tokens: those become tokens of their own, not merges."""
    cut = re.compile(tags.TAG_RE.pattern + "|" + "|".join(re.escape(s) for s in SPECIAL_TOKENS))
    for text in texts:
        for piece in cut.split(text):
            if piece:
                yield piece


def reference_pieces(cfg: MiniTokenizerConfig) -> list[str]:
    """` execution_1.2` as a later plan's `Based on` line names an earlier result (--execution-names)."""
    if not cfg.execution_names:
        return []
    return [f" execution_{p}.{k}" for p in range(1, cfg.max_phase + 1) for k in range(1, cfg.max_prompt + 1)]


def phrase_pieces(texts: Sequence[str], cfg: MiniTokenizerConfig) -> list[str]:
    """The --phrases matches seen at least --min-frequency times, sorted (the same corpus, the same ids)."""
    if not cfg.phrases:
        return []
    pattern = re.compile(cfg.phrases)
    counts = Counter(m[0] for text in texts for m in pattern.finditer(text) if m[0])
    return sorted(p for p, n in counts.items() if n >= cfg.min_frequency)


def number_pieces(cfg: MiniTokenizerConfig) -> list[str]:
    """The numbers that must be one token, in their forms (a bare digit is a byte token anyway)."""
    spaced = [f" {n}" for n in range(cfg.max_number + 1)] if cfg.number_forms != "bare" else []
    bare = [str(n) for n in range(10, cfg.max_number + 1)] if cfg.number_forms != "spaced" else []
    return spaced + bare


def empty_tokenizer(pipeline: str) -> Tokenizer:
    """The pipeline around the BPE model (qwen2: exactly what transformers' Qwen2Tokenizer rebuilds)."""
    tok = Tokenizer(models.BPE())
    if pipeline == QWEN2:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[pipeline]), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def _added(content: str, special: bool = False) -> AddedToken:
    return AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)


def train_tokenizer(texts: Sequence[str], cfg: MiniTokenizerConfig, extra: str = "",
                    phrases: Sequence[str] = ()) -> Tokenizer:
    """Learn the BPE merges from the texts (plus `extra`), then add special tokens, tags, numbers and phrases."""
    tok = empty_tokenizer(cfg.pipeline)
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, min_frequency=cfg.min_frequency,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # exact: digit runs are pieces, so BPE learns the numbers when it sees each often enough
    numbers = number_pieces(cfg) * cfg.min_frequency if cfg.pipeline == EXACT else []
    learned = [*_untagged(texts), *([extra] * cfg.min_frequency if extra else []), *numbers]
    tok.train_from_iterator(learned, trainer, length=len(learned))
    tok.add_special_tokens([_added(t, special=True) for t in SPECIAL_TOKENS])
    # Not special: tags are text of the format, so decode(skip_special_tokens=True) keeps them.
    tok.add_tokens([_added(t) for t in sprint_tags(cfg.max_phase, cfg.max_prompt)])
    tok.add_tokens([_added(t) for t in reference_pieces(cfg)])  # none without --execution-names
    if cfg.pipeline == QWEN2:  # its split gives one digit per piece, so BPE can never join a number
        tok.add_tokens([_added(n) for n in number_pieces(cfg)])
    tok.add_tokens([_added(p) for p in phrases])  # added tokens match first, the longest where several start
    return tok


def missing_pieces(tok: Tokenizer, cfg: MiniTokenizerConfig) -> list[str]:
    """Guaranteed pieces (numbers, tags, special tokens) that are not one token; [] when all are."""
    wanted = [*number_pieces(cfg), *sprint_tags(cfg.max_phase, cfg.max_prompt), *reference_pieces(cfg), *SPECIAL_TOKENS]
    return [w for w in wanted if len(tok.encode(w, add_special_tokens=False).ids) != 1]


def common_pieces(tok: Tokenizer, texts: Sequence[str], cfg: MiniTokenizerConfig) -> tuple[int, list[str]]:
    """(how many distinct pre-tokens the corpus uses at least --min-frequency times, those not one token)."""
    counts: Counter[str] = Counter()
    split = pre_tokenizers.Split(Regex(SPLITS[cfg.pipeline]), behavior="isolated")
    for piece in _untagged(texts):
        counts.update(p for p, _ in split.pre_tokenize_str(piece))
    common = [p for p, n in counts.items() if n >= cfg.min_frequency]
    return len(common), sorted(p for p in common if len(tok.encode(p, add_special_tokens=False).ids) != 1)


def tokenizer_config(cfg: MiniTokenizerConfig, tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json: what transformers needs beyond tokenizer.json (class, roles, chat template)."""
    decoder = {str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized, "rstrip": t.rstrip,
                        "single_word": t.single_word, "special": t.special}
               for i, t in sorted(tok.get_added_tokens_decoder().items())}
    return {
        # qwen2: the class transformers picks for a qwen2 model folder anyway, named so it is not a surprise
        "tokenizer_class": "Qwen2Tokenizer" if cfg.pipeline == QWEN2 else "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": cfg.model_max_length,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": decoder,
    }


def special_tokens_map() -> dict[str, Any]:
    return {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}


def _json(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


def corpus_stats(tok: Tokenizer, texts: Sequence[str]) -> dict[str, Any]:
    """Token counts of the corpus with the new tokenizer (what a training step will cost)."""
    counts = [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]
    chars = sum(len(t) for t in texts)
    total = sum(counts)
    return {"texts": len(texts), "tokens": total, "mean_tokens_per_text": round(total / len(texts), 2),
            "max_tokens_per_text": max(counts), "chars_per_token": round(chars / max(total, 1), 2)}


def make_tokenizer(cfg: MiniTokenizerConfig) -> dict[str, Any]:
    """Learn the tokenizer from `cfg.corpus`, check it, write it to `cfg.out`; returns the summary written beside it."""
    texts = read_corpus(cfg.corpus, cfg.field_names())
    extra = ""
    if cfg.extra_text.lower() != "none":
        try:
            extra = Path(cfg.extra_text).read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read --extra-text {cfg.extra_text} ({exc.strerror}); "
                            "pass a text file or none") from None
    phrases = phrase_pieces(texts, cfg)
    tok = train_tokenizer(texts, cfg, extra, phrases)
    missing = missing_pieces(tok, cfg)
    if missing:
        shown = ", ".join(repr(m) for m in missing[:5])
        raise UserError(f"{len(missing)} numbers are not single tokens (e.g. {shown}): the BPE vocabulary cap "
                        f"was reached first; raise --vocab-size (now {cfg.vocab_size})")
    n_common, split_common = common_pieces(tok, texts, cfg)
    summary = {
        "pipeline": cfg.pipeline,
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "bpe_vocab_size": tok.get_vocab_size(with_added_tokens=False),
        "tags": len(sprint_tags(cfg.max_phase, cfg.max_prompt)),
        "references": len(reference_pieces(cfg)),
        "number_tokens": len(number_pieces(cfg)) if cfg.pipeline == QWEN2 else 0,  # added; exact learns them
        "phrase_tokens": len(phrases),
        "special_tokens": {t: tok.token_to_id(t) for t in SPECIAL_TOKENS},
        "common_pieces": n_common,
        "common_pieces_split": len(split_common),
        "common_pieces_split_examples": split_common[:20],
        "corpus": corpus_stats(tok, texts),
        # where the files came from and went is left out: the same corpus gives the same folder anywhere
        "config": {k: v for k, v in asdict(cfg).items() if k not in ("corpus", "out", "extra_text")},
    }
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "tokenizer.json", tok.to_str(pretty=True) + "\n")
    atomic_write(out / "tokenizer_config.json", _json(tokenizer_config(cfg, tok)))
    atomic_write(out / "special_tokens_map.json", _json(special_tokens_map()))
    atomic_write(out / SUMMARY_FILE, _json(summary))
    return summary


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Learn the mini experiment's tokenizer from a corpus: a byte-level BPE in which every common word "
        "and punctuation run of the corpus, every number 0..--max-number after a space and every SPRINT "
        "tag is one token; ChatML special tokens and chat template. --pipeline qwen2 (default) cuts text "
        "exactly as transformers' Qwen2Tokenizer, which transformers 5 uses for every qwen2 model folder "
        "whatever tokenizer.json says; --pipeline exact round-trips any text but needs another model type. "
        "Writes a folder any Hugging Face loader reads (AutoTokenizer, vLLM, ms-swift) plus "
        f"{SUMMARY_FILE} (vocabulary size, tokens per corpus text). Same corpus, same files, byte for byte."
    )
    add_options(parser, MiniTokenizerConfig)


def handle(args: argparse.Namespace) -> int:
    cfg = config_from(MiniTokenizerConfig, args)
    summary = make_tokenizer(cfg)
    stats = summary["corpus"]
    print(f"{cfg.pipeline} tokenizer written to {cfg.out}: vocabulary {summary['vocab_size']} "
          f"({summary['bpe_vocab_size']} BPE, {len(SPECIAL_TOKENS)} special, {summary['tags']} tags, "
          f"{summary['references']} execution names, {summary['number_tokens']} numbers, "
          f"{summary['phrase_tokens']} phrases); {stats['texts']} corpus texts, {stats['mean_tokens_per_text']} tokens "
          f"per text on average ({stats['chars_per_token']} characters per token)")
    if summary["common_pieces_split"]:
        print(f"note: {summary['common_pieces_split']} common pieces are still split (the --vocab-size cap), "
              f"e.g. {summary['common_pieces_split_examples'][:5]}")
    return 0
