"""The experiment in miniature: the generic pieces `make demo` needs to run SPRINT end to end on a CPU.

`tokenizer` (the project's own small byte-level BPE, `sprint mini-tokenizer`), `model` (a random-init
Qwen2 sized by flags, `sprint mini-model`; its torch half is `weights.py`, run in a torch venv) and
`teacher` (the deterministic stand-in for GPT-4o that answers stages 1-2 over the real protocol,
`sprint teacher-server`). The top layer: it may import any other part of the package.
"""
