"""How long a generation takes on one GPU: decode steps that read the weights and every KV cache,
prefills that compute only what is not cached yet.

Sequential tokens are a proxy for wall-clock time. This model turns tokens into seconds with the
effects that matter for an interleaved planner/executor schedule:

- decode: one step emits one token for each of the `k` sequences decoding together; it reads the
  weights once and each sequence's KV cache, so it costs
  `step_base_s + step_per_seq_s × k + step_per_context_s × Σ contexts` (contexts in tokens). With
  k executors sharing a long context the KV reads grow with k × context;
- prefill: a call first computes the tokens of its prompt that are not in the prefix cache yet
  (vLLM's prefix cache makes a shared prefix free): `prefill_base_s + max(prefill_floor_s,
  prefill_per_token_s × new + prefill_per_pair_s × new × (cached + new / 2))`, the pair term
  being the new tokens' attention over the cached prefix and each other;
- at most `capacity` sequences are served at once (the replay server queues the rest).

Default terms (`H200`): measured on an NVIDIA H200 (PyTorch 2.11, CUDA 13, CUDA graphs) with a
Qwen2 decoder of DeepSeek-R1-Distill-Qwen-7B's shape in bf16, the grid of 40 decode cells
(k = 1..16 sequences at context 512..16,384) and 11 prefill cells of the step-cost table that
README.md "Modelled seconds" reproduces (`sprint gpu-probe` measures the same on any GPU), fitted
by `sprint.latency.stepfit`: 6.60 ms a step + 0.0216 µs per context token summed over the
sequences (the free fit's per-sequence term is slightly negative, so it is 0), within 4.0 % of
every decode cell; prefill 25.8 µs per new token + 0.53 ns per (new, context) pair, within 2 % of
the compute-bound cells, never under one decode step (what a few new tokens cost under CUDA graphs).

`H100`: the published figures at hand. Decode from Lambda Labs' vLLM benchmark of
Llama-3-8B-Instruct on one H100 SXM (github.com/LambdaLabsML/vllm-benchmark,
results/prompt_10/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json): 7.1 ms per token
for one stream, 7.5 ms with ten (+0.6 % per extra sequence); the KV read per context token scaled
from the H200's measured term by the two memory bandwidths' ratio (4.8 / 3.35 TB/s). Prefill is
compute-bound and the H100 is the H200's chip, so its prefill terms are the H200's, plus the same
run's 25 ms of scheduling and HTTP before a first token.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from sprint.core.errors import UserError
from sprint.latency.stepfit import fit_step_table

FORMAT = "sprint-latency/1"  # the `format` of a latency file
LEGACY_FIELDS = ("ttft_base_s", "ttft_per_prompt_token_s", "s_per_token", "batch_slowdown")


@dataclass(frozen=True)
class LatencyModel:
    """Seconds for prefills and decode steps on one GPU (see the module docstring for the terms)."""

    step_base_s: float = 0.0066044
    step_per_seq_s: float = 0.0
    step_per_context_s: float = 2.15989e-08
    prefill_base_s: float = 0.0
    prefill_floor_s: float = 0.0066044
    prefill_per_token_s: float = 2.57563e-05
    prefill_per_pair_s: float = 5.31503e-10
    capacity: int | None = None  # max sequences served at once; None = unlimited
    gpu: str = "NVIDIA H200"  # what tables name the GPU by

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name.endswith("_s") and getattr(self, f.name) < 0:
                raise ValueError(f"{f.name} must be >= 0, got {getattr(self, f.name)}")
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"capacity must be at least 1 (or None for unlimited), got {self.capacity}")

    @classmethod
    def simple(cls, ttft_base_s: float = 0.025, ttft_per_prompt_token_s: float = 3e-5, s_per_token: float = 0.0071,
               batch_slowdown: float = 0.006, capacity: int | None = None, gpu: str = "simple model") -> LatencyModel:
        """The earlier form: a prefill of `ttft_base_s + ttft_per_prompt_token_s × new tokens`, and a step of
        `s_per_token × (1 + batch_slowdown × (k − 1))` whatever the contexts (no KV term)."""
        return cls(step_base_s=s_per_token * (1 - batch_slowdown), step_per_seq_s=s_per_token * batch_slowdown,
                   step_per_context_s=0.0, prefill_base_s=ttft_base_s, prefill_floor_s=0.0,
                   prefill_per_token_s=ttft_per_prompt_token_s, prefill_per_pair_s=0.0, capacity=capacity, gpu=gpu)

    def step(self, decoding: int = 1, context_tokens: int = 0) -> float:
        """Seconds of one decode step while `decoding` sequences decode, their contexts summing to `context_tokens`."""
        return self.step_base_s + self.step_per_seq_s * max(1, decoding) + self.step_per_context_s * context_tokens

    def prefill(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds before decoding starts: `new_tokens` computed after `cached_tokens` found in the cache."""
        new = max(0, new_tokens)
        work = self.prefill_per_token_s * new + self.prefill_per_pair_s * new * (max(0, cached_tokens) + new / 2)
        return self.prefill_base_s + max(self.prefill_floor_s, work)

    def decode_alone(self, n_tokens: int, context_tokens: int = 0) -> float:
        """`n_tokens` decode steps of one sequence alone, its context growing from `context_tokens`."""
        n = max(0, n_tokens)
        return n * self.step(1, context_tokens) + self.step_per_context_s * n * (n - 1) / 2

    def sequential_time(self, n_tokens: int, prompt_tokens: int = 0, cached_tokens: int = 0) -> float:
        """One generation alone on the GPU: prefill of the uncached prompt, then `n_tokens` decode steps."""
        cached = min(cached_tokens, prompt_tokens)
        return self.prefill(prompt_tokens - cached, cached) + self.decode_alone(n_tokens, prompt_tokens)

    @property
    def s_per_token(self) -> float:
        """A step of one sequence at no context: the figure a person quotes as "ms per token"."""
        return self.step(1, 0)

    def terms(self) -> dict[str, Any]:
        """The fields as a latency file's `latency_model` stores them."""
        return asdict(self)

    def describe(self) -> str:
        """One line for reports: the GPU and the terms in ms / µs."""
        pair = f" + {self.prefill_per_pair_s * 1e9:.3g} ns per (new, context) pair" if self.prefill_per_pair_s else ""
        return (f"{self.gpu}: decode step {self.step_base_s * 1e3:.3g} ms + {self.step_per_seq_s * 1e3:.3g} ms per "
                f"sequence + {self.step_per_context_s * 1e6:.3g} µs per context token; prefill "
                f"{self.prefill_base_s * 1e3:.3g} ms + max({self.prefill_floor_s * 1e3:.3g} ms, "
                f"{self.prefill_per_token_s * 1e6:.3g} µs per new token{pair})")


