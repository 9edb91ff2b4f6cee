"""How well a mini model copies an arithmetic execution's first line from the question, teacher-forced.

An execution of the arithmetic task opens with its equation copied from the question (`C * 7 = A , where A
is 6 , ...`). A model that misses the copy solves the wrong equation, and every later step with it, so this
is the skill the base reasoner has to learn first (docs/experiments.md, "Digit equations"). Teacher-forced
accuracy of each copied field on held-out sequential rows measures it without a server: the operation (the
token after the line's name, which no other line starts with), the constant, the right side (a number, or
the first name it reads) and the looked-up digits (`A is 6`). Constants are reported apart for equations
whose right side is a number (round 1) and for those that read other unknowns (later rounds, with earlier
searches' tries in between). Where the tokenizer makes an equation's right part one token (`sprint
mini-tokenizer --phrases`, as the demo's arithmetic task does: ` * 3 = 1`), each field is read from that
token apart (a guess that keeps the operation and constant but not the right side shows so), and `equation` is the
whole token.

With --train it first trains the model (a copy of MODEL, e.g. OUT/init) for --steps steps in plain PyTorch
with the settings of a `sprint finetune` recipe (--recipe, the mini one by default: its batch and micro-batch,
AdamW with its learning rate, betas, weight decay and warmup, cosine to its minimum; bf16 autocast where the CPU
has bf16 instructions, float32 elsewhere, as `sprint finetune` does), printing
the figures every --every steps: a quick way to watch when the copy forms under a given order of the rows
(--order: the rows in the order `swift sft` read them, OUT/NAME-train/train_order.jsonl; otherwise shuffled
by --seed each epoch). The pipeline's models are trained by `swift sft`.

    .venv-swift/bin/python scripts/head_copy.py OUT/base-model OUT/tokenizer OUT/sft/sequential_test.jsonl
    .venv-swift/bin/python scripts/head_copy.py OUT/init OUT/tokenizer OUT/sft/sequential_test.jsonl \
        --train OUT/sft/sequential_train.jsonl --steps 1500
    .venv-swift/bin/python scripts/head_copy.py OUT/sprint-model OUT/tokenizer OUT/sft/train.jsonl --executor-rows 600

The last reads the SPRINT model on executor-view rows (`pack --executor-rows`), the view an executor is sent and
the execution it was trained to write, each field also by the prompt's place in its round.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import time
from collections import Counter
from pathlib import Path

import torch
import yaml
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

NAMES = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
FUSED = re.compile(r"^ ([+*]) ([0-9A-Z]) = ([0-9A-Z])$")  # a right part made one token (` * 3 = 1`, ` + B = A`)
LINE_END = "Ġ.Ċ"  # ` .` and the newline: one token of the mini tokenizer
RECIPE = Path(__file__).resolve().parents[1] / "configs" / "finetune_mini.yaml"
# bf16 autocast only where the CPU multiplies bf16 in hardware (sprint.training.finetune.cpu_has_bf16, not importable
# from ms-swift's venv): elsewhere PyTorch emulates bf16 products, hundreds of times slower than float32
BF16 = bool({"avx512_bf16", "amx_bf16"} & set(Path("/proc/cpuinfo").read_text(errors="replace").split()))


def encode(tok: PreTrainedTokenizerFast, row: dict) -> tuple[list[int], list[int]]:
    """(prompt ids, answer ids) as ms-swift's chatml template renders a row; of an executor-view row (`pack
    --executor-rows`: the assistant turn in parts, its context with `"loss": false`) the answer is the trained
    part, the execution, and the context ends the prompt."""
    user, turn = row["messages"][0]["content"], row["messages"][1:]
    context = "".join(m["content"] for m in turn if m.get("loss") is False)
    answer = "".join(m["content"] for m in turn if m.get("loss") is not False)
    prompt = tok.encode(f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{context}")
    return prompt, tok.encode(answer + "<|im_end|>")


def place(row_id: str) -> str:
    """An executor-view row's place (`ar-00012#exec_1.3@stream` -> `round 1, third or later`, the places of
    `sprint.mini.arithmetic.copy_place`, which ms-swift's venv cannot import); '' for other rows."""
    match = re.search(r"#exec_(\d+)\.(\d+)@", row_id)
    if not match:
        return ""
    where = "round 1" if match[1] == "1" else "later rounds"
    return f"{where}, {('first', 'second', 'third or later')[min(int(match[2]), 3) - 1]}"


