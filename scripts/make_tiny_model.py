"""Build a tiny random-weight Qwen2 model that vLLM's CPU build can serve and ms-swift can train.

It emits gibberish, which is the point: it exercises the real serving and training protocols
in seconds on a CPU. Run it with a Python that has torch + transformers (.venv-vllm or .venv-swift):

    .venv-vllm/bin/python scripts/make_tiny_model.py OUT_DIR --tokenizer PATH_OR_HUB_ID
"""

from __future__ import annotations

import argparse
from pathlib import Path


def make_tiny_model(out_dir: Path, tokenizer: str, seed: int = 0) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(tokenizer)
    # head_dim 64: vLLM's CPU attention crashes with 16.
    config = Qwen2Config(
        vocab_size=151665,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tokenizer", required=True, help="tokenizer directory or hub id")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(make_tiny_model(args.out_dir, args.tokenizer, args.seed))


if __name__ == "__main__":
    main()
