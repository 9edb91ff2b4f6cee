"""Greedy accuracy of a sequential mini model (a base reasoner, or RFT) on the arithmetic task's held-out problems.

A probe for comparing base reasoners trained under other settings without a server (docs/experiments.md, "Where the
base's time goes"): transformers' greedy `generate`, a batch of problems at a time, each graded by its boxed answer
against the gold of OUT/data/test.jsonl, and counted by the problem's number of rounds. The pipeline measures its
models on vLLM (`run_baseline_evaluation.sh`); this reads the same prompt (ChatML, the question in its tags), built
here as `sprint.format.prompt_format.sft_user_content` builds it without an agent prompt, since ms-swift's venv
cannot import sprint.

    .venv-swift/bin/python scripts/base_accuracy.py OUT/base-model OUT/tokenizer OUT/data/test.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

BOXED = re.compile(r"\\boxed\{ (.*?) \}")


def graded(text: str, answer: str) -> bool:
    """The first boxed answer of `text` is the gold `answer` (`C is 8 and D is 2`), word for word."""
    boxed = BOXED.search(text)
    return bool(boxed) and boxed.group(1) == answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="the model folder (OUT/base-model, a checkpoint, ...)")
    parser.add_argument("tokenizer", help="its tokenizer folder (OUT/tokenizer)")
    parser.add_argument("problems", help="held-out problems (OUT/data/test.jsonl: question, answer, rounds)")
    parser.add_argument("--n", type=int, default=200, help="the first N problems")
    parser.add_argument("--batch", type=int, default=50, help="problems generated at once")
    parser.add_argument("--max-new-tokens", type=int, default=1200, help="longer than any trace of the task")
    args = parser.parse_args()

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    with open(args.problems) as f:
        problems = [json.loads(line) for line in f][:args.n]
    right, total = Counter(), Counter()
    started = time.time()
    for i in range(0, len(problems), args.batch):
        batch = problems[i:i + args.batch]
        turns = [[{"role": "user", "content": f"<Question>\n{p['question']}\n</Question>\n\n"}] for p in batch]
        prompts = [tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True) for turn in turns]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
        for problem, ids in zip(batch, out):
            text = tok.decode(ids[enc["input_ids"].shape[1]:], skip_special_tokens=True)
            right[problem["rounds"]] += graded(text, problem["answer"])
            total[problem["rounds"]] += 1
    by_rounds = ", ".join(f"{r} round{'s' * (r > 1)} {right[r]}/{total[r]}" for r in sorted(total))
    seconds = time.time() - started
    print(f"{args.model}: {sum(right.values())}/{sum(total.values())} right ({by_rounds}), {seconds:.0f} s")


if __name__ == "__main__":
    main()
