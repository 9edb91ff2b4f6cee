"""CPU weight sync for GRPO without a GPU: opt-in with SPRINT_RL_CPU_WEIGHT_SYNC=1 (`sprint grpo --cpu`
sets it), never on GPUs.

`swift rlhf --vllm_mode server` copies the policy's weights to `swift rollout` before each
generation batch: the trainer joins the vLLM workers in a `StatelessProcessGroup` (a TCPStore) and
broadcasts the weights through vLLM's `PyNcclCommunicator`. vLLM has no CPU implementation of it
(without NCCL it is disabled and has no `device`), so on a machine without CUDA ms-swift 4.6 stops
at the first sync. This module keeps ms-swift's group (the same store, the same ranks) and does
the broadcast with a gloo process group built on that store: on the receiving side it swaps the
worker extension's communicator for `CpuWeightSyncCommunicator` (and its `torch.cuda.synchronize`
for nothing); on the sending side it replaces ms-swift's broadcast helper, whose CUDA stream and
device calls have no CPU equivalent. Loading the received weights needs one more change on the
CPU: vLLM-CPU repacks each linear layer's weight for its GEMM kernel after loading and leaves an
empty parameter without a `weight_loader`, so ms-swift's `model.load_weights` cannot load into it
again. The worker therefore brackets the loads with vLLM's own layerwise reload (restore the
layers, load, re-run the repacking): `initialize_layerwise_reload` before the first bucket,
`finalize_layerwise_reload` where ms-swift re-runs `process_weights_after_loading` after the last.

It exists so that the real trainer can run against the real rollout server on a CPU, for small
models (the mini experiment's GRPO, the tests); gloo over TCP copies every weight through the
network stack, which costs nothing at a few MB and too much at billions of parameters.
`install()` does nothing unless SPRINT_RL_CPU_WEIGHT_SYNC is set and CUDA is absent. It must run
in both processes: the trainer (the plugin, loaded by `swift rlhf --external_plugins`, calls it)
and the vLLM worker that receives the weights (a process vLLM-CPU spawns without the plugin, so
sprint/rl/cpu_rollout.py calls it at import, which every spawned child of that module repeats).
Each broadcast logs its size and CRC-32 on both sides, so a test can check that what the trainer
sent is what the worker received.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import logging
import os
import sys
import zlib
from typing import Any, Iterable

import torch
from torch.distributed import BroadcastOptions, PrefixStore
from torch.distributed.distributed_c10d import ProcessGroupGloo

from sprint.core.options import env_switch
from sprint.rl import CPU_SYNC_ENV

TRAINER_MODULE = "swift.rlhf_trainers.vllm_client"  # VLLMClient: the sending side
SERVER_MODULE = "swift.pipelines.infer.rollout"  # WeightSyncWorkerExtension: the receiving side
LOG_TAG = "sprint cpu weight sync"
# how long one side waits for the other: each sync starts with an HTTP call to the server that
# returns before the worker starts receiving, so both sides are normally a few ms apart
TIMEOUT = datetime.timedelta(minutes=5)

log = logging.getLogger(__name__)


def enabled() -> bool:
    """Opted in, and no CUDA device: the one case this path is meant for."""
    return env_switch(os.environ.get(CPU_SYNC_ENV)) and not torch.cuda.is_available()


def digest(tensor: torch.Tensor) -> tuple[int, int]:
    """(bytes, CRC-32) of a tensor's contents, whatever its dtype."""
    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return raw.nbytes, zlib.crc32(raw)


def _gloo(group: Any) -> ProcessGroupGloo:
    """The gloo process group on a StatelessProcessGroup's store, made on first use by each side."""
    gloo = getattr(group, "_sprint_gloo", None)
    if gloo is None:
        # a prefix keeps gloo's rendezvous keys apart from the StatelessProcessGroup's own
        gloo = ProcessGroupGloo(PrefixStore("sprint_cpu_weight_sync/", group.store), group.rank, group.world_size,
                                TIMEOUT)
        group._sprint_gloo = gloo
        log.info("%s: rank %d of %d joined the gloo group", LOG_TAG, group.rank, group.world_size)
    return gloo


