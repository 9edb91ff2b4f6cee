"""Latency-aware RL (GRPO with ms-swift) whose rollouts are SPRINT planner/executor runs.

- `sprint.rl.rewards`: the trajectory facts a reward needs and the three rewards (correctness,
  format, latency), plain Python so they can be tested without ms-swift;
- `sprint.rl.rollout`: one SPRINT rollout through the orchestration loop against any async
  generation engine, the calls it made and the facts for `rollout_infos`;
- `sprint.rl.plugin`: the ms-swift plugin file (`--external_plugins sprint/rl/plugin.py`): the
  multi-turn scheduler and the reward classes registered in ms-swift's tables;
- `sprint.rl.grpo_data`: the GRPO training rows (question, gold, task, reference length);
- `sprint.rl.launch`: run_grpo.sh's three commands (rows, `swift rollout`, `swift rlhf`);
- `sprint.rl.cpu_sync`: an opt-in CPU weight sync (SPRINT_RL_CPU_WEIGHT_SYNC=1) for the CPU smoke test.
"""
