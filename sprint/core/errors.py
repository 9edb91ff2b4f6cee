"""How a run ends: the exit codes, and the errors the CLI prints as one line (never a traceback).

The codes (README "Exit codes"): shell `&&` chains and CI must be able to tell a clean run from
one that finished with failed items, from a mistake in the command, from a server that went away.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence

EXIT_OK = 0  # every item ended ok, or was dropped on purpose by a filter (pack's ratio filter)
EXIT_ERROR = 1  # an unexpected error (a bug): a traceback
EXIT_USER = 2  # a mistake in the command, the input, the folder or the server's address: nothing run
EXIT_ITEMS_FAILED = 3  # the run finished but some items failed; re-running the command retries them
EXIT_SERVER_STOPPED = 4  # a server stopped answering mid-run; the run stopped early, re-run to continue
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); finished records are kept


class SprintExit(Exception):
    """An ending the CLI reports in one line with its own exit code."""

    exit_code = EXIT_ERROR


class UserError(SprintExit):
    """Bad input, wrong path, unreachable server, a busy or unwritable folder: say what is wrong and what to do."""

    exit_code = EXIT_USER


class ServerStopped(SprintExit):
    """The circuit breaker tripped: a server stopped answering, so the run stopped starting items.

    Raised after the items in flight have ended and their records (retryable) are written.
    """

    exit_code = EXIT_SERVER_STOPPED


def rerun_command(argv: Sequence[str] | None = None) -> str:
    """The command line of this run (`argv`: its arguments, default this process's), as a user would type it again."""
    return shlex.join(["sprint", *(sys.argv[1:] if argv is None else argv)])


def failed_items_exit(failed: Mapping[str, int], retryable: int, *, what: str = "items",
                      retry_hint: str | None = None, argv: Sequence[str] | None = None) -> int:
    """Report the items that did not end ok (counts by status) on stderr and return the exit code.

    `retryable`: how many of them a re-run of the same command redoes (transient failures); the
    others failed for good (an invalid answer stays invalid at temperature 0) and are named so the
    user looks at them instead of re-running. Returns EXIT_OK when nothing failed.
    """
    total = sum(failed.values())
    if not total:
        return EXIT_OK
    by_status = ", ".join(f"{status}: {n}" for status, n in sorted(failed.items()))
    if total == 1 and what.endswith("s"):
        what = what[:-1]
    print(f"{total} {what} failed ({by_status}); their records say why (`error` in records.jsonl)", file=sys.stderr)
    if retryable:
        print(f"{retryable} of them failed transiently; retry them with: {rerun_command(argv)}", file=sys.stderr)
    if total > retryable:
        hint = retry_hint or "a re-run keeps them; fix the cause, then re-run with --overwrite to redo everything"
        print(f"{total - retryable} failed for good: {hint}", file=sys.stderr)
    return EXIT_ITEMS_FAILED
