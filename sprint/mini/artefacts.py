"""The files of a demo folder that two runs of one commit must share byte for byte.

The data half of `scripts/mini_demo.sh` writes them before any training: the problems and traces, the
stand-in teacher's answers, the SFT rows, pack's records, the tokenizer and the initial weights.
Manifests and summaries hold times and paths, and stages 1-2's records come in the order their answers
came back, so they are not here. Read by `scripts/compare_demo_runs.py` and tests/test_mini_repeatable.py.
"""

from __future__ import annotations

DATA_HALF = ("data/train_traces.jsonl", "data/test.jsonl", "data/teacher.jsonl", "data/corpus.jsonl",
             "sft/train.jsonl", "sft/test.jsonl", "sft/sequential_train.jsonl", "sft/sequential_test.jsonl",
             "sft/records.jsonl", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
             "init/model.safetensors", "init/config.json")