def fields(tokens: list[str], opens_line: bool = False) -> list[tuple[str, int]]:
    """(field, index) of every copied token of the executions' first lines: a line that starts with a bare
    name (the question's equations and the executions' first lines are the only ones); `opens_line`: the
    tokens start a line (an executor-view row's execution)."""
    out = []
    for i, t in enumerate(tokens):
        if t not in NAMES or (tokens[i - 1] != LINE_END if i else not opens_line):
            continue
        if FUSED.match(tokens[i + 1]):  # one token (sprint mini-tokenizer --phrases): three fields and the whole
            j = k = i + 1
            reads = tokens[j][-1].isalpha()
            out.append(("equation " + ("reads" if reads else "number"), j))
        else:  # name, op, constant, `=`, then the right side up to ` ,`
            j, k = i + 4, i + 2
            reads = not tokens[j].strip().isdigit()
        out += [("op", i + 1), ("k " + ("reads" if reads else "number"), k),
                ("rhs " + ("name" if reads else "number"), j)]
        while j < len(tokens) and tokens[j] != "Ġ,":
            j += 1
        if j + 1 < len(tokens) and tokens[j + 1] == "Ġwhere":
            j += 2
            while j < len(tokens) and tokens[j] != "Ġ,":
                if tokens[j].strip().isdigit():
                    out.append(("lookup", j))
                j += 1
    return out


def copied(field: str, want: str, guess: str) -> bool:
    """Whether the guess copies the field: of a fused right part the field's own part (so a miss that keeps the
    operation and constant but not the right side shows as such), of any other token the whole token."""
    w, g = FUSED.match(want), FUSED.match(guess)
    part = {"op": 1, "k": 2, "rhs": 3}.get(field.split()[0])
    if not w or part is None:
        return want == guess
    return bool(g) and g.group(part) == w.group(part)


