"""Decoder shapes the probe measures, and their parameter counts (standard library only: the probe's
measuring part runs where only torch is installed, and tests read the shapes without torch)."""

from __future__ import annotations

SHAPES: dict[str, dict[str, int]] = {
    # DeepSeek-R1-Distill-Qwen-7B (Qwen2): 7.62B parameters, 57 KB of KV cache per context token in bf16
    "r1-distill-qwen-7b": {"hidden": 3584, "inter": 18944, "layers": 28, "heads": 28, "kv": 4, "hd": 128,
                           "vocab": 152064},
    "tiny": {"hidden": 64, "inter": 128, "layers": 2, "heads": 4, "kv": 2, "hd": 16, "vocab": 512},
}


def parameter_count(s: dict[str, int]) -> int:
    """Weights of a Qwen2 decoder of this shape (untied embedding and head, biases on q, k, v)."""
    q, kv = s["heads"] * s["hd"], s["kv"] * s["hd"]
    layer = s["hidden"] * (q + 2 * kv) + q + 2 * kv + q * s["hidden"] + 3 * s["hidden"] * s["inter"] + 2 * s["hidden"]
    return 2 * s["vocab"] * s["hidden"] + s["layers"] * layer + s["hidden"]