H200 = LatencyModel()
H100 = LatencyModel(step_base_s=0.0071 * (1 - 0.006), step_per_seq_s=0.0071 * 0.006,
                    step_per_context_s=H200.step_per_context_s * 4.8 / 3.35, prefill_base_s=0.025,
                    prefill_floor_s=H200.prefill_floor_s, prefill_per_token_s=H200.prefill_per_token_s,
                    prefill_per_pair_s=H200.prefill_per_pair_s, gpu="NVIDIA H100 SXM (published figures)")
PRESETS: dict[str, LatencyModel] = {"h200": H200, "h100": H100}
DEFAULT_LATENCY = "h200"


def model_from_file_data(data: Any, source: str = "the latency file") -> LatencyModel:
    """The model a latency file describes: its `latency_model` terms, the earlier fit-latency form, or a raw
    step-cost table (the probe's grid, the H200 table) fitted now."""
    if not isinstance(data, dict):
        raise UserError(f"{source} holds no latency model; pass a latency file (sprint gpu-probe, sprint fit-latency)")
    fitted = data.get("latency_model")
    gpu = str(data.get("device") or data.get("gpu") or "")
    if fitted is None and data.get("decode"):
        try:
            fitted = fit_step_table(data)["terms"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{source}: cannot fit its step-cost table ({exc})") from None
    elif fitted is None and any(k in data for k in (*LEGACY_FIELDS, "step_base_s")):
        fitted = data
    if not isinstance(fitted, dict):
        raise UserError(f"{source} holds no latency model; pass a latency file (sprint gpu-probe, sprint fit-latency)")
    try:
        if any(k in fitted for k in LEGACY_FIELDS) and "step_base_s" not in fitted:
            simple = {k: fitted[k] for k in LEGACY_FIELDS if k in fitted}
            model = LatencyModel.simple(**simple, capacity=fitted.get("capacity"), gpu=gpu or "fitted (earlier form)")
        else:
            known = {k: v for k, v in fitted.items() if k in LatencyModel.__dataclass_fields__}
            known.setdefault("gpu", gpu or "measured GPU")
            model = LatencyModel(**known)
    except (TypeError, ValueError) as exc:
        raise UserError(f"bad latency model in {source}: {exc}") from None
    return model


def load_latency_model(path: str | Path) -> LatencyModel:
    """The model in a latency file: `sprint gpu-probe`'s, `sprint fit-latency`'s latency.json, or a step-cost table."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the latency model {path} ({exc}); pass a latency file "
                        f"(sprint gpu-probe, sprint fit-latency) or one of {', '.join(PRESETS)}") from None
    return model_from_file_data(data, str(path))


def resolve_latency(spec: str | Path | None) -> LatencyModel:
    """A preset name (`h200`, `h100`; None: the default) or a latency file."""
    if spec is None or str(spec).strip() == "":
        return PRESETS[DEFAULT_LATENCY]
    if str(spec).lower() in PRESETS:
        return PRESETS[str(spec).lower()]
    return load_latency_model(spec)
