"""Errors a user can fix. The CLI prints them as one line and exits 2, never a traceback."""


class UserError(Exception):
    """Bad input, wrong path, unreachable server: say what is wrong and what to do."""

    exit_code = 2
