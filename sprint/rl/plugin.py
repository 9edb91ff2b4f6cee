"""The ms-swift plugin of latency-aware GRPO: load it with `--external_plugins sprint/rl/plugin.py`.

It registers, in ms-swift's own tables,
- `multi_turns["sprint"]`: `SprintScheduler`, whose `run()` performs one SPRINT rollout (the
  orchestration loop, see sprint.rl.rollout) with concurrent `infer_engine.infer_async` calls for the
  planner and the executors, and returns one `RolloutOutput` per call. Each output holds that
  call's messages, and as its response tokens the assistant text it continued (loss mask 0) followed
  by the tokens the model sampled (loss mask 1), so the loss covers every generated token, planner
  and executor turns alike. All outputs of a trajectory carry its facts in `rollout_infos`, so they
  get one reward; ms-swift groups them by request id (its per-request "dynamic sample" mode).
  Overriding `run()` needs server mode: `swift rollout --vllm_use_async_engine true`.
- `orms["sprint_correct"|"sprint_format"|"sprint_latency"|"sprint_critical_path"]`: the rewards of
  sprint.rl.rewards (the last a measurement, weight 0).
On a machine without CUDA and with SPRINT_RL_CPU_WEIGHT_SYNC=1 (`sprint grpo --cpu`), it also
installs the trainer's side of a CPU weight sync (sprint.rl.cpu_sync).

This file imports ms-swift, so only the RL environment (.venv-rl, scripts/install_rl.sh, which also
installs the sprint package) can load it; sprint.rl.rollout and sprint.rl.rewards do not need it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from typing import Any

from swift.infer_engine.protocol import RequestConfig, RolloutInferRequest, RolloutOutput
from swift.rewards import ORM, orms
from swift.rollout import MultiTurnScheduler, multi_turns

from sprint.llm.client import Sampling
from sprint.rl import cpu_sync
from sprint.rl.rewards import batch_rewards
from sprint.rl.rollout import CallSample, Generation, RolloutConfig, run_rollout, token_counter, without_stop

log = logging.getLogger(__name__)

SCHEDULER_NAME = "sprint"


class SprintScheduler(MultiTurnScheduler):
    """A multi-turn scheduler whose turns are SPRINT's planner and executor calls."""

    def __init__(self, infer_engine: Any = None, max_turns: int | None = None, *args: Any, **kwargs: Any) -> None:
        super().__init__(infer_engine, max_turns, *args, **kwargs)
        self.config = RolloutConfig.from_env(os.environ, max_phases=max_turns)

    async def run(self, infer_request: RolloutInferRequest, request_config: RequestConfig,
                  **kwargs: Any) -> list[RolloutOutput]:
        tokenizer = self.tokenizer

        async def generate(messages: list[dict[str, str]], sampling: Sampling) -> Generation:
            call = dataclasses.replace(
                request_config, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                top_p=sampling.top_p, stop=list(sampling.stop), seed=sampling.seed, n=1, stream=False,
                return_details=True,  # the sampled token ids
            )
            response = await self.infer_engine.infer_async(RolloutInferRequest(messages=messages), call, **kwargs)
            choice = response.choices[0]
            return Generation(
                text=without_stop(choice.message.content or "", choice.finish_reason, sampling.stop),
                token_ids=list(choice.token_ids or []),
                finish_reason=choice.finish_reason,
                prompt_tokens=response.usage.prompt_tokens if response.usage else 0,
                logprobs=self._extract_logprobs_from_choice(choice),
                raw=response,
            )

        rollout = await run_rollout(
            infer_request.data_dict or {}, self.config, generate, token_counter(tokenizer),
            temperature=1.0 if request_config.temperature is None else request_config.temperature,
            top_p=1.0 if request_config.top_p is None else request_config.top_p,
        )
        if not rollout.samples:  # the very first call failed: nothing to train on, let ms-swift report it
            infos = rollout.infos
            raise RuntimeError(f"SPRINT rollout of {infos['problem_id']!r} made no call: {infos['error']}")
        return [self.output(infer_request, sample, rollout.infos) for sample in rollout.samples]

    def output(self, infer_request: RolloutInferRequest, sample: CallSample, infos: dict[str, Any]) -> RolloutOutput:
        """One training record: the call's messages, its prefix (masked) + sampled tokens (trained)."""
        gen = sample.generation
        prefix_ids = list(self.tokenizer.encode(sample.prefix, add_special_tokens=False)) if sample.prefix else []
        context = sample.messages[:-1] if sample.prefix else sample.messages
        messages = [dict(m) for m in context]
        messages.append({"role": "assistant", "content": sample.prefix + gen.text})
        response = copy.copy(gen.raw)
        response.id = infer_request.uuid or response.id  # ms-swift maps outputs back to requests by this id
        return RolloutOutput(
            response=response,
            messages=messages,
            response_token_ids=[prefix_ids + gen.token_ids],
            response_loss_mask=[[0] * len(prefix_ids) + [1] * len(gen.token_ids)],
            rollout_logprobs=[gen.logprobs] if gen.logprobs and len(gen.logprobs) == len(gen.token_ids) else [],
            rollout_infos={**infos, "call": {"role": sample.role, "phase": sample.phase, "prompt": sample.prompt}},
        )


class _SprintReward(ORM):
    """An ms-swift outcome reward reading the trajectory facts of each record."""

    reward = ""

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        infos = kwargs.get("rollout_infos") or [None] * len(completions)
        return batch_rewards(self.reward, infos, list(kwargs.get("task") or []), list(kwargs.get("gold") or []),
                             kwargs.get("reference_tokens"))


class SprintCorrect(_SprintReward):
    reward = "sprint_correct"


class SprintFormat(_SprintReward):
    reward = "sprint_format"


class SprintLatency(_SprintReward):
    reward = "sprint_latency"


class SprintCriticalPath(_SprintReward):
    """A measurement logged as a reward (weight 0): the trajectory's sequential tokens."""

    reward = "sprint_critical_path"


multi_turns[SCHEDULER_NAME] = SprintScheduler
for _cls in (SprintCorrect, SprintFormat, SprintLatency, SprintCriticalPath):
    orms[_cls.reward] = _cls
cpu_sync.install("trainer")
