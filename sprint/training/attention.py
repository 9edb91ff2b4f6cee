"""Float32 attention under bf16 autocast: an ms-swift plugin (`--external_plugins` this file).

It registers `sdpa_fp32` with transformers' attention functions: PyTorch's scaled-dot-product
attention with query, key and value in float32 while the rest of the step runs under bf16 autocast.
On the CPU, at the mini model's head size of 32, that is faster than the bf16 kernel (100 steps of
the base's recipe: docs/experiments.md, "Time"), and it keeps the attention logits in float32: the
eager implementation, faster still, computes them as a bf16 product, and the SPRINT model trained
that way miscopied three times as many of its plans' checks. The output goes back to the query's
dtype, so the layers after it see what they would with the stock kernel.

ms-swift imports this file by path before it loads the model (the recipe key `float32_attention`
makes `sprint finetune` pass it), so it imports nothing of sprint's.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "sdpa_fp32"


def sdpa_fp32_attention(module, query, key, value, attention_mask, **kwargs):
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                              attention_mask, **kwargs)
    return out.to(query.dtype), weights


AttentionInterface.register(NAME, sdpa_fp32_attention)