def pad(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (-100 but on the answer)."""
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), pad_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100)
    for b, (p, a) in enumerate(rows):
        ids[b, :len(p) + len(a)] = torch.tensor(p + a)
        mask[b, :len(p) + len(a)] = 1
        labels[b, len(p):len(p) + len(a)] = torch.tensor(a)
    return ids, mask, labels


@torch.no_grad()
def accuracy(model, tok, rows, pad_id: int, places: list[str] | None = None) -> dict[str, float]:
    """Teacher-forced accuracy of every answer token and of each copied field (with `places`, each field also
    by the row's place: executor-view rows)."""
    model.eval()
    hit, seen = Counter(), Counter()
    places = places or [""] * len(rows)
    for start in range(0, len(rows), 16):
        chunk = rows[start:start + 16]
        ids, mask, _ = pad(chunk, pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
            pred = model(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        for b, (p, a) in enumerate(chunk):
            guess = pred[b, len(p) - 1:len(p) + len(a) - 1].tolist()
            seen["tokens"] += len(a)
            hit["tokens"] += sum(g == t for g, t in zip(guess, a))
            wanted, guessed = tok.convert_ids_to_tokens(a), tok.convert_ids_to_tokens(guess)
            where = places[start + b]
            for field, i in fields(wanted, tok.convert_ids_to_tokens(p[-1:])[0].endswith("Ċ")):
                for key in (field, f"{field} @ {where}") if where else (field,):
                    seen[key] += 1
                    hit[key] += copied(field, wanted[i], guessed[i])
    model.train()
    return {f: round(hit[f] / seen[f], 3) for f in sorted(seen)} | {"heads": seen["op"]}


def train(model, tok, train_rows, test_rows, args, pad_id: int) -> None:
    """The recipe's optimiser and schedule in plain PyTorch; figures every --every steps."""
    with open(args.recipe, encoding="utf-8") as f:
        recipe = yaml.safe_load(f)
    swift = recipe["swift"]
    size, micro = recipe["global_batch_size"], swift["per_device_train_batch_size"]
    lr_max, floor = args.lr or swift["learning_rate"], swift["lr_scheduler_kwargs"]["min_lr_rate"]
    if args.order and len(train_rows) < args.steps * size:
        raise SystemExit(f"{args.order}: {len(train_rows)} rows, fewer than {args.steps} steps of {size}")
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": swift["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=lr_max, betas=(0.9, swift["adam_beta2"]))
    warmup = max(1, math.ceil(swift["warmup_ratio"] * args.steps))
    rng, queue = random.Random(args.seed), []
    t0 = time.time()
    for step in range(args.steps):
        if args.order:
            batch = list(range(step * size, (step + 1) * size))
        else:
            if len(queue) < size:
                queue += rng.sample(range(len(train_rows)), len(train_rows))
            batch = [queue.pop() for _ in range(size)]
        batch.sort(key=lambda i: -sum(map(len, train_rows[i])))
        progress = (step - warmup) / max(1, args.steps - warmup)
        cosine = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        for group in opt.param_groups:
            group["lr"] = lr_max * ((step + 1) / warmup if step < warmup else cosine)
        n_tokens = sum(len(train_rows[i][1]) for i in batch)
        loss_sum = 0.0
        for m in range(0, size, micro):
            ids, mask, labels = pad([train_rows[i] for i in batch[m:m + micro]], pad_id)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
                logits = model(input_ids=ids, attention_mask=mask).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(),
                                                     ignore_index=-100, reduction="sum") / n_tokens
            loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if (step + 1) % args.every == 0:
            figures = accuracy(model, tok, test_rows, pad_id)
            print(json.dumps({"step": step + 1, "seconds": round(time.time() - t0), "loss": round(loss_sum, 4),
                              **figures}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a mini model folder (to train: its random init)")
    parser.add_argument("tokenizer", help="the mini tokenizer's folder (OUT/tokenizer)")
    parser.add_argument("rows", help="held-out sequential rows (OUT/sft/sequential_test.jsonl), or rows of pack's "
                        "(executor-view rows are read by their place in the round)")
    parser.add_argument("--executor-rows", type=int, default=0,
                        help="read only the first N executor-view rows of ROWS (0: every row as it is)")
    parser.add_argument("--train", help="sequential rows to train on first (OUT/sft/sequential_train.jsonl)")
    parser.add_argument("--order", help="read --train in this order instead (a swift run's train_order.jsonl)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--recipe", default=str(RECIPE),
                        help="the `sprint finetune` recipe whose settings --train uses")
    parser.add_argument("--lr", type=float, default=0.0, help="the peak learning rate (0: the recipe's)")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="the shuffle of --train (without --order)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--save", help="with --train: write the trained model to this folder (to read it again)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = PreTrainedTokenizerFast(tokenizer_file=f"{args.tokenizer}/tokenizer.json")
    pad_id = tok.convert_tokens_to_ids("<|endoftext|>")

    def load(path: str) -> list[tuple[list[int], list[int]]]:
        with open(path, encoding="utf-8") as f:
            return [encode(tok, json.loads(line)) for line in f if line.strip()]

    test_rows = load(args.rows)
    places = None
    if args.executor_rows:
        with open(args.rows, encoding="utf-8") as f:
            ids = [json.loads(line)["id"] for line in f if line.strip()]
        picked = [i for i, row_id in enumerate(ids) if place(row_id)][:args.executor_rows]
        test_rows, places = [test_rows[i] for i in picked], [place(ids[i]) for i in picked]
    model = Qwen2ForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    if args.train or args.order:
        torch.manual_seed(args.seed)
        train(model, tok, load(args.order or args.train), test_rows, args, pad_id)
        if args.save:
            model.save_pretrained(args.save)
    else:
        print(json.dumps(accuracy(model, tok, test_rows, pad_id, places)))


if __name__ == "__main__":
    main()
