"""The task registry (math, gpqa, countdown) and grading."""
