"""Latency-aware RL (GRPO with ms-swift) whose rollouts are SPRINT planner/executor runs.

- `sprint.rl.rewards`: the trajectory facts a reward needs and the three rewards (correctness,
  format, latency), plain Python so they can be tested without ms-swift;
- `sprint.rl.rollout`: one SPRINT rollout through the orchestration loop against any async
  generation engine, the calls it made and the facts for `rollout_infos`;
- `sprint.rl.plugin`: the ms-swift plugin file (`--external_plugins sprint/rl/plugin.py`): the
  multi-turn scheduler and the reward classes registered in ms-swift's tables;
- `sprint.rl.grpo_data`: the GRPO training rows (question, gold, task, reference length);
- `sprint.rl.launch`: run_grpo.sh's three commands (rows, `swift rollout`, `swift rlhf`);
- without CUDA (`sprint grpo --cpu`): `sprint.rl.cpu_rollout`, ms-swift's rollout server with its
  device check lifted, and `sprint.rl.cpu_sync`, the weight sync over gloo (opt-in: CPU_SYNC_ENV=1).
"""

# The switch of sprint.rl.cpu_sync, here so that the launcher can set it without importing torch.
CPU_SYNC_ENV = "SPRINT_RL_CPU_WEIGHT_SYNC"
