"""Answer comparisons: MATH (Math-Verify + normalisation), GPQA letters, Countdown.

The task adapters (`sprint.tasks.registry`) decide which comparison a task uses; this module knows no
task names.

Why this shape:
- Math-Verify guards its sympy work with SIGALRM, which only works on the main thread. Here the
  alarm is used on the main thread (and inside worker processes, which run on their own main
  thread); off the main thread Math-Verify runs without it, and inputs that could make sympy
  run away (towers of powers, huge literals, very long strings) go to a short-lived subprocess
  that is killed when it overruns. So every function here is correct from any thread.
- A pure-Python normaliser runs first: when both sides normalise to the same string the answer
  is correct without touching sympy, which makes grading many items fast.
- A missing or empty prediction is always wrong.
"""

from __future__ import annotations

import ast
import logging
import math
import multiprocessing
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from sprint.core.errors import UserError
from sprint.format.boxed import braced, last_boxed

# Seconds Math-Verify may spend on one parse or one comparison before the answer counts as wrong.
DEFAULT_TIMEOUT_S = 5

# Below this many items that need sympy a process pool costs more than it saves: spawning
# workers and importing sympy in each takes seconds; one comparison takes milliseconds.
MIN_ITEMS_FOR_POOL = 1000


class _DropTimeoutNotice(logging.Filter):
    """Math-Verify warns once that its timeout is off; this module provides its own guard."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    _logger = logging.getLogger(_name)
    if not any(isinstance(f, _DropTimeoutNotice) for f in _logger.filters):
        _logger.addFilter(_DropTimeoutNotice())


# --------------------------------------------------------------------------- normalisation

_TEXT_CMDS = r"text|textbf|textit|textrm|textnormal|mathrm|mathbf|mathit|mbox|operatorname"
_TEXT_RE = re.compile(r"\\(?:" + _TEXT_CMDS + r")\s*\{([^{}]*)\}")
_UNIT_TAIL_RE = re.compile(
    r"^(?P<num>.*?[0-9}])\s*\\(?:text|mbox|mathrm|textrm)\s*\{\s*(?P<unit>[A-Za-z][A-Za-z .']*)\}"
    r"(?:\s*\^\s*\{?\s*[23]\s*\}?)?$"
)
_UNIT_WORDS = (
    "mm|cm|m|km|in|inch|inches|ft|foot|feet|yd|yard|yards|mi|mile|miles|meter|meters|metre|metres|"
    "centimeters|kilometers|units|square units|sq units|degrees|dollars|cents|seconds|minutes|"
    "hours|days|weeks|months|years|mph|pounds|ounces|grams|kg|liters|gallons|people|ways"
)
_PLAIN_UNIT_RE = re.compile(
    r"^(?P<num>-?\d[\d,]*(?:\.\d+)?)\s+(?:" + _UNIT_WORDS + r")(?:\s*\^\s*\{?[23]\}?)?$"
)
_ASSIGN_RE = re.compile(r"^(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?(?:=|\\in(?![A-Za-z]))")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DECIMAL_RE = re.compile(r"^(-?)(\d*)\.(\d*)$")
_BASE_RE = re.compile(r"^(\d+)_\{?(\d+)\}?$")
_MIXED_RE = re.compile(r"^(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_SIMPLE_FRAC_RE = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(\d+)\}$")


def _strip_wrappers(s: str) -> str:
    """Remove math delimiters and trailing punctuation around an answer."""
    s = s.strip()
    changed = True
    while changed and s:
        changed = False
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
                s = s[len(left) : len(s) - len(right)].strip()
                changed = True
        if s.endswith((".", ";")):
            s = s[:-1].rstrip()
            changed = True
    return s


def _squeeze_spaces(s: str) -> str:
    """Drop whitespace except where it separates a command or word from a following letter."""
    return re.sub(r"\s+", lambda m: " " if _keeps_space(s, m) else "", s)


def _keeps_space(s: str, m: re.Match) -> bool:
    before = s[m.start() - 1] if m.start() > 0 else ""
    after = s[m.end()] if m.end() < len(s) else ""
    return before.isalpha() and after.isalpha()


def clean_latex(answer: str) -> str:
    """Meaning-preserving clean-up of a LaTeX answer (fed to Math-Verify as well)."""
    s = answer
    if "\\boxed" in s or "\\fbox" in s:
        s = last_boxed(s) or s
    s = _strip_wrappers(s)
    s = s.replace("\\displaystyle", "")
    s = re.sub(r"\\(?:left|right|[bB]igg?[lr]?)(?![A-Za-z])\s*", "", s)
    # spacing commands, keeping `\\` (a row break in matrices) intact
    s = re.sub(
        r"\\\\|\\[,;:! ]|\\q?quad(?![A-Za-z])|~",
        lambda m: m.group(0) if m.group(0) == "\\\\" else " ",
        s,
    )
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\\dbinom(?![A-Za-z])", r"\\binom", s)
    s = s.replace("{,}", ",")
    # degrees, percent and currency signs carry no value of their own in MATH answers
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree(?![A-Za-z])", "", s)
    s = re.sub(r"\\?%", "", s)
    s = re.sub(r"\\\$|\$", "", s)
    s = s.strip()
    # units: `5\text{ cm}`, `15\mbox{ cm}^2`, `5 cm`
    m = _UNIT_TAIL_RE.match(s)
    if m and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", m.group("num"))):
        s = m.group("num").strip()
    m = _PLAIN_UNIT_RE.match(s)
    if m:
        s = m.group("num")
    return _squeeze_spaces(s).strip()


def _unwrap_text(s: str) -> str:
    prev = None
    while prev != s:
        prev = s
        s = _TEXT_RE.sub(lambda m: m.group(1), s)
    return s


def _expand_shorthand(s: str) -> str:
    """`\\frac34` -> `\\frac{3}{4}`, `\\frac{270}7` -> `\\frac{270}{7}`, `\\sqrt2` -> `\\sqrt{2}`.

    Only one token is taken, as LaTeX does: `\\frac345` is `\\frac{3}{4}5`."""
    s = re.sub(r"\\frac\s*([0-9A-Za-z])\s*([0-9A-Za-z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*([0-9A-Za-z])\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*([0-9A-Za-z])", r"\\frac\1{\2}", s)
    s = re.sub(r"\\sqrt\s*([0-9A-Za-z])", r"\\sqrt{\1}", s)
    return s


def normalize_answer(answer: str) -> str:
    """Canonical string form of a MATH answer: equal forms mean equal answers.

    The converse does not hold (`0.5` vs `\\frac{1}{2}`); Math-Verify decides those."""
    s = _expand_shorthand(_unwrap_text(clean_latex(answer)))
    m = _ASSIGN_RE.match(s)
    if m and "=" not in s[m.end() :] and s[m.end() :]:
        s = s[m.end() :].strip()
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    m = _BASE_RE.match(s)
    if m:
        s = m.group(1)
    m = _MIXED_RE.match(s)
    if m:
        sign, whole, num, den = m.groups()
        s = f"{sign}\\frac{{{int(whole) * int(den) + int(num)}}}{{{den}}}"
    m = _SIMPLE_FRAC_RE.match(s)
    if m:
        s = f"{m.group(1)}{m.group(2)}/{m.group(3)}"
    m = _DECIMAL_RE.match(s)
    if m and (m.group(2) or m.group(3)):
        whole, frac = m.group(2) or "0", m.group(3).rstrip("0")
        s = f"{m.group(1)}{whole}" + (f".{frac}" if frac else "")
    m = re.match(r"^\(([A-Z])\)$", s)
    if m:
        s = m.group(1)
    if re.fullmatch(r"[A-Za-z][A-Za-z ]{3,}", s):
        s = s.lower()
    return s


def _is_word_answer(gold: str) -> bool:
    """Gold like `\\text{Evelyn}`: compare as words, not as a product of letter symbols."""
    core = clean_latex(gold)
    m = re.fullmatch(
        r"\\(?:text|textbf|textit|textrm|mbox|mathrm)\s*\{\s*([A-Za-z][A-Za-z ']+)\}", core
    )
    return m is not None and len(m.group(1).strip()) >= 2


def _words(answer: str) -> str:
    return re.sub(r"\s+", " ", _unwrap_text(clean_latex(answer))).strip().lower()


# --------------------------------------------------------------------------- Math-Verify


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _risky(s: str) -> bool:
    """Inputs that can make sympy compute for minutes (no SIGALRM off the main thread)."""
    if len(s) > 300:
        return True
    if re.search(r"\^\s*\{[^{}]*\^|\^\s*\d+\s*\^", s):  # towers of powers
        return True
    if re.search(r"[\^!]|\\binom|\\choose|\\cdot|\*\*", s) and re.search(r"\d{5,}", s):
        return True
    return bool(re.search(r"\d{40,}", s))


def _mv_verify(gold: str, pred: str, timeout_s: int | None) -> bool:
    """One Math-Verify comparison; `timeout_s=None` means no SIGALRM (safe off the main thread)."""
    from math_verify import parse, verify  # imported lazily: sympy takes a while to load

    gold_parsed = parse(f"${gold}$", parsing_timeout=timeout_s)
    pred_parsed = parse(f"${pred}$", parsing_timeout=timeout_s)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s))


def _subprocess_entry(gold: str, pred: str, timeout_s: int, conn) -> None:
    try:
        conn.send(_mv_verify(gold, pred, timeout_s))
    except Exception:  # noqa: BLE001 - any failure in the child is a wrong answer
        conn.send(False)
    finally:
        conn.close()


def _mv_in_subprocess(gold: str, pred: str, timeout_s: int) -> bool:
    """Run a risky comparison in its own process (SIGALRM works there); kill it if it overruns."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_subprocess_entry, args=(gold, pred, timeout_s, send), daemon=True)
    proc.start()
    send.close()
    try:
        # start-up (imports) + three timed steps (two parses, one comparison) + slack
        if recv.poll(30 + 3 * timeout_s):
            return bool(recv.recv())
        return False
    except EOFError:
        return False
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()


