"""Stage 4: the planner/executor loop, its schedules, and the sequential baseline."""
