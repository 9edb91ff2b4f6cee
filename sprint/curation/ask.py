"""One chat turn of a curation stage for one item: ask, then read and check the answer into the record.

Both curation stages ask the same way, so a call's failure, a truncated answer, an unreadable one
and an invalid one become the same record statuses (`llm_<kind>`, `truncated`, `unparseable`,
`invalid`) with a readable `error`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from sprint.core.errors import UserError
from sprint.llm.failures import TRANSIENT_KINDS, LLMError

T = TypeVar("T")


def llm_failure(exc: LLMError) -> tuple[str, str, bool]:
    """(status, error, retryable) for a call that failed after retries.

    Auth and unknown-model errors stop the run instead: every later item would fail the same way.
    """
    if exc.kind in ("auth", "not_found"):
        raise UserError(f"{exc}; check the server URL, the model name and the API key, then re-run") from None
    return f"llm_{exc.kind}", str(exc), exc.kind in TRANSIENT_KINDS


def usage_of(completion: Any | None) -> dict[str, int]:
    """Per-record token usage with a fixed shape (zeros when no answer came back)."""
    if completion is None:
        return {"prompt_tokens": 0, "completion_tokens": 0}
    return {"prompt_tokens": completion.prompt_tokens, "completion_tokens": completion.completion_tokens}


async def ask(client: Any, content: str, sampling: Any, record: dict[str, Any], name: str) -> str | None:
    """One chat turn for one item, as both curation stages ask it.

    Stores the answer and its usage in `record` (`<name>_answer`, `<name>_usage`). When the call
    fails or the answer is cut off at max_tokens, sets the record's status/error and returns None.
    """
    try:
        completion = await client.chat([{"role": "user", "content": content}], sampling)
    except LLMError as exc:
        record["status"], record["error"], record["retryable"] = llm_failure(exc)
        return None
    record[f"{name}_answer"] = completion.text
    record[f"{name}_usage"] = usage_of(completion)
    if completion.finish_reason == "length":
        record["status"] = "truncated"
        record["error"] = f"the answer reached max_tokens ({sampling.max_tokens}) before it ended; raise --max-tokens"
        return None
    return completion.text


async def ask_checked(
    client: Any,
    content: str,
    sampling: Any,
    record: dict[str, Any],
    name: str,
    parse: Callable[[str], T],
    answer_error: type[Exception],
    problems: Callable[[T], list[str]],
) -> T | None:
    """`ask`, then read the answer with `parse` and list what is wrong with it with `problems`.

    Returns the parsed answer, or None with the record's status set: the call's failure,
    `unparseable` (`parse` raised `answer_error`) or `invalid` (the problems, joined).
    """
    answer = await ask(client, content, sampling, record, name)
    if answer is None:
        return None
    try:
        value = parse(answer)
    except answer_error as exc:
        record["status"], record["error"] = "unparseable", str(exc)
        return None
    errors = problems(value)
    if errors:
        record["status"], record["error"] = "invalid", "; ".join(errors)
        return None
    return value
