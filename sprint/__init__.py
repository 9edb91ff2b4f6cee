"""sprint: interleaved planning and parallel execution for reasoning models (SPRINT)."""

__version__ = "0.1.0"
