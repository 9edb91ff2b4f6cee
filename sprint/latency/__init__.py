"""Seconds on a GPU: the latency model, one problem's timeline on it, and the step-cost probe."""
