"""Does stage 1 use a tokens-per-minute budget fully, and lose nothing, against a limit that answers 429?

Runs `sprint components` (stage 1) on a few hundred traces (copies of tests/data/traces.jsonl with
their own ids and questions) against the scripted OpenAI-compatible server (tests/fake_server.py)
enforcing a TPM limit the way OpenAI-style APIs do: a bucket refilled at TPM/60 tokens per second
holding one second's worth, each request charged prompt + max_tokens on arrival (HTTP 429 with
Retry-After when it does not fit) and refunded what it did not generate. The stage gets the same
`--tpm`, then a `--tpm` half again too high (the 429s and their Retry-After must correct it). Prints the wall time, the tokens served, `budget used: N %` (served tokens over the most
the limit allowed in that time; target >= 90 %), the 429s and the failed items (target 0).

    .venv/bin/python benchmarks/bench_curation_throughput.py [--items 200] [--tpm 360000]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the scripted server lives with the tests

from fake_server import FakeServer  # noqa: E402

from sprint.curation.components import separate_components  # noqa: E402

MODEL = "test-model"


def make_input(path: Path, n: int) -> dict[str, str]:
    """`n` traces (the fixtures, repeated with new ids/questions); returns question -> scripted answer."""
    base = [json.loads(line) for line in (ROOT / "tests" / "data" / "traces.jsonl").read_text().splitlines() if line.strip()]
    answers: dict[str, str] = {}
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            row = dict(base[i % len(base)])
            row["id"] = f"{row['id']}-{i}"
            row["question"] = f"{row['question']} (variant {i})"
            answers[row["question"].strip()] = row.pop("scripted_components")
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return answers


def run_once(n: int, server_tpm: int, client_tpm: int, max_tokens: int, workers: int) -> tuple[float, bool]:
    """One stage-1 run; prints its figures; returns (budget used, nothing failed)."""
    with tempfile.TemporaryDirectory() as tmp:
        inp = Path(tmp) / "traces.jsonl"
        answers = make_input(inp, n)

        def handler(request: dict, endpoint: str) -> str:
            m = re.search(r"<Question>\n(.*?)\n</Question>", request["messages"][-1]["content"], re.S)
            return answers[m.group(1).strip()]

        with FakeServer(handler, tpm=server_tpm, tpm_window_s=1.0) as srv:
            t0 = time.perf_counter()
            outcome = separate_components(
                str(inp), Path(tmp) / "out", model=MODEL, server_url=srv.base_url, num_workers=workers,
                max_tokens=max_tokens, tpm=client_tpm, progress=False, max_retries=3)
            wall = time.perf_counter() - t0
            budget = srv.budget
            assert budget is not None
            used = budget.used_fraction()
            requests = len(srv.completion_requests)
        records = [json.loads(line) for line in (Path(tmp) / "out" / "records.jsonl").read_text().splitlines()]
    failed = sum(r.get("status") != "ok" for r in records)
    print(f"stage 1 on {n} traces, server limit {server_tpm:,} TPM, --tpm {client_tpm:,}: {wall:.1f} s wall, "
          f"{budget.served:,} tokens served ({budget.served / wall * 60:,.0f} per minute), "
          f"{budget.refused} answered 429 ({requests} requests in all)")
    limiter = (outcome.usage.get("this_run") or {}).get("rate_limiter")
    if limiter:
        print(f"  client limiter: {limiter}")
    print(f"  budget used: {100 * used:.0f} % (target >= 90 %)")
    print(f"  {failed} failed ({len(records)} records, {len(records) - failed} ok)")
    return used, failed == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--tpm", type=int, default=360_000, help="the server's limit")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--workers", type=int, default=16)
    args = ap.parse_args()
    ok = True
    # the budget given right, then overstated by half (the server's 429s and Retry-After must correct it)
    for client_tpm in (args.tpm, args.tpm * 3 // 2):
        used, nothing_failed = run_once(args.items, args.tpm, client_tpm, args.max_tokens, args.workers)
        ok = ok and nothing_failed and used >= 0.9
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