def _sympy_equal(gold: str, pred: str, timeout_s: float) -> bool:
    """Math-Verify on cleaned strings, with a timeout that works in the calling thread."""
    gold_c, pred_c = clean_latex(gold), clean_latex(pred)
    if not gold_c or not pred_c:
        return False
    timeout_s = max(1, math.ceil(timeout_s))  # signal.alarm takes whole seconds
    if _on_main_thread():
        return _mv_verify(gold_c, pred_c, timeout_s)
    if _risky(gold_c) or _risky(pred_c):
        return _mv_in_subprocess(gold_c, pred_c, timeout_s)
    return _mv_verify(gold_c, pred_c, None)


def _fast_math(pred: str | None, gold: str) -> bool | None:
    """Decide without sympy when possible: True/False, or None when sympy must decide."""
    if pred is None or not str(pred).strip():
        return False
    pred_n = normalize_answer(pred)
    if not pred_n:
        return False
    if pred_n == normalize_answer(gold):
        return True
    if _is_word_answer(gold):
        return _words(pred) == _words(gold)
    return None


def grade_math(pred: str | None, gold: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Is `pred` (an answer string, e.g. the boxed content) equivalent to the MATH gold answer?"""
    fast = _fast_math(pred, gold)
    if fast is not None:
        return fast
    return _sympy_equal(gold, str(pred), timeout_s)


# --------------------------------------------------------------------------- GPQA

_GPQA_KEYWORD_RE = re.compile(
    r"(?i:option|choice|answer(?:\s+is)?)\s*[:=]?\s*"
    r"(?:[\(\[]([A-Za-z])[\)\]]|\(?([A-Z])(?![A-Za-z]))"
)


def gpqa_letter(text: str | None, letters: str = "ABCD") -> str | None:
    """The option letter an answer names, or None; never reads a letter out of a word."""
    if text is None:
        return None
    s = text
    if "\\boxed" in s or "\\fbox" in s:
        s = last_boxed(s) or s
    s = _unwrap_text(_strip_wrappers(s)).replace("$", "").strip()
    s = re.sub(r"\*\*|__", "", s).strip()
    allowed = set(letters.upper())

    def pick(letter: str) -> str | None:
        letter = letter.upper()
        return letter if letter in allowed else None

    m = re.fullmatch(r"[\(\[\{]?\s*([A-Za-z])\s*[\)\]\}]?[.:]?", s)
    if m:
        return pick(m.group(1))
    paren = {x for x in re.findall(r"\(([A-Z])\)", s) if x in allowed}
    m = re.match(r"^[\(\[]?([A-Z])[\)\]\.:](?:\s|$)", s)
    if m:  # "A) text", "(B) text"; but "(A) or (B)" names no single option
        return pick(m.group(1)) if paren <= {m.group(1)} else None
    hits = [(a or b).upper() for a, b in _GPQA_KEYWORD_RE.findall(s)]
    hits = [x for x in hits if x in allowed]
    if hits:
        return hits[-1]
    if len(paren) == 1:
        return paren.pop()
    return None


def grade_gpqa(pred: str | None, gold_letter: str, *, letters: str = "ABCD") -> bool:
    """Does the prediction name the gold option letter?"""
    gold = gpqa_letter(gold_letter, letters)
    if gold is None:
        raise UserError(
            f"GPQA gold answer {gold_letter!r} is not an option letter ({letters}); "
            "pass the letter of the correct option"
        )
    return gpqa_letter(pred, letters) == gold


# --------------------------------------------------------------------------- Countdown

_MAX_COUNTDOWN_CHARS = 500


def _latex_frac_to_div(s: str) -> str:
    """`\\frac{a}{b}` -> `((a)/(b))`, innermost first so nested fractions work."""
    for _ in range(50):
        i = s.rfind("\\frac")
        if i < 0:
            return s
        j = i + len("\\frac")
        while j < len(s) and s[j] == " ":
            j += 1
        first = braced(s, j) if j < len(s) and s[j] == "{" else None
        if first is None:
            return s
        k = first[1]
        while k < len(s) and s[k] == " ":
            k += 1
        second = braced(s, k) if k < len(s) and s[k] == "{" else None
        if second is None:
            return s
        s = s[:i] + f"(({first[0]})/({second[0]}))" + s[second[1] :]
    return s


def _normalize_countdown(expr: str) -> str:
    s = expr
    if "\\boxed" in s or "\\fbox" in s:
        s = last_boxed(s) or s
    s = _strip_wrappers(s)
    s = s.replace("$", "")
    s = _latex_frac_to_div(s)
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = re.sub(r"\\times(?![A-Za-z])|×|\\cdot(?![A-Za-z])|·|∗|⋅", "*", s)
    s = re.sub(r"\\div(?![A-Za-z])|÷|:|∕", "/", s)
    s = re.sub(r"[−–—]", "-", s)
    s = re.sub(r"\\[,;! ]", " ", s)
    s = s.replace("\\{", "(").replace("\\}", ")")
    s = s.replace("{", "(").replace("}", ")").replace("[", "(").replace("]", ")")
    return s.strip()


def _countdown_value(node: ast.AST, used: list[int]) -> Fraction:
    """Exact value of an expression tree made only of the four operations and whole numbers."""
    if isinstance(node, ast.Expression):
        return _countdown_value(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp):
        left = _countdown_value(node.left, used)
        right = _countdown_value(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left / right  # ZeroDivisionError is handled by the caller
    raise ValueError(f"not allowed in a Countdown answer: {type(node).__name__}")


def _plain_int(s: str) -> int | None:
    s = s.strip()
    return int(s) if re.fullmatch(r"\d+", s) else None


def check_countdown(expr: str | None, nums: Sequence[int], target: int) -> bool:
    """Does `expr` use each given number exactly once, only + - * / and brackets, and equal
    `target` exactly? Parsed with `ast` (never evaluated as code), computed with fractions."""
    if expr is None or not expr.strip() or len(expr) > _MAX_COUNTDOWN_CHARS:
        return False
    s = _normalize_countdown(expr)
    sides = s.split("=")
    if len(sides) > 2:
        return False
    if len(sides) == 2:
        rhs, lhs = _plain_int(sides[1]), _plain_int(sides[0])
        if rhs is not None:
            if rhs != target:
                return False
            s = sides[0]
        elif lhs is not None:
            if lhs != target:
                return False
            s = sides[1]
        else:
            return False
    if not re.fullmatch(r"[\d\s+\-*/()]+", s) or "**" in s or "//" in s:
        return False
    try:
        tree = ast.parse(s.strip(), mode="eval")
        used: list[int] = []
        value = _countdown_value(tree, used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return False
    return Counter(used) == Counter(int(n) for n in nums) and value == target


# --------------------------------------------------------------------------- gold values


def countdown_gold(gold: object) -> tuple[list[int], int]:
    """`nums` and `target` of a Countdown gold answer ({'nums': [...], 'target': N})."""
    if not isinstance(gold, Mapping) or "nums" not in gold or "target" not in gold:
        raise UserError(
            f"Countdown gold must be a mapping with 'nums' and 'target', got {gold!r}; "
            "pass {'nums': [...], 'target': N}"
        )
    return [int(n) for n in gold["nums"]], int(gold["target"])


# --------------------------------------------------------------------------- MATH batches


@dataclass(frozen=True)
class _MathJob:
    index: int
    pred: str
    gold: str


def _pool_chunk(jobs: list[_MathJob], timeout_s: float) -> list[tuple[int, bool]]:
    """Worker-process body: each worker runs on its own main thread, so SIGALRM works."""
    return [(job.index, _sympy_equal(job.gold, job.pred, timeout_s)) for job in jobs]


def _grade_pending_in_pool(
    jobs: list[_MathJob], workers: int, timeout_s: float
) -> dict[int, bool]:
    """Spread sympy work over processes; an overrunning chunk counts as wrong."""
    chunk = max(1, math.ceil(len(jobs) / (workers * 4)))
    chunks = [jobs[i : i + chunk] for i in range(0, len(jobs), chunk)]
    results: dict[int, bool] = {}
    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(processes=workers)
    try:
        pending = [(c, pool.apply_async(_pool_chunk, (c, timeout_s))) for c in chunks]
        # start-up (imports) + three timed steps per item, every worker busy, + slack
        deadline = time.monotonic() + 60 + 3 * timeout_s * math.ceil(len(jobs) / workers)
        for c, handle in pending:
            try:
                results.update(handle.get(timeout=max(1.0, deadline - time.monotonic())))
            except multiprocessing.TimeoutError:
                results.update({job.index: False for job in c})
            except Exception:  # noqa: BLE001 - a broken worker: grade its share here instead
                results.update(_pool_chunk(c, timeout_s))
    finally:
        pool.terminate()
        pool.join()
    return results


def grade_math_many(
    preds: Sequence[str | None],
    golds: Sequence[str],
    workers: int | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    min_pool_items: int = MIN_ITEMS_FOR_POOL,
) -> list[bool]:
    """Grade a batch of MATH answers. Answers settled by normalisation skip sympy; the rest run in a
    process pool when at least `min_pool_items` need sympy (workers=None: one per CPU;
    workers<=1: always in this process). Workers are spawned, so a script calling this needs
    the usual `if __name__ == "__main__":` guard."""
    if len(preds) != len(golds):
        raise UserError(
            f"{len(preds)} predictions but {len(golds)} gold answers; pass one gold per prediction"
        )
    results: list[bool | None] = [_fast_math(p, str(g)) for p, g in zip(preds, golds)]
    jobs = [
        _MathJob(i, str(p), str(g))
        for i, (p, g, r) in enumerate(zip(preds, golds, results))
        if r is None
    ]
    n_workers = (os.cpu_count() or 1) if workers is None else workers
    n_workers = min(n_workers, max(1, len(jobs)))
    if n_workers > 1 and len(jobs) >= min_pool_items:
        for index, ok in _grade_pending_in_pool(jobs, n_workers, timeout_s).items():
            results[index] = ok
    else:
        for job in jobs:
            results[job.index] = _sympy_equal(job.gold, job.pred, timeout_s)
    return [bool(r) for r in results]
