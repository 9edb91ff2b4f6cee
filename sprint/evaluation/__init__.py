"""Grading runs, counting tokens, metrics with CIs, report.md."""
