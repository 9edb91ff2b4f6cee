"""Where do a problem's calls land, and does it pay? vllm-router's policies vs the client-side ring.

One run per configuration, the same MATH-500 problems each time, on the same two real vLLM CPU
replicas (the tiny random-weight model, prefix caching on; their prefix caches are reset between
configurations, VLLM_SERVER_DEV_MODE's /reset_prefix_cache):

- vllm-router `consistent_hash` (keys on the X-Session-Id header: the problem id),
- vllm-router `cache_aware` (longest prefix match per worker, with load balancing),
- vllm-router `round_robin`,
- no router: the comma-separated list, the client-side hash ring (`sprint.llm.replicas`).

Reported: the executors' prefix-cache hit ratio (cached / prompt tokens, from vLLM's own usage of
each call), the planners' too, the run's wall-clock, and how many requests each replica served
(its /metrics). A random-weight model never writes a plan, so the planner is a small proxy: it
sends every planner request, with its affinity header, to the replica that configuration would
pick (through the router, or the ring's owner), so the real prefill lands and is cached where a
real planner's would, and answers with a scripted plan (two phases of three prompts) instead of
the model's gibberish. Executors are real calls with 8-token answers.

    SPRINT_LOCAL_DATA=../shared/data .venv/bin/python benchmarks/bench_router.py [--n 16]

Exits with status 2 and a message when it cannot run (no .venv-vllm, no vllm-router, no data).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from sprint.core.errors import UserError
from sprint.inference.orchestration import OrchestrationConfig, orchestrate
from sprint.llm.fleet import FleetConfig, start_replica_set
from sprint.llm.replicas import AFFINITY_HEADER, HashRing
from sprint.llm.router import router_executable, server_root, start_router, wait_router_ready
from sprint.llm.serve import default_python, free_port
from sprint.timing import wire

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-qwen2"
FINAL = "<Final_answer>\n"
REASONING = ("We look at the quantities given, write down what each one means, and decide which relation ties "
             "them together before doing any arithmetic; the parts below can be worked out independently. ")


def plan(phase: int) -> str:
    """A scripted plan of three prompts, long enough (about 150 words) that its prefix matters."""
    body = REASONING * 4
    prompts = "\n".join(f"<prompt_{phase}.{k}> Work out part {k} of step {phase} and report the value. "
                        f"</prompt_{phase}.{k}>" for k in (1, 2, 3))
    return f"<Plan_{phase}>\n{body}\n{prompts}\n</Plan_{phase}>"


def fail(message: str) -> None:
    print(f"bench_router: cannot run: {message}", file=sys.stderr)
    raise SystemExit(2)


class PlannerProxy:
    """The scripted planner: prefill on the real replica the configuration routes to, scripted text back."""

    def __init__(self, target: str | list[str]) -> None:
        self.target = target  # the router's URL, or the replica list (the ring picks the owner)
        self.ring = HashRing(target) if isinstance(target, list) else None
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                data = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
                self._send(200, data, "application/json")

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                session = self.headers.get(AFFINITY_HEADER) or ""
                usage = proxy.prefill(request, session)
                phase = request["prompt"].count("<Plan_") if "<Plan_" in request["prompt"] else 0
                text = "\\boxed{1}\n</Final_answer>" if request["prompt"].endswith(FINAL) else plan(phase + 1)
                gen = wire.generate(text, request, "completions", wire.Splitter())
                usage["completion_tokens"] = gen.tokens
                usage["total_tokens"] = usage["prompt_tokens"] + gen.tokens
                frame = wire.Wire.for_request("completions", "plan", request, int(time.time()))
                if not request.get("stream"):
                    self._send(200, json.dumps(frame.body(gen, usage)).encode(), "application/json")
                    return
                events = [*frame.opening(), *(frame.chunk(p) for p in gen.pieces if p),
                          *frame.closing(gen, usage, bool((request.get("stream_options") or {}).get("include_usage")))]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.write(wire.sse(events) + b"0\r\n\r\n")

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def prefill(self, request: dict, session: str) -> dict:
        """Send the planner's prompt (1 token of output) where this configuration routes the problem;
        return its usage (prompt and cached tokens are the real ones)."""
        url = self.ring.owner(session) if self.ring else str(self.target)
        body = {"model": MODEL, "prompt": request["prompt"], "max_tokens": 1}
        sent = urllib.request.Request(url + "/completions", json.dumps(body).encode(),
                                      {"Content-Type": "application/json", AFFINITY_HEADER: session})
        with urllib.request.urlopen(sent, timeout=300) as response:
            real = json.load(response)["usage"]
        return {"prompt_tokens": real["prompt_tokens"], "prompt_tokens_details": real.get("prompt_tokens_details")}

    def __enter__(self) -> PlannerProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Row:
    name: str
    wall_s: float
    ok: int
    executor_hit: float | None
    planner_hit: float | None
    served: dict[str, int]


def counters(replicas: list[str]) -> dict[str, int]:
    out = {}
    for url in replicas:
        with urllib.request.urlopen(server_root(url) + "/metrics", timeout=10) as response:
            text = response.read().decode()
        out[url] = int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                           if line.startswith("vllm:request_success_total")))
    return out


def reset_caches(replicas: list[str]) -> None:
    for url in replicas:
        for _ in range(20):  # refused while blocks are held; nothing runs between configurations
            request = urllib.request.Request(server_root(url) + "/reset_prefix_cache", b"", method="POST")
            with urllib.request.urlopen(request, timeout=30) as response:
                if response.status == 200:
                    break
            time.sleep(0.5)


def run_one(name: str, executor_url: str, planner_target: str | list[str], replicas: list[str], args: argparse.Namespace,
            tokenizer: Path, out: Path) -> Row:
    reset_caches(replicas)
    before = counters(replicas)
    with PlannerProxy(planner_target) as proxy:
        cfg = OrchestrationConfig(
            data="HuggingFaceH4/MATH-500", split="test", range=f"0:{args.n}", out_dir=str(out), prompt_mode="chat",
            tokenizer=str(tokenizer), planner_model=MODEL, planner_server_url=proxy.url, executor_server_url=executor_url,
            max_tokens=8, planner_max_tokens=400, max_phases=3, max_problem_workers=args.problems,
            max_execution_workers=3, max_retries=3, timeout=300, use_cache=False)
        started = time.perf_counter()
        summary = orchestrate(cfg, progress=False)
        wall = time.perf_counter() - started
    after = counters(replicas)
    cache = json.loads((out / "manifest.json").read_text())["prefix_cache"]
    hit = {role: (cache.get(role) or {}).get("hit_ratio") for role in ("executor", "planner")}
    return Row(name, wall, summary["ok"], hit["executor"], hit["planner"],
               {u: after[u] - before[u] for u in replicas})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=16, help="MATH-500 problems (rows 0:n)")
    parser.add_argument("--problems", type=int, default=4, help="problems in flight")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()

    data = Path(os.environ.setdefault("SPRINT_LOCAL_DATA", str(REPO_ROOT.parent / "shared" / "data")))
    tokenizer_src = data / "tokenizers" / "deepseek-r1-distill-qwen-7b"
    if not tokenizer_src.is_dir():
        fail(f"tokenizer {tokenizer_src} missing; set SPRINT_LOCAL_DATA to the shared data folder")
    try:
        python = default_python()
        router_executable()
    except UserError as exc:
        fail(str(exc))
    if not python.exists():
        fail(f"no vLLM Python at {python}; run scripts/install_vllm.sh")

    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # /reset_prefix_cache between configurations
    work = Path(tempfile.mkdtemp(prefix="bench-router-"))
    model_dir = work / MODEL
    made = subprocess.run([str(python), str(REPO_ROOT / "scripts" / "make_tiny_model.py"), str(model_dir),
                           "--tokenizer", str(tokenizer_src)], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False)
    if made.returncode != 0:
        fail(f"make_tiny_model.py failed:\n{made.stderr[-2000:]}")

    port = free_port()
    fleet = start_replica_set(FleetConfig(model_dir=model_dir, served_model_name=MODEL, replicas=2, router="none",
                                          port=port, max_model_len=4096, log=work / "vllm.log", python=python))
    rows: list[Row] = []
    try:
        print(f"starting 2 vLLM CPU replicas (logs in {work}) ...", file=sys.stderr, flush=True)
        fleet.wait_ready(900)
        replicas = [s.base_url for s in fleet.servers]
        for policy in ("consistent_hash", "cache_aware", "round_robin"):
            router = start_router(replicas, free_port(), work / f"router-{policy}.log", policy=policy,
                                  prometheus_port=free_port())
            try:
                wait_router_ready(router)
                rows.append(run_one(f"vllm-router {policy}", router.base_url, router.base_url, replicas, args,
                                    model_dir, work / policy))
            finally:
                router.stop()
            print(f"done: {rows[-1]}", file=sys.stderr, flush=True)
        rows.append(run_one("client-side ring (URL list)", ",".join(replicas), replicas, replicas, args, model_dir,
                            work / "ring"))
        print(f"done: {rows[-1]}", file=sys.stderr, flush=True)
    finally:
        fleet.stop()

    print(f"\n{args.n} MATH-500 problems, {args.problems} in flight, 2 phases x 3 executors, 2 vLLM CPU replicas\n")
    print("| configuration | ok | wall-clock s | executor prefix-cache hit | planner hit | requests per replica |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        split = " / ".join(str(n) for n in r.served.values())
        print(f"| {r.name} | {r.ok}/{args.n} | {r.wall_s:.1f} | {r.executor_hit} | {r.planner_hit} | {split} |")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in rows], indent=2))
    if any(r.ok != args.n for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