def broadcast(group: Any, tensor: torch.Tensor, src: int) -> None:
    """In place, like NCCL's: rank `src` sends `tensor`, every other rank receives into its own."""
    if tensor.device.type != "cpu":
        raise ValueError(f"{LOG_TAG}: tensors must be on the CPU, got {tensor.device}")
    opts = BroadcastOptions()
    opts.rootRank, opts.rootTensor = src, 0
    _gloo(group).broadcast([tensor], opts).wait()
    nbytes, crc = digest(tensor)
    log.info("%s: rank %d %s %d bytes crc32 %08x", LOG_TAG, group.rank,
             "sent" if src == group.rank else "received", nbytes, crc)


class CpuWeightSyncCommunicator:
    """What the rollout worker uses of `PyNcclCommunicator` (`device`, `group`, `broadcast`), over gloo."""

    def __init__(self, group: Any, device: Any = None) -> None:
        self.group = group  # the StatelessProcessGroup: ms-swift calls group.barrier() after each sync
        self.rank = group.rank
        self.world_size = group.world_size
        self.device = torch.device("cpu")
        self.available = True
        self.disabled = False

    def broadcast(self, tensor: torch.Tensor, src: int, stream: Any = None) -> None:
        broadcast(self.group, tensor, src)


def _broadcast_tensors(communicator: Any, tensors: Iterable[torch.Tensor]) -> None:
    """The trainer's send (ms-swift's `_broadcast_tensors_for_vllm_weight_sync`) over gloo.

    `communicator` is whatever VLLMClient.init_communicator made: `swift rlhf` connects to the
    rollout server before it loads plugins, so it is vLLM's own PyNcclCommunicator, disabled
    without NCCL; only its group (the StatelessProcessGroup) and rank are used.
    """
    for tensor in tensors:
        broadcast(communicator.group, tensor.detach().to("cpu"), src=communicator.rank)


def _synchronize(device: Any = None) -> None:
    """CPU work is synchronous: nothing to wait for (ms-swift calls torch.cuda.synchronize here)."""


def _begin_reload(patch_loaders: Any, model: torch.nn.Module) -> None:
    """Before each `load_weights`: ms-swift's own loader patch, then vLLM's layerwise reload."""
    # imported here: the plugin imports this module on GPUs too, where vLLM may predate this API
    from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

    patch_loaders(model)
    initialize_layerwise_reload(model)  # layers already restored for this sync are skipped


def _finish_reload(vllm_model: torch.nn.Module, model_config: Any = None, target_device: Any = None,
                   **kwargs: Any) -> None:
    """After the last bucket: process the reloaded layers (vLLM-CPU repacks their weights)."""
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

    finalize_layerwise_reload(vllm_model, model_config)
    log.info("%s: weights reloaded into the vLLM model", LOG_TAG)


def install(side: str) -> bool:
    """Swap in the CPU communicator where one side of ms-swift's weight sync looks it up.

    side: "trainer" (VLLMClient, which sends) or "server" (the rollout worker extension, which
    receives). Returns whether it did: only with the opt-in set and no CUDA.
    """
    if env_switch(os.environ.get(CPU_SYNC_ENV)) and torch.cuda.is_available():
        log.warning("%s: %s is set but CUDA is present; keeping ms-swift's NCCL weight sync", LOG_TAG, CPU_SYNC_ENV)
    if not enabled():
        return False
    if not log.handlers:  # vLLM's worker processes configure no root logger; the lines must reach the log
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    if side == "trainer":
        importlib.import_module(TRAINER_MODULE)._broadcast_tensors_for_vllm_weight_sync = _broadcast_tensors
    elif side == "server":
        module = importlib.import_module(SERVER_MODULE)
        if not isinstance(module._patch_full_weight_reload_loader, functools.partial):  # not twice
            module._patch_full_weight_reload_loader = functools.partial(_begin_reload,
                                                                        module._patch_full_weight_reload_loader)
        module.finish_vllm_weight_reload = _finish_reload
        module.PyNcclCommunicator = CpuWeightSyncCommunicator
        module.synchronize = _synchronize
    else:
        raise ValueError(f"side must be 'trainer' or 'server', not {side!r}")
    log.info("%s: installed on the %s side (process %d)", LOG_TAG, side, os.getpid())
    return True
